package kvtransport

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the buses' own numbers: what arrived on a bound socket that
// no target's stream counts, and the publisher connections accepted. A
// stream's numbers, refusals included, are kvindex.Metrics.
type Metrics struct {
	refused     *prometheus.CounterVec
	connections prometheus.Counter
}

// NewMetrics registers the buses' metrics on reg (nil: not exported, still
// usable).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "prefixrouter", Subsystem: "kv", Name: "bus_refused_total",
			Help: "KV-event batches a bus received that no target's stream counts, by reason (topics_cap: beyond the distinct topics a bus tracks; malformed: not topic, seq, payload)."}, []string{"reason"}),
		connections: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "prefixrouter", Subsystem: "kv", Name: "bus_connections_total",
			Help: "Publisher connections the buses accepted; a peer whose oversized messages are dropped (--events-max-message-bytes) reconnects and counts again."}),
	}
	if reg != nil {
		reg.MustRegister(m.refused, m.connections)
	}
	return m
}
