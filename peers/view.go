package peers

import (
	"cmp"
	"slices"
	"time"

	"github.com/prefixrouter/prefixrouter/targetid"
)

// View is the mesh as GET /debug/targets shows it ("peers").
type View struct {
	ID     string `json:"replica_id"`
	Listen string `json:"listen"`
	// Security is "curve" (--peer-key-file) or "insecure"
	// (--peer-insecure); HandshakesRefused counts the connections refused
	// for not holding the key.
	Security          string `json:"security"`
	HandshakesRefused uint64 `json:"handshakes_refused"`
	// Sources are the --peers entries and what they resolve to.
	Sources []SourceView `json:"sources"`
	// Peers are the addresses followed: every resolved address, this
	// replica's own shown as self.
	Peers []PeerView `json:"peers"`
	// Sent counts what this replica published, by kind; Dropped what it
	// could not.
	Sent    map[string]uint64 `json:"sent"`
	Dropped uint64            `json:"dropped"`
	// SilentAfterS is how long a peer may say nothing before its
	// in-flight work is dropped and it shows silent.
	SilentAfterS float64 `json:"silent_after_s"`
}

// SourceView is one --peers entry.
type SourceView struct {
	Source    string    `json:"source"`
	Addresses []string  `json:"addresses"`
	LastOK    time.Time `json:"last_ok,omitzero"`
	// LastError is the last resolution's error, empty once one succeeds
	// again (the previous addresses are kept meanwhile).
	LastError string    `json:"last_error,omitempty"`
	ErrorAt   time.Time `json:"error_at,omitzero"`
	Errors    uint64    `json:"errors"`
}

// PeerView is one peer address.
type PeerView struct {
	Peer   string `json:"peer"`
	Source string `json:"source"`
	// Origin is the replica id its messages carry.
	Origin    string `json:"origin,omitempty"`
	State     string `json:"state"`
	Reason    string `json:"reason,omitempty"`
	Connected bool   `json:"connected"`
	// Fault is the state when it is a wiring fault (silent, incompatible,
	// failed, rejected).
	Fault           string    `json:"fault,omitempty"`
	Since           time.Time `json:"since"`
	LastMessage     time.Time `json:"last_message,omitzero"`
	Messages        uint64    `json:"messages"`
	Predictions     uint64    `json:"predictions"`
	PredictedBlocks uint64    `json:"predicted_blocks"`
	Withdrawals     uint64    `json:"withdrawals"`
	Lost            uint64    `json:"lost_messages"`
	Restarts        uint64    `json:"restarts"`
	DecodeErrors    uint64    `json:"decode_errors"`
	LastError       string    `json:"last_error,omitempty"`
	// Rejected counts its messages dropped unapplied, by reason (those
	// with none left out).
	Rejected map[string]uint64 `json:"rejected,omitempty"`
	Lag      LagView           `json:"lag"`
	// Flights is its last report of in-flight work, summed over targets.
	Flights FlightsView `json:"flights"`
}

// LagView is send-to-receive time by the two replicas' clocks.
type LagView struct {
	Samples uint64  `json:"samples"`
	LastS   float64 `json:"last_s"`
	MeanS   float64 `json:"mean_s"`
	MaxS    float64 `json:"max_s"`
}

// FlightsView sums a peer's in-flight work over targets.
type FlightsView struct {
	Targets              int   `json:"targets"`
	InFlight             int64 `json:"in_flight"`
	Prefilling           int64 `json:"prefilling"`
	QueuedUncachedTokens int64 `json:"queued_uncached_tokens"`
}

// View describes the mesh now.
func (m *Mesh) View() View {
	v := View{ID: m.cfg.ID, Listen: m.cfg.Listen, Sources: []SourceView{}, Peers: []PeerView{},
		Sent: map[string]uint64{}, Dropped: m.dropped.Load(), SilentAfterS: m.silentAfter().Seconds(), Security: "insecure"}
	if m.key != nil {
		v.Security = "curve"
	}
	if m.key != nil {
		v.HandshakesRefused = m.refusedN.Load()
	}
	for _, k := range kinds {
		v.Sent[k.String()] = m.sent[k].Load()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.sources {
		v.Sources = append(v.Sources, SourceView{Source: s.spec.Text, Addresses: slices.Clone(s.addrs), LastOK: s.lastOK,
			LastError: s.lastErr, ErrorAt: s.errAt, Errors: s.errors})
	}
	for _, p := range m.peers {
		pv := PeerView{Peer: p.addr, Source: p.source, Origin: p.origin, State: p.state, Reason: p.reason,
			Connected: p.connected(), Fault: p.fault(), Since: p.since, LastMessage: p.lastMessage,
			Messages: p.messages, Predictions: p.predictions, PredictedBlocks: p.predictedBlocks,
			Withdrawals: p.withdrawals, Lost: p.lost, Restarts: p.restarts, DecodeErrors: p.decodeErrors,
			LastError: p.lastError,
			Lag:       LagView{Samples: p.lag.n, LastS: p.lag.last, MaxS: p.lag.max}}
		for r, n := range p.rejected {
			if n > 0 {
				if pv.Rejected == nil {
					pv.Rejected = map[string]uint64{}
				}
				pv.Rejected[rejectNames[r]] = n
			}
		}
		if p.lag.n > 0 {
			pv.Lag.MeanS = p.lag.sum / float64(p.lag.n)
		}
		var flights map[targetid.ID]TargetFlights
		if of := m.flights[p.origin]; of != nil && p.origin != "" {
			flights = of.targets
		}
		for _, f := range flights {
			pv.Flights.Targets++
			pv.Flights.InFlight += f.InFlight
			pv.Flights.Prefilling += f.Prefilling
			pv.Flights.QueuedUncachedTokens += f.QueuedUncachedTokens
		}
		v.Peers = append(v.Peers, pv)
	}
	slices.SortFunc(v.Sources, func(a, b SourceView) int { return cmp.Compare(a.Source, b.Source) })
	slices.SortFunc(v.Peers, func(a, b PeerView) int { return cmp.Compare(a.Peer, b.Peer) })
	return v
}
