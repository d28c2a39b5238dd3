package router

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/tokenize"
)

// storeBlocks publishes BlockStored for every full block of tokens on the
// pod's real ZMQ socket, exactly as vLLM would after computing them.
func storeBlocks(t *testing.T, p *fakePod, h *kvindex.Hasher, tokens []uint32, kind events.Kind) {
	t.Helper()
	keys, err := h.Keys(nil, tokens, kvindex.RequestExtras{})
	if err != nil {
		t.Fatal(err)
	}
	hashes := make([]uint64, len(keys))
	for i, k := range keys {
		hashes[i] = uint64(k)
	}
	ev := events.Event{Kind: kind, BlockHashes: hashes, Medium: events.MediumGPU}
	if kind == events.KindBlockStored {
		ev.TokenIDs = tokens[:len(keys)*h.BlockSize()]
		ev.BlockSize = h.BlockSize()
	}
	b := events.Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: []events.Event{ev}}
	if _, err := p.pub.Publish(&b, events.EncodingMap); err != nil {
		t.Fatal(err)
	}
}

func tokenPrompt(n int) ([]uint32, string) {
	ids := make([]uint32, n)
	parts := make([]string, n)
	for i := range ids {
		ids[i] = uint32(1000 + i)
		parts[i] = fmt.Sprint(ids[i])
	}
	return ids, "[" + strings.Join(parts, ",") + "]"
}

// TestRoutingFollowsConfirmedIndex: placements announced on real ZMQ decide
// the target, and their removal moves the choice — no request ever warmed
// the pods, only events did.
func TestRoutingFollowsConfirmedIndex(t *testing.T) {
	t.Parallel()
	const bs = 4
	a := newFakePod(t, "A", bs, true)
	b := newFakePod(t, "B", bs, true)
	cfg := DefaultConfig()
	cfg.Policy = brain.PolicyPrecise
	cfg.Events.HashSeed, cfg.Events.HasHashSeed, cfg.Events.HashAlgo, cfg.Events.BlockSize = "0", true, "sha256", bs
	cfg.DebugHeaders = true
	cfg.Health = fastHealth(a.endpoint(), b.endpoint())
	r := startRouter(t, cfg)
	waitFor(t, "both pods routable with fresh event streams", func() bool { return freshCount(r, "m") == 2 })

	h, err := kvindex.NewHasher(kvindex.AlgoSHA256, "0", bs)
	if err != nil {
		t.Fatal(err)
	}
	ids, list := tokenPrompt(64)
	body := `{"model":"m","prompt":` + list + `,"max_tokens":1}`

	for _, step := range []struct {
		name      string
		store     *fakePod
		remove    *fakePod
		want      *fakePod
		wantOther *fakePod
	}{
		{name: "stored on B", store: b, want: b, wantOther: a},
		{name: "removed from B, stored on A", remove: b, store: a, want: a, wantOther: b},
	} {
		t.Run(step.name, func(t *testing.T) {
			if step.remove != nil {
				storeBlocks(t, step.remove, h, ids, events.KindBlockRemoved)
			}
			storeBlocks(t, step.store, h, ids, events.KindBlockStored)
			waitFor(t, "index to confirm the placement", func() bool {
				d := dryRun(t, r, "/v1/completions", body)
				w, o := candidate(d, step.want.srv.URL), candidate(d, step.wantOther.srv.URL)
				return w.ConfirmedBlocks == 16 && o.ConfirmedBlocks == 0 && w.Cost < o.Cost
			})
			d := dryRun(t, r, "/v1/completions", body)
			if d.Decision.Target != step.want.srv.URL || d.Decision.Rank != 0 || d.Decision.Reason == "" {
				t.Fatalf("dry run decision %+v, want %s", d.Decision, step.want.srv.URL)
			}
			if d.Blocks != 16 || d.PromptTokens != 64 || d.BlockSize != bs {
				t.Fatalf("dry run: blocks %d prompt_tokens %d block_size %d, want 16 64 4", d.Blocks, d.PromptTokens, d.BlockSize)
			}
			before := step.want.hits.Load()
			for i := 0; i < 5; i++ {
				code, hdr, out := post(t, "http://"+r.Addr()+"/v1/completions", body)
				if code != 200 {
					t.Fatalf("status %d: %s", code, out)
				}
				if got := hdr.Get("X-Prefixrouter-Target"); got != targetName(step.want.srv.URL) {
					t.Fatalf("routed to %s, want %s (the pod holding the blocks); reason %q confirmed %q; dry run %+v", got, step.want.srv.URL, hdr.Get("X-Prefixrouter-Reason"), hdr.Get("X-Prefixrouter-Confirmed-Blocks"), dryRun(t, r, "/v1/completions", body))
				}
				if hdr.Get("X-Prefixrouter-Confirmed-Blocks") != "16" {
					t.Fatalf("confirmed blocks header %q", hdr.Get("X-Prefixrouter-Confirmed-Blocks"))
				}
				ms, ok := strings.CutPrefix(hdr.Get("Server-Timing"), "route;dur=")
				if d, err := strconv.ParseFloat(ms, 64); !ok || err != nil || d <= 0 {
					t.Fatalf("Server-Timing %q, want route;dur=<ms>", hdr.Get("Server-Timing"))
				}
			}
			if got := step.want.hits.Load() - before; got != 5 {
				t.Fatalf("pod received %d requests, want 5", got)
			}
		})
	}
}

