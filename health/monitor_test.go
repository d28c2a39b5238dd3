package health

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/prefixrouter/prefixrouter/internal/logbuf"
)

func TestNewRejectsBadConfig(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{name: "bad endpoint", cfg: Config{Endpoints: []string{"10.0.0.1:8000"}}, wantErr: "missing scheme"},
		{name: "duplicate endpoint", cfg: Config{Endpoints: []string{"http://a:1", "http://A:1/"}}, wantErr: "given twice"},
		{name: "bad dns", cfg: Config{DiscoverDNS: []string{"vllm"}}, wantErr: "NAME:PORT"},
		{name: "negative duration", cfg: Config{ProbeInterval: -time.Second}, wantErr: "--health-probe-interval must be positive"},
		{name: "timeout above interval", cfg: Config{ProbeInterval: time.Second, ProbeTimeout: 2 * time.Second}, wantErr: "exceeds"},
		{name: "stale bound below scrape interval", cfg: Config{ScrapeInterval: time.Second, ScrapeTimeout: time.Second, LoadStaleAfter: 500 * time.Millisecond}, wantErr: "shorter"},
		{name: "negative threshold", cfg: Config{FailureThreshold: -1}, wantErr: "--health-failure-threshold must be at least 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg, Deps{})
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err %v, want containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestMetricsRegistration: metrics go to the given registerer only, with the
// prefix, and a second monitor on the same registerer is refused.
func TestMetricsRegistration(t *testing.T) {
	pod := newFakePod(t, "m")
	env := newTestMonitor(t, Config{Endpoints: []string{pod.spec("")}}, Deps{})
	env.tick()
	fams, err := env.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(fams) < 10 {
		t.Fatalf("only %d families", len(fams))
	}
	allowed := map[string]bool{"target": true, "model": true, "state": true, "reason": true, "verdict": true, "source": true}
	for _, f := range fams {
		if !strings.HasPrefix(f.GetName(), "prefixrouter_health_") {
			t.Errorf("metric %s lacks the prefix", f.GetName())
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if !allowed[l.GetName()] {
					t.Errorf("metric %s has unbounded label %s", f.GetName(), l.GetName())
				}
			}
		}
	}
	if v, ok := env.gauge(t, "prefixrouter_health_target_state", map[string]string{"target": pod.name(0), "state": "routable", "reason": "ok"}); !ok || v != 1 {
		t.Fatal("target_state routable/ok missing")
	}
	if v, _ := env.gauge(t, "prefixrouter_health_targets", map[string]string{"state": "routable"}); v != 1 {
		t.Fatalf("targets{routable} = %v", v)
	}
	if _, err := New(Config{}, Deps{Registerer: env.reg}); err == nil {
		t.Fatal("second registration accepted")
	}
	// Nil registerer: nothing registered, nothing breaks.
	if _, err := New(Config{Endpoints: []string{pod.spec("")}}, Deps{}); err != nil {
		t.Fatal(err)
	}
	if _, err := prometheus.DefaultGatherer.Gather(); err != nil {
		t.Fatal(err)
	}
	if fams, _ := prometheus.DefaultGatherer.Gather(); hasPrefix(fams, "prefixrouter_health_") {
		t.Fatal("metrics leaked into the default registry")
	}
}

func hasPrefix(fams []*dto.MetricFamily, p string) bool {
	for _, f := range fams {
		if strings.HasPrefix(f.GetName(), p) {
			return true
		}
	}
	return false
}

// TestDrainTimeout: a removed target whose requests never finish is dropped
// after the drain timeout.
func TestDrainTimeout(t *testing.T) {
	pod := newFakePod(t, "m")
	res := &fakeResolver{addrs: map[string][]string{}}
	res.set("vllm", "127.0.0.1")
	env := newTestMonitor(t, Config{DiscoverDNS: []string{"vllm:" + strings.Split(pod.srv.URL, ":")[2]}, DrainTimeout: time.Minute}, Deps{Resolver: res})
	env.m.resolveAll(env.ctx)
	env.tick()
	tg := env.target(t, pod.id(0))
	if !tg.CanRoute() {
		t.Fatalf("%s/%s %s", tg.State, tg.Reason, tg.Detail)
	}
	_ = tg.Dispatch(1, 1) // never finished
	res.set("vllm")
	env.m.resolveAll(env.ctx)
	env.clock.Advance(59 * time.Second)
	env.m.evaluate()
	if tg := env.target(t, pod.id(0)); tg.State != StateDraining || !strings.Contains(tg.Detail, "1 requests in flight") {
		t.Fatalf("%s %q", tg.State, tg.Detail)
	}
	env.clock.Advance(time.Second)
	env.m.evaluate()
	if _, ok := env.m.Snapshot().Target(pod.id(0)); ok {
		t.Fatal("still listed after the drain timeout")
	}
}

// TestModelsRefreshAndSubscriberSeesSnapshot: the model list is re-read
// after ModelsInterval; subscribers run after the snapshot has the change.
func TestModelsRefreshAndSubscriberSeesSnapshot(t *testing.T) {
	pod := newFakePod(t, "old")
	env := newTestMonitor(t, Config{Endpoints: []string{pod.spec("")}, ModelsInterval: 30 * time.Second}, Deps{})
	env.tick()
	pod.mu.Lock()
	pod.models = []string{"new"}
	pod.mu.Unlock()
	env.clock.Advance(10 * time.Second)
	env.tick()
	if got := env.target(t, pod.id(0)).Models; len(got) != 1 || got[0] != "old" {
		t.Fatalf("refreshed too early: %v", got)
	}
	env.clock.Advance(20 * time.Second)
	env.tick()
	if got := env.target(t, pod.id(0)).Models; len(got) != 1 || got[0] != "new" {
		t.Fatalf("not refreshed: %v", got)
	}

	seen := false
	env.m.Subscribe(func(c Change) {
		if c.Kind == Added && c.Target.ID.Rank == 1 {
			_, seen = env.m.Snapshot().Target(c.Target.ID)
		}
	})
	env.m.setSource(SourceFlag, map[string]Spec{pod.srv.URL: mustSpec(t, pod.spec("dp=2"))})
	if !seen {
		t.Fatal("subscriber ran before the snapshot had the new target")
	}
}

func mustSpec(t *testing.T, s string) Spec {
	t.Helper()
	spec, err := ParseSpec(s)
	if err != nil {
		t.Fatal(err)
	}
	return spec
}

// TestTargetLabelIsIDString: every per-target series, the snapshot name
// and the debug view use targetid.ID.String() ("endpoint#rank", rank 0
// included), the label kvindex's subscriber puts on prefixrouter_kv_*, so
// the two families join on target.
func TestTargetLabelIsIDString(t *testing.T) {
	pod := newFakePod(t, "m")
	env := newTestMonitor(t, Config{Endpoints: []string{pod.spec("dp=2")}}, Deps{})
	env.tick()
	want := map[string]bool{pod.id(0).String(): true, pod.id(1).String(): true}
	if !want[pod.srv.URL+"#0"] {
		t.Fatalf("targetid.ID renders rank 0 as %q", pod.id(0).String())
	}
	for _, tg := range env.m.Snapshot().Targets {
		if tg.Name != tg.ID.String() {
			t.Errorf("snapshot name %q, want %q", tg.Name, tg.ID.String())
		}
	}
	for _, tv := range env.m.Debug().Targets {
		if !want[tv.Target] {
			t.Errorf("debug view target %q is not a targetid.ID label", tv.Target)
		}
	}
	fams, err := env.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			if v := label(m, "target"); v != "" {
				if !want[v] {
					t.Errorf("%s{target=%q} is not a targetid.ID label", f.GetName(), v)
				}
				seen[v] = true
			}
		}
	}
	if len(seen) != 2 {
		t.Fatalf("series for targets %v, want both ranks", seen)
	}
}

