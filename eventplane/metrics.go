package eventplane

import (
	"github.com/prometheus/client_golang/prometheus"
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
)

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descVerdict, descEventAge, descQueueDepth, descRouted} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	now := c.p.now()
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		m, err := prometheus.NewConstMetric(d, prometheus.GaugeValue, v, labels...)
		if err != nil {
			m = prometheus.NewInvalidMetric(d, err)
		}
		ch <- m
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
