package speculative

import (
	"math"
	"testing"
	"time"
)

// Worked examples of the measurements docs/speculative.md defines (the
// TTL from a latency quantile, backlog and slack; the exposure λ·p·T;
// rates over mature cohorts, token-weighted; the incremental reuse and its
// standard error), computed by the router's own code, so that the
// arithmetic the page and ttl-advise's example show is the code's.

func TestWorkedExampleTTL(t *testing.T) {
	// p99 1.15 s + backlog 0.25 s + slack 0.10 s gives a 1.50 s TTL.
	if got := TTLFor(1150*time.Millisecond, 250*time.Millisecond, 100*time.Millisecond, 5*time.Second); got != 1500*time.Millisecond {
		t.Fatalf("TTLFor(1.15s, 0.25s, 0.10s) = %s, want 1.5s", got)
	}
	tests := []struct {
		name                        string
		q, backlog, slack, maxStale time.Duration
		want                        time.Duration
	}{
		{"rounded up once, after the sum", 1151 * time.Millisecond, 0, 0, 0, 1160 * time.Millisecond},
		{"terms are not rounded one by one", 1004 * time.Millisecond, 3 * time.Millisecond, 3 * time.Millisecond, 0, 1010 * time.Millisecond},
		{"capped by max-stale", 4900 * time.Millisecond, 250 * time.Millisecond, 100 * time.Millisecond, 5 * time.Second, 5 * time.Second},
		{"a cap below the sum", time.Second, 0, 0, 800 * time.Millisecond, 800 * time.Millisecond},
		{"exact multiples stay", 2 * time.Second, 0, 0, 5 * time.Second, 2 * time.Second},
	}
	for _, tt := range tests {
		if got := TTLFor(tt.q, tt.backlog, tt.slack, tt.maxStale); got != tt.want {
			t.Errorf("%s: TTLFor(%s, %s, %s, %s) = %s, want %s", tt.name, tt.q, tt.backlog, tt.slack, tt.maxStale, got, tt.want)
		}
	}
}

func TestWorkedExampleExposure(t *testing.T) {
	// 120 req/s × 0.4% × 1.5 s gives 0.72 live failed predictions, and 2.4
	// at 5 s.
	if got := Exposure(120, 0.004, 1500*time.Millisecond); !near(got, 0.72) {
		t.Errorf("Exposure(120, 0.4%%, 1.5s) = %v, want 0.72", got)
	}
	if got := Exposure(120, 0.004, 5*time.Second); !near(got, 2.4) {
		t.Errorf("Exposure(120, 0.4%%, 5s) = %v, want 2.4", got)
	}
}

// TestWorkedExampleCohortRates: 20,000 inserted with 16,400 confirmed,
// 2,600 expired and 1,000 pending gives 86.3% confirmation and 13.7%
// expiry over a mature denominator of 19,000. The predictions go through
// the store: a first cohort that matures, and a later one still pending.
func TestWorkedExampleCohortRates(t *testing.T) {
	r := newRig(t, DefaultConfig())
	for i := range 19 {
		r.Predict(dispatch(podA, "first"), keyRange(i*1000, 1000))
	}
	r.step(500 * time.Millisecond)
	r.confirm(podA, keyRange(0, 16400))
	r.settle(7 * time.Second) // t = 7.5 s: the first cohort's deadline (2 s) and grace (5 s) passed
	r.Predict(dispatch(podA, "later"), keyRange(19000, 1000))
	r.step(100 * time.Millisecond)

	tv := r.targetView(t, podA)
	m := tv.Mature
	if m.Cohorts != 1 || m.Inserted != 19000 || m.Confirmed != 16400 || m.Expired != 2600 || m.Decided != 19000 {
		t.Fatalf("mature cohorts %+v, want 1 cohort of 19,000: 16,400 confirmed, 2,600 expired", m)
	}
	if got := round3(val(m.Rates.Block)); got != 0.863 {
		t.Errorf("block confirmation rate %v, want 0.863", val(m.Rates.Block))
	}
	if got := round3(val(m.Rates.Expiry)); got != 0.137 {
		t.Errorf("expiry rate %v, want 0.137", val(m.Rates.Expiry))
	}
	if p := tv.Pending; p.Inserted != 1000 || p.Live != 1000 || p.Cohorts != 1 {
		t.Errorf("pending %+v, want the later cohort's 1,000 live predictions alone", p)
	}
	if tv.Funnel.Inserted != 20000 {
		t.Errorf("inserted %d, want 20,000", tv.Funnel.Inserted)
	}
}

// TestWorkedExampleTokenWeighted: 540,000 of 640,000 predicted tokens
// confirmed gives 84.4% token-weighted, over two targets with different
// block sizes, where the block-weighted rate differs.
func TestWorkedExampleTokenWeighted(t *testing.T) {
	r := newRig(t, DefaultConfig())
	big := Dispatch{Target: podA, Namespace: Namespace{Model: "m", BlockSize: 32}}
	for i := range 10 {
		r.Predict(big, keyRange(i*1000, 1000)) // 320,000 tokens
	}
	for i := range 20 {
		r.Predict(dispatch(podB, "b"), keyRange(i*1000, 1000)) // 320,000 tokens
	}
	r.step(100 * time.Millisecond)
	r.confirm(podA, keyRange(0, 10000))
	r.confirm(podB, keyRange(0, 13750)) // 220,000 tokens
	r.settle(8 * time.Second)
	o := r.View().Overall.Mature
	if o.InsertedTokens != 640000 || o.ConfirmedTokens != 540000 {
		t.Fatalf("tokens inserted %d, confirmed %d; want 640,000 and 540,000", o.InsertedTokens, o.ConfirmedTokens)
	}
	if got := round3(val(o.Rates.Token)); got != 0.844 {
		t.Errorf("token-weighted rate %v, want 0.844", val(o.Rates.Token))
	}
	if got := round3(val(o.Rates.Block)); got != 0.792 {
		t.Errorf("block-weighted rate %v, want 0.792 (23,750 of 30,000 blocks)", val(o.Rates.Block))
	}
}

