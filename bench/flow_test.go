package bench

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/bench/report"
	"github.com/prefixrouter/prefixrouter/bench/workload"
	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/flow"
	"github.com/prefixrouter/prefixrouter/sim"
)

func TestParseFlowControl(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []bool
		err  string
	}{
		{"on", []bool{true}, ""},
		{"off", []bool{false}, ""},
		{"on,off", []bool{true, false}, ""},
		{"off, on", []bool{false, true}, ""},
		{"yes", nil, "want on, off"},
		{"on,on", nil, "named twice"},
		{"", nil, "want on, off"},
	} {
		got, err := ParseFlowControl(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %v, want an error with %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || len(got) != len(tc.want) || (len(got) > 1 && got[1] != tc.want[1]) || got[0] != tc.want[0] {
			t.Errorf("%q: %v %v, want %v", tc.in, got, err, tc.want)
		}
	}
}

// TestCapacity checks the saturated pod's rate against the arithmetic
// done by hand for each bound: the step's token budget, the cache, the
// sequence limit, and a prefill alone.
func TestCapacity(t *testing.T) {
	big, err := sim.LookupProfile("h100x2-32b")
	if err != nil {
		t.Fatal(err)
	}
	small := big
	small.NumGPUBlocks = 1200 // 19,200 tokens
	seqs := big
	seqs.MaxNumSeqs = 32
	sf, pp, dps := big.StepFixed.Seconds(), big.PrefillPerToken.Seconds(), big.DecodePerSeq.Seconds()
	for _, tc := range []struct {
		name                 string
		p                    sim.Profile
		pods, prompt, output int
		perStep              float64 // prompts finished per step
	}{
		// 8,192 / (2,000 + 29) prompts a step: the token budget.
		{"budget", big, 4, 2000, 30, 8192.0 / 2029},
		// 19,200 / (29 × (2,000 + 15)) decoding at once: the cache.
		{"cache", small, 1, 2000, 30, 19200.0 / (29 * 2015)},
		// 32 sequences decoding 29 steps each.
		{"sequences", seqs, 2, 200, 30, 32.0 / 29},
		// One output token: prefill only, 8,192 / 2,000 a step.
		{"prefill only", big, 3, 2000, 1, 8192.0 / 2000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.perStep
			d := float64(tc.output - 1)
			want := float64(tc.pods) * c / (sf + c*float64(tc.prompt)*pp + c*d*dps)
			if got := Capacity(tc.p, tc.pods, tc.prompt, tc.output); math.Abs(got-want) > 1e-9*want {
				t.Fatalf("capacity %v, want %v", got, want)
			}
		})
	}
	// The overload preset's fleet: about ten prompts a second a pod, a
	// little below the prefill's bound alone (20,480 tokens a second).
	if got := Capacity(big, 4, 2000, 30); got < 39 || got > 40.5 {
		t.Fatalf("four pods: %v requests a second, want about 39.7", got)
	}
	if Capacity(big, 0, 2000, 30) != 0 || Capacity(big, 1, 0, 30) != 0 {
		t.Fatal("a capacity without pods or prompts")
	}
}

func TestFlowConfig(t *testing.T) {
	classed := &workload.Workload{Classes: []workload.Class{{Name: "fast", Objective: time.Second}, {Name: "slow", Objective: time.Minute}},
		Sessions: []workload.Session{{Turns: []workload.Turn{{Class: "fast"}, {Class: "slow"}}}}}
	plain := &workload.Workload{Sessions: []workload.Session{{Turns: []workload.Turn{{}}}}}
	for _, tc := range []struct {
		name         string
		w            *workload.Workload
		given        []flow.Class
		want         string // the classes, name=objective
		defaultClass string
		err          string
	}{
		{"the workload's", classed, nil, "fast=1s slow=1m0s", "slow", ""},
		{"given", classed, []flow.Class{{Name: "slow", Objective: 10 * time.Second}, {Name: "fast", Objective: 2 * time.Second}}, "slow=10s fast=2s", "fast", ""},
		{"none named: the default", plain, nil, "interactive=2s batch=1m0s", "interactive", ""},
		{"given without one the workload names", classed, []flow.Class{{Name: "fast", Objective: time.Second}}, "", "", `name class "slow"`},
		{"a bad objective", plain, []flow.Class{{Name: "x", Objective: -time.Second}}, "", "", "must not be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := FlowConfig(tc.w, tc.given, map[string]float64{"t": 2})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, c := range cfg.Classes {
				got = append(got, c.Name+"="+c.Objective.String())
			}
			if strings.Join(got, " ") != tc.want || cfg.DefaultClass != tc.defaultClass || cfg.Shares["t"] != 2 {
				t.Fatalf("classes %v, default %q, shares %v; want %s, %q", got, cfg.DefaultClass, cfg.Shares, tc.want, tc.defaultClass)
			}
		})
	}
}

