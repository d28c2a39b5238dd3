package report

import (
	"fmt"
	"math"
)

// Speculative is the speculative policy's predicted placements at the end
// of its run, read from the router's own view (what GET /debug/speculative
// serves), every time converted to model seconds.
type Speculative struct {
	// Settled says every cohort had matured when the view was read: the
	// mature counts then cover every prediction of the run. Otherwise
	// Immature predictions are left out of them.
	Settled  bool       `json:"settled"`
	Immature int64      `json:"immature_predictions"`
	Funnel   SpecFunnel `json:"funnel"`
	// Mature is every mature cohort of the run, over all pods: predictions
	// (blocks) by outcome and the confirmation rates.
	Mature SpecMature `json:"mature"`
	// ConfirmationS is route-to-confirmation latency (before the deadline)
	// and LateS that of confirmations after it (early expiries).
	ConfirmationS SpecLatency   `json:"confirmation_latency_s"`
	LateS         SpecLatency   `json:"late_confirmation_latency_s"`
	FalseWarm     SpecFalseWarm `json:"false_warm"`
	Pods          []SpecPod     `json:"pods"`
	// HoldbackFraction is the share of conversations routed without
	// predictions; Arms each arm's requests and what the pods reported.
	HoldbackFraction float64   `json:"holdback"`
	Arms             []SpecArm `json:"arms"`
	// IncrementalCachedTokens is the speculative arm's cached tokens minus
	// the holdback's at equal volume (absent while an arm has no reported
	// request): the measured benefit of predictions.
	IncrementalCachedTokens *float64 `json:"incremental_cached_tokens,omitempty"`
	// IncrementalStdErr is its standard error, from the spread between
	// random groups of conversations (absent while an arm's requests fall
	// in fewer than two groups): within two of zero, the run shows no
	// benefit.
	IncrementalStdErr *float64 `json:"incremental_stderr_tokens,omitempty"`
	// IncrementalGroups is the fewest variance groups with requests in an
	// arm: the standard error rests on that many draws.
	IncrementalGroups int `json:"incremental_groups,omitempty"`
}

// IncrementalText says the incremental reuse with its standard error, and
// whether it is told from none, or "" while it is not measured.
func (s *Speculative) IncrementalText() string {
	if s.IncrementalCachedTokens == nil {
		return ""
	}
	inc := *s.IncrementalCachedTokens
	if s.IncrementalStdErr == nil {
		return fmt.Sprintf("%.0f cached tokens (an arm too small for a standard error)", inc)
	}
	se := *s.IncrementalStdErr
	bound := tQuantile975(s.IncrementalGroups - 1)
	verdict := fmt.Sprintf("within %.2f standard errors of none, the 95%% bound for %d groups: no difference shown", bound, s.IncrementalGroups)
	if math.Abs(inc) > bound*se {
		verdict = fmt.Sprintf("beyond %.2f standard errors, the 95%% bound for %d groups", bound, s.IncrementalGroups)
	}
	return fmt.Sprintf("%.0f ± %.0f cached tokens (%s)", inc, se, verdict)
}

// tQuantile975 is Student's t distribution's 0.975 quantile for df degrees
// of freedom: the two-sided 95% bound, in standard errors, of an estimate
// whose spread is measured from df + 1 draws.
func tQuantile975(df int) float64 {
	table := []float64{12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
		2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
		2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042}
	switch {
	case df < 1:
		return math.Inf(1)
	case df <= len(table):
		return table[df-1]
	case df <= 60:
		return 2.000
	}
	return 1.960
}

// SpecFunnel follows predictions (blocks) from insertion to the requests
// routed on them and the cached tokens those requests reported.
type SpecFunnel struct {
	Inserted             uint64 `json:"inserted"`
	Confirmed            uint64 `json:"confirmed"`
	ConfirmedLate        uint64 `json:"confirmed_late"`
	Referenced           uint64 `json:"referenced"`
	Followed             uint64 `json:"followed"`
	FollowerRoutes       uint64 `json:"follower_routes"`
	FollowerCachedTokens uint64 `json:"follower_cached_tokens"`
}

// SpecMature is mature predictions by outcome and the rates over the
// decided ones (confirmed + expired; nil without any).
type SpecMature struct {
	Inserted     int64    `json:"inserted"`
	Confirmed    int64    `json:"confirmed"`
	ExpiredEarly int64    `json:"expired_early"`
	ExpiredStale int64    `json:"expired_stale"`
	Invalidated  int64    `json:"invalidated"`
	Withdrawn    int64    `json:"withdrawn"`
	Unknown      int64    `json:"unknown"`
	BlockRate    *float64 `json:"block_rate"`
	RequestRate  *float64 `json:"request_rate"`
	TokenRate    *float64 `json:"token_rate"`
}

// SpecLatency is a latency sample's size and percentiles (nil without
// samples), model seconds.
type SpecLatency struct {
	Samples int      `json:"samples"`
	P50     *float64 `json:"p50"`
	P95     *float64 `json:"p95"`
	P99     *float64 `json:"p99"`
}

// SpecFalseWarm counts routes made on predictions that expired
// unconfirmed or were withdrawn, and the prefill tokens they cost.
type SpecFalseWarm struct {
	Routes uint64 `json:"routes"`
	Tokens uint64 `json:"tokens"`
}

// SpecPod is one pod's TTL (model seconds) and why, and its trust.
// TTLWhy is the router's own explanation, in the router's wall-clock time
// (model time divided by the time scale), as the report's table says.
type SpecPod struct {
	Pod    string  `json:"pod"`
	TTLS   float64 `json:"ttl_s"`
	TTLWhy string  `json:"ttl_why"`
	Trust  float64 `json:"trust"`
	// BlockRate is the pod's recent mature block-confirmation rate.
	BlockRate *float64 `json:"block_rate"`
}

// SpecArm is one holdback arm.
type SpecArm struct {
	Arm              string   `json:"arm"`
	Requests         int64    `json:"requests"`
	ReportedRequests int64    `json:"reported_requests"`
	PromptTokens     int64    `json:"prompt_tokens"`
	CachedTokens     int64    `json:"cached_tokens"`
	CachedPerRequest *float64 `json:"cached_tokens_per_request"`
	TTFTP50          *float64 `json:"ttft_p50_s"`
	TTFTP90          *float64 `json:"ttft_p90_s"`
}
