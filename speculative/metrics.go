package speculative

import (
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixrouter/prefixrouter/internal/constmetric"
	"github.com/prefixrouter/prefixrouter/internal/lockedhist"
)

// histogram is a Prometheus histogram kept under its owner's lock.
type histogram = lockedhist.Histogram

var newHistogram = lockedhist.New

// Bucket bounds, in seconds.
var (
	latencyBuckets = prometheus.ExponentialBuckets(0.005, 1.5, 20) // 5 ms to 11 s
	ttftBuckets    = prometheus.ExponentialBuckets(1e-3, 2, 18)    // the router's TTFT buckets
)

// Series. Labels are bounded: target (endpoint#rank), model, arm, outcome,
// reason — never prompt text, token ids, hashes or request ids. The
// outcome and token series count mature cohorts only, so that their rates
// leave pending predictions out.
var (
	tm = []string{"target", "model"}

	descInserted = prometheus.NewDesc("prefixrouter_speculative_predictions_inserted_total",
		"Predicted placements inserted (unique per target and block).", tm, nil)
	descOutcomes = prometheus.NewDesc("prefixrouter_speculative_predictions_total",
		"Predictions of mature cohorts by outcome: confirmed, expired_early, expired_stale, invalidated, withdrawn, unknown.",
		[]string{"target", "model", "outcome"}, nil)
	descOutcomeTokens = prometheus.NewDesc("prefixrouter_speculative_prediction_tokens_total",
		"Prompt tokens of mature cohorts' predictions by outcome (token-weighted rates).", []string{"target", "model", "outcome"}, nil)
	descRequests = prometheus.NewDesc("prefixrouter_speculative_requests_total",
		"Requests of mature cohorts with confirmed or expired predictions.", tm, nil)
	descRequestsConfirmed = prometheus.NewDesc("prefixrouter_speculative_requests_confirmed_total",
		"Sum over those requests of each one's confirmed share of its decided predictions (request-weighted rate = this / requests).", tm, nil)
	descCohorts = prometheus.NewDesc("prefixrouter_speculative_cohorts_matured_total",
		"Cohorts (predictions grouped by insertion window) that matured.", tm, nil)
	descPending = prometheus.NewDesc("prefixrouter_speculative_pending_predictions",
		"Live unconfirmed predictions.", tm, nil)
	descImmature = prometheus.NewDesc("prefixrouter_speculative_immature_predictions",
		"Predictions in cohorts not yet mature, kept out of every rate.", tm, nil)
	descTTL = prometheus.NewDesc("prefixrouter_speculative_ttl_seconds",
		"The target's current prediction TTL.", tm, nil)
	descTrust = prometheus.NewDesc("prefixrouter_speculative_trust",
		"Weight of the target's predicted run: its posterior confirmation rate, 0 while its event stream is not fresh.", tm, nil)
	descExposure = prometheus.NewDesc("prefixrouter_speculative_exposure",
		"Estimated live failed predictions: prediction-request rate × failure probability × TTL.", tm, nil)
	descLatency = prometheus.NewDesc("prefixrouter_speculative_confirmation_seconds",
		"Route-to-confirmation latency: outcome confirmed (before the deadline) or late (an early expiry).",
		[]string{"target", "model", "outcome"}, nil)
	descReferenced = prometheus.NewDesc("prefixrouter_speculative_referenced_total",
		"Predictions counted by a later lookup.", tm, nil)
	descFollowed = prometheus.NewDesc("prefixrouter_speculative_followed_total",
		"Predictions a follower request was routed on.", tm, nil)
	descFollowerRoutes = prometheus.NewDesc("prefixrouter_speculative_follower_routes_total",
		"Requests routed on predictions.", tm, nil)
	descFollowerCached = prometheus.NewDesc("prefixrouter_speculative_follower_cached_tokens_total",
		"Cached prompt tokens the pods reported for requests routed on predictions.", tm, nil)
	descFalseWarm = prometheus.NewDesc("prefixrouter_speculative_false_warm_routes_total",
		"Requests routed on a prediction that later expired unconfirmed or was withdrawn.", tm, nil)
	descFalseWarmTokens = prometheus.NewDesc("prefixrouter_speculative_false_warm_tokens_total",
		"Prefill tokens false-warm routes cost: predicted minus reported cached tokens.", tm, nil)
	descInvalidations = prometheus.NewDesc("prefixrouter_speculative_invalidations_total",
		"Invalidations of the target's predictions by reason (cleared, restarted, removed).", []string{"target", "reason"}, nil)

	am = []string{"model", "arm"}

	descArmRequests = prometheus.NewDesc("prefixrouter_speculative_arm_requests_total",
		"Requests per holdback arm.", am, nil)
	descArmPrompt = prometheus.NewDesc("prefixrouter_speculative_arm_prompt_tokens_total",
		"Prompt tokens per holdback arm.", am, nil)
	descArmReported = prometheus.NewDesc("prefixrouter_speculative_arm_reported_requests_total",
		"Requests per holdback arm whose cached tokens the pod reported.", am, nil)
	descArmCached = prometheus.NewDesc("prefixrouter_speculative_arm_cached_tokens_total",
		"Cached prompt tokens the pods reported per holdback arm.", am, nil)
	descArmTTFT = prometheus.NewDesc("prefixrouter_speculative_arm_ttft_seconds",
		"Time to first byte per holdback arm.", am, nil)
	descIncremental = prometheus.NewDesc("prefixrouter_speculative_incremental_cached_tokens",
		"Cached tokens the speculative arm got beyond the holdback's at equal volume.", []string{"model"}, nil)
	descIncrementalStdErr = prometheus.NewDesc("prefixrouter_speculative_incremental_cached_tokens_stderr",
		"Standard error of the incremental cached tokens, from the spread between random groups of conversations: within two of zero, no benefit is shown.", []string{"model"}, nil)

	// The peer replicas' predictions, by origin (the replica's id, at most
	// MaxOrigins), summed over targets: counted apart from the local ones.
	og = []string{"origin"}

	descPeerInserted = prometheus.NewDesc("prefixrouter_speculative_peer_predictions_inserted_total",
		"Predictions received from a peer replica and inserted (unique per target and block).", og, nil)
	descPeerOutcomes = prometheus.NewDesc("prefixrouter_speculative_peer_predictions_total",
		"A peer replica's predictions of mature cohorts by outcome: confirmed, expired_early, expired_stale, invalidated, withdrawn, unknown.",
		[]string{"origin", "outcome"}, nil)
	descPeerArrivedExpired = prometheus.NewDesc("prefixrouter_speculative_peer_predictions_arrived_expired_total",
		"Predictions received from a peer replica after their deadline (not inserted).", og, nil)
	descPeerPending = prometheus.NewDesc("prefixrouter_speculative_peer_pending_predictions",
		"A peer replica's live unconfirmed predictions.", og, nil)
	descPeerFollowed = prometheus.NewDesc("prefixrouter_speculative_peer_followed_total",
		"A peer replica's predictions a follower request of this replica was routed on.", og, nil)
	descPeerFalseWarm = prometheus.NewDesc("prefixrouter_speculative_peer_false_warm_routes_total",
		"This replica's routes on a peer replica's prediction that later expired unconfirmed or was withdrawn.", og, nil)
	descPeerFalseWarmTokens = prometheus.NewDesc("prefixrouter_speculative_peer_false_warm_tokens_total",
		"Prefill tokens those false-warm routes cost: predicted minus reported cached tokens.", og, nil)
)

