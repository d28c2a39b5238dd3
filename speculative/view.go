package speculative

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// View is the store as the router's GET /debug/speculative shows it: the
// configuration, every known target (those without predictions too),
// everything summed over targets, and the holdback's arms.
type View struct {
	Config   ConfigView   `json:"config"`
	Overall  Stats        `json:"overall"`
	Targets  []TargetView `json:"targets"`
	Holdback HoldbackView `json:"holdback"`
	// Peers are the predictions received from peer replicas, by origin,
	// summed over targets (--peers); the numbers above are this
	// replica's own, save the follower and false-warm routes, which are
	// its routes on any origin's predictions.
	Peers []PeerView `json:"peers"`
}

// ConfigView is the configuration and the constants the numbers rest on.
type ConfigView struct {
	TTL            string  `json:"ttl"` // auto or the fixed TTL
	TTLPercentile  float64 `json:"ttl_percentile"`
	MaxStaleS      float64 `json:"max_stale_s"`
	InitialTTLS    float64 `json:"initial_ttl_s"`
	MinSamples     int     `json:"min_samples"`
	TimerS         float64 `json:"timer_resolution_s"`
	CohortWindowS  float64 `json:"cohort_window_s"`
	RecentCohorts  int     `json:"recent_cohorts"`
	GraceS         float64 `json:"grace_s"` // early-expiry window and cohort ingestion allowance
	PriorMean      float64 `json:"trust_prior_mean"`
	PriorStrength  float64 `json:"trust_prior_blocks"`
	HoldbackShare  float64 `json:"holdback"`
	RateTimeConstS float64 `json:"rate_time_constant_s"`
}

// TargetView is one target.
type TargetView struct {
	Target     string    `json:"target"` // endpoint#rank, the metrics' label
	Endpoint   string    `json:"endpoint"`
	Rank       int       `json:"rank"`
	Model      string    `json:"model,omitempty"`
	Generation uint64    `json:"generation"`
	TTL        TTLView   `json:"ttl"`
	Trust      TrustView `json:"trust"`
	Stats
	// Peers are the peer replicas' predictions on the target, by origin.
	Peers []PeerView `json:"peers,omitempty"`
}

// TTLView is a target's TTL and why it is what it is.
type TTLView struct {
	S         float64 `json:"s"`
	Why       string  `json:"why"`
	Samples   int     `json:"samples"`
	QuantileS float64 `json:"quantile_s,omitempty"`
	BacklogS  float64 `json:"backlog_s"`
	TargetS   float64 `json:"target_s,omitempty"`
}

// TrustView is a target's trust: what Trust returns now, and the
// posterior it is when the stream is fresh.
type TrustView struct {
	Value       float64 `json:"value"`
	Posterior   float64 `json:"posterior"`
	StreamFresh bool    `json:"stream_fresh"`
	Why         string  `json:"why"`
}

// Stats are the numbers a target has, and the sum over all targets.
type Stats struct {
	Pending PendingView `json:"pending"`
	// Mature covers the recent mature cohorts (trust's evidence);
	// MatureTotal every cohort matured since the router started.
	Mature        CohortView        `json:"mature"`
	MatureTotal   CohortView        `json:"mature_total"`
	Latency       LatencyView       `json:"latency"`
	Exposure      ExposureView      `json:"exposure"`
	Funnel        FunnelView        `json:"funnel"`
	FalseWarm     FalseWarmView     `json:"false_warm"`
	Invalidations map[string]uint64 `json:"invalidations"`
}

// PendingView is what is not mature yet, kept out of every rate: the live
// predictions and the open cohorts' volume with their outcomes so far.
type PendingView struct {
	Live      int64 `json:"live"`
	Cohorts   int64 `json:"cohorts"`
	Inserted  int64 `json:"inserted"`
	Confirmed int64 `json:"confirmed_so_far"`
	Ended     int64 `json:"ended_so_far"`
}

// CohortView is mature cohorts' predictions by outcome (blocks, and
// tokens where the rates need them) and the rates over the decided ones
// (confirmed + expired; null without any).
type CohortView struct {
	Cohorts         int64 `json:"cohorts"`
	Inserted        int64 `json:"inserted"`
	Confirmed       int64 `json:"confirmed"`
	Expired         int64 `json:"expired"`
	ExpiredEarly    int64 `json:"expired_early"`
	ExpiredStale    int64 `json:"expired_stale"`
	Invalidated     int64 `json:"invalidated"`
	Withdrawn       int64 `json:"withdrawn"`
	Unknown         int64 `json:"unknown"`
	Decided         int64 `json:"decided"`
	InsertedTokens  int64 `json:"inserted_tokens"`
	ConfirmedTokens int64 `json:"confirmed_tokens"`
	ExpiredTokens   int64 `json:"expired_tokens"`
	Requests        int64 `json:"requests"`
	Rates           Rates `json:"rates"`
}

