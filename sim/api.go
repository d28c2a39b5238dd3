package sim

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex"
)

// routes is the pod's HTTP surface.
func (p *Pod) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", p.handleCompletions)
	mux.HandleFunc("POST /v1/chat/completions", p.handleChat)
	mux.HandleFunc("POST /v1/completions/render", p.handleRenderCompletions)
	mux.HandleFunc("POST /v1/chat/completions/render", p.handleRenderChat)
	mux.HandleFunc("POST /tokenize", p.handleTokenize)
	mux.HandleFunc("POST /detokenize", p.handleDetokenize)
	mux.HandleFunc("GET /v1/models", p.handleModels)
	mux.HandleFunc("GET /health", p.handleHealth)
	mux.HandleFunc("GET /metrics", p.handleMetrics)
	mux.HandleFunc("POST /reset_prefix_cache", p.handleResetPrefixCache)
	mux.HandleFunc("GET /sim/faults", p.handleGetFaults)
	mux.HandleFunc("POST /sim/faults", p.handlePostFaults)
	mux.HandleFunc("POST /sim/restart", p.handleRestart)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{status: http.StatusNotFound, typ: "NotFoundError", msg: "Not Found"})
	})
	scale := strconv.FormatFloat(p.cfg.TimeScale, 'g', -1, 64)
	var key *[sha256.Size]byte
	if p.cfg.APIKey != "" {
		d := sha256.Sum256([]byte(p.cfg.APIKey))
		key = &d
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Sim-Time-Scale", scale)
		if id := r.Header.Get("X-Request-Id"); id != "" {
			w.Header().Set("X-Request-Id", id)
		}
		if key != nil && !authorized(r.Header.Get("Authorization"), key) {
			p.keyless.Add(1)
		}
		if key != nil && r.Method != http.MethodOptions && strings.HasPrefix(r.URL.Path, "/v1") && !authorized(r.Header.Get("Authorization"), key) {
			p.unauthorized.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, `{"error":"Unauthorized"}`)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// authorized reports whether an Authorization header carries the pod's
// key as a bearer token (the scheme in any case, as vLLM reads it),
// comparing digests in constant time.
func authorized(header string, key *[sha256.Size]byte) bool {
	scheme, token, _ := strings.Cut(header, " ")
	if !strings.EqualFold(scheme, "bearer") {
		return false
	}
	d := sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(d[:], key[:]) == 1
}

// Unauthorized is how many requests the pod refused for a missing or
// wrong API key (Config.APIKey).
func (p *Pod) Unauthorized() int64 { return p.unauthorized.Load() }

// Keyless is how many requests on any path, guarded or open, came
// without the pod's API key: what a client that should always send it
// (the router) left out.
func (p *Pod) Keyless() int64 { return p.keyless.Load() }

// readBody reads a bounded request body.
func (p *Pod) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, p.cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &apiError{status: http.StatusRequestEntityTooLarge, typ: "BadRequestError", msg: fmt.Sprintf("request body exceeds %d bytes", p.cfg.MaxBodyBytes)}
		}
		return nil, badRequest("reading body: %v", err)
	}
	return body, nil
}

// readJSON reads the body and decodes it strictly into v.
func (p *Pod) readJSON(w http.ResponseWriter, r *http.Request, v any) *apiError {
	body, aerr := p.readBody(w, r)
	if aerr != nil {
		return aerr
	}
	if err := decodeStrict(body, v); err != nil {
		return asAPIError(err)
	}
	return nil
}

// available reports a pod that cannot take requests right now.
func (p *Pod) available() *apiError {
	if p.down.Load() {
		return &apiError{status: http.StatusServiceUnavailable, typ: "ServiceUnavailableError", msg: "the server is restarting"}
	}
	if p.faults.get().Dead {
		return &apiError{status: http.StatusInternalServerError, typ: "InternalServerError", msg: errEngineDead.Error()}
	}
	return nil
}

// resolveModel maps a request's model to the adapter it names ("" for the
// base model) and its lora_id.
func (p *Pod) resolveModel(name string) (string, int64, *apiError) {
	if name == "" || name == p.cfg.Model {
		return "", 0, nil
	}
	if id, ok := p.loraIDs[name]; ok {
		return name, id, nil
	}
	return "", 0, &apiError{status: http.StatusNotFound, typ: "NotFoundError", msg: fmt.Sprintf("The model `%s` does not exist.", name), param: "model"}
}

