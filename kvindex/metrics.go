package kvindex

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the event-ingestion and index numbers kvindex owns. Labels are
// bounded: target (endpoint#rank), event type, tier, reason.
type Metrics struct {
	batches         *prometheus.CounterVec
	events          *prometheus.CounterVec
	decodeErrors    *prometheus.CounterVec
	gaps            *prometheus.CounterVec
	replays         *prometheus.CounterVec
	replayedBatches *prometheus.CounterVec
	restarts        *prometheus.CounterVec
	unrecovered     *prometheus.CounterVec
	rankMismatches  *prometheus.CounterVec
	reconnects      *prometheus.CounterVec
	hashChecks      *prometheus.CounterVec
	hashMismatches  *prometheus.CounterVec
	unchained       *prometheus.CounterVec
	skipped         *prometheus.CounterVec
	placements      *prometheus.GaugeVec
	evictions       *prometheus.CounterVec
	lastEvent       *prometheus.GaugeVec
}

// NewMetrics registers the kvindex metrics on reg (nil: not exported, still
// usable).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "prefixrouter", Subsystem: "kv", Name: name, Help: help}, labels)
	}
	m := &Metrics{
		batches:         counter("event_batches_total", "KV-event batches applied, per target.", "target"),
		events:          counter("events_total", "KV events applied, per target and type.", "target", "type"),
		decodeErrors:    counter("decode_errors_total", "KV-event payloads that failed to decode and were skipped.", "target"),
		gaps:            counter("sequence_gaps_total", "Sequence gaps detected in a target's event stream.", "target"),
		replays:         counter("replays_total", "Replay requests issued to a target's replay socket.", "target"),
		replayedBatches: counter("replayed_batches_total", "Batches recovered through replay.", "target"),
		restarts:        counter("restarts_total", "Target restarts detected (sequence went backwards); placements cleared.", "target"),
		rankMismatches:  counter("rank_mismatches_total", "Batches whose data_parallel_rank differs from the rank of the subscription they arrived on.", "target"),
		unrecovered:     counter("unrecovered_batches_total", "Batches known missing that replay could not bring back; the index may be wrong until it turns over.", "target"),
		reconnects:      counter("reconnects_total", "Event-stream reconnections.", "target"),
		hashChecks:      counter("hash_checks_total", "BlockStored blocks recomputed from their token_ids to verify the router's hashing.", "target"),
		hashMismatches:  counter("hash_mismatches_total", "Recomputed blocks whose hash differs from the pod's: seed, algorithm or block size disagree.", "target", "reason"),
		unchained:       counter("unchained_blocks_total", "Token-derived mode: stored blocks whose parent was unknown, kept only so removals resolve.", "target"),
		skipped:         counter("skipped_events_total", "Events not indexed, by reason (other KV-cache group, unknown type).", "target", "reason"),
		evictions:       counter("index_evictions_total", "Placements evicted by the per-target cap.", "target"),
		placements: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "prefixrouter", Subsystem: "kv", Name: "index_placements",
			Help: "Confirmed placements in the index, per target and tier."}, []string{"target", "tier"}),
		lastEvent: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "prefixrouter", Subsystem: "kv", Name: "last_event_timestamp_seconds",
			Help: "Unix time the last event batch from a target was received."}, []string{"target"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.batches, m.events, m.decodeErrors, m.gaps, m.replays, m.replayedBatches, m.restarts, m.unrecovered, m.rankMismatches,
			m.reconnects, m.hashChecks, m.hashMismatches, m.unchained, m.skipped, m.placements, m.evictions, m.lastEvent} {
			reg.MustRegister(c)
		}
	}
	return m
}

// forgetTarget drops a removed target's series so the label set stays bounded
// by the live fleet.
func (m *Metrics) forgetTarget(label string) {
	if m == nil {
		return
	}
	for _, v := range []*prometheus.MetricVec{m.batches.MetricVec, m.events.MetricVec, m.decodeErrors.MetricVec, m.gaps.MetricVec,
		m.replays.MetricVec, m.replayedBatches.MetricVec, m.restarts.MetricVec, m.unrecovered.MetricVec, m.rankMismatches.MetricVec, m.reconnects.MetricVec, m.hashChecks.MetricVec,
		m.hashMismatches.MetricVec, m.unchained.MetricVec, m.skipped.MetricVec, m.placements.MetricVec, m.evictions.MetricVec, m.lastEvent.MetricVec} {
		v.DeletePartialMatch(prometheus.Labels{"target": label})
	}
}
