package health

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/targetid"
)

// TestScrapedLoadGoesStale: load comes from /metrics; when scrapes fail the
// last values stay but are marked stale once older than the bound, the
// target is degraded (still routable) and the metric says so; a good scrape
// clears it.
func TestScrapedLoadGoesStale(t *testing.T) {
	pod := newFakePod(t, "m")
	pod.setLoad(3, 7, 0.42, 16, "sha256")
	env := newTestMonitor(t, Config{Endpoints: []string{pod.spec("")}, ScrapeInterval: time.Second, LoadStaleAfter: 3 * time.Second}, Deps{})
	env.tick()
	b := env.target(t, pod.id(0)).Busy()
	if b.Running != 3 || b.Waiting != 7 || b.KVUsage != 0.42 || b.Stale || b.At.IsZero() {
		t.Fatalf("busy after scrape: %+v", b)
	}
	name := map[string]string{"target": pod.name(0)}
	if v, _ := env.gauge(t, "prefixrouter_health_load_requests_waiting", name); v != 7 {
		t.Fatalf("waiting gauge %v", v)
	}

	pod.metricOK.Store(false)
	steps := []struct {
		advance   time.Duration
		wantStale bool
	}{
		{time.Second, false},
		{time.Second, false},
		{time.Second, false}, // exactly at the bound: not yet
		{time.Second, true},
		{time.Second, true},
	}
	for i, s := range steps {
		env.clock.Advance(s.advance)
		env.tick()
		tg := env.target(t, pod.id(0))
		if tg.Scraped.Stale != s.wantStale {
			t.Fatalf("step %d: stale=%v, want %v", i, tg.Scraped.Stale, s.wantStale)
		}
		if tg.Scraped.Waiting != 7 {
			t.Fatalf("step %d: last values lost: %+v", i, tg.Scraped)
		}
		if s.wantStale {
			if tg.State != StateDegraded || tg.Reason != ReasonMetricsStale || !strings.Contains(tg.Detail, "500") || !tg.CanRoute() {
				t.Fatalf("step %d: %s/%s %q routable=%v", i, tg.State, tg.Reason, tg.Detail, tg.CanRoute())
			}
		} else if tg.State != StateRoutable {
			t.Fatalf("step %d: %s/%s", i, tg.State, tg.Reason)
		}
	}
	if v, _ := env.gauge(t, "prefixrouter_health_load_stale", name); v != 1 {
		t.Fatalf("load_stale gauge %v", v)
	}
	if v, _ := env.gauge(t, "prefixrouter_health_scrape_failures_total", name); v != 5 {
		t.Fatalf("scrape_failures_total %v", v)
	}
	pod.metricOK.Store(true)
	pod.setLoad(1, 0, 0.1, 16, "sha256")
	env.tick()
	if tg := env.target(t, pod.id(0)); tg.Scraped.Stale || tg.State != StateRoutable || tg.Scraped.Running != 1 {
		t.Fatalf("after recovery: %s/%s %+v", tg.State, tg.Reason, tg.Scraped)
	}
}

// TestScrapeNotVLLM: a 200 /metrics without vLLM gauges is a failed scrape.
func TestScrapeNotVLLM(t *testing.T) {
	pod := newFakePod(t, "m")
	pod.setMetrics("# TYPE go_goroutines gauge\ngo_goroutines 12\n")
	env := newTestMonitor(t, Config{Endpoints: []string{pod.spec("")}}, Deps{})
	env.tick()
	tg := env.target(t, pod.id(0))
	if !tg.Scraped.Stale || tg.Reason != ReasonMetricsStale || !strings.Contains(tg.Detail, "no vllm:") {
		t.Fatalf("got %s/%s %q %+v", tg.State, tg.Reason, tg.Detail, tg.Scraped)
	}
}

