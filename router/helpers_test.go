package router

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/internal/poll"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/sim/publish"
	"github.com/prefixrouter/prefixrouter/targetid"
	"github.com/prefixrouter/prefixrouter/tokenize"
)

// quietLogger discards logs unless ROUTER_TEST_LOG is set.
func quietLogger() *slog.Logger {
	if os.Getenv("ROUTER_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// fastHealth returns a health configuration that notices changes within a
// few hundred milliseconds, for tests. The tests run side by side under
// -race beside other packages' tests, on a machine that can be loaded
// far past its cores: probes slowed past their timeout for a second must
// not take a pod down (a 503 "no routable target" in the middle of a
// test), so a pod is down after four failed probes 300 ms apart. A dead
// pod refuses at once and is down in 1.2 s.
func fastHealth(endpoints ...string) health.Config {
	h := health.DefaultConfig()
	h.Endpoints = endpoints
	h.ProbeInterval = 300 * time.Millisecond
	h.ProbeTimeout = 300 * time.Millisecond
	h.FailureThreshold = 4
	h.SuccessThreshold = 1
	h.ModelsInterval = 300 * time.Millisecond
	h.ScrapeInterval = 150 * time.Millisecond
	h.ScrapeTimeout = 150 * time.Millisecond
	h.EvalInterval = 50 * time.Millisecond
	return h
}

// startRouter starts a router on loopback ports chosen by the OS and stops
// it when the test ends.
func startRouter(t testing.TB, cfg Config, tokenizers ...string) *Router {
	t.Helper()
	return startRouterLogging(t, cfg, quietLogger(), tokenizers...)
}

// startRouterLogging is startRouter with the router's logs going to log.
// The event plane judges the streams as often as fastHealth's monitor
// evaluates (unless the test set its own pace): a test waiting for a
// fresh pod then waits a tick of 50 ms, not the default 500 ms.
func startRouterLogging(t testing.TB, cfg Config, log *slog.Logger, tokenizers ...string) *Router {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	cfg.AdminListen = "127.0.0.1:0"
	if cfg.Events.EvalInterval == DefaultConfig().Events.EvalInterval {
		cfg.Events.EvalInterval = 50 * time.Millisecond
	}
	// No client timeout of its own: only the router's contexts (the
	// request's life, --tokenize-timeout) end a remote tokenization.
	// Caches of a few MiB hold every prompt a test sends; the defaults'
	// (320 MiB of counters) take about 0.2 s to clear on Close under
	// -race, once per router.
	reg := tokenize.NewRegistry(tokenize.Options{Logger: quietLogger(), HTTPClient: &http.Client{},
		CacheMaxBytes: 4 << 20, MessageCacheMaxBytes: 1 << 20})
	for _, spec := range tokenizers {
		if _, err := reg.AddSpec(spec); err != nil {
			t.Fatalf("tokenizer %s: %v", spec, err)
		}
	}
	r, err := New(cfg, Deps{Tokenizers: reg, Logger: log})
	if err != nil {
		t.Fatalf("router: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := r.Start(ctx); err != nil {
		cancel()
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		_ = r.Shutdown(sctx)
		cancel()
		reg.Close()
	})
	return r
}

// waitFor waits for cond (internal/poll).
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, what, cond)
}

// routableCount is the number of targets of model that can take work.
func routableCount(r *Router, model string) int {
	n := 0
	for _, t := range r.mon.Snapshot().ForModel(model) {
		if t.CanRoute() {
			n++
		}
	}
	return n
}

// freshCount is the number of routable targets of model whose event stream
// is fresh.
func freshCount(r *Router, model string) int {
	n := 0
	for _, t := range r.mon.Snapshot().ForModel(model) {
		if t.CanRoute() && r.ev.Verdict(t.ID) == eventplane.VerdictFresh {
			n++
		}
	}
	return n
}