// TestStateLogLines: a target's first judged state is logged without a
// previous state (the one it is created in, awaiting its first probe, was
// no judgement), every change names the previous one, and a target that
// stays degraded (here a cache-config conflict: --block-size 32 against a
// pod of 16) is logged again once a minute, not at every evaluation.
func TestStateLogLines(t *testing.T) {
	pod := newFakePod(t, "m")
	pod.healthy.Store(false)
	var logs logbuf.Buffer
	env := newTestMonitor(t, Config{Endpoints: []string{pod.spec("")}, BlockSize: 32},
		Deps{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	env.m.evaluate()
	if l := logs.Lines("target state"); len(l) != 0 {
		t.Fatalf("logged before the first probe: %q", l)
	}
	for range 3 {
		env.tick()
	}
	lines := logs.Lines("target state")
	if len(lines) != 1 || !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], "state=down reason=probe_failed") ||
		strings.Contains(lines[0], "previous") {
		t.Fatalf("first state lines %q: want one warning, down for the failed probe, without a previous state", lines)
	}

	pod.healthy.Store(true)
	for range 3 {
		env.tick()
	}
	lines = logs.Lines("target state")
	if len(lines) != 2 || !strings.Contains(lines[1], "state=degraded reason=cache_config_conflict") ||
		!strings.Contains(lines[1], "previous=down previous_reason=probe_failed") {
		t.Fatalf("state lines %q: want the change to the conflict, naming the previous state", lines)
	}
	for range 10 {
		env.clock.Advance(5 * time.Second)
		env.tick()
	}
	if n := len(logs.Lines("target state")); n != 2 {
		t.Fatalf("%d state lines within a minute of the conflict, want 2", n)
	}
	env.clock.Advance(15 * time.Second)
	env.tick()
	lines = logs.Lines("target state")
	if len(lines) != 3 || !strings.Contains(lines[2], "reason=cache_config_conflict") || !strings.Contains(lines[2], "for=1m") ||
		strings.Contains(lines[2], "previous") {
		t.Fatalf("state lines %q: want one repeat of the lasting conflict", lines)
	}
}