var allDescs = []*prometheus.Desc{descInserted, descOutcomes, descOutcomeTokens, descRequests, descRequestsConfirmed,
	descCohorts, descPending, descImmature, descTTL, descTrust, descExposure, descLatency, descReferenced, descFollowed,
	descFollowerRoutes, descFollowerCached, descFalseWarm, descFalseWarmTokens, descInvalidations,
	descArmRequests, descArmPrompt, descArmReported, descArmCached, descArmTTFT, descIncremental, descIncrementalStdErr,
	descPeerInserted, descPeerOutcomes, descPeerArrivedExpired, descPeerPending, descPeerFollowed,
	descPeerFalseWarm, descPeerFalseWarmTokens}

// collector produces every series at scrape time from the store, so that
// a removed target's series vanish with it and the request path never
// touches a metric.
type collector struct{ s *Store }

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
}

// outcomeSeries maps the outcome label to a count.
var outcomeSeries = []struct {
	name  string
	value func(b *[numOutcomes]int64) int64
}{
	{"confirmed", func(b *[numOutcomes]int64) int64 { return b[outcomeConfirmed] }},
	{"expired_early", func(b *[numOutcomes]int64) int64 { return b[outcomeEarly] }},
	{"expired_stale", func(b *[numOutcomes]int64) int64 { return b[outcomeExpired] - b[outcomeEarly] }},
	{"invalidated", func(b *[numOutcomes]int64) int64 { return b[outcomeInvalidated] }},
	{"withdrawn", func(b *[numOutcomes]int64) int64 { return b[outcomeWithdrawn] }},
	{"unknown", func(b *[numOutcomes]int64) int64 { return b[outcomeUnknown] }},
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	emit := func(d *prometheus.Desc, kind prometheus.ValueType, v float64, labels ...string) {
		ch <- constmetric.New(d, kind, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) { emit(d, prometheus.CounterValue, v, labels...) }
	gauge := func(d *prometheus.Desc, v float64, labels ...string) { emit(d, prometheus.GaugeValue, v, labels...) }
	s := c.s
	peers := map[string]*peerSums{}
	for _, t := range *s.targets.Load() {
		trust := s.Trust(t.id)
		t.mu.RLock()
		n, md := t.name, t.model
		tot := &t.cohorts.total
		counter(descInserted, float64(t.funnel.inserted), n, md)
		for _, o := range outcomeSeries {
			counter(descOutcomes, float64(o.value(&tot.blocks)), n, md, o.name)
			counter(descOutcomeTokens, float64(o.value(&tot.tokens)), n, md, o.name)
		}
		counter(descRequests, float64(tot.requests), n, md)
		counter(descRequestsConfirmed, tot.requestConfirmed, n, md)
		counter(descCohorts, float64(tot.cohorts), n, md)
		gauge(descPending, float64(len(t.pending)), n, md)
		pend := t.cohorts.pendingSum()
		gauge(descImmature, float64(pend.blocks[outcomeInserted]), n, md)
		ttl := time.Duration(t.ttl.Load())
		gauge(descTTL, ttl.Seconds(), n, md)
		gauge(descTrust, trust, n, md)
		post := math.Float64frombits(t.posterior.Load())
		gauge(descExposure, Exposure(t.rate.perSec, 1-post, ttl), n, md)
		ch <- t.latHist[0].Metric(descLatency, n, md, "confirmed")
		ch <- t.latHist[1].Metric(descLatency, n, md, "late")
		f := &t.funnel
		counter(descReferenced, float64(t.referenced.Load()), n, md)
		counter(descFollowed, float64(f.followed), n, md)
		counter(descFollowerRoutes, float64(f.followerRoutes), n, md)
		counter(descFollowerCached, float64(f.followerCachedTokens), n, md)
		counter(descFalseWarm, float64(f.falseWarmRoutes), n, md)
		counter(descFalseWarmTokens, float64(f.falseWarmTokens), n, md)
		for r, v := range t.invalidations {
			counter(descInvalidations, float64(v), n, Reason(r).String())
		}
		t.peerSumsLocked(peers)
		t.mu.RUnlock()
	}
	for origin, p := range peers {
		counter(descPeerInserted, float64(p.l.inserted), origin)
		for _, o := range outcomeSeries {
			counter(descPeerOutcomes, float64(o.value(&p.total.blocks)), origin, o.name)
		}
		counter(descPeerArrivedExpired, float64(p.l.arrivedExpired), origin)
		gauge(descPeerPending, float64(p.l.live), origin)
		counter(descPeerFollowed, float64(p.l.followed), origin)
		counter(descPeerFalseWarm, float64(p.l.falseWarmRoutes), origin)
		counter(descPeerFalseWarmTokens, float64(p.l.falseWarmTokens), origin)
	}
	s.arms.models.Range(func(k, v any) bool {
		model, m := k.(string), v.(*modelArms)
		m.mu.Lock()
		defer m.mu.Unlock()
		for a := range m.arms {
			st, arm := &m.arms[a], Arm(a).String()
			counter(descArmRequests, float64(st.requests), model, arm)
			counter(descArmPrompt, float64(st.promptTokens), model, arm)
			counter(descArmReported, float64(st.reportedRequests), model, arm)
			counter(descArmCached, float64(st.cachedTokens), model, arm)
			ch <- st.ttftHist.Metric(descArmTTFT, model, arm)
		}
		inc, incOK, se, seOK := m.incremental()
		if incOK {
			gauge(descIncremental, inc, model)
		}
		if seOK {
			gauge(descIncrementalStdErr, se, model)
		}
		return true
	})
}
