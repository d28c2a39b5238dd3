package health

import (
	"fmt"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixrouter/prefixrouter/internal/constmetric"
)

// metrics are the prefixrouter_health_* series. Per-target series are
// produced at scrape time from the current snapshot (so removed targets
// vanish without bookkeeping); labels are bounded: target, model, state,
// reason, source. The event-stream series that share the prefix
// (prefixrouter_health_events_*, prefixrouter_health_routed_in_window) are
// the event plane's (package eventplane), registered there under the names
// operators know.
type metrics struct {
	m               *Monitor
	discoveryErrors *prometheus.CounterVec
	reloads         *prometheus.CounterVec

	state                                                     *prometheus.Desc
	running, waiting, kvUsage, loadAge, loadStale             *prometheus.Desc
	inflight, prefilling, queuedUncached                      *prometheus.Desc
	dispatched, upstreamFailures, breakerOpens, probeFailures *prometheus.Desc
	scrapeFailures, transitions, conflict, targets            *prometheus.Desc
	prefixCachingOff                                          *prometheus.Desc
	peerInflight, peerQueuedUncached                          *prometheus.Desc
}

func newMetrics(m *Monitor, reg prometheus.Registerer) (*metrics, error) {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("prefixrouter_health_"+name, help, labels, nil)
	}
	t := "target"
	mt := &metrics{
		m: m,
		discoveryErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixrouter_health_discovery_errors_total",
			Help: "Discovery failures (unreadable or invalid endpoints file, DNS errors); previous targets are kept.",
		}, []string{"source"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixrouter_health_discovery_reloads_total",
			Help: "Discovery results applied (file changes, DNS resolutions).",
		}, []string{"source"}),
		state:              d("target_state", "1 for the target's current state and reason.", t, "state", "reason"),
		running:            d("load_requests_running", "Scraped vllm:num_requests_running.", t),
		waiting:            d("load_requests_waiting", "Scraped vllm:num_requests_waiting.", t),
		kvUsage:            d("load_kv_cache_usage_ratio", "Scraped vllm:kv_cache_usage_perc (a fraction).", t),
		loadAge:            d("load_age_seconds", "Seconds since the last successful /metrics scrape (absent: never).", t),
		loadStale:          d("load_stale", "1 when the scraped load is older than the staleness bound.", t),
		inflight:           d("inflight_requests", "Requests this router dispatched to the target and not finished.", t),
		prefilling:         d("prefilling_requests", "In-flight requests without a first byte yet.", t),
		queuedUncached:     d("queued_uncached_tokens", "Uncached prompt tokens of prefilling requests.", t),
		dispatched:         d("dispatched_total", "Requests dispatched to the target.", t),
		upstreamFailures:   d("upstream_failures_total", "Upstream failures reported by the router.", t),
		breakerOpens:       d("breaker_opens_total", "Times the target's circuit breaker opened.", t),
		probeFailures:      d("probe_failures_total", "Failed GET /health probes.", t),
		scrapeFailures:     d("scrape_failures_total", "Failed GET /metrics scrapes.", t),
		transitions:        d("state_transitions_total", "Changes of the target's state.", t),
		conflict:           d("cache_config_conflict", "1 when the target's cache config disagrees with its model's peers or the flags.", t, "model"),
		targets:            d("targets", "Targets per state.", "state"),
		peerInflight:       d("peer_inflight_requests", "Requests the other router replicas report in flight to the target (--peers; 0 without).", t),
		peerQueuedUncached: d("peer_queued_uncached_tokens", "Uncached prompt tokens the other router replicas report queued on the target without a first byte.", t),
		prefixCachingOff:   d("prefix_caching_disabled", "1 when the pod reports enable_prefix_caching=False: it publishes no KV events and gives no cache hits (absent: cache config not scraped).", t),
	}
	if reg == nil {
		return mt, nil
	}
	for _, c := range []prometheus.Collector{mt.discoveryErrors, mt.reloads, mt} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering: %w", err)
		}
	}
	return mt, nil
}

// Describe implements prometheus.Collector.
func (mt *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{mt.state,
		mt.running, mt.waiting, mt.kvUsage, mt.loadAge, mt.loadStale, mt.inflight, mt.prefilling,
		mt.queuedUncached, mt.dispatched, mt.upstreamFailures, mt.breakerOpens, mt.probeFailures,
		mt.scrapeFailures, mt.transitions, mt.conflict, mt.targets, mt.prefixCachingOff,
		mt.peerInflight, mt.peerQueuedUncached} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (mt *metrics) Collect(ch chan<- prometheus.Metric) {
	snap := mt.m.Snapshot()
	if snap == nil {
		return
	}
	now := mt.m.now()
	emit := func(d *prometheus.Desc, vt prometheus.ValueType, v float64, labels []string) {
		ch <- constmetric.New(d, vt, v, labels...)
	}
	g := func(d *prometheus.Desc, v float64, labels ...string) { emit(d, prometheus.GaugeValue, v, labels) }
	c := func(d *prometheus.Desc, v uint64, labels ...string) {
		emit(d, prometheus.CounterValue, float64(v), labels)
	}
	perState := map[State]int{StateRoutable: 0, StateDegraded: 0, StateDown: 0, StateDraining: 0}
	for _, t := range snap.Targets {
		n := t.Name // ID.String(): the target label of every package
		l := t.live
		perState[t.State]++
		g(mt.state, 1, n, string(t.State), string(t.Reason))
		if !t.Scraped.At.IsZero() {
			g(mt.running, float64(t.Scraped.Running), n)
			g(mt.waiting, float64(t.Scraped.Waiting), n)
			g(mt.kvUsage, t.Scraped.KVUsage, n)
			g(mt.loadAge, now.Sub(t.Scraped.At).Seconds(), n)
		}
		g(mt.loadStale, b2f(t.Scraped.Stale), n)
		g(mt.inflight, float64(l.inflight.Load()), n)
		g(mt.prefilling, float64(l.prefilling.Load()), n)
		g(mt.queuedUncached, float64(l.queuedUncached.Load()), n)
		var peers Flights
		if p := l.peers.Load(); p != nil {
			peers = *p
		}
		g(mt.peerInflight, float64(peers.InFlight), n)
		g(mt.peerQueuedUncached, float64(peers.QueuedUncachedTokens), n)
		c(mt.dispatched, l.dispatched.Load(), n)
		c(mt.upstreamFailures, l.upstream.Load(), n)
		c(mt.breakerOpens, l.breakerOpens.Load(), n)
		c(mt.probeFailures, l.probeFailures.Load(), n)
		c(mt.scrapeFailures, l.scrapeFailures.Load(), n)
		c(mt.transitions, l.transitions.Load(), n)
		if t.Cache.Known {
			g(mt.prefixCachingOff, b2f(t.Cache.PrefixCachingDisabled()), n)
		}
		if t.State != StateDraining {
			for _, mod := range t.Models {
				g(mt.conflict, b2f(slices.Contains(t.conflictModels, mod)), n, mod)
			}
		}
	}
	for st, k := range perState {
		g(mt.targets, float64(k), string(st))
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
