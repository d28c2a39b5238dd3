package health

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestProbeThresholdsFlapping drives a pod's /health through sequences and
// checks the state after every probe: a flapping pod must neither take an up
// target down before FailureThreshold consecutive failures nor bring a down
// one back before SuccessThreshold consecutive successes.
func TestProbeThresholdsFlapping(t *testing.T) {
	tests := []struct {
		name   string
		health string // one probe per character: + healthy, - failing
		want   string // state after each probe: R routable/degraded, D down
	}{
		{name: "first success is enough", health: "+", want: "R"},
		{name: "starts down until a success", health: "--+", want: "DDR"},
		{name: "alternating never goes down", health: "+-+-+-+-+-", want: "RRRRRRRRRR"},
		{name: "two failures are tolerated", health: "+--+--+", want: "RRRRRRR"},
		{name: "three failures take it down", health: "+---", want: "RRRD"},
		{name: "one success does not bring it back", health: "+---+-+-+", want: "RRRDDDDDD"},
		{name: "two successes bring it back", health: "+---++", want: "RRRDDR"},
		{name: "flapping after recovery", health: "+---++-+--+", want: "RRRDDRRRRRR"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := newFakePod(t, "m")
			env := newTestMonitor(t, Config{Endpoints: []string{pod.spec("")}, FailureThreshold: 3, SuccessThreshold: 2}, Deps{})
			var got strings.Builder
			for _, c := range tt.health {
				pod.healthy.Store(c == '+')
				env.m.probeAll(env.ctx)
				env.m.scrapeAll(env.ctx)
				tg := env.target(t, pod.id(0))
				if tg.CanRoute() {
					got.WriteByte('R')
				} else {
					got.WriteByte('D')
					if tg.State != StateDown {
						t.Fatalf("not routable but state %s (%s)", tg.State, tg.Reason)
					}
				}
			}
			if got.String() != tt.want {
				t.Fatalf("states %s, want %s", got.String(), tt.want)
			}
		})
	}
}

func TestProbeReasonsAndModels(t *testing.T) {
	pod := newFakePod(t, "llama", "llama-lora")
	env := newTestMonitor(t, Config{Endpoints: []string{pod.spec("")}}, Deps{})
	tg := env.target(t, pod.id(0))
	if tg.State != StateDown || tg.Reason != ReasonAwaitingProbe {
		t.Fatalf("before probing: %s/%s", tg.State, tg.Reason)
	}
	env.tick()
	tg = env.target(t, pod.id(0))
	if tg.State != StateRoutable {
		t.Fatalf("after probing: %s/%s %s", tg.State, tg.Reason, tg.Detail)
	}
	if got := strings.Join(tg.Models, ","); got != "llama,llama-lora" {
		t.Fatalf("models %q", got)
	}
	snap := env.m.Snapshot()
	if len(snap.ForModel("llama")) != 1 || len(snap.ForModel("other")) != 0 {
		t.Fatalf("ForModel wrong: %v", snap.ModelNames())
	}

	// A pod that answers 503 goes down after the threshold with the status in the detail.
	pod.healthy.Store(false)
	for range 3 {
		env.tick()
	}
	tg = env.target(t, pod.id(0))
	if tg.State != StateDown || tg.Reason != ReasonProbeFailed || !strings.Contains(tg.Detail, "503") {
		t.Fatalf("after failures: %s/%s %q", tg.State, tg.Reason, tg.Detail)
	}
	if env.m.Snapshot().Routable() {
		t.Fatal("snapshot routable with its only target down")
	}

	// A dead server (connection refused) is a probe failure too.
	pod.healthy.Store(true)
	env.tick()
	env.tick()
	pod.srv.Close()
	for range 3 {
		env.tick()
	}
	tg = env.target(t, pod.id(0))
	if tg.State != StateDown || tg.Reason != ReasonProbeFailed {
		t.Fatalf("closed server: %s/%s %q", tg.State, tg.Reason, tg.Detail)
	}
}

