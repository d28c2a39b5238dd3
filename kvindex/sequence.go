package kvindex

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// Sequencer owns one event stream's sequence: it applies the messages a
// receiver queues in order, replays what the pod still buffers on first
// join, after a gap and after a restart, detects restarts, decodes and
// delivers batches, and keeps the stream's status. A receiver (one pod's
// subscriber, one topic of a bus: package kvtransport) owns the socket,
// queues what it frames (Queue, Offer) and supplies the replay
// (SequencerConfig.Replay); an in-process stream (Direct) hands batches
// over itself.
type Sequencer struct {
	cfg   SequencerConfig
	log   *slog.Logger
	label string

	mu       sync.Mutex
	status   SubscriberStatus
	refusals RefusalLog

	queue  chan Message
	resync chan struct{} // the pod restarted (Resync)

	// The rate windows belong to the apply loop (or Direct's caller).
	clears, resets, gaps rateWindow
}

// SequencerConfig is what a stream's sequence tracking needs.
type SequencerConfig struct {
	Target targetid.ID
	// Handle is called for every decoded batch in sequence order, from
	// the apply loop. replayed says the batch came through replay.
	Handle func(seq uint64, b *events.Batch, replayed bool)
	// Restarted is called when the pod's process restarted and everything
	// it held is gone; it runs before the new process's batches are
	// handled.
	Restarted func()
	// DecodeFailed, if set, sees each payload that could not be decoded.
	DecodeFailed func(seq uint64, err error)
	// QueueSize is how many received messages may wait to be applied
	// (default 4096).
	QueueSize int
	Logger    *slog.Logger // with the stream's attributes
	Metrics   *Metrics
	// Now stamps each batch's arrival (LastEvent); nil: time.Now.
	Now func() time.Time
	// Replay, when set, asks the pod's replay socket for its buffered
	// payloads (kvtransport supplies it); ReplayBuffer, when set, is read
	// instead: an in-process stream's pod buffer (DirectConfig.Replay).
	// Neither: a gap is counted and unrecovered.
	Replay       ReplayFunc
	ReplayBuffer ReplayBuffer
	// Limits bound what the stream's batches may do; zero: no bounds.
	Limits StreamLimits
}

// ReplayFunc asks a pod's replay buffer for every batch from sequence
// start on and calls fn with each payload, in order, until the buffer's
// end or fn returning false: the seam between the sequencer and the
// transport that reaches the pod's replay socket. The payloads are
// decoded by the stream, within its bounds. An error ends the replay;
// what it did not bring back is counted as unrecovered.
type ReplayFunc func(ctx context.Context, start uint64, fn func(seq uint64, payload []byte) bool) error

// ReplayBuffer calls fn with the batches a pod's replay buffer holds from
// sequence start on, in order, until fn returns false: what a replay
// socket answers, already decoded.
type ReplayBuffer func(start uint64, fn func(seq uint64, b *events.Batch) bool)

// canReplay reports whether the pod's buffered batches can be asked for.
func (s *Sequencer) canReplay() bool { return s.cfg.Replay != nil || s.cfg.ReplayBuffer != nil }

// Message is what a receiver queues on its stream: one framed batch, a
// framing error, or a change of connection.
type Message struct {
	Seq     uint64
	Payload []byte
	// Batch is the message already decoded (an in-process stream,
	// Direct); Payload is then unused.
	Batch *events.Batch
	Err   error // malformed framing
	// Connected marks the socket (re)connecting rather than a message:
	// the moment to catch up through replay.
	Connected bool
	// StartOver, when set, is why the stream starts over before this
	// message: another connection took the topic over (a bus). In the
	// queue, so that it comes before the new connection's first batch.
	StartOver string
}

// NewSequencer returns a stream's sequencer; Run applies what is queued.
func NewSequencer(cfg SequencerConfig) *Sequencer {
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 4096
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Sequencer{
		cfg:    cfg,
		label:  cfg.Target.String(),
		log:    cfg.Logger,
		status: SubscriberStatus{Target: cfg.Target},
		queue:  make(chan Message, cfg.QueueSize),
		resync: make(chan struct{}, 1),
		clears: rateWindow{n: cfg.Limits.ClearsPerMinute},
		resets: rateWindow{n: cfg.Limits.ResetsPerMinute},
		gaps:   rateWindow{n: cfg.Limits.GapsPerMinute},
	}
}

