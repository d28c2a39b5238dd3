package bench

import (
	"math"
	"strings"
	"testing"

	"github.com/prefixrouter/prefixrouter/bench/report"
	"github.com/prefixrouter/prefixrouter/speculative"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// TestSummarizeSpeculative checks that the router's view reaches the
// results in model seconds, with pods named as the fleet's.
func TestSummarizeSpeculative(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	v := speculative.View{
		Overall: speculative.Stats{
			Funnel:      speculative.FunnelView{Inserted: 250, Confirmed: 240, ConfirmedLate: 4, FollowerRoutes: 3, FollowerCachedTokens: 6000},
			MatureTotal: speculative.CohortView{Inserted: 250, Confirmed: 240, ExpiredEarly: 4, ExpiredStale: 6, Rates: speculative.Rates{Block: f(0.96)}},
			Latency:     speculative.LatencyView{Confirmed: speculative.Percentiles{Samples: 240, P50: f(0.1), P95: f(0.12), P99: f(0.13)}},
			FalseWarm:   speculative.FalseWarmView{Routes: 1, Tokens: 96},
		},
		Targets: []speculative.TargetView{{Endpoint: "http://127.0.0.1:1", Rank: 0, TTL: speculative.TTLView{S: 0.14, Why: "why"},
			Trust: speculative.TrustView{Value: 0.9}}},
		Holdback: speculative.HoldbackView{Fraction: 0.25, Models: []speculative.ModelView{{Model: "m", Incremental: f(3000),
			Arms: []speculative.ArmView{{Arm: "speculative", Requests: 30, CachedPerRequest: f(1500), TTFTP90: f(0.02)}, {Arm: "holdback", Requests: 10, CachedPerRequest: f(1200)}}}}},
	}
	pod := func(id targetid.ID) string {
		if id == (targetid.ID{Endpoint: "http://127.0.0.1:1"}) {
			return "pod-0"
		}
		return "?"
	}
	s := summarizeSpeculative(&v, 5, pod)
	if !s.Settled || s.Funnel.Inserted != 250 || s.Mature.ExpiredStale != 6 || *s.Mature.BlockRate != 0.96 {
		t.Fatalf("summary %+v", s)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	if !near(*s.ConfirmationS.P99, 0.65) || s.Pods[0].Pod != "pod-0" || !near(s.Pods[0].TTLS, 0.7) || !near(*s.Arms[0].TTFTP90, 0.1) || *s.IncrementalCachedTokens != 3000 {
		t.Fatalf("times not in model seconds or pods unnamed: %+v %+v %+v", s.ConfirmationS, s.Pods, s.Arms)
	}
	note := speculativeNote("speculative", s)
	for _, want := range []string{"250 blocks predicted, 240 confirmed by their event (4 late)", "mature block confirmation 96.0%",
		"3 routes on predictions (6000 cached tokens reported); 1 false-warm (96 prefill tokens)", "TTL 700ms",
		"holdback arm 10 requests, 1200 cached tokens each", "incremental reuse 3000"} {
		if !strings.Contains(note, want) {
			t.Errorf("note %q lacks %q", note, want)
		}
	}
}

func TestBasisOf(t *testing.T) {
	for _, tc := range []struct {
		r    routedOn
		want string
	}{
		{routedOn{}, report.BasisUnknown},
		{routedOn{known: true}, report.BasisNone},
		{routedOn{known: true, confirmedBlocks: 10, predictedTokens: 160}, report.BasisConfirmed},
		{routedOn{known: true, confirmedBlocks: 10, predictedTokens: 400}, report.BasisPrediction},
		{routedOn{known: true, predictedTokens: 16}, report.BasisPrediction},
	} {
		if got := basisOf(tc.r, 16); got != tc.want {
			t.Errorf("%+v: %s, want %s", tc.r, got, tc.want)
		}
	}
}

// TestPairedGapReportRendersInChromium opens a paired-gap report in
// headless Chromium: the matrix draws a panel per policy.
func TestPairedGapReportRendersInChromium(t *testing.T) {
	res := &report.Results{Workload: map[string]any{"name": "paired-gap"}, Engine: EngineLive, TimeScale: 4,
		Order: []string{"precise", "speculative"}, Policies: map[string]*report.Policy{}}
	for _, pol := range res.Order {
		var recs []report.Record
		var pairs []report.Pair
		for i, cond := range []string{"none", "restart"} {
			for j, gap := range []string{"below-p50", "beyond-ttl"} {
				basis := report.BasisConfirmed
				if j == 0 {
					basis = map[string]string{"precise": report.BasisNone, "speculative": report.BasisPrediction}[pol]
				}
				pairs = append(pairs, report.Pair{Condition: cond, Gap: gap, GapS: 0.3, Basis: basis, CachedTokens: 2000 * i, Pod: "pod-0", FirstPod: "pod-0"})
				recs = append(recs, report.Record{Group: i, Sent: float64(j), TTFT: 0.1, E2E: 0.2, PromptTokens: 2000, Pod: "pod-0", Status: 200})
			}
		}
		p := report.Summarize(recs)
		p.Pairs = pairs
		res.Policies[pol] = p
	}
	path, err := res.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	checkChartInChromium(t, path, "paired-gap", "precise", "speculative")
}
