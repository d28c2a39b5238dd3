package router

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixrouter/prefixrouter/brain"
)

// readAccessLog reads the JSON lines of the access log at path by request
// id, each line also kept raw.
func readAccessLog(t *testing.T, path string) (map[string]map[string]any, map[string][]string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines, raw := map[string]map[string]any{}, map[string][]string{}
	for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("access log line %q: %v", l, err)
		}
		id, _ := m["request_id"].(string)
		lines[id] = m
		raw[id] = append(raw[id], l)
	}
	return lines, raw
}

// send makes a request with the given request id and returns the status.
func send(t *testing.T, method, url, id, body string) int {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Request-Id", id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestAccessLog: every API request writes one line once it has ended, with
// the fields its path knows, and never the prompt.
func TestAccessLog(t *testing.T) {
	t.Parallel()
	const bs = 4
	a := newFakePod(t, "A", bs, true)
	b := newFakePod(t, "B", bs, true)
	path := filepath.Join(t.TempDir(), "access.jsonl")
	cfg := DefaultConfig()
	cfg.Policy = brain.PolicyPrecise // a decision that stops reading, and a tail
	cfg.Events.BlockSize = bs
	cfg.AccessLog = path
	cfg.MaxBodyBytes = 16 << 10
	cfg.Health = fastHealth(a.endpoint(), b.endpoint())
	r := startRouter(t, cfg, "m=bytes")
	waitFor(t, "pods fresh", func() bool { return freshCount(r, "m") == 2 })
	waitFor(t, "block keys", func() bool { return r.ev.Keys() != nil })
	base := "http://" + r.Addr()

	const secret = "SECRET-PROMPT-TEXT"
	ids, list := tokenPrompt(64)
	// A long chat: the decision reads its first blocks (no pod holds any)
	// and the tail encodes the rest after dispatch.
	chat := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, secret+strings.Repeat(" lorem ipsum dolor", 400))
	dc := dryRun(t, r, "/v1/chat/completions", chat)
	if dc.LookedUpBlocks >= dc.Blocks {
		t.Fatalf("the decision read all %d blocks: no tail to wait for", dc.Blocks)
	}
	wholeChat := dc.PromptTokens

	type want struct {
		method, path, body string
		status             int
		outcome, policy    string
		model              string
		target             bool // a pod was tried
		prompt             any  // float64 count, or nil
		source             string
		predicted          any // float64, or nil
		reported           any // float64, or nil
		retries            float64
	}
	cases := map[string]want{
		"ids":         {"POST", "/v1/completions", `{"model":"m","prompt":` + list + `}`, 200, "ok", "precise", "m", true, float64(len(ids)), "ids", float64(0), float64(0), 0},
		"chat-tail":   {"POST", "/v1/chat/completions", chat, 200, "ok", "precise", "m", true, float64(wholeChat), "local", float64(0), float64(0), 0},
		"embeddings":  {"POST", "/v1/embeddings", `{"model":"m","input":"` + secret + `"}`, 200, "ok", "least-load", "m", true, float64(5), "usage", nil, nil, 0},
		"unknown":     {"POST", "/v1/completions", `{"model":"nope","prompt":"` + secret + `"}`, 404, "unknown_model", "precise", "nope", false, nil, "", nil, nil, 0},
		"bad-json":    {"POST", "/v1/chat/completions", `{"model":`, 400, "bad_request", "", "", false, nil, "", nil, nil, 0},
		"get-on-post": {"GET", "/v1/completions", ``, 405, "method_not_allowed", "", "", false, nil, "", nil, nil, 0},
		"no-route":    {"POST", "/v1/nothing", `{}`, 404, "not_found", "", "", false, nil, "", nil, nil, 0},
		"models":      {"GET", "/v1/models", ``, 200, "ok", "", "", false, nil, "", nil, nil, 0},
		"too-large":   {"POST", "/v1/completions", `{"model":"m","prompt":"` + strings.Repeat("x", 20<<10) + `"}`, 413, "too_large", "", "", false, nil, "", nil, nil, 0},
	}
	for id, c := range cases {
		if got := send(t, c.method, base+c.path, id, c.body); got != c.status {
			t.Fatalf("%s: status %d, want %d", id, got, c.status)
		}
	}
	// Both pods fail before their first byte: the second answer is
	// relayed, one retry later.
	for _, p := range []*fakePod{a, b} {
		p.setHandler(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "engine dead", 500) })
	}
	cases["retried"] = want{"POST", "/v1/completions", `{"model":"m","prompt":"hi"}`, 500, "upstream_error", "precise", "m", true, float64(3), "local", float64(0), nil, 1}
	if got := send(t, "POST", base+"/v1/completions", "retried", cases["retried"].body); got != 500 {
		t.Fatalf("retried: status %d", got)
	}

	var lines map[string]map[string]any
	var raw map[string][]string
	waitFor(t, "a line per request", func() bool {
		lines, raw = readAccessLog(t, path)
		return len(lines) == len(cases)
	})
	for id, c := range cases {
		l := lines[id]
		if n := len(raw[id]); n != 1 {
			t.Fatalf("%s: %d lines", id, n)
		}
		if strings.Contains(raw[id][0], secret) || strings.Contains(raw[id][0], "1001,1002") {
			t.Fatalf("%s: the line carries the prompt: %s", id, raw[id][0])
		}
		ts, _ := time.Parse(time.RFC3339Nano, l["time"].(string))
		if time.Since(ts) > time.Minute || l["method"] != c.method || l["path"] != c.path || l["status"] != float64(c.status) ||
			l["outcome"] != c.outcome || l["policy"] != c.policy || l["retries"] != c.retries {
			t.Fatalf("%s: line %s, want %+v", id, raw[id][0], c)
		}
		if c.target != (l["target"] != "") || c.target != (l["route_ms"] != nil) || c.target != (l["ttfb_ms"] != nil) {
			t.Fatalf("%s: target %q route %v ttfb %v: %s", id, l["target"], l["route_ms"], l["ttfb_ms"], raw[id][0])
		}
		if l["prompt_tokens"] != c.prompt || l["prompt_source"] != c.source ||
			l["predicted_cached_tokens"] != c.predicted || l["reported_cached_tokens"] != c.reported {
			t.Fatalf("%s: prompt %v (%v) predicted %v reported %v, want %v (%v) %v %v", id, l["prompt_tokens"], l["prompt_source"],
				l["predicted_cached_tokens"], l["reported_cached_tokens"], c.prompt, c.source, c.predicted, c.reported)
		}
		if d, ok := l["duration_ms"].(float64); !ok || d <= 0 {
			t.Fatalf("%s: duration %v", id, l["duration_ms"])
		}
		if l["model"] != c.model {
			t.Fatalf("%s: model %v, want %q", id, l["model"], c.model)
		}
	}
}

