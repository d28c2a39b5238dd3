package kvindex

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/targetid"
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
	refused         *prometheus.CounterVec
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
		hashChecks:      counter("hash_checks_total", "Verifications of the router's block keys against the pod's BlockStored events (blocks recomputed from their token_ids, or block sizes compared), passed or failed.", "target"),
		hashMismatches:  counter("hash_mismatches_total", "Failed verifications of the router's block keys, by reason (hash: seed or algorithm disagree; block_size; extra_keys).", "target", "reason"),
		unchained:       counter("unchained_blocks_total", "Token-derived mode: stored blocks whose parent was unknown, kept only so removals resolve.", "target"),
		skipped:         counter("skipped_events_total", "Events not indexed, by reason (other KV-cache group, unknown type).", "target", "reason"),
		evictions:       counter("index_evictions_total", "Placements evicted by the per-target cap.", "target"),
		placements: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "prefixrouter", Subsystem: "kv", Name: "index_placements",
			Help: "Confirmed placements in the index, per target and tier."}, []string{"target", "tier"}),
		refused: counter("refused_total", "KV-event batches (or AllBlocksCleared events) received and not applied, per target and reason (source_address, other_connection, second_topic, clear_rate, reset_rate, gap_rate, queue_full, events_cap, blocks_cap, tokens_cap).", "target", "reason"),
		lastEvent: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "prefixrouter", Subsystem: "kv", Name: "last_event_timestamp_seconds",
			Help: "Unix time the last event batch from a target was received."}, []string{"target"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.batches, m.events, m.decodeErrors, m.gaps, m.replays, m.replayedBatches, m.restarts, m.unrecovered, m.rankMismatches,
			m.reconnects, m.hashChecks, m.hashMismatches, m.unchained, m.skipped, m.placements, m.evictions, m.lastEvent, m.refused} {
			reg.MustRegister(c)
		}
	}
	return m
}

// CountRefusal counts one of id's batches refused before any stream of
// its took it (a bus's source and connection checks); a stream counts its
// own (Sequencer.Refuse).
func (m *Metrics) CountRefusal(id targetid.ID, r Refusal) {
	if m != nil {
		m.refused.WithLabelValues(id.String(), r.String()).Inc()
	}
}

// Label values the per-target series are initialised with.
var (
	mismatchReasons = []string{MismatchHash, MismatchBlockSize, MismatchExtraKeys}
	skipReasons     = []string{skipOtherGroup, skipUnknownType, skipInvalid}
	eventKinds      = []events.Kind{events.KindBlockStored, events.KindBlockRemoved, events.KindAllBlocksCleared}
)

// AddTarget creates a new target's counters at zero, so that an alert on
// their rate (hash mismatches, batches lost for good, gaps) sees the series
// before the first occurrence. ForgetTarget deletes them.
func (m *Metrics) AddTarget(id targetid.ID) {
	if m == nil {
		return
	}
	label := id.String()
	for _, c := range []*prometheus.CounterVec{m.batches, m.decodeErrors, m.gaps, m.replays, m.replayedBatches, m.restarts,
		m.unrecovered, m.rankMismatches, m.reconnects, m.hashChecks, m.unchained, m.evictions} {
		c.WithLabelValues(label)
	}
	for _, k := range eventKinds {
		m.events.WithLabelValues(label, k.String())
	}
	for _, r := range mismatchReasons {
		m.hashMismatches.WithLabelValues(label, r)
	}
	for _, r := range skipReasons {
		m.skipped.WithLabelValues(label, r)
	}
	for _, r := range Refusals() {
		m.refused.WithLabelValues(label, r.String())
	}
	for t := range numTiers {
		m.placements.WithLabelValues(label, Tier(t).String())
	}
}

// ForgetTarget drops a removed target's series so the label set stays
// bounded by the live fleet.
func (m *Metrics) ForgetTarget(id targetid.ID) { m.forgetTarget(id.String()) }

// forgetTarget drops a removed target's series so the label set stays bounded
// by the live fleet.
func (m *Metrics) forgetTarget(label string) {
	if m == nil {
		return
	}
	for _, v := range []*prometheus.MetricVec{m.batches.MetricVec, m.events.MetricVec, m.decodeErrors.MetricVec, m.gaps.MetricVec,
		m.replays.MetricVec, m.replayedBatches.MetricVec, m.restarts.MetricVec, m.unrecovered.MetricVec, m.rankMismatches.MetricVec, m.reconnects.MetricVec, m.hashChecks.MetricVec,
		m.hashMismatches.MetricVec, m.unchained.MetricVec, m.skipped.MetricVec, m.placements.MetricVec, m.evictions.MetricVec, m.lastEvent.MetricVec, m.refused.MetricVec} {
		v.DeletePartialMatch(prometheus.Labels{"target": label})
	}
}
