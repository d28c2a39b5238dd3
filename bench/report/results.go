package report

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
)

// Record is what one request measured, times in model seconds.
type Record struct {
	Session, Turn int
	// Group is the workload's sharing group (-1: none); Stage the ladder
	// stage (-1: none).
	Group, Stage int
	// Sent is when the request left, from the run's start.
	Sent float64
	// TTFT is to the first streamed token, E2E to the end of the stream;
	// both zero when the request failed.
	TTFT, E2E float64
	// PromptTokens and CachedTokens are the server's usage;
	// OutputTokens the tokens it generated.
	PromptTokens, CachedTokens, OutputTokens int
	// Pod served the request ("" when unknown).
	Pod string
	// Status is the HTTP status (0: no answer); Err says why it failed.
	Status int
	Err    string
	// APIError is the type of the OpenAI-shaped error a failed request
	// ended in ("" when it ended in none).
	APIError string
	// Class is the request's priority class (flow control's; "" when the
	// run has none) and Tenant whom it was charged to ("": none). Demand
	// is the tokens it asked for: its prompt and its max tokens.
	Class, Tenant string
	Demand        int
	// Queued says it waited in the router's line (flow control), QueueS
	// for how long; ShedReason is why the router refused it (Err is
	// ErrShed then).
	Queued     bool
	QueueS     float64
	ShedReason string
}

// ErrShed is the error of a request the router's flow control refused
// (a 429): its error kind in error_kinds.
const ErrShed = "shed"

// Failed reports a request without a complete answer.
func (r *Record) Failed() bool { return r.Err != "" }

// Shed reports a request the server refused for load (429 or 503).
func (r *Record) Shed() bool { return r.Status == 429 || r.Status == 503 }

// Results is results.json: the run and one summary per policy.
type Results struct {
	// Workload is the workload's name and parameters.
	Workload map[string]any `json:"workload"`
	// Engine is "live" (simulated pods on loopback), "des" (the same pods
	// and routing code in virtual time) or "target" (an endpoint given by
	// URL).
	Engine string `json:"engine"`
	Seed   uint64 `json:"seed"`
	// TimeScale is model seconds per wall second; every time here is in
	// model seconds.
	TimeScale float64 `json:"time_scale"`
	// Fleet describes the simulated pods (live engine) or the target.
	Fleet map[string]any `json:"fleet"`
	// Order is the policies in the order they ran.
	Order    []string           `json:"policy_order"`
	Policies map[string]*Policy `json:"policies"`
	// Notes are what a reader must know to trust the figures (lag of the
	// simulator, prompts cut, requests unfinished at the bound).
	Notes []string `json:"notes,omitempty"`
	// Stages are the rate ladder's steps (rate per model second, start
	// and end in model seconds), empty without a ladder.
	Stages []StageSpan `json:"stages,omitempty"`
	// FlowControl is the routers' flow control (des engine): its arms,
	// classes and shares.
	FlowControl *FlowControl `json:"flow_control,omitempty"`
	// Command is the command line that made the results.
	Command string `json:"command,omitempty"`
	// Date is when the run started (RFC 3339).
	Date string `json:"date,omitempty"`
}

// StageSpan is one step of a ladder on the run's clock.
type StageSpan struct {
	Rate  float64 `json:"rate"`
	Start float64 `json:"start_s"`
	End   float64 `json:"end_s"`
}

// Dist summarizes a latency distribution in model seconds.
type Dist struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
}

