package bench

import (
	"testing"

	"github.com/prefixrouter/prefixrouter/bench/report"
	"github.com/prefixrouter/prefixrouter/bench/workload"
)

// TestPairedGapOnDES runs paired-gap's matrix on the des engine and checks
// what each cell must show (docs/benchmark.md, "The paired-gap matrix"):
// inside the event gap only predictions find the first request's pod; a
// restarted pod's predictions are invalidated once the router sees the new
// process; delayed events leave the follower to predictions until the TTL,
// then to nothing.
func TestPairedGapOnDES(t *testing.T) {
	o, res := runQuickDES(t, workload.KindPairedGap, "precise", "speculative")
	prefix := o.Workload.Params["prefix_tokens"].(int)
	cells := map[string]map[[2]string]report.Pair{}
	for _, pol := range o.Policies {
		p := res.Policies[pol]
		if len(p.Pairs) != len(o.Workload.Cells) {
			t.Fatalf("%s: %d cells, want %d", pol, len(p.Pairs), len(o.Workload.Cells))
		}
		cells[pol] = map[[2]string]report.Pair{}
		for _, c := range p.Pairs {
			cells[pol][[2]string{c.Condition, c.Gap}] = c
		}
	}
	for _, tc := range []struct {
		policy, cond, gap string
		basis             string
		// cached: whether the second request must find the prefix cached
		// (-1: either).
		cached int
	}{
		{"precise", workload.CondNone, workload.GapBelowP50, report.BasisNone, -1},
		{"speculative", workload.CondNone, workload.GapBelowP50, report.BasisPrediction, 1},
		{"speculative", workload.CondNone, workload.GapNearP95, report.BasisConfirmed, 1},
		{"speculative", workload.CondCancel, workload.GapBelowP50, report.BasisPrediction, 1},
		{"speculative", workload.CondRestart, workload.GapBelowP50, report.BasisPrediction, 0},
		{"speculative", workload.CondRestart, workload.GapNearP95, report.BasisNone, 0},
		{"precise", workload.CondRestart, workload.GapNearTTL, report.BasisNone, 0},
		{"speculative", workload.CondDelayedEvents, workload.GapNearTTL, report.BasisPrediction, 1},
		{"precise", workload.CondDelayedEvents, workload.GapNearTTL, report.BasisNone, -1},
		{"speculative", workload.CondDelayedEvents, workload.GapBeyondTTL, report.BasisNone, -1},
	} {
		c := cells[tc.policy][[2]string{tc.cond, tc.gap}]
		if c.Basis != tc.basis {
			t.Errorf("%s %s %s: routed on %q, want %q", tc.policy, tc.cond, tc.gap, c.Basis, tc.basis)
		}
		if got := c.CachedTokens >= prefix; tc.cached >= 0 && got != (tc.cached == 1) {
			t.Errorf("%s %s %s: %d cached tokens of the %d-token prefix", tc.policy, tc.cond, tc.gap, c.CachedTokens, prefix)
		}
		if tc.basis == report.BasisPrediction && !c.SamePod {
			t.Errorf("%s %s %s: routed on a prediction to %s, the first went to %s", tc.policy, tc.cond, tc.gap, c.Pod, c.FirstPod)
		}
	}
	if s := cells["speculative"][[2]string{workload.CondRestart, workload.GapNearP95}].Spec; s == nil || s.EndedUnconfirmed == 0 {
		t.Errorf("restart: the restarted pod's predictions did not end unconfirmed (%+v)", s)
	}
}