// Refuse counts a batch or event not applied, and logs it at most once per
// RefusalLogEvery per reason.
func (s *Sequencer) Refuse(r Refusal, detail string, args ...any) {
	s.mu.Lock()
	log := s.refusals.Record(r, detail, s.cfg.Now())
	s.mu.Unlock()
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.refused.WithLabelValues(s.label, r.String()).Inc()
	}
	if log {
		s.log.Warn("KV events refused, not applied: "+detail, append(args, "reason", r.String(), "log_every", RefusalLogEvery)...)
	}
}

// Status returns a snapshot of the stream's state and counters.
func (s *Sequencer) Status() SubscriberStatus {
	s.mu.Lock()
	st := s.status
	st.Refused = s.refusals.RefusalCounts
	s.mu.Unlock()
	st.QueueDepth = len(s.queue)
	return st
}

// Queue queues msg for the apply loop, waiting while the queue is full;
// it fails only when ctx ends. Only the receiver queues, and not after
// Close.
func (s *Sequencer) Queue(ctx context.Context, msg Message) error {
	select {
	case s.queue <- msg:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Offer queues msg unless the queue is full, and reports whether it did.
func (s *Sequencer) Offer(msg Message) bool {
	select {
	case s.queue <- msg:
		return true
	default:
		return false
	}
}

// QueueCap is how many messages the queue holds.
func (s *Sequencer) QueueCap() int { return cap(s.queue) }

// Close tells the apply loop that the receiver queues no more: Run returns
// once the queue is drained. The receiver calls it once, when it ends.
func (s *Sequencer) Close() { close(s.queue) }

// Started records when the receiver started: until its first connection,
// the time ConnectionChanged reports.
func (s *Sequencer) Started(now time.Time) {
	s.update(func(st *SubscriberStatus) {
		if st.ConnectionChanged.IsZero() {
			st.ConnectionChanged = now
		}
	})
}

// SetConnected records the receiver's connection coming up or going down.
func (s *Sequencer) SetConnected(connected bool, now time.Time) {
	s.update(func(st *SubscriberStatus) {
		st.Connected, st.ConnectionChanged = connected, now
		st.EverConnected = st.EverConnected || connected
	})
}

// Reconnected counts a connection after the first.
func (s *Sequencer) Reconnected() {
	s.update(func(st *SubscriberStatus) { st.Reconnects++ })
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.reconnects.WithLabelValues(s.label).Inc()
	}
}

func (s *Sequencer) update(fn func(*SubscriberStatus)) {
	s.mu.Lock()
	fn(&s.status)
	s.mu.Unlock()
}

// resyncReason is what the log says of a restart health saw.
const resyncReason = "resync requested: pod restarted"

// Resync tells the stream that the pod is known to have restarted (health
// saw its process start time change, for instance) even though the
// sequence numbers did not reveal it: placements are cleared and rebuilt
// from the replay buffer. It does not block.
func (s *Sequencer) Resync() {
	select {
	case s.resync <- struct{}{}:
	default:
	}
}

// stream is the apply loop's view of the sequence.
type stream struct {
	have bool   // a batch has been applied since the last (re)start
	next uint64 // next expected sequence
	// [dupFrom, next) was delivered by replay while live copies of the same
	// batches may still sit in the queue; those copies are not a restart.
	dupFrom uint64
	dupOpen bool
}

// Run owns sequence tracking and replay. On connecting it replays what
// the pod's buffer holds (from 0 on first join, so a router joining late
// learns what it can; from the next expected batch after a reconnect); on a
// gap it replays the missing range; when the sequence goes backwards the pod
// restarted, so placements are cleared and replay starts over from 0.
func (s *Sequencer) Run(ctx context.Context) {
	var st stream
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.resync:
			s.restart(ctx, &st, resyncReason)
			if s.canReplay() {
				s.catchUp(ctx, &st)
			}
		case msg, ok := <-s.queue:
			if !ok {
				return
			}
			s.handle(ctx, &st, msg)
		}
	}
}

