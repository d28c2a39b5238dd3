package router

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// forwardedPaths are the POST endpoints the router forwards by load, every
// alias included.
var forwardedPaths = []string{"/v1/embeddings", "/pooling", "/classify", "/score", "/v1/score",
	"/rerank", "/v1/rerank", "/v2/rerank", "/detokenize"}

func decodeEcho(t *testing.T, b []byte) forwardEcho {
	t.Helper()
	var e forwardEcho
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("pod answer %s: %v", b, err)
	}
	return e
}

// TestForwardedEndpoints: every forwarded endpoint reaches a pod serving the
// body's model, on the path the client named, with the body byte for byte;
// /version reaches a pod with GET.
func TestForwardedEndpoints(t *testing.T) {
	t.Parallel()
	a := newFakePod(t, "A", 16, false, "alpha")
	b := newFakePod(t, "B", 16, false, "beta")
	c := newFakePod(t, "C", 16, false, "alpha")
	cfg := DefaultConfig()
	cfg.Health = fastHealth(a.endpoint(), b.endpoint(), c.endpoint())
	r := startRouter(t, cfg)
	waitFor(t, "pods routable", func() bool { return routableCount(r, "alpha") == 2 && routableCount(r, "beta") == 1 })
	base := "http://" + r.Addr()

	// Odd spacing, key order and escapes: a re-encoding proxy would change them.
	body := `{ "input" : ["x \u00e9 ✓", "y"],"model":"alpha" , "extra":{"b":1,"a":[1.50,2e3]} }`
	for _, path := range forwardedPaths {
		t.Run(path, func(t *testing.T) {
			code, hdr, out := post(t, base+path, body)
			if code != 200 || hdr.Get("X-Request-Id") == "" {
				t.Fatalf("status %d, request id %q: %s", code, hdr.Get("X-Request-Id"), out)
			}
			e := decodeEcho(t, out)
			if e.Body != body || e.Path != path || e.Method != "POST" {
				t.Fatalf("the pod got %s %s %q, want POST %s and the body unchanged", e.Method, e.Path, e.Body, path)
			}
			if e.Pod != "A" && e.Pod != "C" {
				t.Fatalf("answered by %s, which does not serve alpha", e.Pod)
			}
		})
	}
	if n := b.forwardHits.Load(); n != 0 {
		t.Fatalf("the beta pod got %d requests for alpha", n)
	}
	resp, err := http.Get(base + "/version")
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if e := decodeEcho(t, out); resp.StatusCode != 200 || e.Method != "GET" || e.Path != "/version" {
		t.Fatalf("/version: %d %s", resp.StatusCode, out)
	}
	if code, _, out := post(t, base+"/version", `{}`); code != 405 {
		t.Fatalf("POST /version: %d %s", code, out)
	}
}

// TestForwardedLeastLoadAndRetry: a forwarded request goes to the pod with
// the fewest requests in flight, and one whose pod fails before the first
// byte is retried on another.
func TestForwardedLeastLoadAndRetry(t *testing.T) {
	t.Parallel()
	a := newFakePod(t, "A", 16, false)
	c := newFakePod(t, "C", 16, false)
	cfg := DefaultConfig()
	cfg.Health = fastHealth(a.endpoint(), c.endpoint())
	r := startRouter(t, cfg)
	waitFor(t, "pods routable", func() bool { return routableCount(r, "m") == 2 })
	base := "http://" + r.Addr()

	// The first request is held by whichever pod takes it: the other is
	// then the least loaded.
	release, held := make(chan struct{}), make(chan *fakePod, 1)
	var once sync.Once
	for _, p := range []*fakePod{a, c} {
		p.setForward(func(w http.ResponseWriter, q *http.Request) {
			first := false
			once.Do(func() { first = true })
			if first {
				held <- p
				<-release
			}
			p.echoForward(w, q)
		})
	}
	busy := make(chan int, 1)
	go func() {
		code, _, _ := post(t, base+"/v1/embeddings", `{"model":"m","input":"held"}`)
		busy <- code
	}()
	loaded := <-held
	idle := a
	if loaded == a {
		idle = c
	}
	for i := 0; i < 4; i++ {
		code, _, out := post(t, base+"/v1/embeddings", `{"model":"m","input":"x"}`)
		if e := decodeEcho(t, out); code != 200 || e.Pod != idle.name {
			t.Fatalf("request %d: %d from %s, want %s (%s has a request in flight)", i, code, e.Pod, idle.name, loaded.name)
		}
	}

	// The idle pod now fails before its first byte: the request moves on
	// to the loaded one.
	idle.setForward(func(w http.ResponseWriter, q *http.Request) {
		http.Error(w, "engine dead", http.StatusServiceUnavailable)
	})
	code, _, out := post(t, base+"/v2/rerank", `{"model":"m","query":"q","documents":["d"]}`)
	if e := decodeEcho(t, out); code != 200 || e.Pod != loaded.name {
		t.Fatalf("rerank: %d %s, want %s's answer after %s failed", code, out, loaded.name, idle.name)
	}
	if n := metricValue(t, r, `prefixrouter_retries_total{target="`+targetName(idle.srv.URL)+`"}`); n != 1 {
		t.Fatalf("retries after %s's failure: %v, want 1", idle.name, n)
	}
	close(release)
	if code := <-busy; code != 200 {
		t.Fatalf("held request: %d", code)
	}
}

