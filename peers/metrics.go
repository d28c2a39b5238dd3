package peers

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixrouter/prefixrouter/internal/constmetric"
)

// Series. The peer label is a peer's address (tcp://IP:PORT, as resolved
// from --peers) and source a --peers entry as given: both bounded by the
// flags. A peer's series vanish when it leaves the list.
var (
	pl = []string{"peer"}

	descConnected = prometheus.NewDesc("prefixrouter_peer_connected",
		"1 while a message from the peer replica arrived within the silence bound, else 0.", pl, nil)
	descMessages = prometheus.NewDesc("prefixrouter_peer_messages_received_total",
		"Messages received from the peer replica (every kind, the heartbeat included).", pl, nil)
	descPredictions = prometheus.NewDesc("prefixrouter_peer_predictions_received_total",
		"Predicted placements (one per request and target) received from the peer replica.", pl, nil)
	descBlocks = prometheus.NewDesc("prefixrouter_peer_predicted_blocks_received_total",
		"Predicted blocks received from the peer replica.", pl, nil)
	descWithdrawals = prometheus.NewDesc("prefixrouter_peer_withdrawals_received_total",
		"Withdrawn placements received from the peer replica.", pl, nil)
	descLost = prometheus.NewDesc("prefixrouter_peer_messages_lost_total",
		"Messages of the peer replica that never arrived (gaps in its sequence).", pl, nil)
	descDecodeErrors = prometheus.NewDesc("prefixrouter_peer_decode_errors_total",
		"Messages from the peer replica that could not be read (malformed, or a wire version this replica does not read).", pl, nil)
	descLag = prometheus.NewDesc("prefixrouter_peer_lag_seconds",
		"Send-to-receive time of the peer replica's messages, by the two replicas' clocks (their skew included).", pl, nil)
	descFault = prometheus.NewDesc("prefixrouter_peer_wiring_fault",
		"1 while the peer has this fault (silent, incompatible, failed, rejected; GET /debug/targets says why), else 0.", []string{"peer", "fault"}, nil)
	descRejected = prometheus.NewDesc("prefixrouter_peer_messages_rejected_total",
		"Messages from the peer replica dropped unapplied, by reason: malformed, version, clock (sent time over a minute from this replica's), in_flight, queued_tokens, targets, keys, deadline (beyond what one replica reports).", []string{"peer", "reason"}, nil)
	descRefused = prometheus.NewDesc("prefixrouter_peer_handshakes_refused_total",
		"Connections to --peer-listen refused because the client does not hold --peer-key-file.", nil, nil)
	descInsecure = prometheus.NewDesc("prefixrouter_peer_insecure",
		"1 while the mesh runs without a key (--peer-insecure): in the clear, believing any process at a --peers address.", nil, nil)
	descResolved = prometheus.NewDesc("prefixrouter_peer_source_resolved",
		"1 while the --peers entry's last resolution succeeded, else 0.", []string{"source"}, nil)
	descResolveErrors = prometheus.NewDesc("prefixrouter_peer_source_resolve_errors_total",
		"Failed resolutions of the --peers entry.", []string{"source"}, nil)
	descAddresses = prometheus.NewDesc("prefixrouter_peer_source_addresses",
		"Addresses the --peers entry resolves to (this replica's own included).", []string{"source"}, nil)
	descSent = prometheus.NewDesc("prefixrouter_peer_messages_sent_total",
		"Messages this replica published to its peers, by kind.", []string{"kind"}, nil)
	descDropped = prometheus.NewDesc("prefixrouter_peer_messages_dropped_total",
		"Messages this replica could not publish (send queue full or socket refusing).", nil, nil)
)

var allDescs = []*prometheus.Desc{descConnected, descMessages, descPredictions, descBlocks, descWithdrawals, descLost,
	descDecodeErrors, descLag, descFault, descRejected, descRefused, descInsecure, descResolved, descResolveErrors, descAddresses, descSent, descDropped}

var faultNames = []string{stateSilent, stateIncompatible, stateFailed, stateRejected}

// collector produces every series at scrape time from the mesh.
type collector struct{ m *Mesh }

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	emit := func(d *prometheus.Desc, kind prometheus.ValueType, v float64, labels ...string) {
		ch <- constmetric.New(d, kind, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		emit(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) { emit(d, prometheus.GaugeValue, v, labels...) }
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range m.peers {
		if p.state == stateSelf {
			continue
		}
		a := p.addr
		gauge(descConnected, b2f(p.connected()), a)
		counter(descMessages, p.messages, a)
		counter(descPredictions, p.predictions, a)
		counter(descBlocks, p.predictedBlocks, a)
		counter(descWithdrawals, p.withdrawals, a)
		counter(descLost, p.lost, a)
		counter(descDecodeErrors, p.decodeErrors, a)
		ch <- p.lag.hist.Metric(descLag, a)
		for _, f := range faultNames {
			gauge(descFault, b2f(p.fault() == f), a, f)
		}
		for r, n := range p.rejected {
			counter(descRejected, n, a, rejectNames[r])
		}
	}
	for _, s := range m.sources {
		gauge(descResolved, b2f(s.lastErr == "" && !s.lastOK.IsZero()), s.spec.Text)
		counter(descResolveErrors, s.errors, s.spec.Text)
		gauge(descAddresses, float64(len(s.addrs)), s.spec.Text)
	}
	for _, k := range kinds {
		counter(descSent, m.sent[k].Load(), k.String())
	}
	counter(descDropped, m.dropped.Load())
	gauge(descInsecure, b2f(m.key == nil))
	if m.key != nil {
		counter(descRefused, m.refusedN.Load())
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
