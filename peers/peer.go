package peers

import (
	"context"
	"math"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/lockedhist"
)

// Peer states, as GET /debug/targets shows them.
const (
	// stateConnecting: subscribed, nothing received yet.
	stateConnecting = "connecting"
	// stateConnected: a message arrived within the silence bound.
	stateConnected = "connected"
	// stateSilent: nothing for longer than the silence bound (a peer that
	// went away or said bye), or nothing since subscribing past the
	// connect grace (a wiring fault: wrong address or port, or no
	// --peer-listen there).
	stateSilent = "silent"
	// stateIncompatible: its messages are of a wire version this replica
	// does not read.
	stateIncompatible = "incompatible"
	// stateFailed: the subscription could not be set up.
	stateFailed = "failed"
	// stateSelf: the address is this replica's own.
	stateSelf = "self"
	// stateRejected: it sent a message this replica dropped, unreadable
	// or beyond what a replica reports (plausible.go), within rejectHold.
	stateRejected = "rejected"
)

// peer is one followed address. Guarded by the mesh's lock, save cancel.
type peer struct {
	addr, source string
	cancel       context.CancelFunc
	since        time.Time // followed since
	state        string
	reason       string
	origin       string // the replica id its messages carry

	lastMessage                        time.Time
	lastSeq                            uint64
	messages, predictions, withdrawals uint64
	predictedBlocks, lost, restarts    uint64
	decodeErrors                       uint64
	lastError                          string
	// rejected counts the messages dropped, by reason; rejectedAt is when
	// the last was.
	rejected    [numRejectReasons]uint64
	rejectedAt  time.Time
	lag         *lagStats
	faultLogged time.Time
}

func (p *peer) stop() {
	if p.cancel != nil {
		p.cancel()
	}
}

// connected reports whether p is heard from.
func (p *peer) connected() bool { return p.state == stateConnected || p.state == stateRejected }

// reject counts a message of p's dropped at now for reason.
func (p *peer) reject(now time.Time, reason int, detail string) {
	p.rejected[reason]++
	p.rejectedAt = now
	p.state, p.reason = stateRejected, rejectNames[reason]+": "+detail
}

// judge updates p's state at now: a peer that went quiet is silent, and a
// fault is logged when found and once a minute while it lasts.
func (p *peer) judge(now time.Time, m *Mesh) {
	switch p.state {
	case stateRejected:
		if now.Sub(p.lastMessage) > m.silentAfter() {
			p.state, p.reason = stateSilent, "no message for "+m.silentAfter().String()+" (its last were rejected: "+p.reason+")"
		} else if now.Sub(p.rejectedAt) > rejectHold {
			p.state, p.reason = stateConnected, ""
		}
	case stateConnected:
		if now.Sub(p.lastMessage) > m.silentAfter() {
			p.state, p.reason = stateSilent, "no message for "+m.silentAfter().String()+": the replica went away or cannot reach this one"
		}
	case stateConnecting:
		if now.Sub(p.since) > connectGrace {
			p.state, p.reason = stateSilent, "no message since subscribing "+connectGrace.String()+" ago: check that the replica runs with --peer-listen on this address and port, that the port is reachable, and that both hold the same --peer-key-file (or both run --peer-insecure)"
		}
	}
	if p.fault() != "" && now.Sub(p.faultLogged) >= time.Minute {
		p.faultLogged = now
		m.log.Warn("peer replica wiring fault", "peer", p.addr, "state", p.state, "reason", p.reason)
	} else if p.fault() == "" {
		p.faultLogged = time.Time{}
	}
}

// fault names p's wiring fault, "" for none: the state of a peer that
// should be heard from and is not.
func (p *peer) fault() string {
	switch p.state {
	case stateSilent, stateIncompatible, stateFailed, stateRejected:
		return p.state
	}
	return ""
}

// lagStats summarises send-to-receive lag: the sender's clock against
// this replica's, so it includes the clocks' skew.
type lagStats struct {
	last, max, sum float64
	n              uint64
	hist           lockedhist.Histogram
}

func newLagStats() *lagStats { return &lagStats{hist: lockedhist.New(lagBuckets)} }

func (l *lagStats) observe(d time.Duration) {
	s := math.Max(d.Seconds(), 0)
	l.last, l.max = s, math.Max(l.max, s)
	l.sum += s
	l.n++
	l.hist.Observe(s)
}

var lagBuckets = []float64{0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5}