// Rates are confirmation rates weighted by block, by request (each
// request's confirmed share, averaged) and by token, and the block expiry
// rate.
type Rates struct {
	Block   *float64 `json:"block"`
	Request *float64 `json:"request"`
	Token   *float64 `json:"token"`
	Expiry  *float64 `json:"expiry"`
}

// LatencyView is route-to-confirmation latency over the recent window:
// confirmations before the deadline, and late ones (early expiries).
type LatencyView struct {
	Confirmed Percentiles `json:"confirmed"`
	Late      Percentiles `json:"late_after_expiry"`
}

// Percentiles of a latency sample, in seconds (null without samples).
type Percentiles struct {
	Samples int      `json:"samples"`
	P50     *float64 `json:"p50_s"`
	P95     *float64 `json:"p95_s"`
	P99     *float64 `json:"p99_s"`
}

// ExposureView is the live unconfirmed predictions and the λ·p·T estimate
// of live failed ones: λ the recent rate of requests that inserted
// predictions, p one minus the posterior confirmation rate, T the TTL
// (p and T per target only; overall, the sums).
type ExposureView struct {
	Live               int64    `json:"live"`
	RatePerS           float64  `json:"rate_per_s"`
	FailureProbability *float64 `json:"failure_probability,omitempty"`
	TTLS               *float64 `json:"ttl_s,omitempty"`
	Estimate           float64  `json:"estimate"`
}

// FunnelView follows predictions from insertion to the cached tokens of
// the requests routed on them.
type FunnelView struct {
	Inserted             uint64 `json:"inserted"`
	Confirmed            uint64 `json:"confirmed"`
	ConfirmedLate        uint64 `json:"confirmed_late"`
	Referenced           uint64 `json:"referenced"`
	Followed             uint64 `json:"followed"`
	FollowerRoutes       uint64 `json:"follower_routes"`
	FollowerReported     uint64 `json:"follower_routes_reported"`
	FollowerCachedTokens uint64 `json:"follower_cached_tokens"`
}

// FalseWarmView counts the routes made on predictions that later expired
// unconfirmed or were withdrawn, and the prefill tokens they cost
// (predicted minus reported cached, for routes whose usage was reported).
type FalseWarmView struct {
	Routes uint64 `json:"routes"`
	Tokens uint64 `json:"tokens"`
}

// HoldbackView is the holdback's arms per model.
type HoldbackView struct {
	Fraction float64     `json:"fraction"`
	Models   []ModelView `json:"models"`
}

// ModelView is one model's arms and the incremental reuse: the
// speculative arm's cached tokens minus the holdback's at equal volume
// (null while an arm has no reported request).
type ModelView struct {
	Model       string    `json:"model"`
	Arms        []ArmView `json:"arms"`
	Incremental *float64  `json:"incremental_cached_tokens"`
	// IncrementalStdErr is its standard error, from the spread between
	// random groups of conversations (null while an arm's requests fall in
	// fewer than two groups): within two of zero, no benefit is shown.
	IncrementalStdErr *float64 `json:"incremental_stderr_tokens"`
	// IncrementalGroups is the fewer of the two arms' variance groups
	// with requests: the standard error rests on that many draws, less
	// one degree of freedom.
	IncrementalGroups int               `json:"incremental_groups"`
	Assigned          map[string]uint64 `json:"assigned_by"`
}

// ArmView is one arm's requests and what the pods reported of them.
type ArmView struct {
	Arm              string   `json:"arm"`
	Requests         int64    `json:"requests"`
	PromptTokens     int64    `json:"prompt_tokens"`
	ReportedRequests int64    `json:"reported_requests"`
	CachedTokens     int64    `json:"cached_tokens"`
	CachedPerRequest *float64 `json:"cached_tokens_per_request"`
	TTFTSamples      int      `json:"ttft_samples"`
	TTFTP50          *float64 `json:"ttft_p50_s"`
	TTFTP90          *float64 `json:"ttft_p90_s"`
}