func (s *Sequencer) handle(ctx context.Context, st *stream, msg Message) {
	if msg.Err != nil {
		s.decodeFailed(0, msg.Err)
		return
	}
	if msg.Connected {
		if s.canReplay() {
			s.catchUp(ctx, st)
		}
		return
	}
	if msg.StartOver != "" {
		// The message itself, the new stream's first, replays what the
		// pod buffered before it.
		s.restart(ctx, st, msg.StartOver)
	}
	switch {
	case st.dupOpen && msg.Seq >= st.dupFrom && msg.Seq < st.next:
		return // live copy of a batch the replay already delivered
	case !st.have:
		if s.canReplay() && msg.Seq > 0 {
			st.next = s.replay(ctx, 0, msg.Seq)
		}
	case msg.Seq < st.next:
		// Sequence numbers only go backwards when a new process starts
		// counting from 0: live batches are never duplicated, and batches
		// replayed ahead of the live stream are filtered below. A restart
		// health saw arrives as a Resync instead; this one only the
		// stream says, so it is rate-limited.
		if !s.resets.allow(s.cfg.Now()) {
			s.Refuse(RefusedResetRate, "the event sequence went backwards more often than the reset limit allows", "expected", st.next, "got", msg.Seq)
			return
		}
		s.restart(ctx, st, "event sequence went backwards: pod restarted")
		if s.canReplay() && msg.Seq > 0 {
			st.next = s.replay(ctx, 0, msg.Seq)
		}
	case msg.Seq > st.next:
		if !s.gaps.allow(s.cfg.Now()) {
			s.Refuse(RefusedGapRate, "the event sequence skipped batches more often than the gap limit allows", "expected", st.next, "got", msg.Seq)
			return
		}
		missing := msg.Seq - st.next
		s.update(func(ss *SubscriberStatus) { ss.Gaps++ })
		if s.cfg.Metrics != nil {
			s.cfg.Metrics.gaps.WithLabelValues(s.label).Inc()
		}
		s.log.Warn("event sequence gap", "expected", st.next, "got", msg.Seq, "missing", missing)
		if s.canReplay() {
			st.next = s.replay(ctx, st.next, msg.Seq)
		} else {
			s.unrecovered(missing)
		}
	}
	if st.have && msg.Seq < st.next {
		return // the replay already delivered it
	}
	if msg.Batch != nil {
		s.handOver(msg.Seq, msg.Batch, nil, false)
	} else {
		s.deliver(msg.Seq, msg.Payload, false)
	}
	st.have, st.next, st.dupOpen = true, msg.Seq+1, false
}

// restart forgets the old process: its placements are cleared by the
// Restarted callback and the sequence starts over.
func (s *Sequencer) restart(_ context.Context, st *stream, why string) {
	s.log.Warn(why+"; clearing its placements", "expected", st.next)
	s.update(func(ss *SubscriberStatus) { ss.Restarts++; ss.HaveSeq = false })
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.restarts.WithLabelValues(s.label).Inc()
	}
	if s.cfg.Restarted != nil {
		s.cfg.Restarted()
	}
	*st = stream{}
}

// catchUp replays everything the pod buffered from the next expected batch
// (from 0 when nothing was applied yet), without waiting for live traffic:
// an idle pod's history is learned as soon as the connection is up.
func (s *Sequencer) catchUp(ctx context.Context, st *stream) {
	start := uint64(0)
	if st.have {
		start = st.next
	}
	next := s.replay(ctx, start, events.EndOfReplay)
	if next > start {
		st.have, st.next = true, next
		st.dupFrom, st.dupOpen = start, true
	}
}

func (s *Sequencer) unrecovered(n uint64) {
	s.update(func(ss *SubscriberStatus) { ss.Unrecovered += n })
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.unrecovered.WithLabelValues(s.label).Add(float64(n))
	}
}

// deliver decodes and hands one batch to the handler.
func (s *Sequencer) deliver(seq uint64, payload []byte, replayed bool) {
	b, err := events.DecodeLimited(payload, s.cfg.Limits.Decode)
	s.handOver(seq, &b, err, replayed)
}

