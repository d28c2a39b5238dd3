package speculative

import (
	"bytes"
	"encoding/json"
	"flag"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var update = flag.Bool("update", false, "rewrite testdata/view.golden.json")

// scenario drives a store through a little of everything: two targets
// (one known without predictions), confirmations, an early and a stale
// expiry, a withdrawal, a false-warm follower, both arms.
func scenario(r *rig) {
	r.AddTarget(podB)
	leader := r.Predict(dispatch(podA, "secret-request-id"), keyRange(7777000, 8))
	r.step(200 * time.Millisecond)
	ext := r.Lookup(podA, keyRange(7777000, 8), 0)
	f := r.Follow(ext.Ref, "follower")
	r.confirm(podA, keyRange(7777000, 5))
	rejected := r.Predict(dispatch(podA, "rejected"), keyRange(7777100, 2))
	rejected.Withdraw()
	r.step(2500 * time.Millisecond) // the leader's last three blocks expired
	r.confirm(podA, keyRange(7777005, 1))
	r.Record(Outcome{Model: "m", Arm: ArmSpeculative, PromptTokens: 140, PredictedCached: 128, ReportedCached: 80, CachedReported: true,
		TTFT: 90 * time.Millisecond, Follower: f})
	r.Record(Outcome{Model: "m", Arm: ArmHoldback, PromptTokens: 140, ReportedCached: 16, CachedReported: true, TTFT: 150 * time.Millisecond})
	// Two requests an arm make a standard error (model m2).
	for arm, cached := range map[Arm][]int{ArmSpeculative: {10, 30}, ArmHoldback: {0, 20}} {
		for g, c := range cached {
			r.Record(Outcome{Model: "m2", Arm: arm, Group: uint8(g), PromptTokens: 40, ReportedCached: c, CachedReported: true})
		}
	}
	r.Assign(Conversation{Model: "m", SessionID: "s"})
	r.Assign(Conversation{Model: "m", Keys: keyRange(7777200, 3)})
	_ = leader
	r.settle(10 * time.Second)
	r.Predict(dispatch(podA, "pending"), keyRange(7777300, 2))
	r.step(100 * time.Millisecond)
}

// TestViewGolden pins the debug view's JSON shape and numbers for the
// scenario. Rewrite it with go test ./speculative -run TestViewGolden
// -update.
func TestViewGolden(t *testing.T) {
	r := newRig(t, DefaultConfig())
	scenario(r)
	got, err := json.MarshalIndent(r.View(), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	path := filepath.Join("testdata", "view.golden.json")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the view differs from %s (rewrite with -update if intended):\n%s", path, got)
	}

	v := r.View()
	a := v.Targets[0]
	m := a.MatureTotal
	if m.Confirmed != 5 || m.Expired != 3 || m.ExpiredEarly != 1 || m.ExpiredStale != 2 || m.Withdrawn != 2 {
		t.Errorf("target A mature %+v", m)
	}
	if a.FalseWarm.Routes != 1 || a.FalseWarm.Tokens != 48 || a.Funnel.FollowerCachedTokens != 80 {
		t.Errorf("target A false-warm %+v funnel %+v", a.FalseWarm, a.Funnel)
	}
	if v.Targets[1].Target != podB.String() || v.Targets[1].Funnel.Inserted != 0 {
		t.Errorf("target B %+v", v.Targets[1])
	}
	if v.Overall.Pending.Live != 2 || v.Overall.Funnel.Inserted != 12 {
		t.Errorf("overall %+v", v.Overall)
	}
}

// TestMetrics: every series is there, labelled only by target, model,
// arm, outcome and reason, and no label carries a request id or a block
// key.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := newRigOn(t, DefaultConfig(), reg)
	if _, err := New(DefaultConfig(), Deps{Registerer: reg}); err == nil {
		t.Fatal("a second store registered on the same registry")
	}
	scenario(r)
	// A peer replica's prediction on B: its series are by origin.
	o, err := r.Origin("router-b")
	if err != nil {
		t.Fatal(err)
	}
	r.PredictFrom(o, dispatch(podB, "secret"), keyRange(7777, 3), r.clock.Now().Add(time.Second))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	allowed := []string{"target", "model", "arm", "outcome", "reason", "origin"}
	values := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				if !slices.Contains(allowed, l.GetName()) {
					t.Errorf("%s has label %s", mf.GetName(), l.GetName())
				}
				if strings.Contains(l.GetValue(), "secret") || strings.Contains(l.GetValue(), "7777") {
					t.Errorf("%s label %s=%q carries a request id or a key", mf.GetName(), l.GetName(), l.GetValue())
				}
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
			values[mf.GetName()+"{"+strings.Join(ls, ",")+"}"] = v
		}
	}
	a := podA.String()
	for series, want := range map[string]float64{
		"prefixrouter_speculative_predictions_inserted_total{model=m,target=" + a + "}":                        12,
		"prefixrouter_speculative_predictions_total{model=m,outcome=confirmed,target=" + a + "}":               5,
		"prefixrouter_speculative_predictions_total{model=m,outcome=expired_early,target=" + a + "}":           1,
		"prefixrouter_speculative_predictions_total{model=m,outcome=expired_stale,target=" + a + "}":           2,
		"prefixrouter_speculative_predictions_total{model=m,outcome=withdrawn,target=" + a + "}":               2,
		"prefixrouter_speculative_prediction_tokens_total{model=m,outcome=confirmed,target=" + a + "}":         80,
		"prefixrouter_speculative_pending_predictions{model=m,target=" + a + "}":                               2,
		"prefixrouter_speculative_immature_predictions{model=m,target=" + a + "}":                              2,
		"prefixrouter_speculative_ttl_seconds{model=m,target=" + a + "}":                                       2,
		"prefixrouter_speculative_confirmation_seconds{model=m,outcome=confirmed,target=" + a + "}":            5,
		"prefixrouter_speculative_confirmation_seconds{model=m,outcome=late,target=" + a + "}":                 1,
		"prefixrouter_speculative_false_warm_routes_total{model=m,target=" + a + "}":                           1,
		"prefixrouter_speculative_false_warm_tokens_total{model=m,target=" + a + "}":                           48,
		"prefixrouter_speculative_follower_cached_tokens_total{model=m,target=" + a + "}":                      80,
		"prefixrouter_speculative_trust{model=,target=" + podB.String() + "}":                                  priorMean,
		"prefixrouter_speculative_arm_cached_tokens_total{arm=holdback,model=m}":                               16,
		"prefixrouter_speculative_arm_ttft_seconds{arm=speculative,model=m}":                                   1,
		"prefixrouter_speculative_incremental_cached_tokens{model=m}":                                          64,
		"prefixrouter_speculative_incremental_cached_tokens{model=m2}":                                         20,
		"prefixrouter_speculative_incremental_cached_tokens_stderr{model=m2}":                                  2 * math.Sqrt(200),
		"prefixrouter_speculative_requests_total{model=m,target=" + a + "}":                                    1,
		"prefixrouter_speculative_requests_confirmed_total{model=m,target=" + a + "}":                          5.0 / 8,
		"prefixrouter_speculative_cohorts_matured_total{model=m,target=" + a + "}":                             1,
		"prefixrouter_speculative_referenced_total{model=m,target=" + a + "}":                                  8,
		"prefixrouter_speculative_exposure{model=,target=" + podB.String() + "}":                               0,
		"prefixrouter_speculative_invalidations_total{reason=restarted,target=" + a + "}":                      0,
		"prefixrouter_speculative_arm_requests_total{arm=speculative,model=m}":                                 1,
		"prefixrouter_speculative_follower_routes_total{model=m,target=" + a + "}":                             1,
		"prefixrouter_speculative_followed_total{model=m,target=" + a + "}":                                    8,
		"prefixrouter_speculative_arm_prompt_tokens_total{arm=holdback,model=m}":                               140,
		"prefixrouter_speculative_arm_reported_requests_total{arm=holdback,model=m}":                           1,
		"prefixrouter_speculative_prediction_tokens_total{model=m,outcome=expired_stale,target=" + a + "}":     32,
		"prefixrouter_speculative_predictions_total{model=m,outcome=unknown,target=" + a + "}":                 0,
		"prefixrouter_speculative_predictions_total{model=m,outcome=invalidated,target=" + a + "}":             0,
		"prefixrouter_speculative_confirmation_seconds{model=,outcome=confirmed,target=" + podB.String() + "}": 0,
		"prefixrouter_speculative_peer_pending_predictions{origin=router-b}":                                   3,
		"prefixrouter_speculative_peer_predictions_inserted_total{origin=router-b}":                            3,
	} {
		got, ok := values[series]
		if !ok {
			t.Errorf("no series %s", series)
			continue
		}
		if !near(got, want) {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	// Every family described is collected.
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, d := range allDescs {
		name := strings.SplitN(d.String(), "\"", 3)[1]
		if !names[name] {
			t.Errorf("%s described, never collected", name)
		}
	}
}