// View is the debug view now; the router serves it as JSON at GET
// /debug/speculative on the admin listener. It takes each target's lock in
// turn.
func (s *Store) View() View {
	v := View{
		Config: ConfigView{
			TTL: FormatTTL(s.cfg.TTL), TTLPercentile: s.cfg.TTLPercentile, MaxStaleS: s.cfg.MaxStale.Seconds(),
			InitialTTLS: min(InitialTTL, s.cfg.MaxStale).Seconds(), MinSamples: MinSamples(s.cfg.TTLPercentile),
			TimerS: TimerResolution.Seconds(), CohortWindowS: cohortWindow.Seconds(), RecentCohorts: recentCohorts,
			GraceS: s.cfg.MaxStale.Seconds(), PriorMean: priorMean, PriorStrength: priorStrength,
			HoldbackShare: s.cfg.Holdback, RateTimeConstS: rateTau.Seconds(),
		},
		Targets: []TargetView{},
	}
	var recent, total, pending counts
	var live int64
	var confirmed, late []time.Duration
	var exposure ExposureView
	inv := map[string]uint64{}
	for _, t := range *s.targets.Load() {
		tv, c := s.targetView(t)
		v.Targets = append(v.Targets, tv)
		recent.addAll(&c.recent)
		total.addAll(&c.total)
		pending.addAll(&c.pending)
		live += tv.Pending.Live
		confirmed = append(confirmed, c.confirmed...)
		late = append(late, c.late...)
		exposure.Live += tv.Exposure.Live
		exposure.RatePerS += tv.Exposure.RatePerS
		exposure.Estimate += tv.Exposure.Estimate
		addFunnel(&v.Overall.Funnel, &tv.Funnel)
		v.Overall.FalseWarm.Routes += tv.FalseWarm.Routes
		v.Overall.FalseWarm.Tokens += tv.FalseWarm.Tokens
		for k, n := range tv.Invalidations {
			inv[k] += n
		}
	}
	slices.SortFunc(v.Targets, func(a, b TargetView) int { return cmp.Compare(a.Target, b.Target) })
	v.Overall.Pending = pendingView(live, &pending)
	v.Overall.Mature = cohortView(&recent)
	v.Overall.MatureTotal = cohortView(&total)
	v.Overall.Latency = LatencyView{Confirmed: percentiles(confirmed), Late: percentiles(late)}
	v.Overall.Exposure = exposure
	v.Overall.Invalidations = inv
	v.Holdback = s.holdbackView()
	v.Peers = s.peerViews()
	return v
}

// peerViews sums every target's peer ledgers by origin.
func (s *Store) peerViews() []PeerView {
	by := map[string]*peerSums{}
	for _, t := range *s.targets.Load() {
		t.mu.RLock()
		t.peerSumsLocked(by)
		t.mu.RUnlock()
	}
	return peerViews(by)
}

// targetCounts are what View sums over targets.
type targetCounts struct {
	recent, total, pending counts
	confirmed, late        []time.Duration
}

func (s *Store) targetView(t *targetState) (TargetView, targetCounts) {
	fresh := s.stream(t.id).Fresh
	t.mu.RLock()
	defer t.mu.RUnlock()
	c := targetCounts{recent: t.cohorts.recentSum(), total: t.cohorts.total, pending: t.cohorts.pendingSum()}
	c.confirmed = t.lat.appendTo(nil, false, false)
	c.late = t.lat.appendTo(nil, false, true)
	post := math.Float64frombits(t.posterior.Load())
	ttl := time.Duration(t.ttl.Load())
	tv := TargetView{
		Target: t.name, Endpoint: t.id.Endpoint, Rank: t.id.Rank, Model: t.model, Generation: t.gen,
		TTL: TTLView{S: ttl.Seconds(), Why: t.ctl.why, Samples: t.lat.len(), QuantileS: t.ctl.quantile.Seconds(),
			BacklogS: t.backlog.Seconds(), TargetS: t.ctl.target.Seconds()},
		Trust: TrustView{Posterior: post, StreamFresh: fresh},
	}
	decided := c.recent.decided()
	switch {
	case !fresh:
		tv.Trust.Why = "the target's KV-event stream is not fresh: predictions do not count, and those that end unconfirmed meanwhile end unknown"
	case decided == 0:
		tv.Trust.Value = post
		tv.Trust.Why = "no mature cohort yet: the prior alone"
	default:
		tv.Trust.Value = post
		tv.Trust.Why = "recent mature cohorts' block-confirmation rate under the prior"
	}
	tv.Pending = pendingView(int64(len(t.pending)), &c.pending)
	tv.Mature = cohortView(&c.recent)
	tv.MatureTotal = cohortView(&c.total)
	tv.Latency = LatencyView{Confirmed: percentiles(c.confirmed), Late: percentiles(c.late)}
	fail, ttlS := 1-post, ttl.Seconds()
	tv.Exposure = ExposureView{Live: int64(len(t.pending)), RatePerS: t.rate.perSec, FailureProbability: &fail, TTLS: &ttlS,
		Estimate: Exposure(t.rate.perSec, fail, ttl)}
	f := &t.funnel
	tv.Funnel = FunnelView{Inserted: f.inserted, Confirmed: f.confirmed, ConfirmedLate: f.late, Referenced: t.referenced.Load(),
		Followed: f.followed, FollowerRoutes: f.followerRoutes, FollowerReported: f.followerReported,
		FollowerCachedTokens: f.followerCachedTokens}
	tv.FalseWarm = FalseWarmView{Routes: f.falseWarmRoutes, Tokens: f.falseWarmTokens}
	if len(t.peers) > 0 {
		by := map[string]*peerSums{}
		t.peerSumsLocked(by)
		tv.Peers = peerViews(by)
	}
	tv.Invalidations = map[string]uint64{}
	for r, n := range t.invalidations {
		tv.Invalidations[Reason(r).String()] = n
	}
	return tv, c
}

