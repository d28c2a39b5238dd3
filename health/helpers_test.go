package health

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixrouter/prefixrouter/internal/manualclock"
	"github.com/prefixrouter/prefixrouter/internal/poll"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// fakePod is a vLLM-shaped HTTP server: /health, /v1/models, /metrics.
type fakePod struct {
	srv      *httptest.Server
	healthy  atomic.Bool
	metricOK atomic.Bool
	mu       sync.Mutex
	models   []string
	metrics  string
	probes   atomic.Int64
}

func newFakePod(t *testing.T, models ...string) *fakePod {
	t.Helper()
	p := &fakePod{models: models}
	p.healthy.Store(true)
	p.metricOK.Store(true)
	p.setLoad(0, 0, 0, 16, "sha256")
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *fakePod) serve(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
		p.probes.Add(1)
		if !p.healthy.Load() {
			http.Error(w, "engine dead", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	case "/v1/models":
		p.mu.Lock()
		var parts []string
		for _, m := range p.models {
			parts = append(parts, fmt.Sprintf(`{"id":%q,"object":"model","owned_by":"vllm"}`, m))
		}
		p.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"list","data":[`+strings.Join(parts, ",")+`]}`)
	case "/metrics":
		if !p.metricOK.Load() {
			http.Error(w, "boom", http.StatusInternalServerError)
			return
		}
		p.mu.Lock()
		body := p.metrics
		p.mu.Unlock()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		io.WriteString(w, body)
	default:
		http.NotFound(w, r)
	}
}

// setLoad sets an unlabelled-engine (engine="0") exposition like vLLM's.
func (p *fakePod) setLoad(running, waiting int, kv float64, blockSize int, algo string) {
	p.setMetrics(vllmExposition(map[int][3]float64{0: {float64(running), float64(waiting), kv}}, blockSize, algo))
}

func (p *fakePod) setMetrics(s string) {
	p.mu.Lock()
	p.metrics = s
	p.mu.Unlock()
}

func (p *fakePod) spec(opts string) string {
	if opts == "" {
		return p.srv.URL
	}
	return p.srv.URL + "?" + opts
}

func (p *fakePod) id(rank int) targetid.ID {
	return targetid.ID{Endpoint: p.srv.URL, Rank: rank}
}

// name is the target label of one rank: the same string every package uses.
func (p *fakePod) name(rank int) string { return p.id(rank).String() }

// vllmExposition renders load gauges per engine and a cache_config_info
// sample per engine, as vLLM's prometheus_client output looks.
func vllmExposition(engines map[int][3]float64, blockSize int, algo string) string {
	var b strings.Builder
	b.WriteString("# HELP vllm:num_requests_running Number of requests in model execution batches.\n# TYPE vllm:num_requests_running gauge\n")
	for e := range len(engines) {
		fmt.Fprintf(&b, "vllm:num_requests_running{engine=\"%d\",model_name=\"m\"} %g\n", e, engines[e][0])
	}
	b.WriteString("# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n# TYPE vllm:num_requests_waiting gauge\n")
	for e := range len(engines) {
		fmt.Fprintf(&b, "vllm:num_requests_waiting{engine=\"%d\",model_name=\"m\"} %g\n", e, engines[e][1])
	}
	b.WriteString("# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n# TYPE vllm:kv_cache_usage_perc gauge\n")
	for e := range len(engines) {
		fmt.Fprintf(&b, "vllm:kv_cache_usage_perc{engine=\"%d\",model_name=\"m\"} %g\n", e, engines[e][2])
	}
	b.WriteString("# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n# TYPE vllm:prompt_tokens_total counter\n")
	b.WriteString("vllm:prompt_tokens_total{engine=\"0\",model_name=\"m\"} 1234.0\n")
	b.WriteString("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n")
	for e := range len(engines) {
		fmt.Fprintf(&b, "vllm:cache_config_info{block_size=\"%d\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"%d\",gpu_memory_utilization=\"0.9\",num_gpu_blocks=\"19207\",prefix_caching_hash_algo=\"%s\"} 1.0\n", blockSize, e, algo)
	}
	return b.String()
}

// fakeResolver returns settable answers.
type fakeResolver struct {
	mu    sync.Mutex
	addrs map[string][]string
	err   error
}

func (r *fakeResolver) LookupHost(_ context.Context, host string) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return nil, r.err
	}
	return append([]string(nil), r.addrs[host]...), nil
}

func (r *fakeResolver) set(host string, addrs ...string) {
	r.mu.Lock()
	r.addrs[host] = addrs
	r.err = nil
	r.mu.Unlock()
}

type testEnv struct {
	m     *Monitor
	clock *manualclock.Clock
	reg   *prometheus.Registry
	ctx   context.Context
}

// newTestMonitor builds a monitor with a fake clock; cfg zero fields take
// defaults.
func newTestMonitor(t testing.TB, cfg Config, deps Deps) *testEnv {
	t.Helper()
	env := &testEnv{clock: manualclock.New(), reg: prometheus.NewRegistry(), ctx: t.Context()}
	if deps.Now == nil {
		deps.Now = env.clock.Now
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	deps.Registerer = env.reg
	m, err := New(cfg, deps)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	env.m = m
	return env
}

// tick runs one round of everything Run does, synchronously.
func (e *testEnv) tick() {
	e.m.probeAll(e.ctx)
	e.m.scrapeAll(e.ctx)
	e.m.evaluate()
}

func (e *testEnv) target(t *testing.T, id targetid.ID) *Target {
	t.Helper()
	tg, ok := e.m.Snapshot().Target(id)
	if !ok {
		t.Fatalf("target %v not in snapshot", id)
	}
	return tg
}

// gauge returns the value of a gathered metric with the given labels.
func (e *testEnv) gauge(t *testing.T, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	fams, err := e.reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, mt := range f.GetMetric() {
			for k, v := range labels {
				if label(mt, k) != v {
					continue next
				}
			}
			if g := mt.GetGauge(); g != nil {
				return g.GetValue(), true
			}
			if c := mt.GetCounter(); c != nil {
				return c.GetValue(), true
			}
		}
	}
	return 0, false
}

// eventually waits for cond (internal/poll).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, what, cond)
}
