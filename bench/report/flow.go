package report

import "slices"

// FlowControl is the run's flow control as results.json records it: the
// arms each policy ran with, the priority classes with their TTFT
// objectives (highest first), the tenants' weights and the admission's
// budget and bounds.
type FlowControl struct {
	// Arms are "on" (requests admitted through the router's line) and
	// "off" (every request dispatched at once), in the order they ran.
	Arms         []string           `json:"arms"`
	Classes      []FlowClass        `json:"classes"`
	DefaultClass string             `json:"default_class"`
	Shares       map[string]float64 `json:"tenant_shares,omitempty"`
	// BudgetS is the queued prefill, in seconds at a pod's pace, past
	// which a pod takes no more and requests wait in the router.
	BudgetS     float64 `json:"dispatch_budget_s"`
	MaxRequests int     `json:"queue_max_requests"`
	MaxTokens   int64   `json:"queue_max_tokens"`
}

// FlowClass is one priority class and its TTFT objective (0: none).
type FlowClass struct {
	Name       string  `json:"name"`
	ObjectiveS float64 `json:"slo_ttft_s"`
}

// ClassSummary is one priority class's requests.
type ClassSummary struct {
	Requests int `json:"requests"`
	Answered int `json:"answered"`
	// WithinSLO counts the answers whose TTFT was within the objective.
	WithinSLO int `json:"within_slo"`
	// GoodputPerS is WithinSLO per model second of the run (DurationS).
	GoodputPerS float64 `json:"goodput_per_s"`
	TTFT        Dist    `json:"ttft_s"`
	SLOTTFTS    float64 `json:"slo_ttft_s"`
	// Shed counts the requests flow control refused, by reason in
	// ShedReasons; Queued those that waited in the line (answered, shed
	// or unfinished), QueueS how long the answered ones waited.
	Shed        int            `json:"shed"`
	ShedReasons map[string]int `json:"shed_reasons,omitempty"`
	Queued      int            `json:"queued"`
	QueueS      Dist           `json:"queue_s"`
}

// TenantSummary is what one tenant asked of the fleet and got.
type TenantSummary struct {
	Weight   float64 `json:"weight"`
	Requests int     `json:"requests"`
	Answered int     `json:"answered"`
	Shed     int     `json:"shed"`
	// DemandedTokens is the prompt and max tokens of every request the
	// tenant sent; ServedTokens the prompt and output tokens of those
	// answered; ServedFraction the one over the other.
	DemandedTokens int64   `json:"demanded_tokens"`
	ServedTokens   int64   `json:"served_tokens"`
	ServedFraction float64 `json:"served_fraction"`
	// FairShareTokens is the tenant's weighted share of every tenant's
	// served tokens: weight / the weights' sum × their served tokens.
	// WithinFairShare says it demanded no more than that.
	FairShareTokens float64 `json:"fair_share_tokens"`
	WithinFairShare bool    `json:"within_fair_share"`
}

// StageFlow is one ladder step's requests under flow control's classes:
// the answers within their objective per second of the step, the sheds,
// and each class's TTFT p90.
type StageFlow struct {
	Stage       int                `json:"stage"`
	Rate        float64            `json:"rate"`
	GoodputPerS float64            `json:"goodput_per_s"`
	Shed        int                `json:"shed"`
	TTFTP90     map[string]float64 `json:"ttft_p90_s"`
}

// Objective is class's TTFT objective in seconds (0: none, or no such
// class).
func (fc *FlowControl) Objective(class string) float64 {
	if i := slices.IndexFunc(fc.Classes, func(c FlowClass) bool { return c.Name == class }); i >= 0 {
		return fc.Classes[i].ObjectiveS
	}
	return 0
}

// weight is tenant's share weight (1 when not named).
func (fc *FlowControl) weight(tenant string) float64 {
	if w, ok := fc.Shares[tenant]; ok {
		return w
	}
	return 1
}

// Good reports whether r is an answer within its class's objective (any
// answer, for a class without one).
func (fc *FlowControl) Good(r *Record) bool {
	if r.Failed() {
		return false
	}
	obj := fc.Objective(r.Class)
	return obj <= 0 || r.TTFT <= obj
}