// prepared is a parsed, tokenized generation request.
type prepared struct {
	req     *genRequest
	model   string // as echoed in responses
	lora    string
	loraID  int64
	prompts [][]uint32
	maxTok  int
	salt    string
}

// readPrepared reads the body and prepares it as prepare does.
func (p *Pod) readPrepared(w http.ResponseWriter, r *http.Request, chat bool) (*prepared, *apiError) {
	body, aerr := p.readBody(w, r)
	if aerr != nil {
		return nil, aerr
	}
	return p.prepare(body, chat)
}

func (p *Pod) prepare(body []byte, chat bool) (*prepared, *apiError) {
	req, err := parseGenRequest(body, chat)
	if err != nil {
		return nil, asAPIError(err)
	}
	lora, loraID, aerr := p.resolveModel(req.Model)
	if aerr != nil {
		return nil, aerr
	}
	pr := &prepared{req: req, model: req.Model, lora: lora, loraID: loraID, maxTok: req.maxTokens(p.cfg.DefaultMaxTokens)}
	if pr.model == "" {
		pr.model = p.cfg.Model
	}
	if req.CacheSalt != nil {
		pr.salt = *req.CacheSalt
	}
	if chat {
		ids, err := p.encodeChat(req.Messages, req.Tools, req.ChatTemplateKwargs, req.AddGenerationPrompt, req.ContinueFinalMessage, req.AddSpecialTokens)
		if err != nil {
			return nil, err
		}
		pr.prompts = [][]uint32{ids}
	} else {
		inputs, err := parsePrompts(req.Prompt)
		if err != nil {
			return nil, &apiError{status: 400, typ: "BadRequestError", msg: err.Error(), param: "prompt"}
		}
		add := req.AddSpecialTokens == nil || *req.AddSpecialTokens
		for _, in := range inputs {
			ids := in.ids
			if in.isText {
				if ids, err = p.tok.Encode(in.text, add); err != nil {
					return nil, badRequest("tokenizing prompt: %v", err)
				}
			}
			pr.prompts = append(pr.prompts, ids)
		}
	}
	if req.kv != nil && len(pr.prompts) > 1 {
		// One set of kv_transfer_params names one request's blocks.
		return nil, &apiError{status: 400, typ: "BadRequestError", msg: "kv_transfer_params: a batch of prompts cannot share one KV transfer", param: "kv_transfer_params"}
	}
	limit := min(p.prof.MaxModelLen, p.prof.KVTokens())
	for _, ids := range pr.prompts {
		if len(ids) == 0 {
			return nil, &apiError{status: 400, typ: "BadRequestError", msg: "The decoder prompt cannot be empty", param: "prompt"}
		}
		if len(ids)+pr.maxTok > limit {
			return nil, badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
				limit, len(ids)+pr.maxTok, len(ids), pr.maxTok)
		}
	}
	return pr, nil
}

func (p *Pod) encodeChat(messages, tools, kwargs []byte, addGen *bool, cont bool, addSpecial *bool) ([]uint32, *apiError) {
	in := ChatInput{Messages: messages, Tools: tools, ChatTemplateKwargs: kwargs, AddGenerationPrompt: addGen == nil || *addGen, ContinueFinalMessage: cont}
	if cont && addGen == nil {
		in.AddGenerationPrompt = false
	}
	prompt, ids, err := p.tok.EncodeChat(in)
	if err != nil {
		return nil, badRequest("rendering chat template: %v", err)
	}
	if addSpecial != nil && *addSpecial {
		if ids, err = p.tok.Encode(prompt, true); err != nil {
			return nil, badRequest("tokenizing prompt: %v", err)
		}
	}
	return ids, nil
}

func asAPIError(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	return badRequest("%v", err)
}

// newSeq builds an engine request; its prompt's block hashes are computed
// here, on the caller's goroutine, so the engine loop does not.
func (p *Pod) newSeq(e *engine, id string, ids []uint32, pr *prepared, notify chan struct{}) (*seq, error) {
	s, err := e.newSeq(id, ids, pr.maxTok, kvindex.RequestExtras{LoRAName: pr.lora, CacheSalt: pr.salt}, pr.loraID, notify)
	if err != nil {
		return nil, err
	}
	if kv := pr.req.kv; kv != nil {
		s.kvAnswer = kv.DoRemoteDecode
		n, failure := remoteBlocks(kv)
		if failure != "" {
			// vLLM's kv_load_failure_policy "recompute": the prompt is
			// computed here as if no transfer had been asked for.
			e.stats.kvFailures.Add(1)
			p.log.Warn("KV transfer failed, recomputing the prompt locally", "rank", e.rank, "reason", failure)
		}
		s.remoteBlocks = n
	}
	return s, nil
}