// TestBadInputNeverReachesPod covers every malformed request: the router
// answers with an OpenAI-shaped error and the right status, and the pod sees
// nothing.
func TestBadInputNeverReachesPod(t *testing.T) {
	t.Parallel()
	p := newFakePod(t, "A", 16, false)
	cfg := DefaultConfig()
	cfg.MaxBodyBytes = 4096
	cfg.Health = fastHealth(p.endpoint())
	r := startRouter(t, cfg)
	waitFor(t, "pod routable", func() bool { return routableCount(r, "m") == 1 })
	base := "http://" + r.Addr()

	cases := []struct {
		name, path, body string
		status           int
		param            string
	}{
		{"malformed JSON", "/v1/completions", `{"model":"m","prompt":`, 400, ""},
		{"not an object", "/v1/completions", `["m"]`, 400, ""},
		{"empty body", "/v1/completions", ``, 400, ""},
		{"missing model", "/v1/completions", `{"prompt":"hi"}`, 400, "model"},
		{"model not a string", "/v1/completions", `{"model":7,"prompt":"hi"}`, 400, "model"},
		{"missing prompt", "/v1/completions", `{"model":"m"}`, 400, "prompt"},
		{"prompt wrong type", "/v1/completions", `{"model":"m","prompt":{"a":1}}`, 400, "prompt"},
		{"prompt empty list", "/v1/completions", `{"model":"m","prompt":[]}`, 400, "prompt"},
		{"negative token id", "/v1/completions", `{"model":"m","prompt":[1,-1]}`, 400, "prompt[1]"},
		{"fractional token id", "/v1/completions", `{"model":"m","prompt":[1.5]}`, 400, "prompt[0]"},
		{"mixed batch", "/v1/completions", `{"model":"m","prompt":["a",[1]]}`, 400, "prompt[1]"},
		{"stream not bool", "/v1/completions", `{"model":"m","prompt":"hi","stream":"yes"}`, 400, "stream"},
		{"cache_salt not string", "/v1/completions", `{"model":"m","prompt":"hi","cache_salt":1}`, 400, "cache_salt"},
		{"missing messages", "/v1/chat/completions", `{"model":"m"}`, 400, "messages"},
		{"messages not array", "/v1/chat/completions", `{"model":"m","messages":"hi"}`, 400, "messages"},
		{"message without role", "/v1/chat/completions", `{"model":"m","messages":[{"content":"hi"}]}`, 400, "messages[0].role"},
		{"content wrong type", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":5}]}`, 400, "messages[0].content"},
		{"tools not array", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":{}}`, 400, "tools"},
		{"both generation flags", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}],"add_generation_prompt":true,"continue_final_message":true}`, 400, "continue_final_message"},
		{"unknown model", "/v1/completions", `{"model":"nope","prompt":"hi"}`, 404, "model"},
		{"oversized body", "/v1/completions", `{"model":"m","prompt":"` + strings.Repeat("x", 5000) + `"}`, 413, ""},
		{"unknown path", "/v1/audio/transcriptions", `{"model":"m"}`, 404, ""},
		{"embeddings bad JSON", "/v1/embeddings", `{"model":"m","input":`, 400, ""},
		{"embeddings model not a string", "/v1/embeddings", `{"model":["m"],"input":"x"}`, 400, "model"},
		{"embeddings unknown model", "/v1/embeddings", `{"model":"nope","input":"x"}`, 404, "model"},
		{"rerank unknown model", "/v2/rerank", `{"model":"nope","query":"q","documents":["d"]}`, 404, "model"},
		{"responses without input", "/v1/responses", `{"model":"m"}`, 400, "input"},
		{"responses input wrong type", "/v1/responses", `{"model":"m","input":5}`, 400, "input"},
		{"responses instructions wrong type", "/v1/responses", `{"model":"m","input":"x","instructions":[]}`, 400, "instructions"},
		{"responses unknown model", "/v1/responses", `{"model":"nope","input":"x"}`, 404, "model"},
		{"tokenize bad JSON", "/tokenize", `{`, 400, ""},
		{"tokenize unknown model", "/tokenize", `{"model":"nope","prompt":"x"}`, 404, "model"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, _, b := post(t, base+c.path, c.body)
			if code != c.status {
				t.Fatalf("status %d, want %d: %s", code, c.status, b)
			}
			var e struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
					Code    *string `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(b, &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
				t.Fatalf("not an OpenAI error: %s", b)
			}
			got := ""
			if e.Error.Param != nil {
				got = *e.Error.Param
			}
			if got != c.param {
				t.Fatalf("param %q, want %q (%s)", got, c.param, b)
			}
		})
	}
	if n := p.hits.Load(); n != 0 {
		t.Fatalf("the pod received %d bad requests", n)
	}

	// GET on a POST endpoint.
	resp, err := http.Get(base + "/v1/completions")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 {
		t.Fatalf("GET /v1/completions: %d, want 405", resp.StatusCode)
	}

	// No routable target: 503 with Retry-After, and /ready says so.
	p.srv.Close()
	waitFor(t, "pod down", func() bool { return routableCount(r, "m") == 0 })
	code, hdr, b := post(t, base+"/v1/completions", `{"model":"m","prompt":"hi"}`)
	if code != 503 || hdr.Get("Retry-After") == "" || !strings.Contains(string(b), `"error"`) {
		t.Fatalf("no target: status %d Retry-After %q body %s", code, hdr.Get("Retry-After"), b)
	}
	resp, err = http.Get(base + "/ready")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Fatalf("/ready with no routable target: %d", resp.StatusCode)
	}
	resp, err = http.Get(base + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/health: %d", resp.StatusCode)
	}
}