// TestWorkedExampleIncrementalReuse: 360,000 cached follower tokens
// against a holdback's 210,000 at equal volume gives 150,000 incremental.
func TestWorkedExampleIncrementalReuse(t *testing.T) {
	if got, ok := IncrementalReuse(360000, 1000, 210000, 1000); !ok || got != 150000 {
		t.Fatalf("IncrementalReuse at equal volume = %v, %v; want 150,000", got, ok)
	}
	// The holdback is small: its 50 requests at 210 cached tokens each are
	// 210,000 at the speculative arm's 1,000 requests.
	if got, ok := IncrementalReuse(360000, 1000, 10500, 50); !ok || got != 150000 {
		t.Fatalf("IncrementalReuse scaled = %v, %v; want 150,000", got, ok)
	}
	if _, ok := IncrementalReuse(360000, 1000, 0, 0); ok {
		t.Fatal("an empty holdback gave an incremental reuse")
	}

	// Through the store's outcome records and view.
	r := newRig(t, Config{Holdback: 0.05})
	for range 1000 {
		r.Record(Outcome{Model: "m", Arm: ArmSpeculative, PromptTokens: 2000, ReportedCached: 360, CachedReported: true, TTFT: 80 * time.Millisecond})
	}
	for range 50 {
		r.Record(Outcome{Model: "m", Arm: ArmHoldback, PromptTokens: 2000, ReportedCached: 210, CachedReported: true, TTFT: 120 * time.Millisecond})
	}
	// A request whose usage was not reported counts as a request, not in
	// the cached tokens per request.
	r.Record(Outcome{Model: "m", Arm: ArmHoldback, PromptTokens: 2000})
	mv := r.View().Holdback.Models
	if len(mv) != 1 || val(mv[0].Incremental) != 150000 {
		t.Fatalf("holdback view %+v, want 150,000 incremental cached tokens", mv)
	}
	if a := mv[0].Arms[1]; a.Requests != 51 || a.ReportedRequests != 50 || val(a.CachedPerRequest) != 210 || val(a.TTFTP50) != 0.12 {
		t.Errorf("holdback arm %+v", a)
	}
	// Every request in one variance group: no spread between groups to
	// measure, so no standard error.
	if se := mv[0].IncrementalStdErr; se != nil {
		t.Errorf("standard error %v from a single group", *se)
	}
}

// TestIncrementalStdErr: the incremental reuse's standard error from the
// spread between each arm's variance groups, where a conversation's
// requests count once, and where it cannot say anything.
func TestIncrementalStdErr(t *testing.T) {
	type req struct {
		group  uint8
		cached int
	}
	each := func(cached ...int) []req { // one group a request
		out := make([]req, len(cached))
		for i, c := range cached {
			out[i] = req{uint8(i), c}
		}
		return out
	}
	for _, tc := range []struct {
		name       string
		spec, hold []req
		inc, se    float64
		ok         bool
	}{
		// Means 200 and 100, variances 10,000 and 5,000: 3 × (200 − 100)
		// and 3 × √(10,000/3 + 5,000/2) = 229.13, as for independent
		// requests.
		{"a request a group", each(100, 200, 300), each(50, 150), 300, 229.129, true},
		{"no spread", each(400, 400), each(100, 100), 600, 0, true},
		// Two conversations an arm, three and two requests each: the
		// groups' totals 900 and 300 about 600, and 100 and 300 about 200,
		// give 6 × √(10,000 + 2,500) = 670.82 (independent requests would
		// give 319).
		{"conversations of several requests", []req{{0, 300}, {0, 300}, {0, 300}, {1, 100}, {1, 100}, {1, 100}},
			[]req{{0, 50}, {0, 50}, {1, 150}, {1, 150}}, 600, 670.820, true},
		{"one holdback group", each(100, 200), []req{{3, 50}, {3, 70}}, 180, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, Config{Holdback: 0.05})
			for arm, reqs := range map[Arm][]req{ArmSpeculative: tc.spec, ArmHoldback: tc.hold} {
				for _, q := range reqs {
					r.Record(Outcome{Model: "m", Arm: arm, Group: q.group, PromptTokens: 1000, ReportedCached: q.cached, CachedReported: true})
				}
			}
			mv := r.View().Holdback.Models[0]
			if math.Abs(val(mv.Incremental)-tc.inc) > 1e-9 {
				t.Errorf("incremental %v, want %v", val(mv.Incremental), tc.inc)
			}
			se := mv.IncrementalStdErr
			if (se != nil) != tc.ok || (se != nil && math.Abs(*se-tc.se) > 0.001) {
				t.Errorf("standard error %v, want %v (known: %v)", se, tc.se, tc.ok)
			}
		})
	}
}