// SummarizeFlow fills p's flow-control figures from its records (p as
// Summarize made it): the goodput, each class's and each tenant's
// summary, and each ladder step's (stages: the run's ladder, empty
// without one).
func SummarizeFlow(p *Policy, recs []Record, fc *FlowControl, stages []StageSpan) {
	if fc == nil {
		return
	}
	good := 0
	classes := map[string]*ClassSummary{}
	ttft := map[string][]float64{}
	queue := map[string][]float64{}
	tenants := map[string]*TenantSummary{}
	for i := range recs {
		r := &recs[i]
		c := classes[r.Class]
		if c == nil {
			c = &ClassSummary{SLOTTFTS: fc.Objective(r.Class)}
			classes[r.Class] = c
		}
		c.Requests++
		if r.Queued {
			c.Queued++
		}
		var t *TenantSummary
		if r.Tenant != "" {
			if t = tenants[r.Tenant]; t == nil {
				t = &TenantSummary{Weight: fc.weight(r.Tenant)}
				tenants[r.Tenant] = t
			}
			t.Requests++
			t.DemandedTokens += int64(r.Demand)
		}
		switch {
		case r.Err == ErrShed:
			c.Shed++
			if c.ShedReasons == nil {
				c.ShedReasons = map[string]int{}
			}
			c.ShedReasons[r.ShedReason]++
			if t != nil {
				t.Shed++
			}
		case !r.Failed():
			c.Answered++
			ttft[r.Class] = append(ttft[r.Class], r.TTFT)
			queue[r.Class] = append(queue[r.Class], r.QueueS)
			if fc.Good(r) {
				c.WithinSLO++
				good++
			}
			if t != nil {
				t.Answered++
				t.ServedTokens += int64(r.PromptTokens + r.OutputTokens)
			}
		}
	}
	span := p.DurationS
	rate := func(n int) float64 {
		if span <= 0 {
			return 0
		}
		return float64(n) / span
	}
	g := rate(good)
	p.GoodputPerS = &g
	p.ByPriority = classes
	for name, c := range classes {
		c.TTFT, c.QueueS = dist(ttft[name]), dist(queue[name])
		c.GoodputPerS = rate(c.WithinSLO)
	}
	if len(tenants) > 0 {
		var served int64
		weights := 0.0
		for _, t := range tenants {
			served += t.ServedTokens
			weights += t.Weight
		}
		for _, t := range tenants {
			t.FairShareTokens = t.Weight / weights * float64(served)
			t.WithinFairShare = float64(t.DemandedTokens) <= t.FairShareTokens
			if t.DemandedTokens > 0 {
				t.ServedFraction = float64(t.ServedTokens) / float64(t.DemandedTokens)
			}
		}
		p.ByTenant = tenants
	}
	p.FlowByStage = flowByStage(recs, fc, stages)
}

// flowByStage is each ladder step's goodput, sheds and per-class TTFT
// p90, by the step the requests arrived in.
func flowByStage(recs []Record, fc *FlowControl, stages []StageSpan) []StageFlow {
	if len(stages) == 0 {
		return nil
	}
	out := make([]StageFlow, len(stages))
	ttft := make([]map[string][]float64, len(stages))
	for i, s := range stages {
		out[i] = StageFlow{Stage: i, Rate: s.Rate, TTFTP90: map[string]float64{}}
		ttft[i] = map[string][]float64{}
	}
	for i := range recs {
		r := &recs[i]
		if r.Stage < 0 || r.Stage >= len(stages) {
			continue
		}
		st := &out[r.Stage]
		switch {
		case r.Err == ErrShed:
			st.Shed++
		case !r.Failed():
			ttft[r.Stage][r.Class] = append(ttft[r.Stage][r.Class], r.TTFT)
			if fc.Good(r) {
				st.GoodputPerS++
			}
		}
	}
	for i, s := range stages {
		if d := s.End - s.Start; d > 0 {
			out[i].GoodputPerS /= d
		}
		for class, xs := range ttft[i] {
			out[i].TTFTP90[class] = dist(xs).P90
		}
	}
	return out
}