// TestAccessLogStreamLineAtEnd: a stream's line is written when its relay
// ends, not when the handler returns.
func TestAccessLogStreamLineAtEnd(t *testing.T) {
	t.Parallel()
	p := newFakePod(t, "A", 16, false)
	h, release := holdingStream("data: {\"choices\":[{\"text\":\"a\"}]}\n\n",
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":2}}}\n\ndata: [DONE]\n\n")
	p.setHandler(h)
	path := filepath.Join(t.TempDir(), "access.jsonl")
	cfg := DefaultConfig()
	cfg.AccessLog = path
	cfg.Health = fastHealth(p.endpoint())
	r := startRouter(t, cfg)
	waitFor(t, "pod routable", func() bool { return routableCount(r, "m") == 1 })

	req, _ := http.NewRequest("POST", "http://"+r.Addr()+"/v1/completions",
		strings.NewReader(`{"model":"m","prompt":"hi","stream":true,"stream_options":{"include_usage":true}}`))
	req.Header.Set("X-Request-Id", "stream-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	// While the pod holds the rest the request has not ended: no line.
	// (The router counts the prompt through the pod's /tokenize: 4.)
	first := make(chan struct{})
	go func() {
		_, _ = br.ReadString('\n')
		close(first)
	}()
	<-first
	if lines, _ := readAccessLog(t, path); len(lines) != 0 {
		t.Fatalf("a line before the stream ended: %v", lines)
	}
	close(release)
	if _, err := io.ReadAll(br); err != nil {
		t.Fatal(err)
	}
	var lines map[string]map[string]any
	waitFor(t, "the stream's line", func() bool { lines, _ = readAccessLog(t, path); return len(lines) == 1 })
	l := lines["stream-1"]
	if l["stream"] != true || l["status"] != float64(200) || l["outcome"] != "ok" || l["reported_cached_tokens"] != float64(2) ||
		l["prompt_tokens"] != float64(4) || l["prompt_source"] != "remote" {
		t.Fatalf("stream line %v", l)
	}
}

// gatedWriter blocks every write until its gate opens.
type gatedWriter struct {
	gate chan struct{}
	mu   sync.Mutex
	buf  bytes.Buffer
}

func (w *gatedWriter) Write(p []byte) (int, error) {
	<-w.gate
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

// TestAccessLogDropsWhenBehind: a destination that blocks never holds a
// writer of lines: past the buffer, lines are dropped and counted, and
// every line is either written or counted.
func TestAccessLogDropsWhenBehind(t *testing.T) {
	w := &gatedWriter{gate: make(chan struct{})}
	reg := prometheus.NewRegistry()
	l, err := newAccessLog(w, nil, reg, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	const total = 3 * accessLogBuffer
	for i := range total {
		// Returns at once whatever the writer is doing; a blocking write
		// would hang here for good.
		l.write(&accessLine{RequestID: fmt.Sprint(i), Outcome: "ok"})
	}
	dropped := testutil.ToFloat64(l.droppedFull)
	if dropped == 0 {
		t.Fatalf("%d lines to a blocked destination, none dropped", total)
	}
	close(w.gate)
	l.close()
	written := bytes.Count(w.buf.Bytes(), []byte("\n"))
	if written+int(dropped) != total {
		t.Fatalf("written %d + dropped %v != %d", written, dropped, total)
	}
	l.write(&accessLine{RequestID: "late"})
	if bytes.Contains(w.buf.Bytes(), []byte("late")) {
		t.Fatal("a line written after close")
	}
}
