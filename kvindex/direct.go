package kvindex

import (
	"context"
	"log/slog"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// DirectConfig is what an in-process stream needs; the fields mean what
// SequencerConfig's of the same names do.
type DirectConfig struct {
	Target    targetid.ID
	Handle    func(seq uint64, b *events.Batch, replayed bool)
	Restarted func()
	Logger    *slog.Logger
	Metrics   *Metrics
	// Now stamps each batch's arrival; nil: time.Now. A caller running on
	// a virtual clock gives its own, so that freshness is judged on it.
	Now func() time.Time
	// Replay, when set, reads the pod's replay buffer: a gap, a restart
	// and a reconnection are then replayed from it, as a subscriber's are
	// from the replay socket (at once, on the caller's clock). Nil: a gap
	// is unrecovered.
	Replay ReplayBuffer
}

// Direct is one target's KV-event stream fed in process: the caller holds
// decoded batches with their sequence numbers (the benchmark's
// discrete-event engine, which models the publisher and the network
// itself) and hands them over in order. Sequence tracking and replay are
// the subscriber's own (a gap is counted and replayed, a sequence going
// backwards is a restart), with the caller's replay buffer for the socket.
// Deliver applies the batch before it returns; calls must not overlap.
type Direct struct {
	s  *Sequencer
	st stream
}

// NewDirect returns a connected in-process stream.
func NewDirect(cfg DirectConfig) *Direct {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	s := NewSequencer(SequencerConfig{
		Target: cfg.Target, Handle: cfg.Handle, Restarted: cfg.Restarted,
		Logger: log.With("target", cfg.Target.String()), Metrics: cfg.Metrics, Now: cfg.Now, QueueSize: 1,
		ReplayBuffer: cfg.Replay,
	})
	s.SetConnected(true, s.cfg.Now())
	return &Direct{s: s}
}

// Deliver applies batch seq of the stream.
func (d *Direct) Deliver(seq uint64, b *events.Batch) {
	d.s.handle(context.Background(), &d.st, Message{Seq: seq, Batch: b})
}

// Disconnect marks the stream's connection lost (a network cut): its
// verdict turns disconnected, and batches the caller no longer delivers
// are missed until Connect.
func (d *Direct) Disconnect() {
	d.s.SetConnected(false, d.s.cfg.Now())
}

// Connect marks the connection back and catches up from the replay
// buffer, as a subscriber does when its socket reconnects.
func (d *Direct) Connect() {
	d.s.SetConnected(true, d.s.cfg.Now())
	d.s.handle(context.Background(), &d.st, Message{Connected: true})
}

// Resync tells the stream that the pod is known to have restarted (a
// scrape saw its process start time change) although no sequence number
// showed it yet: its placements are cleared and the sequence starts over.
func (d *Direct) Resync() {
	d.s.restart(context.Background(), &d.st, resyncReason)
}

// Status is the stream's state and counters.
func (d *Direct) Status() SubscriberStatus { return d.s.Status() }