// TestStreamingPassesThroughIncrementally: the client receives the first
// chunk while the pod is still holding the rest back. A buffering proxy
// would deadlock here (and fail on the wait's deadline).
func TestStreamingPassesThroughIncrementally(t *testing.T) {
	t.Parallel()
	p := newFakePod(t, "A", 16, false)
	h, release := holdingStream("data: {\"choices\":[{\"text\":\"first\"}]}\n\n",
		"data: {\"choices\":[{\"text\":\"second\"}]}\n\n"+
			"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n"+
			"data: [DONE]\n\n")
	p.setHandler(h)
	cfg := DefaultConfig()
	cfg.Health = fastHealth(p.endpoint())
	r := startRouter(t, cfg)
	waitFor(t, "pod routable", func() bool { return routableCount(r, "m") == 1 })

	resp, err := http.Post("http://"+r.Addr()+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"m","prompt":"hi","stream":true,"stream_options":{"include_usage":true}}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("content type %q", ct)
	}
	br := bufio.NewReader(resp.Body)
	if line := firstLine(t, br, release); !strings.Contains(line, "first") {
		t.Fatalf("first line %q", line)
	}
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(rest), "second") || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("rest of stream: %q", rest)
	}
}

// TestClientCancelCancelsUpstream: a client that gives up, before the first
// byte or in the middle of a stream, closes the pod's request.
func TestClientCancelCancelsUpstream(t *testing.T) {
	t.Parallel()
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			p := newFakePod(t, "A", 16, false)
			arrived := make(chan struct{}, 1)
			canceled := make(chan struct{})
			p.setHandler(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if stream {
					w.Header().Set("Content-Type", "text/event-stream")
					fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n")
					w.(http.Flusher).Flush()
				}
				arrived <- struct{}{}
				<-r.Context().Done()
				close(canceled)
			})
			cfg := DefaultConfig()
			cfg.Health = fastHealth(p.endpoint())
			r := startRouter(t, cfg)
			waitFor(t, "pod routable", func() bool { return routableCount(r, "m") == 1 })

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+r.Addr()+"/v1/completions",
				strings.NewReader(fmt.Sprintf(`{"model":"m","prompt":"hi","stream":%v}`, stream)))
			done := make(chan struct{})
			go func() {
				defer close(done)
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					if stream {
						br := bufio.NewReader(resp.Body)
						_, _ = br.ReadString('\n')
						cancel()
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
			<-arrived
			if !stream {
				cancel()
			}
			select {
			case <-canceled:
			case <-time.After(15 * time.Second):
				t.Fatal("the pod's request was never cancelled")
			}
			<-done
			waitFor(t, "in-flight accounting to drain", func() bool {
				tg := r.mon.Snapshot().ForModel("m")[0]
				return tg.Busy().InFlight == 0
			})
		})
	}
}

