package bench

import (
	"fmt"
	"strings"

	"github.com/prefixrouter/prefixrouter/bench/report"
	"github.com/prefixrouter/prefixrouter/bench/workload"
	"github.com/prefixrouter/prefixrouter/flow"
	"github.com/prefixrouter/prefixrouter/sim"
)

// ParseFlowControl reads --flow-control: on, off, or both in the order
// they run (on,off), each policy running once per arm.
func ParseFlowControl(s string) ([]bool, error) {
	var out []bool
	for f := range strings.SplitSeq(s, ",") {
		var on bool
		switch strings.TrimSpace(f) {
		case "on":
			on = true
		case "off":
		default:
			return nil, fmt.Errorf("flow control %q: want on, off, or on,off", f)
		}
		for _, o := range out {
			if o == on {
				return nil, fmt.Errorf("flow control %q: %s named twice", s, strings.TrimSpace(f))
			}
		}
		out = append(out, on)
	}
	return out, nil
}

// armName is an arm as the results name it.
func armName(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// Capacity is the requests per second pods of profile p serve at
// saturation when every request is a prompt of prompt tokens, none of
// them cached, and output tokens: the rate of a pod whose every step
// fills the token budget (docs/benchmark.md, "The overload workload").
//
// At saturation a pod's steps run back to back, each finishing c prompts'
// prefill and carrying the c × (output − 1) requests decoding: c × (prompt
// + output − 1) tokens, at most the step's budget, c × (output − 1)
// sequences, at most max_num_seqs, and their KV (each holding its prompt
// and half its output on average), at most the cache. c is the largest
// the three bounds allow; a step takes StepFixed + c × prompt ×
// PrefillPerToken + c × (output − 1) × DecodePerSeq, and the pod answers c
// requests a step.
func Capacity(p sim.Profile, pods, prompt, output int) float64 {
	if pods <= 0 || prompt <= 0 || output <= 0 {
		return 0
	}
	P, D := float64(prompt), float64(output-1)
	c := float64(p.MaxNumBatchedTokens) / (P + D)
	if D > 0 {
		c = min(c, float64(p.MaxNumSeqs)/D, float64(p.KVTokens())/(D*(P+float64(output)/2)))
	}
	step := p.StepFixed.Seconds() + c*P*p.PrefillPerToken.Seconds() + c*D*p.DecodePerSeq.Seconds()
	return float64(pods) * c / step
}

// FlowConfig is flow control's line for a workload: the classes it
// names, objectives and priorities as given (highest first), else the
// workload's own, else flow.DefaultConfig's; the tenants' shares as
// given. It fails when a request names a class the line has not.
func FlowConfig(w *workload.Workload, classes []flow.Class, shares map[string]float64) (flow.Config, error) {
	cfg := flow.DefaultConfig()
	switch {
	case len(classes) > 0:
		cfg.Classes = classes
	case len(w.Classes) > 0:
		cfg.Classes = nil
		for _, c := range w.Classes {
			cfg.Classes = append(cfg.Classes, flow.Class{Name: c.Name, Objective: c.Objective})
		}
	}
	if cfg.ClassIndex(cfg.DefaultClass) < 0 {
		// The lowest class: a request that names none claims no
		// priority.
		cfg.DefaultClass = cfg.Classes[len(cfg.Classes)-1].Name
	}
	cfg.Shares = shares
	if err := cfg.Validate(); err != nil {
		return cfg, err
	}
	for i := range w.Sessions {
		for _, t := range w.Sessions[i].Turns {
			if t.Class != "" && cfg.ClassIndex(t.Class) < 0 {
				return cfg, fmt.Errorf("--slo-ttft: the workload's requests name class %q, which it does not give", t.Class)
			}
		}
	}
	return cfg, nil
}

// flowResults is what results.json records of the run's flow control;
// its budget is the routers' own (des.Result.Budget) once a run with flow
// control on reports it.
func (o *Options) flowResults() *report.FlowControl {
	a := o.Admission
	fc := &report.FlowControl{DefaultClass: a.Line.DefaultClass, Shares: a.Line.Shares, BudgetS: a.Budget.Seconds(),
		MaxRequests: a.Line.MaxRequests, MaxTokens: a.Line.MaxTokens}
	for _, on := range o.FlowControl {
		fc.Arms = append(fc.Arms, armName(on))
	}
	for _, c := range a.Line.Classes {
		fc.Classes = append(fc.Classes, report.FlowClass{Name: c.Name, ObjectiveS: c.Objective.Seconds()})
	}
	return fc
}