// TestModelDefaultAndRetrieve: GET /v1/models/{id} answers the pods' entry
// (ids with slashes too) or an OpenAI-shaped 404; a forwarded body without a
// model takes the fleet's only model, and is refused when there are several.
func TestModelDefaultAndRetrieve(t *testing.T) {
	t.Parallel()
	a := newFakePod(t, "A", 16, false, "org/model-x")
	cfg := DefaultConfig()
	cfg.Health = fastHealth(a.endpoint())
	r := startRouter(t, cfg)
	waitFor(t, "pod routable", func() bool { return routableCount(r, "org/model-x") == 1 })
	base := "http://" + r.Addr()

	get := func(path string) (int, []byte) {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	code, b := get("/v1/models/org/model-x")
	var entry struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		OwnedBy string `json:"owned_by"`
	}
	if err := json.Unmarshal(b, &entry); code != 200 || err != nil || entry.ID != "org/model-x" || entry.Object != "model" || entry.OwnedBy != "vllm" {
		t.Fatalf("retrieve: %d %s", code, b)
	}
	code, b = get("/v1/models/nope")
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &e); code != 404 || err != nil || e.Error.Code != "model_not_found" || !strings.Contains(e.Error.Message, "nope") {
		t.Fatalf("unknown model: %d %s", code, b)
	}

	code, _, out := post(t, base+"/v1/embeddings", `{"input":"x"}`)
	if ec := decodeEcho(t, out); code != 200 || ec.Pod != "A" || ec.Body != `{"input":"x"}` {
		t.Fatalf("embeddings without a model: %d %s", code, out)
	}

	b2 := newFakePod(t, "B", 16, false, "beta")
	cfg.Health = fastHealth(a.endpoint(), b2.endpoint())
	r2 := startRouter(t, cfg)
	waitFor(t, "pods routable", func() bool { return routableCount(r2, "org/model-x")+routableCount(r2, "beta") == 2 })
	code, _, out = post(t, "http://"+r2.Addr()+"/score", `{"text_1":"a","text_2":"b"}`)
	if code != 400 || !strings.Contains(string(out), `"param":"model"`) {
		t.Fatalf("score without a model before two models: %d %s", code, out)
	}
}