// fakePod is a minimal vLLM stand-in on real HTTP: /health, /v1/models,
// /metrics with cache_config_info, and a completions handler the test
// supplies. It counts the requests that reach the API endpoints.
type fakePod struct {
	name         string
	srv          *httptest.Server
	pub          *publish.Publisher
	hits         atomic.Int64 // completions and chat requests
	tokenizeHits atomic.Int64
	blockSize    int
	models       []string
	handle       atomic.Pointer[http.HandlerFunc]
	// render answers /v1/completions/render when set; without it the
	// pod answers 404 there, as vLLM before the render endpoints did.
	render atomic.Pointer[http.HandlerFunc]
	// forward answers the endpoints the router forwards by load
	// (embeddings, pooling, classify, score, rerank, detokenize, version);
	// forwardHits counts the requests that reach them.
	forward     atomic.Pointer[http.HandlerFunc]
	forwardHits atomic.Int64
}

func newFakePod(t testing.TB, name string, blockSize int, withEvents bool, models ...string) *fakePod {
	t.Helper()
	if len(models) == 0 {
		models = []string{"m"}
	}
	p := &fakePod{name: name, blockSize: blockSize, models: models}
	if withEvents {
		pub, err := publish.New(publish.Config{Bind: "tcp://127.0.0.1:*", ReplayBind: "tcp://127.0.0.1:*", Logger: quietLogger()})
		if err != nil {
			t.Fatalf("publisher: %v", err)
		}
		p.pub = pub
		t.Cleanup(func() { pub.Close() })
	}
	p.setHandler(p.echo)
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(200) })
	mux.HandleFunc("/v1/models", func(w http.ResponseWriter, _ *http.Request) {
		var data []map[string]any
		for _, m := range p.models {
			data = append(data, map[string]any{"id": m, "object": "model", "owned_by": "vllm", "parent": nil})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
	})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} 0\n")
		fmt.Fprintf(w, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 0\n")
		fmt.Fprintf(w, "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0\n")
		fmt.Fprintf(w, "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"%d\",engine=\"0\",num_gpu_blocks=\"1000\",prefix_caching_hash_algo=\"sha256\",enable_prefix_caching=\"True\"} 1\n", p.blockSize)
	})
	api := func(w http.ResponseWriter, r *http.Request) {
		p.hits.Add(1)
		(*p.handle.Load())(w, r)
	}
	mux.HandleFunc("/v1/completions", api)
	mux.HandleFunc("/v1/chat/completions", api)
	mux.HandleFunc("/v1/responses", api)
	p.setForward(p.echoForward)
	for _, path := range []string{"/v1/embeddings", "/pooling", "/classify", "/score", "/v1/score",
		"/rerank", "/v1/rerank", "/v2/rerank", "/detokenize", "/version"} {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			p.forwardHits.Add(1)
			(*p.forward.Load())(w, r)
		})
	}
	mux.HandleFunc("/v1/completions/render", func(w http.ResponseWriter, r *http.Request) {
		if h := p.render.Load(); h != nil {
			(*h)(w, r)
			return
		}
		http.NotFound(w, r)
	})
	mux.HandleFunc("/tokenize", func(w http.ResponseWriter, r *http.Request) {
		// vLLM's answer shape; the router's remote tokenization and the
		// /tokenize forward both land here.
		p.tokenizeHits.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, `{"count":4,"max_model_len":8192,"tokens":[1,2,3,4],"pod":%q}`, p.name)
	})
	p.srv = httptest.NewServer(mux)
	t.Cleanup(p.srv.Close)
	return p
}

func (p *fakePod) setHandler(h http.HandlerFunc) { p.handle.Store(&h) }

func (p *fakePod) setForward(h http.HandlerFunc) { p.forward.Store(&h) }

// forwardEcho is echoForward's answer: the pod, and the request as it
// arrived.
type forwardEcho struct {
	Pod    string `json:"pod"`
	Method string `json:"method"`
	Path   string `json:"path"`
	Body   string `json:"body"`
}

// echoForward answers a forwarded endpoint with what it received, and a
// usage as vLLM's pooling endpoints report it.
func (p *fakePod) echoForward(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	out, _ := json.Marshal(struct {
		forwardEcho
		Usage map[string]int `json:"usage"`
	}{forwardEcho{p.name, r.Method, r.URL.Path, string(b)}, map[string]int{"prompt_tokens": 5, "total_tokens": 5}})
	_, _ = w.Write(out)
}