// kvTransferAnswer is the kv_transfer_params of a finished prefill that
// asked for them (do_remote_decode), nil otherwise.
func (p *Pod) kvTransferAnswer(s *seq) *kvTransferAnswer {
	if !s.kvAnswer {
		return nil
	}
	blocks, engineID := s.out.kvTransfer()
	if blocks == nil {
		blocks = []int32{}
	}
	return &kvTransferAnswer{
		DoRemotePrefill: true, RemoteBlockIDs: blocks, RemoteEngineID: engineID,
		RemoteHost: p.cfg.Host, RemotePort: p.ln.Addr().(*net.TCPAddr).Port, TPSize: 1,
	}
}

// run submits prepared prompts to one rank and returns their sequences.
func (p *Pod) run(ctx context.Context, rank int, idPrefix string, pr *prepared, notify chan struct{}) ([]*seq, error) {
	e := p.engines[rank]
	seqs := make([]*seq, 0, len(pr.prompts))
	for i, ids := range pr.prompts {
		s, err := p.newSeq(e, idPrefix+"-"+strconv.Itoa(i), ids, pr, notify)
		if err != nil {
			p.abortAll(e, seqs)
			return nil, err
		}
		if err := e.submit(ctx, engineMsg{kind: msgAdd, s: s}); err != nil {
			p.abortAll(e, seqs)
			return nil, err
		}
		seqs = append(seqs, s)
	}
	return seqs, nil
}

// abortAll tells the engine the client is gone; their blocks are freed.
func (p *Pod) abortAll(e *engine, seqs []*seq) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, s := range seqs {
		_ = e.submit(ctx, engineMsg{kind: msgAbort, s: s})
	}
}

func (p *Pod) requestID(r *http.Request, prefix string) string {
	if id := r.Header.Get("X-Request-Id"); id != "" && len(id) <= 128 {
		return prefix + id
	}
	return fmt.Sprintf("%s%d-%d", prefix, p.index, p.reqSeq.Add(1))
}

// outputText decodes generated tokens [from, to).
func (p *Pod) outputText(from, to int) string {
	if to <= from {
		return ""
	}
	out := p.engines[0].output
	ids := make([]uint32, 0, to-from)
	for i := from; i < to; i++ {
		ids = append(ids, out[i%len(out)])
	}
	s, err := p.tok.Decode(ids, true)
	if err != nil {
		return ""
	}
	return s
}

func (p *Pod) usageFor(seqs []*seq, snaps []Snapshot) *usage {
	u := &usage{}
	cached := 0
	for i, s := range seqs {
		u.PromptTokens += s.promptLen
		u.CompletionTokens += snaps[i].Generated
		cached += snaps[i].CachedTokens
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	if !p.cfg.DisablePromptTokensDetails {
		u.PromptTokensDetails = &promptDetails{CachedTokens: cached}
	}
	return u
}

func (p *Pod) handleCompletions(w http.ResponseWriter, r *http.Request) { p.generate(w, r, false) }
func (p *Pod) handleChat(w http.ResponseWriter, r *http.Request)        { p.generate(w, r, true) }

func (p *Pod) generate(w http.ResponseWriter, r *http.Request, chat bool) {
	if aerr := p.available(); aerr != nil {
		writeError(w, aerr)
		return
	}
	pr, aerr := p.readPrepared(w, r, chat)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	rank, err := p.pickRank(r.Header.Get("X-data-parallel-rank"))
	if err != nil {
		writeError(w, asAPIError(err))
		return
	}
	prefix := "cmpl-"
	if chat {
		prefix = "chatcmpl-"
	}
	id := p.requestID(r, prefix)
	notify := make(chan struct{}, 1)
	seqs, err := p.run(r.Context(), rank, id, pr, notify)
	if err != nil {
		if r.Context().Err() == nil {
			writeError(w, &apiError{status: http.StatusServiceUnavailable, typ: "ServiceUnavailableError", msg: err.Error()})
		}
		return
	}
	g := &generation{p: p, w: w, r: r, chat: chat, id: id, model: pr.model, created: time.Now().Unix(),
		seqs: seqs, eng: p.engines[rank], notify: notify, pr: pr}
	if pr.req.Stream {
		g.stream()
	} else {
		g.complete()
	}
}