// Policy is one policy's summary.
type Policy struct {
	Requests int `json:"requests"`
	// Errors counts requests without a complete answer, Shed the part of
	// them the server refused for load (429, 503).
	Errors int  `json:"errors"`
	Shed   int  `json:"shed"`
	TTFT   Dist `json:"ttft_s"`
	E2E    Dist `json:"e2e_s"`
	// OutputTokensPerS is the output tokens of complete requests over the
	// run's span, first send to last answer.
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
	// CacheHitRate is CachedTokens / PromptTokens as the server reports
	// them (usage.prompt_tokens_details.cached_tokens).
	CacheHitRate float64 `json:"cache_hit_rate"`
	PromptTokens int64   `json:"prompt_tokens"`
	CachedTokens int64   `json:"cached_tokens"`
	// PodShare is each pod's fraction of the answered requests.
	PodShare map[string]float64 `json:"pod_share,omitempty"`
	// Speculative is the speculative policy's funnel, rates and TTL; absent
	// for the others.
	Speculative *Speculative `json:"speculative,omitempty"`
	// Pairs is the paired-gap workload's matrix, cell by cell.
	Pairs []Pair `json:"pairs,omitempty"`
	// Holder counts, in a burst workload, the requests after a burst's
	// first that reached the pod the first one went to.
	Holder *Holder `json:"holder,omitempty"`
	// Faults is the faults workload's account: how every request ended
	// and how fast the router's view of each faulted pod converged back.
	Faults *Faults `json:"faults,omitempty"`

	// DurationS is the run's span in model seconds.
	DurationS float64 `json:"duration_s"`
	// ErrorKinds counts the errors by what went wrong.
	ErrorKinds map[string]int `json:"error_kinds,omitempty"`
	// SimLagMaxS is the longest the simulated pods' model clock trailed
	// the wall clock (live engine): above a few hundredths of a second the
	// machine, not the policy, shaped the latencies.
	SimLagMaxS float64 `json:"sim_lag_max_s,omitempty"`
	// Preemptions is the simulated pods' preemptions.
	Preemptions int64 `json:"preemptions,omitempty"`
	// Routers is the number of router replicas the clients were spread
	// over (des engine; 0: one).
	Routers int `json:"routers,omitempty"`
	// DecisionUS is the wall time, in microseconds, each routed request's
	// decision and dispatch bookkeeping took inside the run (des engine:
	// the router's own cost per request, free of HTTP).
	DecisionUS *Dist `json:"decision_us,omitempty"`
	// WallS is the wall time the run took (des engine).
	WallS float64 `json:"wall_s,omitempty"`

	// Policy is the routing policy of the row and FlowControl its arm,
	// "on" or "off" (des engine; absent for the oracle, which has no
	// router).
	Policy      string `json:"policy,omitempty"`
	FlowControl string `json:"flow_control,omitempty"`
	// GoodputPerS is the answers within their class's TTFT objective per
	// model second of the run (DurationS); ByPriority each class's
	// requests, ByTenant each tenant's, FlowByStage each ladder step's
	// (SummarizeFlow; absent without flow control's classes).
	GoodputPerS *float64                  `json:"goodput_per_s,omitempty"`
	ByPriority  map[string]*ClassSummary  `json:"by_priority,omitempty"`
	ByTenant    map[string]*TenantSummary `json:"by_tenant,omitempty"`
	FlowByStage []StageFlow               `json:"flow_by_stage,omitempty"`

	// TTFTCDF is the TTFT distribution as (seconds, fraction) points;
	// TTFTOverTime the TTFT p50 and p90 of requests sent in each slice of
	// the run, for the report's charts.
	TTFTCDF      [][2]float64 `json:"ttft_cdf"`
	TTFTOverTime []TimeBin    `json:"ttft_over_time"`
	// TTFTByStage is the TTFT of the answered requests that arrived in each
	// step of the ladder, and their output tokens per second of the step
	// (absent without a ladder).
	TTFTByStage []StageTTFT `json:"ttft_by_stage,omitempty"`
}

// StageTTFT is one ladder step's requests: how many were answered, their
// TTFT, and their output tokens over the step's span.
type StageTTFT struct {
	Stage    int     `json:"stage"`
	Answered int     `json:"answered"`
	TTFT     Dist    `json:"ttft_s"`
	Output   float64 `json:"output_tokens"`
}

// Holder is how many followers (a burst's requests after its first, by
// send time) reached the pod that served the first.
type Holder struct {
	Followers int `json:"followers"`
	OnHolder  int `json:"on_holder"`
}

// HolderOf counts, over every group, the answered requests after the
// group's first that went to the first one's pod; nil without groups.
func HolderOf(recs []Record) *Holder {
	first := map[int]*Record{}
	for i := range recs {
		r := &recs[i]
		if r.Group < 0 || r.Failed() {
			continue
		}
		if f := first[r.Group]; f == nil || r.Sent < f.Sent {
			first[r.Group] = r
		}
	}
	if len(first) == 0 {
		return nil
	}
	h := &Holder{}
	for i := range recs {
		r := &recs[i]
		f := first[r.Group]
		if r.Group < 0 || r.Failed() || f == nil || f == r {
			continue
		}
		h.Followers++
		if r.Pod == f.Pod {
			h.OnHolder++
		}
	}
	return h
}

// TimeBin is the TTFT of the requests sent in one slice of the run.
type TimeBin struct {
	Start    float64 `json:"start_s"`
	Requests int     `json:"requests"`
	P50      float64 `json:"p50"`
	P90      float64 `json:"p90"`
}