// echo answers like vLLM without streaming, naming the pod in the text.
func (p *fakePod) echo(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"x","object":"text_completion","choices":[{"index":0,"text":%q}],"usage":{"prompt_tokens":8,"completion_tokens":1,"total_tokens":9,"prompt_tokens_details":{"cached_tokens":0}}}`, p.name)
}

// endpoint is the pod's --endpoint spec.
func (p *fakePod) endpoint() string {
	ep := p.srv.URL + "?model=" + strings.Join(p.models, "&model=")
	if p.pub != nil {
		ep += "&events=" + p.pub.Endpoint() + "&replay=" + p.pub.ReplayEndpoint()
	} else {
		// Nothing listens there: the stream stays disconnected.
		ep += "&events=tcp://127.0.0.1:1"
	}
	return ep
}

// post sends body to the router and returns status, headers and body.
func post(t testing.TB, url, body string) (int, http.Header, []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read %s: %v", url, err)
	}
	return resp.StatusCode, resp.Header, b
}

// dryRun asks the admin API what it would do with body.
func dryRun(t testing.TB, r *Router, path, body string) DryRun {
	t.Helper()
	code, _, b := post(t, "http://"+r.AdminAddr()+"/debug/route"+path, body)
	if code != 200 {
		t.Fatalf("dry run %s: status %d: %s", path, code, b)
	}
	var d DryRun
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(&d); err != nil {
		t.Fatalf("dry run: %v in %s", err, b)
	}
	return d
}

func candidate(d DryRun, endpoint string) DryCandidate {
	for _, c := range d.Candidates {
		if c.Target == endpoint {
			return c
		}
	}
	return DryCandidate{}
}

// targetName is the name the router gives rank 0 of an endpoint (debug
// headers, metric labels).
func targetName(endpoint string) string {
	return targetid.ID{Endpoint: endpoint}.String()
}

// decisionName is the dry run's chosen target by name.
func decisionName(d DryRun) string {
	return targetid.ID{Endpoint: d.Decision.Target, Rank: d.Decision.Rank}.String()
}

func candidateByName(d DryRun, name string) DryCandidate {
	for _, c := range d.Candidates {
		if (targetid.ID{Endpoint: c.Target, Rank: c.Rank}).String() == name {
			return c
		}
	}
	return DryCandidate{}
}

// chatKeysAsPodsSee returns a function that keys a chat body as a pod of
// the fleet would, with a tokenizer of its own (spec, as --tokenizer takes
// it): holding a prompt then warms nothing in the router's caches.
func chatKeysAsPodsSee(t testing.TB, r *Router, spec string) func(body []byte) []kvindex.Key {
	t.Helper()
	reg := tokenize.NewRegistry(tokenize.Options{CacheMaxBytes: -1, MessageCacheMaxBytes: -1})
	t.Cleanup(reg.Close)
	name, path, _ := strings.Cut(spec, "=")
	tok, err := reg.Add(name, path, tokenize.ModeLocal)
	if err != nil {
		t.Fatal(err)
	}
	return func(body []byte) []kvindex.Key {
		req := new(Request)
		if err := ParseRequest(EndpointChat, body, req); err != nil {
			t.Fatal(err)
		}
		_, ids, err := tok.EncodeChat(req.Chat)
		if err != nil {
			t.Fatal(err)
		}
		keys, err := r.ev.Keys().Keyer.Keys(nil, ids, kvindex.RequestExtras{})
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}
}

// firstLine reads a streamed answer's first line while the pod holds the
// rest back until release is closed, which it does once the line is in (or
// when it gives up: a buffering proxy never delivers it).
func firstLine(t testing.TB, br *bufio.Reader, release chan struct{}) string {
	t.Helper()
	first := make(chan string, 1)
	go func() {
		line, _ := br.ReadString('\n')
		first <- line
	}()
	defer close(release)
	select {
	case line := <-first:
		return line
	case <-time.After(15 * time.Second):
		t.Fatal("the first chunk never arrived while the pod held the rest: the proxy buffers")
	}
	return ""
}

// holdingStream is a pod handler that streams first as an event stream and
// holds rest back until release is closed.
func holdingStream(first, rest string) (h http.HandlerFunc, release chan struct{}) {
	release = make(chan struct{})
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, first)
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, rest)
	}, release
}

// adminDebugTargets decodes GET /debug/targets on r's admin listener into v.
func adminDebugTargets(t testing.TB, r *Router, v any) {
	t.Helper()
	resp, err := http.Get("http://" + r.AdminAddr() + "/debug/targets")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET /debug/targets: %v", err)
	}
}