func addFunnel(dst, f *FunnelView) {
	dst.Inserted += f.Inserted
	dst.Confirmed += f.Confirmed
	dst.ConfirmedLate += f.ConfirmedLate
	dst.Referenced += f.Referenced
	dst.Followed += f.Followed
	dst.FollowerRoutes += f.FollowerRoutes
	dst.FollowerReported += f.FollowerReported
	dst.FollowerCachedTokens += f.FollowerCachedTokens
}

func pendingView(live int64, c *counts) PendingView {
	return PendingView{Live: live, Cohorts: c.cohorts, Inserted: c.blocks[outcomeInserted],
		Confirmed: c.blocks[outcomeConfirmed], Ended: c.ended()}
}

func cohortView(c *counts) CohortView {
	b, tk := &c.blocks, &c.tokens
	v := CohortView{
		Cohorts: c.cohorts, Inserted: b[outcomeInserted], Confirmed: b[outcomeConfirmed],
		Expired: b[outcomeExpired], ExpiredEarly: b[outcomeEarly], ExpiredStale: b[outcomeExpired] - b[outcomeEarly],
		Invalidated: b[outcomeInvalidated], Withdrawn: b[outcomeWithdrawn], Unknown: b[outcomeUnknown],
		Decided: c.decided(), InsertedTokens: tk[outcomeInserted], ConfirmedTokens: tk[outcomeConfirmed],
		ExpiredTokens: tk[outcomeExpired], Requests: c.requests,
	}
	v.Rates = Rates{
		Block:   ratio(float64(b[outcomeConfirmed]), float64(v.Decided)),
		Request: ratio(c.requestConfirmed, float64(c.requests)),
		Token:   ratio(float64(tk[outcomeConfirmed]), float64(tk[outcomeConfirmed]+tk[outcomeExpired])),
		Expiry:  ratio(float64(b[outcomeExpired]), float64(v.Decided)),
	}
	return v
}

func ratio(num, den float64) *float64 {
	if den <= 0 {
		return nil
	}
	r := num / den
	return &r
}

func percentiles(d []time.Duration) Percentiles {
	p := Percentiles{Samples: len(d)}
	if len(d) == 0 {
		return p
	}
	slices.Sort(d)
	sec := func(q float64) *float64 { v := Quantile(d, q).Seconds(); return &v }
	p.P50, p.P95, p.P99 = sec(0.5), sec(0.95), sec(0.99)
	return p
}

func (s *Store) holdbackView() HoldbackView {
	hv := HoldbackView{Fraction: s.cfg.Holdback, Models: []ModelView{}}
	s.arms.models.Range(func(k, v any) bool {
		m := v.(*modelArms)
		m.mu.Lock()
		mv := ModelView{Model: k.(string), Assigned: map[string]uint64{}}
		for b, n := range m.bases {
			if n > 0 {
				mv.Assigned[Basis(b).String()] = n
			}
		}
		for a := range m.arms {
			st := &m.arms[a]
			av := ArmView{Arm: Arm(a).String(), Requests: st.requests, PromptTokens: st.promptTokens,
				ReportedRequests: st.reportedRequests, CachedTokens: st.cachedTokens,
				CachedPerRequest: ratio(float64(st.cachedTokens), float64(st.reportedRequests))}
			ttft := st.ttft.appendTo(nil, false, false)
			av.TTFTSamples = len(ttft)
			if len(ttft) > 0 {
				slices.Sort(ttft)
				p50, p90 := Quantile(ttft, 0.5).Seconds(), Quantile(ttft, 0.9).Seconds()
				av.TTFTP50, av.TTFTP90 = &p50, &p90
			}
			mv.Arms = append(mv.Arms, av)
		}
		mv.IncrementalGroups = min(usedGroups(m.arms[ArmSpeculative].groups[:]), usedGroups(m.arms[ArmHoldback].groups[:]))
		if inc, incOK, se, seOK := m.incremental(); incOK {
			mv.Incremental = &inc
			if seOK {
				mv.IncrementalStdErr = &se
			}
		}
		m.mu.Unlock()
		hv.Models = append(hv.Models, mv)
		return true
	})
	slices.SortFunc(hv.Models, func(a, b ModelView) int { return cmp.Compare(a.Model, b.Model) })
	return hv
}