// TestClientCancelCancelsTokenization: a client that gives up while the
// router is still asking a pod to tokenize its prompt ends that call at
// once, long before the tokenization timeout, and nothing is proxied.
func TestClientCancelCancelsTokenization(t *testing.T) {
	t.Parallel()
	p := newFakePod(t, "A", 16, false)
	arrived := make(chan struct{}, 1)
	canceled := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The server notices a closed connection only once the body is read.
		_, _ = io.Copy(io.Discard, r.Body)
		arrived <- struct{}{}
		<-r.Context().Done()
		close(canceled)
	})
	p.render.Store(&h)
	cfg := DefaultConfig()
	cfg.Health = fastHealth(p.endpoint())
	cfg.Tokenization = tokenize.ModeRemote
	cfg.TokenizeTimeout = 10 * time.Minute
	r := startRouter(t, cfg)
	waitFor(t, "pod routable", func() bool { return routableCount(r, "m") == 1 })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+r.Addr()+"/v1/completions",
		strings.NewReader(`{"model":"m","prompt":"hi"}`))
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	<-arrived
	cancel()
	select {
	case <-canceled:
	case <-time.After(15 * time.Second):
		t.Fatal("the pod's tokenization call was never cancelled")
	}
	if err := <-done; err == nil {
		t.Fatal("the cancelled request got an answer")
	}
	if n := p.hits.Load(); n != 0 {
		t.Fatalf("a request whose client left during tokenization was proxied %d times", n)
	}
}

// TestRetryBeforeFirstByte: a pod that drops the connection or answers 5xx
// before any byte is retried on another one; the client only sees success.
func TestRetryBeforeFirstByte(t *testing.T) {
	t.Parallel()
	for _, failure := range []string{"connection dropped", "status 503", "stream dies before first chunk"} {
		t.Run(failure, func(t *testing.T) {
			bad := newFakePod(t, "bad", 16, false)
			good := newFakePod(t, "good", 16, false)
			bad.setHandler(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				switch failure {
				case "connection dropped":
					c, _, err := w.(http.Hijacker).Hijack()
					if err == nil {
						c.Close()
					}
				case "status 503":
					http.Error(w, `{"error":{"message":"engine dead"}}`, http.StatusServiceUnavailable)
				default:
					w.Header().Set("Content-Type", "text/event-stream")
					w.(http.Flusher).Flush()
					c, _, err := w.(http.Hijacker).Hijack()
					if err == nil {
						c.Close()
					}
				}
			})
			cfg := DefaultConfig()
			cfg.Policy = brain.PolicyRoundRobin
			cfg.DebugHeaders = true
			cfg.Health = fastHealth(bad.endpoint(), good.endpoint())
			cfg.Health.BreakerFailures = 1000 // keep the bad pod in rotation
			r := startRouter(t, cfg)
			waitFor(t, "both pods routable", func() bool { return routableCount(r, "m") == 2 })
			for i := 0; i < 6; i++ {
				code, hdr, b := post(t, "http://"+r.Addr()+"/v1/completions", `{"model":"m","prompt":"hi","stream":true}`)
				if code != 200 || !strings.Contains(string(b), "good") {
					t.Fatalf("request %d: status %d body %s", i, code, b)
				}
				if hdr.Get("X-Prefixrouter-Target") != targetName(good.srv.URL) {
					t.Fatalf("answered by %s", hdr.Get("X-Prefixrouter-Target"))
				}
			}
			if bad.hits.Load() == 0 {
				t.Fatal("round-robin never tried the failing pod: the retry path was not exercised")
			}
		})
	}
}

