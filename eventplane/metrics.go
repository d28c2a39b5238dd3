package eventplane

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixrouter/prefixrouter/internal/constmetric"
)

// collector produces the plane's per-target event-stream series at scrape
// time from the published view, so removed targets vanish without
// bookkeeping. Their names keep the prefixrouter_health_ prefix they had
// when health judged freshness: dashboards and alert rules select them by
// name, so the move of their owner does not rename them.
type collector struct {
	p *Plane
}

var (
	descVerdict = prometheus.NewDesc("prefixrouter_health_events_verdict",
		"1 for the current verdict on the target's KV-event stream.", []string{"target", "verdict"}, nil)
	descEventAge = prometheus.NewDesc("prefixrouter_health_events_last_age_seconds",
		"Seconds since the target's last KV-event batch (absent: never).", []string{"target"}, nil)
	descQueueDepth = prometheus.NewDesc("prefixrouter_health_events_queue_depth",
		"Received KV-event batches not yet applied.", []string{"target"}, nil)
	descRouted = prometheus.NewDesc("prefixrouter_health_routed_in_window",
		"Requests dispatched to the target over the routing window.", []string{"target"}, nil)

	// Bus series (--events-listen). Topics are what publishers send and
	// unbounded, so none is a label: a routed topic is named by its
	// target, and unknown ones are only counted (listed by topic in GET
	// /debug/targets).
	descBusBatches = prometheus.NewDesc("prefixrouter_kv_bus_batches_total",
		"KV-event batches applied from a bus, per target (since the target's topic was first routed).", []string{"bus", "target"}, nil)
	descBusGaps = prometheus.NewDesc("prefixrouter_kv_bus_sequence_gaps_total",
		"Sequence gaps in a target's topic on a bus.", []string{"bus", "target"}, nil)
	descBusReplays = prometheus.NewDesc("prefixrouter_kv_bus_replays_total",
		"Replay requests for a target's topic on a bus.", []string{"bus", "target"}, nil)
	descBusRestarts = prometheus.NewDesc("prefixrouter_kv_bus_restarts_total",
		"Restarts seen in a target's topic on a bus (sequence went backwards).", []string{"bus", "target"}, nil)
	descBusUnknownBatches = prometheus.NewDesc("prefixrouter_kv_bus_unknown_batches_total",
		"Batches on a bus whose topic matches no target: received, never applied.", []string{"bus"}, nil)
	descBusUnknownTopics = prometheus.NewDesc("prefixrouter_kv_bus_unknown_topics",
		"Distinct topics matching no target listed for a bus (at most 64; GET /debug/targets names them).", []string{"bus"}, nil)
	descBusDeferred = prometheus.NewDesc("prefixrouter_kv_bus_deferred_batches_total",
		"Batches on a bus dropped before block keys were known (replayed once a batch of the topic is applied).", []string{"bus"}, nil)
)

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descVerdict, descEventAge, descQueueDepth, descRouted,
		descBusBatches, descBusGaps, descBusReplays, descBusRestarts, descBusUnknownBatches, descBusUnknownTopics, descBusDeferred} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	now := c.p.now()
	metric := func(d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
		ch <- constmetric.New(d, t, v, labels...)
	}
	g := func(d *prometheus.Desc, v float64, labels ...string) { metric(d, prometheus.GaugeValue, v, labels...) }
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		metric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for _, b := range c.p.Buses() {
		for _, t := range b.Topics {
			counter(descBusBatches, t.Batches, b.Listen, t.Target)
			counter(descBusGaps, t.Gaps, b.Listen, t.Target)
			counter(descBusReplays, t.Replays, b.Listen, t.Target)
			counter(descBusRestarts, t.Restarts, b.Listen, t.Target)
		}
		counter(descBusUnknownBatches, b.UnknownBatches, b.Listen)
		g(descBusUnknownTopics, float64(len(b.UnknownTopics)), b.Listen)
		counter(descBusDeferred, b.DeferredBatches, b.Listen)
	}
	for id, e := range *c.p.view.Load() {
		n, f := id.String(), &e.fresh
		g(descVerdict, 1, n, string(f.Verdict))
		if !f.LastEvent.IsZero() {
			g(descEventAge, now.Sub(f.LastEvent).Seconds(), n)
		}
		g(descQueueDepth, float64(f.QueueDepth), n)
		g(descRouted, float64(f.RoutedInWindow), n)
	}
}