func TestConfiguredModelMustBeServed(t *testing.T) {
	pod := newFakePod(t, "served")
	env := newTestMonitor(t, Config{Endpoints: []string{pod.spec("model=other")}}, Deps{})
	env.tick()
	tg := env.target(t, pod.id(0))
	if tg.State != StateDown || tg.Reason != ReasonModelsUnknown || !strings.Contains(tg.Detail, `"other"`) {
		t.Fatalf("got %s/%s %q", tg.State, tg.Reason, tg.Detail)
	}
	// The configured model is the one routed on when it is served.
	pod2 := newFakePod(t, "a", "b")
	env2 := newTestMonitor(t, Config{Endpoints: []string{pod2.spec("model=b")}}, Deps{})
	env2.tick()
	tg = env2.target(t, pod2.id(0))
	if tg.State != StateRoutable || strings.Join(tg.Models, ",") != "b" {
		t.Fatalf("got %s/%s models %v", tg.State, tg.Reason, tg.Models)
	}
}

func TestModelsErrorKeepsTargetDown(t *testing.T) {
	pod := newFakePod(t) // empty model list
	env := newTestMonitor(t, Config{Endpoints: []string{pod.spec("")}}, Deps{})
	env.tick()
	tg := env.target(t, pod.id(0))
	if tg.State != StateDown || tg.Reason != ReasonModelsUnknown || !strings.Contains(tg.Detail, "empty") {
		t.Fatalf("got %s/%s %q", tg.State, tg.Reason, tg.Detail)
	}
}

func TestParseModels(t *testing.T) {
	tests := []struct {
		in      string
		want    string
		wantErr bool
	}{
		{in: `{"object":"list","data":[{"id":"b"},{"id":"a"},{"id":"b"}]}`, want: "a,b"},
		{in: `{"data":[{"id":""},{"id":"ok"}]}`, want: "ok"},
		{in: `{"data":[]}`, wantErr: true},
		{in: `{"data":"x"}`, wantErr: true},
		{in: `not json`, wantErr: true},
	}
	for _, tt := range tests {
		got, err := parseModels([]byte(tt.in))
		if (err != nil) != tt.wantErr || strings.Join(got, ",") != tt.want {
			t.Errorf("parseModels(%s) = %v, %v", tt.in, got, err)
		}
	}
}

// TestBreaker: upstream failures reported by the router open the breaker at
// once (CanRoute reads the live state), the snapshot then says down, the
// cooldown lets one trial through, a failed trial doubles the cooldown and a
// good one closes the breaker.
func TestBreaker(t *testing.T) {
	pod := newFakePod(t, "m")
	env := newTestMonitor(t, Config{Endpoints: []string{pod.spec("")}, BreakerFailures: 3, BreakerCooldown: 10 * time.Second}, Deps{})
	env.tick()
	tg := env.target(t, pod.id(0))
	if !tg.CanRoute() {
		t.Fatalf("not routable: %s %s", tg.State, tg.Detail)
	}
	fail := func() {
		f := tg.Dispatch(100, 100)
		f.Finish(OutcomeUpstreamError)
	}
	fail()
	fail()
	// Client errors and cancellations say nothing about the target.
	for _, o := range []Outcome{OutcomeClientError, OutcomeCanceled} {
		f := tg.Dispatch(10, 10)
		f.Finish(o)
	}
	if !tg.CanRoute() {
		t.Fatal("opened before the threshold")
	}
	fail()
	if tg.CanRoute() {
		t.Fatal("breaker did not open after 3 consecutive upstream failures")
	}
	env.m.evaluate()
	tg = env.target(t, pod.id(0))
	if tg.State != StateDown || tg.Reason != ReasonCircuitOpen {
		t.Fatalf("snapshot after opening: %s/%s", tg.State, tg.Reason)
	}

	env.clock.Advance(10 * time.Second)
	env.m.evaluate()
	tg = env.target(t, pod.id(0))
	if tg.State != StateDegraded || tg.Reason != ReasonCircuitHalf || !tg.CanRoute() {
		t.Fatalf("after cooldown: %s/%s routable=%v", tg.State, tg.Reason, tg.CanRoute())
	}
	trial := tg.Dispatch(10, 10)
	if tg.CanRoute() {
		t.Fatal("second request let through while the half-open trial runs")
	}
	trial.FirstByte()
	trial.Finish(OutcomeUpstreamError)
	if tg.CanRoute() {
		t.Fatal("failed trial did not reopen the breaker")
	}
	env.clock.Advance(15 * time.Second) // second open lasts 20s
	if tg.CanRoute() {
		t.Fatal("cooldown did not double")
	}
	env.clock.Advance(5 * time.Second)
	if !tg.CanRoute() {
		t.Fatal("doubled cooldown did not end")
	}
	trial = tg.Dispatch(10, 10)
	trial.Finish(OutcomeSuccess)
	if !tg.CanRoute() || tg.live.breakerState() != "closed" {
		t.Fatalf("good trial did not close the breaker: %s", tg.live.breakerState())
	}
	env.tick() // fresh metrics: the clock moved 30s
	if tg = env.target(t, pod.id(0)); tg.State != StateRoutable {
		t.Fatalf("after closing: %s/%s", tg.State, tg.Reason)
	}
	if v, _ := env.gauge(t, "prefixrouter_health_breaker_opens_total", map[string]string{"target": pod.name(0)}); v != 2 {
		t.Fatalf("breaker_opens_total = %v, want 2", v)
	}
}

