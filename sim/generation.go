package sim

import (
	"encoding/json"
	"errors"
	"net/http"
)

// generation answers one completions or chat request whose sequences are in
// an engine.
type generation struct {
	p       *Pod
	w       http.ResponseWriter
	r       *http.Request
	chat    bool
	id      string
	model   string
	created int64
	seqs    []*seq
	eng     *engine
	notify  chan struct{}
	pr      *prepared
}

// wait blocks until the engine pokes or the client leaves; false means the
// client is gone and the sequences were aborted.
func (g *generation) wait() bool {
	select {
	case <-g.notify:
		return true
	case <-g.r.Context().Done():
		g.p.abortAll(g.eng, g.seqs)
		return false
	}
}

func (g *generation) snapshots(dst []Snapshot) []Snapshot {
	dst = dst[:0]
	for _, s := range g.seqs {
		dst = append(dst, s.out.snapshot())
	}
	return dst
}

// processGone reports errors that mean the server process died: the client
// sees its connection drop, not an HTTP answer.
func processGone(err error) bool {
	return errors.Is(err, errRestarted) || errors.Is(err, errClosed)
}

// dropConnection closes the client connection without a proper end of
// response, as a crashed server would.
func (g *generation) dropConnection() {
	rc := http.NewResponseController(g.w)
	_ = rc.Flush()
	conn, _, err := rc.Hijack()
	if err != nil {
		return
	}
	_ = conn.Close()
}

func engineError(err error) *apiError {
	return &apiError{status: http.StatusInternalServerError, typ: "InternalServerError", msg: err.Error()}
}

func (g *generation) complete() {
	var snaps []Snapshot
	for {
		if !g.wait() {
			return
		}
		snaps = g.snapshots(snaps)
		all := true
		for _, s := range snaps {
			if s.Err != nil {
				if processGone(s.Err) {
					g.dropConnection()
					return
				}
				g.p.abortAll(g.eng, g.seqs)
				writeError(g.w, engineError(s.Err))
				return
			}
			all = all && s.Done
		}
		if all {
			break
		}
	}
	u := g.p.usageFor(g.seqs, snaps)
	if g.chat {
		resp := chatResponse{ID: g.id, Object: "chat.completion", Created: g.created, Model: g.model, Usage: u, KVTransferParams: g.p.kvTransferAnswer(g.seqs[0])}
		for i, s := range snaps {
			resp.Choices = append(resp.Choices, chatChoice{Index: i, Message: chatMessage{Role: "assistant", Content: g.p.outputText(0, s.Generated), ToolCalls: []any{}}, FinishReason: strp(s.Finish)})
		}
		writeJSON(g.w, http.StatusOK, resp)
		return
	}
	resp := completionResponse{ID: g.id, Object: "text_completion", Created: g.created, Model: g.model, Usage: u, KVTransferParams: g.p.kvTransferAnswer(g.seqs[0])}
	for i, s := range snaps {
		resp.Choices = append(resp.Choices, completionChoice{Index: i, Text: g.p.outputText(0, s.Generated), FinishReason: strp(s.Finish)})
	}
	writeJSON(g.w, http.StatusOK, resp)
}

// stream writes Server-Sent Events: headers at once (as uvicorn does), the
// first chunk when the first token exists, later tokens coalesced into
// whatever accumulated since the last write, a usage chunk when asked for,
// then [DONE].
func (g *generation) stream() {
	h := g.w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	g.w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(g.w)
	_ = rc.Flush()

	sent := make([]int, len(g.seqs))
	finished := make([]bool, len(g.seqs))
	var snaps []Snapshot
	buf := make([]byte, 0, 1024)
	for {
		if !g.wait() {
			return
		}
		snaps = g.snapshots(snaps)
		buf = buf[:0]
		all := true
		for i, s := range snaps {
			if s.Err != nil {
				if processGone(s.Err) {
					g.dropConnection()
					return
				}
				g.p.abortAll(g.eng, g.seqs)
				buf = appendEvent(buf, errorBody{errorDetail{Message: s.Err.Error(), Type: "InternalServerError", Code: 500}})
				buf = append(buf, "data: [DONE]\n\n"...)
				_, _ = g.w.Write(buf)
				_ = rc.Flush()
				return
			}
			if finished[i] {
				continue
			}
			if s.Generated > sent[i] || s.Done {
				var fin *string
				if s.Done {
					fin = strp(s.Finish)
					finished[i] = true
				}
				buf = g.appendChunk(buf, i, sent[i], s.Generated, fin)
				sent[i] = s.Generated
			}
			all = all && finished[i]
		}
		if all {
			if o := g.pr.req.StreamOptions; o != nil && o.IncludeUsage {
				buf = g.appendUsage(buf, snaps)
			}
			buf = append(buf, "data: [DONE]\n\n"...)
		}
		if len(buf) > 0 {
			if _, err := g.w.Write(buf); err != nil {
				g.p.abortAll(g.eng, g.seqs)
				return
			}
			if err := rc.Flush(); err != nil {
				g.p.abortAll(g.eng, g.seqs)
				return
			}
		}
		if all {
			return
		}
	}
}

func appendEvent(buf []byte, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		return buf
	}
	buf = append(buf, "data: "...)
	buf = append(buf, b...)
	return append(buf, "\n\n"...)
}

func (g *generation) appendChunk(buf []byte, idx, from, to int, fin *string) []byte {
	text := g.p.outputText(from, to)
	if !g.chat {
		return appendEvent(buf, completionResponse{ID: g.id, Object: "text_completion", Created: g.created, Model: g.model,
			Choices: []completionChoice{{Index: idx, Text: text, FinishReason: fin}}})
	}
	if from == 0 && to > 0 {
		// vLLM opens a chat stream with the role.
		buf = appendEvent(buf, chatChunk{ID: g.id, Object: "chat.completion.chunk", Created: g.created, Model: g.model,
			Choices: []chatChunkChoice{{Index: idx, Delta: chatDelta{Role: "assistant", Content: strp("")}}}})
	}
	return appendEvent(buf, chatChunk{ID: g.id, Object: "chat.completion.chunk", Created: g.created, Model: g.model,
		Choices: []chatChunkChoice{{Index: idx, Delta: chatDelta{Content: &text}, FinishReason: fin}}})
}

func (g *generation) appendUsage(buf []byte, snaps []Snapshot) []byte {
	u := g.p.usageFor(g.seqs, snaps)
	if g.chat {
		return appendEvent(buf, chatChunk{ID: g.id, Object: "chat.completion.chunk", Created: g.created, Model: g.model, Choices: []chatChunkChoice{}, Usage: u})
	}
	return appendEvent(buf, completionResponse{ID: g.id, Object: "text_completion", Created: g.created, Model: g.model, Choices: []completionChoice{}, Usage: u})
}
