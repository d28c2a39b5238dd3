package workload

import (
	"fmt"
	"math"
	"slices"
)

// Overload is flow control's workload: prompts that share nothing
// (InputTokens ± half, uniformly, as Random's) on a ladder that runs from
// below the fleet's capacity to past it, each request of a priority class
// (drawn by the classes' shares) and charged to a tenant (drawn by the
// tenants' weights). What it shows is what a router does once the pods
// cannot keep up: which requests still meet their class's objective, which
// are refused, and whether a tenant that sends more than its share takes
// the fleet from the others.
type Overload struct {
	Common
	InputTokens, OutputTokens int
	Stages                    []Stage
	Arrival                   Arrival
	// Classes are the priority classes, highest first; their shares need
	// not sum to 1 (they are weights).
	Classes []Class
	Tenants []Tenant
	// Capacity is the fleet's capacity the ladder was sized by (requests
	// per second; 0: not known), recorded with the workload.
	Capacity float64
}

// Generate makes the workload.
func (p Overload) Generate() (*Workload, error) {
	if p.InputTokens < 2 || p.OutputTokens < 1 {
		return nil, fmt.Errorf("overload: the input length must be at least 2 and the output length positive")
	}
	if err := checkStages(p.Stages); err != nil {
		return nil, fmt.Errorf("overload: %w", err)
	}
	if len(p.Classes) == 0 || len(p.Tenants) == 0 {
		return nil, fmt.Errorf("overload: at least one class and one tenant")
	}
	classW := make([]float64, len(p.Classes))
	for i, c := range p.Classes {
		if c.Name == "" || !(c.Share > 0) || math.IsInf(c.Share, 0) || c.Objective < 0 {
			return nil, fmt.Errorf("overload: class %q: a name, a positive share and an objective not negative", c.Name)
		}
		if slices.IndexFunc(p.Classes[:i], func(o Class) bool { return o.Name == c.Name }) >= 0 {
			return nil, fmt.Errorf("overload: class %q given twice", c.Name)
		}
		classW[i] = c.Share
	}
	tenantW := make([]float64, len(p.Tenants))
	for i, t := range p.Tenants {
		if t.Name == "" || !(t.Weight > 0) || math.IsInf(t.Weight, 0) {
			return nil, fmt.Errorf("overload: tenant %q: a name and a positive weight", t.Name)
		}
		if slices.IndexFunc(p.Tenants[:i], func(o Tenant) bool { return o.Name == t.Name }) >= 0 {
			return nil, fmt.Errorf("overload: tenant %q given twice", t.Name)
		}
		tenantW[i] = t.Weight
	}
	tx := p.texter()
	rng := p.rng(6)
	at, stage := arrivals(rng, p.Stages, p.Arrival)
	classes := make([]map[string]any, len(p.Classes))
	for i, c := range p.Classes {
		classes[i] = map[string]any{"name": c.Name, "slo_ttft_s": c.Objective.Seconds(), "share": c.Share}
	}
	tenants := make([]map[string]any, len(p.Tenants))
	for i, t := range p.Tenants {
		tenants[i] = map[string]any{"name": t.Name, "weight": t.Weight}
	}
	w := &Workload{Name: KindOverload, Stages: p.Stages, Classes: slices.Clone(p.Classes), Params: map[string]any{
		"input_tokens": p.InputTokens, "output_tokens": p.OutputTokens, "arrival": string(p.Arrival),
		"stages": stageParams(p.Stages), "seed": p.Seed, "vocab": string(p.Vocab),
		"classes": classes, "tenants": tenants,
	}}
	if p.Capacity > 0 {
		w.Params["capacity_per_s"] = math.Round(p.Capacity*100) / 100
		loads := make([]float64, len(p.Stages))
		for i, st := range p.Stages {
			loads[i] = math.Round(st.Rate/p.Capacity*100) / 100
		}
		w.Params["loads"] = loads
	}
	for i, t := range at {
		n := p.InputTokens/2 + rng.IntN(p.InputTokens+1)
		c, tn := pick(rng.Float64(), classW), pick(rng.Float64(), tenantW)
		w.Sessions = append(w.Sessions, Session{Start: t, Group: -1, Turns: []Turn{{
			Parts: []string{tx.text(kindOverload, uint64(i), n)}, MaxTokens: p.OutputTokens, Stage: stage[i],
			Class: p.Classes[c].Name, Tenant: p.Tenants[tn].Name,
		}}})
	}
	return w, nil
}

// pick is the index u (uniform in [0, 1)) falls on when [0, 1) is cut in
// proportion to the weights.
func pick(u float64, weights []float64) int {
	sum := 0.0
	for _, w := range weights {
		sum += w
	}
	acc := 0.0
	for i, w := range weights {
		acc += w / sum
		if u < acc {
			return i
		}
	}
	return len(weights) - 1
}