// overloadRun is a small overload on the des engine, flow control on and
// off: two pods at one and then four times their capacity (500-token
// prompts, 10 output tokens), one request in four interactive.
func overloadRun(t *testing.T) *report.Results {
	t.Helper()
	prof, err := sim.LookupProfile("h100x2-32b")
	if err != nil {
		t.Fatal(err)
	}
	capacity := Capacity(prof, 2, 500, 10)
	spec := workload.Spec{Kind: workload.KindOverload, Seed: 3, Vocab: workload.Bytes, InputTokens: 500, OutputTokens: 10,
		Loads: []float64{1, 4}, StageDuration: 4 * time.Second, Arrival: workload.Poisson,
		Classes: []workload.Class{{Name: "interactive", Objective: time.Second, Share: 0.25}, {Name: "batch", Objective: 5 * time.Second, Share: 0.75}},
		Tenants: []workload.Tenant{{Name: "a", Weight: 5}, {Name: "b", Weight: 1}, {Name: "c", Weight: 1}}}
	w, err := workload.Build(spec, workload.Limits{Capacity: capacity})
	if err != nil {
		t.Fatal(err)
	}
	line, err := FlowConfig(w, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(context.Background(), Options{Workload: w, Policies: []string{"precise", Oracle}, Seed: 1, Engine: EngineDES,
		Fleet: sim.Config{Pods: 2, Profile: prof, TimeScale: 5}, Drain: 10 * time.Second,
		FlowControl: []bool{true, false}, Admission: brain.AdmissionConfig{Line: line}})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestOverloadResults checks results.json's flow-control fields for each
// row: every request ends answered, shed or unfinished (nothing lost),
// sheds are counted as errors of kind shed and only with flow control on,
// and each class and tenant has its figures.
func TestOverloadResults(t *testing.T) {
	res := overloadRun(t)
	if got := strings.Join(res.Order, ","); got != "precise/fc-on,precise/fc-off,oracle" {
		t.Fatalf("rows %s", got)
	}
	fc := res.FlowControl
	if fc == nil || strings.Join(fc.Arms, ",") != "on,off" || len(fc.Classes) != 2 || fc.BudgetS != 0.5 {
		t.Fatalf("flow control %+v", fc)
	}
	n := res.Workload["requests"].(int)
	for _, tc := range []struct {
		row, arm string
		sheds    bool
	}{
		{"precise/fc-on", "on", true},
		{"precise/fc-off", "off", false},
		{"oracle", "", false},
	} {
		t.Run(tc.row, func(t *testing.T) {
			p := res.Policies[tc.row]
			if p.FlowControl != tc.arm || p.GoodputPerS == nil || len(p.FlowByStage) != 2 {
				t.Fatalf("arm %q, goodput %v, %d steps", p.FlowControl, p.GoodputPerS, len(p.FlowByStage))
			}
			answered := p.Requests - p.Errors
			shed, unfinished := p.ErrorKinds[report.ErrShed], p.ErrorKinds[errUnfinished]
			if p.Requests != n || answered+shed+unfinished != n {
				t.Fatalf("%d sent, %d records: %d answered + %d shed + %d unfinished (errors %v)", n, p.Requests, answered, shed, unfinished, p.ErrorKinds)
			}
			if (shed > 0) != tc.sheds || p.Shed != shed {
				t.Fatalf("%d shed (%d refused for load), want sheds %v", shed, p.Shed, tc.sheds)
			}
			total := 0
			for _, c := range []string{"interactive", "batch"} {
				cs := p.ByPriority[c]
				if cs == nil || cs.Requests == 0 || cs.SLOTTFTS == 0 {
					t.Fatalf("class %s: %+v", c, cs)
				}
				total += cs.Requests
			}
			if total != n || len(p.ByTenant) != 3 {
				t.Fatalf("%d requests over the classes, %d tenants", total, len(p.ByTenant))
			}
			for name, ts := range p.ByTenant {
				if ts.DemandedTokens <= 0 || ts.ServedTokens > ts.DemandedTokens {
					t.Fatalf("tenant %s: %+v", name, ts)
				}
			}
			if !tc.sheds && p.ByTenant["b"].ServedFraction != 1 && unfinished == 0 {
				t.Fatalf("tenant b served %v without flow control", p.ByTenant["b"].ServedFraction)
			}
		})
	}
}

// TestFlowReportRendersInChromium: the report of an overload run, flow
// control on and off, draws goodput and each class's TTFT p90 over the
// ladder's steps for both arms, in headless Chromium.
func TestFlowReportRendersInChromium(t *testing.T) {
	res := overloadRun(t)
	path, err := res.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	got := renderInChromium(t, path)
	if len(got.Problems) > 0 {
		t.Fatalf("the page logged or requested:\n%s", strings.Join(got.Problems, "\n"))
	}
	want := []string{"precise/fc-on", "precise/fc-off", "oracle"}
	for _, id := range []string{"goodput-by-stage", "ttft-p90-interactive", "ttft-p90-batch"} {
		found := false
		for _, c := range got.Charts {
			if c.ID != id {
				continue
			}
			found = true
			if !slices.Equal(c.Drawn, want) || c.Width < 200 || c.Height < 100 {
				t.Fatalf("%s chart %+v, want %v drawn", id, c, want)
			}
		}
		if !found {
			t.Fatalf("no %s chart", id)
		}
	}
}