func TestDebugViewJSON(t *testing.T) {
	up := newFakePod(t, "m")
	down := newFakePod(t, "m")
	down.healthy.Store(false)
	up.setMetrics(vllmExposition(map[int][3]float64{0: {1, 0, 0.1}, 1: {2, 0, 0.2}}, 16, "sha256"))
	env := newTestMonitor(t, Config{Endpoints: []string{up.spec("dp=2"), down.spec("")}}, Deps{})
	env.tick()
	b, err := json.Marshal(env.m.Debug())
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Ready   bool `json:"ready"`
		Targets []struct {
			Target, State, Reason, Detail string
			CanRoute                      bool            `json:"can_route"`
			EventStream                   json.RawMessage `json:"event_stream"`
			Load                          struct {
				Stale bool
			}
			Cache struct {
				BlockSize int `json:"block_size"`
			} `json:"cache_config"`
		}
		Sources []struct{ Source string }
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	if !v.Ready || len(v.Targets) != 3 || len(v.Sources) != 1 || v.Sources[0].Source != "flag" {
		t.Fatalf("debug view: %s", b)
	}
	got := map[string]string{}
	for _, tv := range v.Targets {
		got[tv.Target] = tv.State + "/" + tv.Reason
		if tv.EventStream != nil {
			t.Errorf("%s: health's view has an event stream (the event plane's): %s", tv.Target, tv.EventStream)
		}
	}
	want := map[string]string{
		up.name(0):   "routable/ok",
		up.name(1):   "routable/ok",
		down.name(0): "down/probe_failed",
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: %s, want %s (%s)", k, got[k], w, b)
		}
	}
}

// TestProbeRun: the one probe rule, which the monitor and a virtual fleet
// both follow.
func TestProbeRun(t *testing.T) {
	cfg := DefaultConfig()
	cfg.FailureThreshold, cfg.SuccessThreshold = 3, 2
	cases := []struct {
		name    string
		start   ProbeRun
		probes  []bool
		wantUp  bool
		changes int
	}{
		{"never up: up on the first good probe", ProbeRun{}, []bool{true}, true, 1},
		{"never up and failing stays down", ProbeRun{}, []bool{false, false, false, false}, false, 0},
		{"up: two failures keep it up", ProbeRun{Up: true, EverUp: true}, []bool{false, false, true}, true, 0},
		{"up: three failures take it down", ProbeRun{Up: true, EverUp: true}, []bool{false, false, false}, false, 1},
		{"down after up: one good probe is not enough", ProbeRun{EverUp: true}, []bool{true}, false, 0},
		{"down after up: two good probes bring it back", ProbeRun{EverUp: true}, []bool{true, true}, true, 1},
		{"a failure in between starts the count over", ProbeRun{EverUp: true}, []bool{true, false, true}, false, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, changes := c.start, 0
			for _, ok := range c.probes {
				if r.Observe(ok, cfg) {
					changes++
				}
			}
			if r.Up != c.wantUp || changes != c.changes {
				t.Fatalf("up %v after %d changes, want %v after %d", r.Up, changes, c.wantUp, c.changes)
			}
		})
	}
}
