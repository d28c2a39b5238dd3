package report

import (
	"encoding/json"
	"math"
	"testing"
)

// flowRecords are ten requests over two ladder steps of 10 s: interactive
// (2 s) and batch (30 s) answers within and past their objectives, sheds
// and one unfinished, from a heavy tenant and a light one.
func flowRecords() []Record {
	ok := func(stage int, class, tenant string, sent, ttft float64) Record {
		return Record{Stage: stage, Class: class, Tenant: tenant, Sent: sent, TTFT: ttft, E2E: ttft + 1, Status: 200,
			PromptTokens: 90, OutputTokens: 10, Demand: 100}
	}
	shed := func(stage int, class, tenant string, sent float64, why string) Record {
		return Record{Stage: stage, Class: class, Tenant: tenant, Sent: sent, Status: 429, Err: ErrShed, ShedReason: why, Demand: 100, Queued: why == "deadline"}
	}
	q := ok(1, "batch", "heavy", 11, 25)
	q.Queued, q.QueueS = true, 20
	return []Record{
		ok(0, "interactive", "light", 0, 0.5),
		ok(0, "interactive", "heavy", 1, 3), // past 2 s
		ok(0, "batch", "heavy", 2, 10),
		ok(0, "batch", "light", 3, 1),
		q,
		ok(1, "batch", "heavy", 12, 31), // past 30 s
		ok(1, "interactive", "light", 13, 1.5),
		shed(1, "batch", "heavy", 14, "deadline"),
		shed(1, "interactive", "heavy", 15, "queue_full"),
		{Stage: 1, Class: "batch", Tenant: "heavy", Sent: 16, Err: "unfinished at the drain bound", Demand: 100, Queued: true},
	}
}

func flowConfig() *FlowControl {
	return &FlowControl{Arms: []string{"on"}, Classes: []FlowClass{{Name: "interactive", ObjectiveS: 2}, {Name: "batch", ObjectiveS: 30}},
		DefaultClass: "interactive", Shares: map[string]float64{"light": 1}}
}

func TestSummarizeFlow(t *testing.T) {
	recs := flowRecords()
	p := Summarize(recs)
	SummarizeFlow(p, recs, flowConfig(), []StageSpan{{Rate: 1, Start: 0, End: 10}, {Rate: 2, Start: 10, End: 20}})
	// Five answers within their objective over the run: first send at 0,
	// last answer at 12 + 31 + 1 = 44.
	if p.DurationS != 44 || p.GoodputPerS == nil || math.Abs(*p.GoodputPerS-5.0/44) > 1e-9 {
		t.Fatalf("duration %v, goodput %v: want 5 answers within their objective over 44 s", p.DurationS, p.GoodputPerS)
	}
	in, ba := p.ByPriority["interactive"], p.ByPriority["batch"]
	tests := []struct {
		what      string
		got, want float64
	}{
		{"interactive requests", float64(in.Requests), 4},
		{"interactive answered", float64(in.Answered), 3},
		{"interactive within 2 s", float64(in.WithinSLO), 2},
		{"interactive shed", float64(in.Shed), 1},
		{"interactive queue_full sheds", float64(in.ShedReasons["queue_full"]), 1},
		{"interactive objective", in.SLOTTFTS, 2},
		{"interactive TTFT p90", in.TTFT.P90, 3},
		{"interactive TTFT p50", in.TTFT.P50, 1.5},
		{"batch requests", float64(ba.Requests), 6},
		{"batch answered", float64(ba.Answered), 4},
		{"batch within 30 s", float64(ba.WithinSLO), 3},
		{"batch shed", float64(ba.Shed), 1},
		{"batch queued (answered, shed, unfinished)", float64(ba.Queued), 3},
		{"batch queue p99", ba.QueueS.P99, 20},
		{"errors", float64(p.Errors), 3},
		{"shed (429)", float64(p.Shed), 2},
		{"shed error kind", float64(p.ErrorKinds[ErrShed]), 2},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("%s: %v, want %v", tc.what, tc.got, tc.want)
		}
	}
	heavy, light := p.ByTenant["heavy"], p.ByTenant["light"]
	// 7 answers served 100 tokens each; equal weights: a fair share of 350.
	for _, tc := range []struct {
		name           string
		ts             *TenantSummary
		demand, served int64
		within         bool
	}{
		{"heavy", heavy, 700, 400, false},
		{"light", light, 300, 300, true},
	} {
		if tc.ts.DemandedTokens != tc.demand || tc.ts.ServedTokens != tc.served || tc.ts.FairShareTokens != 350 || tc.ts.WithinFairShare != tc.within {
			t.Errorf("%s: %+v, want %d demanded, %d served, a fair share of 350, within %v", tc.name, tc.ts, tc.demand, tc.served, tc.within)
		}
	}
	if light.ServedFraction != 1 {
		t.Errorf("light served fraction %v", light.ServedFraction)
	}
	st := p.FlowByStage
	if len(st) != 2 || st[0].GoodputPerS != 0.3 || st[1].GoodputPerS != 0.2 || st[1].Shed != 2 || st[0].TTFTP90["interactive"] != 3 || st[1].TTFTP90["batch"] != 31 {
		t.Errorf("by stage %+v", st)
	}
	raw, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"goodput_per_s", "by_priority", "by_tenant", "flow_by_stage", "error_kinds"} {
		if _, ok := back[field]; !ok {
			t.Errorf("results.json's policy has no %s", field)
		}
	}
	bp := back["by_priority"].(map[string]any)["interactive"].(map[string]any)
	for _, field := range []string{"ttft_s", "slo_ttft_s", "shed", "queued"} {
		if _, ok := bp[field]; !ok {
			t.Errorf("by_priority.interactive has no %s", field)
		}
	}
	bt := back["by_tenant"].(map[string]any)["light"].(map[string]any)
	for _, field := range []string{"demanded_tokens", "served_tokens", "within_fair_share"} {
		if _, ok := bt[field]; !ok {
			t.Errorf("by_tenant.light has no %s", field)
		}
	}
}

// Without flow control's classes there is nothing to summarize.
func TestSummarizeFlowWithout(t *testing.T) {
	recs := flowRecords()
	p := Summarize(recs)
	SummarizeFlow(p, recs, nil, nil)
	if p.GoodputPerS != nil || p.ByPriority != nil || p.ByTenant != nil {
		t.Fatalf("figures without flow control: %+v", p)
	}
}

func TestFairShareByWeight(t *testing.T) {
	tests := []struct {
		name   string
		shares map[string]float64
		// heavy's fair share of the 700 served tokens.
		want       float64
		heavyFair  bool
		lightFairs bool
	}{
		{"equal weights", nil, 350, false, true},
		{"heavy weighs 3", map[string]float64{"heavy": 3}, 525, false, false},
		{"heavy weighs 6", map[string]float64{"heavy": 6}, 600, false, false},
		{"light weighs 0.25", map[string]float64{"light": 0.25}, 560, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			recs := flowRecords()
			p := Summarize(recs)
			fc := flowConfig()
			fc.Shares = tc.shares
			SummarizeFlow(p, recs, fc, nil)
			h, l := p.ByTenant["heavy"], p.ByTenant["light"]
			if math.Abs(h.FairShareTokens-tc.want) > 1e-9 || h.WithinFairShare != tc.heavyFair || l.WithinFairShare != tc.lightFairs {
				t.Fatalf("heavy %+v, light %+v; want heavy's share %v", h, l, tc.want)
			}
			if p.FlowByStage != nil {
				t.Fatal("steps without a ladder")
			}
		})
	}
}