// TestScrapePerRank: vLLM labels gauges by engine (the DP rank); each rank
// gets its own; unlabelled gauges are pod-wide.
func TestScrapePerRank(t *testing.T) {
	pod := newFakePod(t, "m")
	pod.setMetrics(vllmExposition(map[int][3]float64{0: {1, 2, 0.25}, 1: {4, 5, 0.5}}, 16, "sha256"))
	env := newTestMonitor(t, Config{Endpoints: []string{pod.spec("dp=3")}}, Deps{})
	env.tick()
	r0, r1, r2 := env.target(t, pod.id(0)), env.target(t, pod.id(1)), env.target(t, pod.id(2))
	if r0.Scraped.Running != 1 || r0.Scraped.Waiting != 2 || r1.Scraped.Running != 4 || r1.Scraped.KVUsage != 0.5 || r0.Scraped.PodWide {
		t.Fatalf("per-rank load: %+v %+v", r0.Scraped, r1.Scraped)
	}
	if !r2.Scraped.Stale || r2.State != StateDegraded {
		t.Fatalf("rank without gauges: %+v %s", r2.Scraped, r2.State)
	}
	pod.setMetrics("vllm:num_requests_running 6\nvllm:num_requests_waiting 1\nvllm:gpu_cache_usage_perc 0.7\n")
	env.tick()
	r1 = env.target(t, pod.id(1))
	if r1.Scraped.Running != 6 || r1.Scraped.KVUsage != 0.7 || !r1.Scraped.PodWide {
		t.Fatalf("unlabelled gauges: %+v", r1.Scraped)
	}
}

func TestParseVLLMMetrics(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		running map[string]float64
		kv      map[string]float64
		cache   map[string]CacheConfig
		start   float64
		wantErr bool
	}{
		{
			name:    "process start time",
			in:      "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1.7890958e+09\nvllm:num_requests_running 0\n",
			running: map[string]float64{"": 0},
			start:   1.7890958e+09,
		},
		{
			name:    "vllm exposition",
			in:      vllmExposition(map[int][3]float64{0: {3, 1, 0.5}}, 32, "xxhash"),
			running: map[string]float64{"0": 3},
			kv:      map[string]float64{"0": 0.5},
			cache:   map[string]CacheConfig{"0": {Known: true, BlockSize: 32, NumGPUBlocks: 19207, HashAlgo: "xxhash", PrefixCaching: "True"}},
		},
		{
			name:    "two models on one engine are summed",
			in:      "vllm:num_requests_running{model_name=\"a\"} 2\nvllm:num_requests_running{model_name=\"b\"} 3\n",
			running: map[string]float64{"": 5},
		},
		{
			name:    "kv usage clamped, NaN ignored, None label",
			in:      "vllm:kv_cache_usage_perc{engine=\"0\"} 1.5\nvllm:kv_cache_usage_perc{engine=\"1\"} NaN\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"} 1\n",
			kv:      map[string]float64{"0": 1},
			cache:   map[string]CacheConfig{"": {Known: true, BlockSize: 16}},
			running: map[string]float64{"0": 0},
		},
		{
			name:    "garbage in unrelated families is ignored",
			in:      "foo{{{ bar\n# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\nvllm:num_requests_running_total{ 9\n",
			running: map[string]float64{"": 1},
		},
		{name: "malformed value", in: "vllm:num_requests_running abc\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pm, err := parseVLLMMetrics([]byte(tt.in))
			if tt.wantErr {
				if err == nil {
					t.Fatal("no error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tt.running {
				if l := pm.load[k]; l == nil || l.running != v {
					t.Errorf("running[%q] = %+v, want %v", k, l, v)
				}
			}
			for k, v := range tt.kv {
				if l := pm.load[k]; l == nil || l.kv != v || !l.haveKV {
					t.Errorf("kv[%q] = %+v, want %v", k, l, v)
				}
			}
			if pm.processStart != tt.start {
				t.Errorf("process start %v, want %v", pm.processStart, tt.start)
			}
			for k, v := range tt.cache {
				if pm.cache[k] != v {
					t.Errorf("cache[%q] = %+v, want %+v", k, pm.cache[k], v)
				}
			}
		})
	}
}