// TestResponsesStreamAndUsage: a streamed Responses answer passes through
// as it comes, and the cached tokens its final event reports are counted.
func TestResponsesStreamAndUsage(t *testing.T) {
	t.Parallel()
	p := newFakePod(t, "A", 16, false)
	h, release := holdingStream("event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"}}\n\n",
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"status\":\"completed\","+
			"\"usage\":{\"input_tokens\":40,\"input_tokens_details\":{\"cached_tokens\":32},\"output_tokens\":2,\"total_tokens\":42}}}\n\n")
	p.setHandler(h)
	cfg := DefaultConfig()
	cfg.Policy = brain.PolicyPrecise
	cfg.Health = fastHealth(p.endpoint())
	r := startRouter(t, cfg)
	waitFor(t, "pod routable", func() bool { return routableCount(r, "m") == 1 })

	resp, err := http.Post("http://"+r.Addr()+"/v1/responses", "application/json",
		strings.NewReader(`{"model":"m","input":"hi","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line := firstLine(t, br, release); line != "event: response.created\n" {
		t.Fatalf("first line %q", line)
	}
	rest, err := io.ReadAll(br)
	if err != nil || !strings.Contains(string(rest), "response.completed") {
		t.Fatalf("rest of the stream: %q (%v)", rest, err)
	}
	series := `prefixrouter_reported_cached_tokens_total{model="m",policy="precise",target="` + targetName(p.srv.URL) + `"}`
	waitFor(t, "the reported cached tokens", func() bool { return metricValue(t, r, series) == 32 })
}

// TestResponsesRoutedByPrefix: a Responses request is routed to the pod
// holding the blocks of the chat vLLM renders from it; one whose prompt the
// router cannot derive (tools) is routed on load.
func TestResponsesRoutedByPrefix(t *testing.T) {
	t.Parallel()
	const bs = 4
	a := newFakePod(t, "A", bs, true)
	b := newFakePod(t, "B", bs, true)
	cfg := DefaultConfig()
	cfg.Policy = brain.PolicyPrecise
	cfg.Events.BlockSize = bs
	cfg.DebugHeaders = true
	cfg.Health = fastHealth(a.endpoint(), b.endpoint())
	r := startRouter(t, cfg, "m=bytes")
	waitFor(t, "both pods fresh", func() bool { return freshCount(r, "m") == 2 })
	waitFor(t, "block keys", func() bool { return r.ev.Keys() != nil })

	system := strings.Repeat("You route requests to the pod that holds their prefix. ", 4)
	user := "Which pod holds this conversation?"
	chat, err := json.Marshal(map[string]any{"model": "m", "messages": []map[string]any{
		{"role": "system", "content": system}, {"role": "user", "content": user}}})
	if err != nil {
		t.Fatal(err)
	}
	keys := chatKeysAsPodsSee(t, r, "m=bytes")(chat)
	bID := targetIDOf(t, r, b.srv.URL)
	r.ev.Index().Store(bID, kvindex.TierGPU, keys)

	for _, c := range []struct {
		name, body string
		held       bool
	}{
		{"instructions and string input",
			fmt.Sprintf(`{"model":"m","instructions":%q,"input":%q}`, system, user), true},
		{"message items with text parts",
			fmt.Sprintf(`{"model":"m","input":[{"type":"message","role":"system","content":%q},{"role":"user","content":[{"type":"input_text","text":%q}]}]}`, system, user), true},
		{"tools: routed on load",
			fmt.Sprintf(`{"model":"m","instructions":%q,"input":%q,"tools":[{"type":"function","name":"f","parameters":{}}]}`, system, user), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := dryRun(t, r, "/v1/responses", c.body)
			held := candidate(d, b.srv.URL).ConfirmedBlocks
			if c.held != (held == len(keys)) || (!c.held && held != 0) {
				t.Fatalf("B's confirmed run %d of the %d blocks held; dry run %+v", held, len(keys), d)
			}
			if !c.held {
				return
			}
			if d.Decision.Target != b.srv.URL {
				t.Fatalf("dry run chose %s, want B: %+v", d.Decision.Target, d)
			}
			code, hdr, out := post(t, "http://"+r.Addr()+"/v1/responses", c.body)
			if code != 200 || hdr.Get("X-Prefixrouter-Target") != targetName(b.srv.URL) {
				t.Fatalf("routed to %q (%d %s), want B", hdr.Get("X-Prefixrouter-Target"), code, out)
			}
		})
	}
}

// targetIDOf is the router's target id of rank 0 of an endpoint.
func targetIDOf(t *testing.T, r *Router, url string) (id targetid.ID) {
	t.Helper()
	for _, tg := range r.mon.Snapshot().Targets {
		if tg.ID.Endpoint == url {
			return tg.ID
		}
	}
	t.Fatalf("no target %s", url)
	return id
}