// limitClears drops the AllBlocksCleared events beyond the stream's clear
// limit from b, counting each; b is copied before it changes.
func (s *Sequencer) limitClears(seq uint64, b *events.Batch) *events.Batch {
	if s.cfg.Limits.ClearsPerMinute <= 0 {
		return b
	}
	var kept []events.Event
	for i := range b.Events {
		ev := &b.Events[i]
		if ev.Kind == events.KindAllBlocksCleared && !s.clears.allow(s.cfg.Now()) {
			if kept == nil {
				kept = append(make([]events.Event, 0, len(b.Events)), b.Events[:i]...)
			}
			s.Refuse(RefusedClearRate, "AllBlocksCleared arrived more often than the clear limit allows", "seq", seq)
			continue
		}
		if kept != nil {
			kept = append(kept, *ev)
		}
	}
	if kept == nil {
		return b
	}
	c := *b
	c.Events = kept
	return &c
}

// handOver hands one batch, decoded with err, to the handler and records
// its arrival.
func (s *Sequencer) handOver(seq uint64, b *events.Batch, err error, replayed bool) {
	if r, ok := limitRefusal(err); ok {
		s.Refuse(r, "a batch exceeds the stream's bounds: "+err.Error(), "seq", seq)
		err = errRefused
	} else if err != nil {
		s.decodeFailed(seq, err)
	} else {
		s.cfg.Handle(seq, s.limitClears(seq, b), replayed)
	}
	now := s.cfg.Now()
	s.update(func(st *SubscriberStatus) {
		st.LastSeq, st.HaveSeq, st.LastEvent = seq, true, now
		if err == nil {
			st.Batches++
			st.Events += uint64(len(b.Events))
		}
		if replayed {
			st.Replayed++
		}
	})
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.lastEvent.WithLabelValues(s.label).Set(float64(now.UnixNano()) / 1e9)
		if replayed {
			s.cfg.Metrics.replayedBatches.WithLabelValues(s.label).Inc()
		}
	}
}

func (s *Sequencer) decodeFailed(seq uint64, err error) {
	s.update(func(st *SubscriberStatus) { st.DecodeErrors++ })
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.decodeErrors.WithLabelValues(s.label).Inc()
	}
	s.log.Warn("skipping undecodable event batch", "seq", seq, "err", err)
	if s.cfg.DecodeFailed != nil {
		s.cfg.DecodeFailed(seq, err)
	}
}

// replay asks the pod's replay buffer for batches from start and delivers
// those before stop (the live batch that revealed the gap is delivered by the
// caller). It returns the next sequence expected after what it delivered.
// Failures are logged and counted; the stream then continues with the gap.
func (s *Sequencer) replay(ctx context.Context, start, stop uint64) uint64 {
	s.update(func(st *SubscriberStatus) { st.Replaying = true; st.Replays++ })
	defer s.update(func(st *SubscriberStatus) { st.Replaying = false })
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.replays.WithLabelValues(s.label).Inc()
	}
	next := start
	take := func(seq uint64, payload []byte, b *events.Batch) bool {
		if seq >= stop {
			return false
		}
		if seq < next {
			return true
		}
		if seq > next && !publisherStart(next, seq) {
			s.log.Warn("replay buffer no longer holds the requested batches", "from", next, "oldest_available", seq)
			s.unrecovered(seq - next)
		}
		if b != nil {
			s.handOver(seq, b, nil, true)
		} else {
			s.deliver(seq, payload, true)
		}
		next = seq + 1
		return true
	}
	if s.cfg.ReplayBuffer != nil {
		s.cfg.ReplayBuffer(start, func(seq uint64, b *events.Batch) bool { return take(seq, nil, b) })
	} else if err := s.cfg.Replay(ctx, start, func(seq uint64, payload []byte) bool {
		return take(seq, payload, nil)
	}); err != nil {
		s.log.Warn("replay failed", "from", start, "err", err)
	}
	if stop != events.EndOfReplay && next < stop && !publisherStart(next, stop) {
		s.log.Warn("replay did not reach the live stream", "from", start, "next", next, "live", stop)
		s.unrecovered(stop - next)
	}
	return next
}

// errRefused marks a batch refused by the stream's bounds: counted as a
// refusal, not as a decode error.
var errRefused = errors.New("refused")

// publisherStart reports whether batch got, expected after want, is where
// a publisher's numbering starts rather than a loss: vLLM numbers a
// process's batches from 0, other publishers seen in the field from 1, so
// from the origin (nothing applied since the subscriber joined or the pod
// restarted) a missing batch 0 alone is no loss.
func publisherStart(want, got uint64) bool { return want == 0 && got == 1 }