func FuzzParseVLLMMetrics(f *testing.F) {
	f.Add([]byte(vllmExposition(map[int][3]float64{0: {3, 1, 0.5}, 1: {1, 1, 1}}, 16, "sha256")))
	f.Add([]byte("vllm:num_requests_running{engine=\"0\"} 1e308\nvllm:cache_config_info{block_size=\"-1\"} 1\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		pm, err := parseVLLMMetrics(b)
		if err != nil {
			return
		}
		for _, l := range pm.load {
			if l.running < 0 || l.waiting < 0 || l.kv < 0 || l.kv > 1 {
				t.Fatalf("out of range load %+v", l)
			}
		}
		for _, c := range pm.cache {
			if c.BlockSize < 0 || c.NumGPUBlocks < 0 {
				t.Fatalf("negative cache config %+v", c)
			}
		}
	})
}

// TestInFlightAccounting: dispatch, first byte and finish move the router's
// own counters; a request that fails before its first byte releases its
// queued tokens at Finish; double calls are ignored; Tokens reports the
// counts as last revised before the first byte.
func TestInFlightAccounting(t *testing.T) {
	pod := newFakePod(t, "m")
	env := newTestMonitor(t, Config{Endpoints: []string{pod.spec("")}}, Deps{})
	env.tick()
	tg := env.target(t, pod.id(0))
	a := tg.Dispatch(1000, 400)
	b := tg.Dispatch(200, 500) // uncached capped at prompt
	check := func(step string, inflight, prefilling, prompt, uncached int64) {
		t.Helper()
		bz := tg.Busy()
		if bz.InFlight != inflight || bz.Prefilling != prefilling || bz.QueuedPromptTokens != prompt || bz.QueuedUncachedTokens != uncached {
			t.Fatalf("%s: %+v", step, bz)
		}
	}
	tokens := func(f *Flight, prompt, uncached int) {
		t.Helper()
		if p, u := f.Tokens(); p != prompt || u != uncached {
			t.Fatalf("Tokens() = %d, %d; want %d, %d", p, u, prompt, uncached)
		}
	}
	check("dispatched", 2, 2, 1200, 600)
	tokens(a, 1000, 400)
	tokens(b, 200, 200)
	a.Revise(1100, 100) // the router learned more of the prompt after dispatch
	check("revised", 2, 2, 1300, 300)
	tokens(a, 1100, 100)
	a.FirstByte()
	a.FirstByte()
	a.Revise(5000, 5000) // too late: ignored
	check("first byte", 2, 1, 200, 200)
	tokens(a, 1100, 100)
	a.Finish(OutcomeSuccess)
	a.Finish(OutcomeSuccess)
	check("a finished", 1, 1, 200, 200)
	b.Finish(OutcomeCanceled)
	check("b cancelled before first byte", 0, 0, 0, 0)
	var none *Flight
	none.FirstByte()
	none.Revise(10, 10)
	none.Finish(OutcomeUpstreamError)
	tokens(none, 0, 0)
	if f := env.m.Dispatch(pod.id(7), 1, 1); f != nil {
		t.Fatal("unknown target gave a live flight")
	}

	// Concurrent use from many goroutines nets to zero (run with -race).
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 200 {
				f := tg.Dispatch(100+j, j)
				if (i+j)%3 != 0 {
					f.FirstByte()
				}
				f.Finish(OutcomeSuccess)
				_ = tg.CanRoute()
			}
		})
	}
	wg.Wait()
	check("after concurrent traffic", 0, 0, 0, 0)
	if v, _ := env.gauge(t, "prefixrouter_health_dispatched_total", map[string]string{"target": pod.name(0)}); v != 2+1600 {
		t.Fatalf("dispatched_total %v", v)
	}
}

