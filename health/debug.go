package health

import (
	"maps"
	"slices"
	"time"
)

// DebugView is health's part of the router's admin GET /debug/targets:
// every target with its state, reason, probes, breaker, load and cache
// config, plus discovery sources and per-model cache agreement. The router
// adds each target's event stream ("event_stream") from the event plane.
type DebugView struct {
	Generated       time.Time      `json:"generated"`
	SnapshotVersion uint64         `json:"snapshot_version"`
	Ready           bool           `json:"ready"` // at least one routable target
	Sources         []SourceStatus `json:"sources"`
	Models          []ModelConfig  `json:"models"`
	Targets         []TargetView   `json:"targets"`
}

// TargetView is one target in the debug view.
type TargetView struct {
	Target   string    `json:"target"`
	Endpoint string    `json:"endpoint"`
	Rank     int       `json:"rank"`
	Source   string    `json:"source"`
	Role     Role      `json:"role"`
	Events   string    `json:"events_address"`
	Replay   string    `json:"replay_address,omitempty"`
	State    State     `json:"state"`
	Reason   Reason    `json:"reason"`
	Detail   string    `json:"detail,omitempty"`
	Since    time.Time `json:"since"`
	CanRoute bool      `json:"can_route"`

	Models           []string `json:"models"`
	ConfiguredModels []string `json:"configured_models,omitempty"`
	DiscoveredModels []string `json:"discovered_models,omitempty"`
	ModelsError      string   `json:"models_error,omitempty"`

	Probe    ProbeView   `json:"probe"`
	Breaker  BreakerView `json:"breaker"`
	Load     LoadView    `json:"load"`
	Cache    CacheConfig `json:"cache_config"`
	Conflict string      `json:"cache_config_conflict,omitempty"`
	// PrefixCachingDisabled is shown on its own: the state's reason names
	// only the most severe problem.
	PrefixCachingDisabled bool `json:"prefix_caching_disabled,omitempty"`
}

// ProbeView is the /health probe state of the target's endpoint.
type ProbeView struct {
	Up                   bool      `json:"up"`
	ConsecutiveSuccesses int       `json:"consecutive_successes"`
	ConsecutiveFailures  int       `json:"consecutive_failures"`
	LastProbe            time.Time `json:"last_probe,omitzero"`
	LastUp               time.Time `json:"last_up,omitzero"`
	LatencyMs            float64   `json:"latency_ms"`
	LastError            string    `json:"last_error,omitempty"`
}

// BreakerView is the circuit breaker fed by proxy outcomes.
type BreakerView struct {
	State               string    `json:"state"` // closed, open, half_open
	ConsecutiveFailures int64     `json:"consecutive_failures"`
	OpenUntil           time.Time `json:"open_until,omitzero"`
	Opens               uint64    `json:"opens"`
	UpstreamFailures    uint64    `json:"upstream_failures"`
}

// LoadView is scraped load plus the router's in-flight accounting.
type LoadView struct {
	Running              int       `json:"running"`
	Waiting              int       `json:"waiting"`
	KVUsage              float64   `json:"kv_cache_usage"`
	ScrapedAt            time.Time `json:"scraped_at,omitzero"`
	Stale                bool      `json:"stale"`
	PodWide              bool      `json:"pod_wide,omitempty"`
	ScrapeError          string    `json:"scrape_error,omitempty"`
	InFlight             int64     `json:"in_flight"`
	Prefilling           int64     `json:"prefilling"`
	QueuedPromptTokens   int64     `json:"queued_prompt_tokens"`
	QueuedUncachedTokens int64     `json:"queued_uncached_tokens"`
	Dispatched           uint64    `json:"dispatched"`
	// Peers is the in-flight work the other router replicas report
	// (--peers); the fields above are this router's own.
	Peers *Flights `json:"peers,omitempty"`
}

// Debug returns the debug view. It takes the registry lock briefly; it is
// for the admin API, not the request path.
func (m *Monitor) Debug() DebugView {
	snap := m.Snapshot()
	now := m.now()
	v := DebugView{Generated: now, SnapshotVersion: snap.Version, Ready: snap.Routable()}
	for _, name := range slices.Sorted(maps.Keys(snap.Models)) {
		v.Models = append(v.Models, snap.Models[name])
	}

	type epInfo struct {
		probe                  ProbeView
		models                 []string
		modelsErr, scrapeError string
	}
	m.mu.Lock()
	for _, src := range []string{SourceFlag, SourceFile, SourceDNS} {
		if st, ok := m.srcStatus[src]; ok {
			v.Sources = append(v.Sources, *st)
		}
	}
	eps := map[string]epInfo{}
	for name, ep := range m.endpoints {
		eps[name] = epInfo{
			probe: ProbeView{
				Up: ep.run.Up, ConsecutiveSuccesses: ep.run.OK, ConsecutiveFailures: ep.run.Failed,
				LastProbe: ep.lastProbe, LastUp: ep.lastUp,
				LatencyMs: float64(ep.probeLatency.Microseconds()) / 1000, LastError: ep.probeErr,
			},
			models:      slices.Clone(ep.models),
			modelsErr:   ep.modelsErr,
			scrapeError: ep.scrapeErr,
		}
	}
	m.mu.Unlock()

	for _, t := range snap.Targets {
		l := t.live
		ep := eps[t.ID.Endpoint]
		tv := TargetView{
			Target: t.Name, Endpoint: t.ID.Endpoint, Rank: t.ID.Rank, Source: t.Source, Role: t.Spec.Role,
			Events: t.Spec.Events, Replay: t.Spec.Replay,
			State: t.State, Reason: t.Reason, Detail: t.Detail, Since: t.Since, CanRoute: t.CanRoute(),
			Models: t.Models, ConfiguredModels: t.Spec.Models, DiscoveredModels: ep.models, ModelsError: ep.modelsErr,
			Probe: ep.probe,
			Breaker: BreakerView{
				State: l.breakerState(), ConsecutiveFailures: l.consecFail.Load(),
				Opens: l.breakerOpens.Load(), UpstreamFailures: l.upstream.Load(),
			},
			Load: LoadView{
				Running: t.Scraped.Running, Waiting: t.Scraped.Waiting, KVUsage: t.Scraped.KVUsage,
				ScrapedAt: t.Scraped.At, Stale: t.Scraped.Stale, PodWide: t.Scraped.PodWide, ScrapeError: ep.scrapeError,
				InFlight: l.inflight.Load(), Prefilling: l.prefilling.Load(),
				QueuedPromptTokens: l.queuedPrompt.Load(), QueuedUncachedTokens: l.queuedUncached.Load(),
				Dispatched: l.dispatched.Load(), Peers: l.peers.Load(),
			},
			Cache:                 t.Cache,
			Conflict:              t.ConfigConflict,
			PrefixCachingDisabled: t.Cache.PrefixCachingDisabled(),
		}
		if tv.Breaker.State != "closed" {
			tv.Breaker.OpenUntil = time.Unix(0, l.breakerUntil.Load()).UTC()
		}
		v.Targets = append(v.Targets, tv)
	}
	return v
}