// Summarize makes a policy's summary from its records.
func Summarize(recs []Record) *Policy {
	p := &Policy{Requests: len(recs)}
	var ttft, e2e []float64
	pods := map[string]int{}
	answered := 0
	first, last := math.Inf(1), math.Inf(-1)
	var outTokens int64
	for i := range recs {
		r := &recs[i]
		first = math.Min(first, r.Sent)
		if r.Failed() {
			p.Errors++
			if r.Shed() {
				p.Shed++
			}
			if p.ErrorKinds == nil {
				p.ErrorKinds = map[string]int{}
			}
			p.ErrorKinds[r.Err]++
			continue
		}
		answered++
		ttft = append(ttft, r.TTFT)
		e2e = append(e2e, r.E2E)
		last = math.Max(last, r.Sent+r.E2E)
		outTokens += int64(r.OutputTokens)
		p.PromptTokens += int64(r.PromptTokens)
		p.CachedTokens += int64(r.CachedTokens)
		if r.Pod != "" {
			pods[r.Pod]++
		}
	}
	p.TTFT, p.E2E = dist(ttft), dist(e2e)
	if last > first {
		p.DurationS = last - first
		p.OutputTokensPerS = float64(outTokens) / p.DurationS
	}
	if p.PromptTokens > 0 {
		p.CacheHitRate = float64(p.CachedTokens) / float64(p.PromptTokens)
	}
	if len(pods) > 0 {
		p.PodShare = map[string]float64{}
		for pod, n := range pods {
			p.PodShare[pod] = float64(n) / float64(answered)
		}
	}
	p.TTFTCDF = cdf(ttft, 200)
	p.TTFTOverTime = overTime(recs, 40)
	p.TTFTByStage = byStage(recs)
	return p
}

// byStage summarizes the answered requests of each ladder step.
func byStage(recs []Record) []StageTTFT {
	ttft := map[int][]float64{}
	out := map[int]float64{}
	last := -1
	for i := range recs {
		r := &recs[i]
		if r.Stage < 0 || r.Failed() {
			continue
		}
		ttft[r.Stage] = append(ttft[r.Stage], r.TTFT)
		out[r.Stage] += float64(r.OutputTokens)
		last = max(last, r.Stage)
	}
	var st []StageTTFT
	for s := 0; s <= last; s++ {
		if len(ttft[s]) > 0 {
			st = append(st, StageTTFT{Stage: s, Answered: len(ttft[s]), TTFT: dist(ttft[s]), Output: out[s]})
		}
	}
	return st
}

// DistOf sorts xs and summarizes it as every distribution of the results
// is.
func DistOf(xs []float64) Dist { return dist(xs) }

// dist sorts xs and summarizes it.
func dist(xs []float64) Dist {
	if len(xs) == 0 {
		return Dist{}
	}
	slices.Sort(xs)
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return Dist{Mean: sum / float64(len(xs)), P50: quantile(xs, 0.5), P90: quantile(xs, 0.9), P99: quantile(xs, 0.99)}
}

// quantile of sorted xs, the nearest rank (the smallest x with at least q
// of the values at or below it).
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// cdf is at most n points of the empirical CDF of sorted xs, always
// keeping the first and the last.
func cdf(sorted []float64, n int) [][2]float64 {
	if len(sorted) == 0 {
		return [][2]float64{}
	}
	step := max(1, len(sorted)/n)
	var out [][2]float64
	for i := 0; i < len(sorted); i += step {
		out = append(out, [2]float64{sorted[i], float64(i+1) / float64(len(sorted))})
	}
	if lastX := sorted[len(sorted)-1]; out[len(out)-1][1] != 1 {
		out = append(out, [2]float64{lastX, 1})
	}
	return out
}

// overTime bins the answered requests by send time into n slices of the
// run.
func overTime(recs []Record, n int) []TimeBin {
	end := 0.0
	for _, r := range recs {
		end = math.Max(end, r.Sent)
	}
	if end == 0 {
		end = 1
	}
	width := end / float64(n)
	groups := make([][]float64, n)
	for _, r := range recs {
		if r.Failed() {
			continue
		}
		i := min(int(r.Sent/width), n-1)
		groups[i] = append(groups[i], r.TTFT)
	}
	out := []TimeBin{}
	for i, g := range groups {
		if len(g) == 0 {
			continue
		}
		slices.Sort(g)
		out = append(out, TimeBin{Start: float64(i) * width, Requests: len(g), P50: quantile(g, 0.5), P90: quantile(g, 0.9)})
	}
	return out
}

// PodNames lists the pods that served any policy, sorted naturally
// (pod-2 before pod-10).
func (r *Results) PodNames() []string {
	seen := map[string]bool{}
	for _, p := range r.Policies {
		for pod := range p.PodShare {
			seen[pod] = true
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := names[i], names[j]
		if len(a) != len(b) {
			return len(a) < len(b)
		}
		return a < b
	})
	return names
}

// Write saves results.json and report.html in dir (created if needed) and
// returns the report's path.
func (r *Results) Write(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("results directory: %w", err)
	}
	raw, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return "", fmt.Errorf("results.json: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(raw, '\n'), 0o644); err != nil {
		return "", fmt.Errorf("results.json: %w", err)
	}
	page, err := HTML(r)
	if err != nil {
		return "", fmt.Errorf("report.html: %w", err)
	}
	path := filepath.Join(dir, "report.html")
	if err := os.WriteFile(path, page, 0o644); err != nil {
		return "", fmt.Errorf("report.html: %w", err)
	}
	return path, nil
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, cmp.Compare)
	return keys
}