// TestGracefulShutdownDrains: a request in flight when shutdown starts
// completes.
func TestGracefulShutdownDrains(t *testing.T) {
	t.Parallel()
	p := newFakePod(t, "A", 16, false)
	arrived := make(chan struct{})
	release := make(chan struct{})
	p.setHandler(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-release
		p.echo(w, r)
	})
	cfg := DefaultConfig()
	cfg.Health = fastHealth(p.endpoint())
	r := startRouter(t, cfg)
	waitFor(t, "pod routable", func() bool { return routableCount(r, "m") == 1 })
	type result struct {
		code int
		body []byte
	}
	res := make(chan result, 1)
	go func() {
		resp, err := http.Post("http://"+r.Addr()+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hi"}`))
		if err != nil {
			res <- result{code: -1, body: []byte(err.Error())}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		res <- result{resp.StatusCode, b}
	}()
	<-arrived
	var wg sync.WaitGroup
	wg.Add(1)
	var shutErr error
	go func() {
		defer wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		shutErr = r.Shutdown(ctx)
	}()
	close(release)
	got := <-res
	wg.Wait()
	if got.code != 200 || !strings.Contains(string(got.body), `"A"`) {
		t.Fatalf("in-flight request during shutdown: %d %s", got.code, got.body)
	}
	if shutErr != nil {
		t.Fatalf("shutdown: %v", shutErr)
	}
}

// TestModelsUnionAndForwarding: /v1/models merges every pod's list and
// /tokenize reaches a pod serving the body's model.
func TestModelsUnionAndForwarding(t *testing.T) {
	t.Parallel()
	a := newFakePod(t, "A", 16, false, "alpha")
	b := newFakePod(t, "B", 16, false, "beta")
	cfg := DefaultConfig()
	cfg.Policy = brain.PolicyPrecise
	cfg.Health = fastHealth(a.endpoint(), b.endpoint())
	r := startRouter(t, cfg)
	waitFor(t, "pods routable", func() bool { return routableCount(r, "alpha")+routableCount(r, "beta") == 2 })
	resp, err := http.Get("http://" + r.Addr() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if list.Object != "list" || len(list.Data) != 2 || list.Data[0].ID != "alpha" || list.Data[1].ID != "beta" {
		t.Fatalf("models: %+v", list)
	}
	code, hdr, body := post(t, "http://"+r.Addr()+"/tokenize", `{"model":"beta","prompt":"hi"}`)
	if code != 200 || !strings.Contains(string(body), `"pod":"B"`) || hdr.Get("X-Request-Id") == "" {
		t.Fatalf("tokenize: %d %s", code, body)
	}
	if a.tokenizeHits.Load() != 0 {
		t.Fatal("tokenize for beta reached the alpha pod")
	}

	// The operator's view of the targets.
	var view struct {
		Policy string `json:"policy"`
		Keys   struct {
			Configured bool `json:"configured"`
		} `json:"block_keys"`
		Health struct {
			Ready   bool `json:"ready"`
			Targets []struct {
				Target string   `json:"target"`
				State  string   `json:"state"`
				Reason string   `json:"reason"`
				Models []string `json:"models"`
			} `json:"targets"`
		} `json:"health"`
	}
	adminDebugTargets(t, r, &view)
	if view.Policy != "precise" || !view.Health.Ready || len(view.Health.Targets) != 2 {
		t.Fatalf("debug targets: %+v", view)
	}
	for _, tg := range view.Health.Targets {
		if tg.State != "routable" || tg.Reason == "" || len(tg.Models) != 1 {
			t.Fatalf("target view %+v", tg)
		}
	}
}

// TestRequestIDAndHeaders: X-Request-Id propagates both ways, hop-by-hop
// headers stop at the proxy, and the dp rank is only sent to dp pods.
func TestRequestIDAndHeaders(t *testing.T) {
	t.Parallel()
	p := newFakePod(t, "A", 16, false)
	seen := make(chan http.Header, 1)
	p.setHandler(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
		w.Header().Set("Keep-Alive", "timeout=5")
		p.echo(w, r)
	})
	cfg := DefaultConfig()
	cfg.Health = fastHealth(p.endpoint())
	r := startRouter(t, cfg)
	waitFor(t, "pod routable", func() bool { return routableCount(r, "m") == 1 })
	req, _ := http.NewRequest(http.MethodPost, "http://"+r.Addr()+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"hi"}`))
	req.Header.Set("X-Request-Id", "client-42")
	req.Header.Set("Authorization", "Bearer k")
	req.Header.Set("Connection", "keep-alive, X-Secret")
	req.Header.Set("X-Secret", "hop")
	req.Header.Set("Proxy-Authorization", "p")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	h := <-seen
	if h.Get("X-Request-Id") != "client-42" || resp.Header.Get("X-Request-Id") != "client-42" {
		t.Fatalf("request id: upstream %q, response %q", h.Get("X-Request-Id"), resp.Header.Get("X-Request-Id"))
	}
	if h.Get("Authorization") != "Bearer k" {
		t.Fatal("Authorization not forwarded")
	}
	for _, k := range []string{"X-Secret", "Proxy-Authorization", "X-Data-Parallel-Rank"} {
		if h.Get(k) != "" {
			t.Fatalf("%s reached the pod", k)
		}
	}
	if resp.Header.Get("Keep-Alive") != "" {
		t.Fatal("hop-by-hop Keep-Alive reached the client")
	}
	if resp.Header.Get("X-Prefixrouter-Target") != "" {
		t.Fatal("debug headers without --debug-headers")
	}
}
