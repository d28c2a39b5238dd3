package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// client sends one streamed completions request and times it.
type client struct {
	http  *http.Client
	model string
}

func newClient(model string) *client {
	tr := &http.Transport{
		Proxy:               nil, // loopback or the URL given: never an environment proxy
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 4096,
		IdleConnTimeout:     3 * time.Second, // under vLLM's 5 s keep-alive
		DisableCompression:  true,
	}
	return &client{http: &http.Client{Transport: tr}, model: model}
}

func (c *client) close() { c.http.CloseIdleConnections() }

// dest is where one request goes.
type dest struct {
	url    string            // the completions endpoint
	header map[string]string // extra headers (a data-parallel rank)
	pod    string            // the pod, when the sender chose it
}

// answer is what one request measured, in wall time.
type answer struct {
	ttft, e2e              time.Duration
	prompt, cached, output int
	text                   string
	status                 int
	target                 string // the router's X-Prefixrouter-Target
	// prefillTarget is the router's X-Prefixrouter-Prefill-Target: the
	// prefill pod that computed a split request's prompt.
	prefillTarget string
	// routed is what the router's decision counted on the chosen target
	// (its debug headers; known false without them).
	routed routedOn
	err    string // a short kind, "" when complete
	detail error
	// apiError is the type of the OpenAI-shaped error the request ended in
	// ({"error": {"message", "type"}} as the body or a stream chunk), ""
	// when it ended in none: a failure without one reached the client
	// only as a cut or garbled stream.
	apiError string
}

// Error kinds: few and stable, since the report counts by them.
const (
	errNoAnswer   = "no answer"
	errStream     = "error in stream"
	errCut        = "stream cut"
	errUnfinished = "unfinished at the drain bound"
)

// do sends prompt to d and reads the stream to its end. keepText keeps the
// generated text (a multi-turn session's next prompt needs it).
func (c *client) do(ctx context.Context, d dest, prompt string, maxTokens int, keepText bool) answer {
	body, err := json.Marshal(map[string]any{
		"model": c.model, "prompt": prompt, "max_tokens": maxTokens, "ignore_eos": true, "temperature": 0,
		"stream": true, "stream_options": map[string]any{"include_usage": true},
	})
	if err != nil {
		return answer{err: errNoAnswer, detail: err}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.url, bytes.NewReader(body))
	if err != nil {
		return answer{err: errNoAnswer, detail: err}
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range d.header {
		req.Header.Set(k, v)
	}
	t0 := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		return answer{err: c.cancelled(ctx, errNoAnswer), detail: err}
	}
	defer resp.Body.Close()
	a := answer{status: resp.StatusCode, target: resp.Header.Get("X-Prefixrouter-Target"),
		prefillTarget: resp.Header.Get("X-Prefixrouter-Prefill-Target"), routed: routedFrom(resp.Header)}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		a.err = fmt.Sprintf("HTTP %d", resp.StatusCode)
		a.detail = fmt.Errorf("%s: %s", a.err, bytes.TrimSpace(msg))
		a.apiError = openAIErrorType(msg)
		return a
	}
	var text strings.Builder
	done := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
		if !ok {
			continue
		}
		if string(line) == "[DONE]" {
			done = true
			break
		}
		var chunk struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
				Details          *struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal(line, &chunk); err != nil {
			a.err, a.detail = errStream, fmt.Errorf("undecodable chunk: %w", err)
			return a
		}
		if len(chunk.Error) > 0 && string(chunk.Error) != "null" {
			a.err, a.detail = errStream, fmt.Errorf("%s", chunk.Error)
			a.apiError = openAIErrorType(line)
			return a
		}
		if len(chunk.Choices) > 0 {
			if a.ttft == 0 {
				a.ttft = time.Since(t0)
			}
			if keepText {
				text.WriteString(chunk.Choices[0].Text)
			}
		}
		if u := chunk.Usage; u != nil {
			a.prompt, a.output = u.PromptTokens, u.CompletionTokens
			if u.Details != nil {
				a.cached = u.Details.CachedTokens
			}
		}
	}
	a.e2e = time.Since(t0)
	if err := sc.Err(); err != nil || !done || a.ttft == 0 {
		a.err, a.detail = c.cancelled(ctx, errCut), fmt.Errorf("stream ended early: %v", err)
		return a
	}
	a.text = text.String()
	return a
}

// openAIErrorType is the type of an OpenAI-shaped error body
// ({"error": {"message": "...", "type": "..."}}), "" when body is not one.
func openAIErrorType(body []byte) string {
	var e struct {
		Error *struct {
			Message *string `json:"message"`
			Type    string  `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil || e.Error == nil || e.Error.Message == nil || e.Error.Type == "" {
		return ""
	}
	return e.Error.Type
}

// routedOn is what the router's decision counted on the target it chose:
// its confirmed run in blocks and the prompt tokens it expected the pod to
// serve from cache (the confirmed run plus the predicted one weighted by
// trust), from the X-Prefixrouter-* debug headers.
type routedOn struct {
	known           bool
	confirmedBlocks int
	predictedTokens int
}

func routedFrom(h http.Header) routedOn {
	cb, err1 := strconv.Atoi(h.Get("X-Prefixrouter-Confirmed-Blocks"))
	pt, err2 := strconv.Atoi(h.Get("X-Prefixrouter-Predicted-Cached-Tokens"))
	if err1 != nil || err2 != nil {
		return routedOn{}
	}
	return routedOn{known: true, confirmedBlocks: cb, predictedTokens: pt}
}

// cancelled names an error caused by the driver's own bound as such.
func (c *client) cancelled(ctx context.Context, kind string) string {
	if errors.Is(context.Cause(ctx), errDrainBound) {
		return errUnfinished
	}
	return kind
}