func BenchmarkDispatchFinish(b *testing.B) {
	env := newTestMonitor(b, Config{Endpoints: []string{"http://127.0.0.1:1"}}, Deps{})
	tg, _ := env.m.Snapshot().Target(env.m.Snapshot().Targets[0].ID)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if !tg.CanRoute() {
				_ = tg.Busy()
			}
			f := tg.Dispatch(4096, 1024)
			f.FirstByte()
			f.Finish(OutcomeSuccess)
		}
	})
}

// TestProcessRestartIsAChange: a new process_start_time_seconds tells
// subscribers the pod restarted, even when nothing else changed.
func TestProcessRestartIsAChange(t *testing.T) {
	pod := newFakePod(t, "m")
	base := vllmExposition(map[int][3]float64{0: {0, 0, 0}}, 16, "sha256")
	pod.setMetrics(base + "process_start_time_seconds 1000.5\n")
	env := newTestMonitor(t, Config{Endpoints: []string{pod.spec("")}, ScrapeInterval: time.Second}, Deps{})
	var restarted []targetid.ID
	cancel := env.m.Subscribe(func(c Change) {
		if c.Kind == Restarted {
			restarted = append(restarted, c.Target.ID)
		}
	})
	defer cancel()
	env.tick()
	env.tick() // same process: nothing
	if len(restarted) != 0 {
		t.Fatalf("restart reported for an unchanged process: %v", restarted)
	}
	if got := env.target(t, pod.id(0)).Scraped.ProcessStart; got != 1000.5 {
		t.Fatalf("process start %v", got)
	}
	pod.setMetrics(base + "process_start_time_seconds 2000.25\n")
	env.tick()
	if len(restarted) != 1 || restarted[0] != pod.id(0) {
		t.Fatalf("restarts reported: %v", restarted)
	}
	pod.setMetrics(base) // a pod that stops exposing it is not a restart
	env.tick()
	if len(restarted) != 1 {
		t.Fatalf("restarts reported: %v", restarted)
	}
}

// TestPeerFlightsJoinBusy: what peer replicas report of a target adds to
// the router's own in-flight work in Busy, apart in Busy.Peers, and stays
// out of what the router shares (Flights) and of its own counters.
func TestPeerFlightsJoinBusy(t *testing.T) {
	pod := newFakePod(t, "m")
	env := newTestMonitor(t, Config{Endpoints: []string{pod.spec("")}}, Deps{})
	env.tick()
	tg := env.target(t, pod.id(0))
	f := tg.Dispatch(1000, 800)
	defer f.Finish(OutcomeSuccess)
	peers := Flights{InFlight: 3, Prefilling: 2, QueuedUncachedTokens: 4000}
	tg.SetPeerFlights(peers)
	b := tg.Busy()
	if b.InFlight != 4 || b.Prefilling != 3 || b.QueuedUncachedTokens != 4800 || b.QueuedPromptTokens != 1000 || b.Peers != peers {
		t.Fatalf("busy %+v", b)
	}
	if own := tg.Flights(); own != (Flights{InFlight: 1, Prefilling: 1, QueuedUncachedTokens: 800}) {
		t.Fatalf("own flights %+v", own)
	}
	name := map[string]string{"target": pod.name(0)}
	if v, _ := env.gauge(t, "prefixrouter_health_peer_queued_uncached_tokens", name); v != 4000 {
		t.Fatalf("peer queued gauge %v", v)
	}
	if v, _ := env.gauge(t, "prefixrouter_health_queued_uncached_tokens", name); v != 800 {
		t.Fatalf("own queued gauge %v: want this router's only", v)
	}
	tg.SetPeerFlights(Flights{})
	if b := tg.Busy(); b.InFlight != 1 || !b.Peers.IsZero() {
		t.Fatalf("after the peers' work ended: %+v", b)
	}
}
