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

// sequencer owns one event stream's sequence: it applies the messages a
// receiver queues in order, replays what the pod's replay socket still
// holds on first join, after a gap and after a restart, detects restarts,
// decodes and delivers batches, and keeps the stream's status. A per-pod
// Subscriber feeds one from its SUB socket; a Bus feeds one per topic.
type sequencer struct {
	cfg   sequencerConfig
	log   *slog.Logger
	label string

	mu     sync.Mutex
	status SubscriberStatus

	queue  chan rawMessage
	resync chan string // why the stream starts over

	// The rate windows belong to the apply loop (or Direct's caller).
	clears, resets, gaps rateWindow
	// logged is when each refusal reason was last logged; under mu.
	logged [numRefusals]time.Time
}

// sequencerConfig is what a stream's sequence tracking needs; the fields
// mean what SubscriberConfig's of the same names do.
type sequencerConfig struct {
	Target        targetid.ID
	Replay        string
	Handle        func(seq uint64, b *events.Batch, replayed bool)
	Restarted     func()
	DecodeFailed  func(seq uint64, err error)
	ReplayTimeout time.Duration
	QueueSize     int
	Logger        *slog.Logger // with the stream's attributes
	Metrics       *Metrics
	// Now stamps each batch's arrival (LastEvent); nil: time.Now.
	Now func() time.Time
	// ReplayBuffer, when set, is read instead of the Replay socket: an
	// in-process stream's pod buffer (DirectConfig.Replay).
	ReplayBuffer ReplayBuffer
	// Limits bound what the stream's batches may do; zero: no bounds.
	Limits StreamLimits
	// MaxMessageBytes bounds a replayed batch (0: 64 MiB).
	MaxMessageBytes int64
}

// ReplayBuffer calls fn with the batches a pod's replay buffer holds from
// sequence start on, in order, until fn returns false: what a replay
// socket answers, already decoded.
type ReplayBuffer func(start uint64, fn func(seq uint64, b *events.Batch) bool)

// canReplay reports whether the pod's buffered batches can be asked for.
func (s *sequencer) canReplay() bool { return s.cfg.Replay != "" || s.cfg.ReplayBuffer != nil }

type rawMessage struct {
	seq     uint64
	payload []byte
	// batch is the message already decoded (an in-process stream,
	// Direct); payload is then unused.
	batch *events.Batch
	err   error // malformed framing
	// connected marks the socket (re)connecting rather than a message:
	// the moment to catch up through replay.
	connected bool
	// startOver, when set, is why the stream starts over before this
	// message: another connection took the topic over (Bus). In the
	// queue, so that it comes before the new connection's first batch.
	startOver string
}

func newSequencer(cfg sequencerConfig) *sequencer {
	if cfg.ReplayTimeout <= 0 {
		cfg.ReplayTimeout = 5 * time.Second
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 4096
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = 64 << 20
	}
	return &sequencer{
		cfg:    cfg,
		label:  cfg.Target.String(),
		log:    cfg.Logger,
		status: SubscriberStatus{Target: cfg.Target},
		queue:  make(chan rawMessage, cfg.QueueSize),
		resync: make(chan string, 1),
		clears: rateWindow{n: cfg.Limits.ClearsPerMinute},
		resets: rateWindow{n: cfg.Limits.ResetsPerMinute},
		gaps:   rateWindow{n: cfg.Limits.GapsPerMinute},
	}
}

// refuse counts a batch or event not applied, and logs it at most once per
// refusalLogEvery per reason.
func (s *sequencer) refuse(r Refusal, detail string, args ...any) {
	now := s.cfg.Now()
	s.mu.Lock()
	s.status.Refused.record(r, detail, now)
	log := s.logged[r].IsZero() || now.Sub(s.logged[r]) >= refusalLogEvery
	if log {
		s.logged[r] = now
	}
	s.mu.Unlock()
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.refused.WithLabelValues(s.label, r.String()).Inc()
	}
	if log {
		s.log.Warn("KV events refused, not applied: "+detail, append(args, "reason", r.String(), "log_every", refusalLogEvery)...)
	}
}

// Status returns a snapshot of the stream's state and counters.
func (s *sequencer) Status() SubscriberStatus {
	s.mu.Lock()
	st := s.status
	s.mu.Unlock()
	st.QueueDepth = len(s.queue)
	return st
}

func (s *sequencer) update(fn func(*SubscriberStatus)) {
	s.mu.Lock()
	fn(&s.status)
	s.mu.Unlock()
}

// Resync tells the stream that the pod is known to have restarted (health
// saw its process start time change, for instance) even though the
// sequence numbers did not reveal it: placements are cleared and rebuilt
// from the replay buffer. It does not block.
func (s *sequencer) Resync() {
	select {
	case s.resync <- "resync requested: pod restarted":
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

// apply owns sequence tracking and replay. On connecting it replays what
// the pod's buffer holds (from 0 on first join, so a router joining late
// learns what it can; from the next expected batch after a reconnect); on a
// gap it replays the missing range; when the sequence goes backwards the pod
// restarted, so placements are cleared and replay starts over from 0.
func (s *sequencer) apply(ctx context.Context) {
	var st stream
	for {
		select {
		case <-ctx.Done():
			return
		case why := <-s.resync:
			s.restart(ctx, &st, why)
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

func (s *sequencer) handle(ctx context.Context, st *stream, msg rawMessage) {
	if msg.err != nil {
		s.decodeFailed(0, msg.err)
		return
	}
	if msg.connected {
		if s.canReplay() {
			s.catchUp(ctx, st)
		}
		return
	}
	if msg.startOver != "" {
		// The message itself, the new stream's first, replays what the
		// pod buffered before it.
		s.restart(ctx, st, msg.startOver)
	}
	switch {
	case st.dupOpen && msg.seq >= st.dupFrom && msg.seq < st.next:
		return // live copy of a batch the replay already delivered
	case !st.have:
		if s.canReplay() && msg.seq > 0 {
			st.next = s.replay(ctx, 0, msg.seq)
		}
	case msg.seq < st.next:
		// Sequence numbers only go backwards when a new process starts
		// counting from 0: live batches are never duplicated, and batches
		// replayed ahead of the live stream are filtered below. A restart
		// health saw arrives as a Resync instead; this one only the
		// stream says, so it is rate-limited.
		if !s.resets.allow(s.cfg.Now()) {
			s.refuse(RefusedResetRate, "the event sequence went backwards more often than the reset limit allows", "expected", st.next, "got", msg.seq)
			return
		}
		s.restart(ctx, st, "event sequence went backwards: pod restarted")
		if s.canReplay() && msg.seq > 0 {
			st.next = s.replay(ctx, 0, msg.seq)
		}
	case msg.seq > st.next:
		if !s.gaps.allow(s.cfg.Now()) {
			s.refuse(RefusedGapRate, "the event sequence skipped batches more often than the gap limit allows", "expected", st.next, "got", msg.seq)
			return
		}
		missing := msg.seq - st.next
		s.update(func(ss *SubscriberStatus) { ss.Gaps++ })
		if s.cfg.Metrics != nil {
			s.cfg.Metrics.gaps.WithLabelValues(s.label).Inc()
		}
		s.log.Warn("event sequence gap", "expected", st.next, "got", msg.seq, "missing", missing)
		if s.canReplay() {
			st.next = s.replay(ctx, st.next, msg.seq)
		} else {
			s.unrecovered(missing)
		}
	}
	if st.have && msg.seq < st.next {
		return // the replay already delivered it
	}
	if msg.batch != nil {
		s.handOver(msg.seq, msg.batch, nil, false)
	} else {
		s.deliver(msg.seq, msg.payload, false)
	}
	st.have, st.next, st.dupOpen = true, msg.seq+1, false
}

// restart forgets the old process: its placements are cleared by the
// Restarted callback and the sequence starts over.
func (s *sequencer) restart(_ context.Context, st *stream, why string) {
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
func (s *sequencer) catchUp(ctx context.Context, st *stream) {
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

func (s *sequencer) unrecovered(n uint64) {
	s.update(func(ss *SubscriberStatus) { ss.Unrecovered += n })
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.unrecovered.WithLabelValues(s.label).Add(float64(n))
	}
}

// deliver decodes and hands one batch to the handler.
func (s *sequencer) deliver(seq uint64, payload []byte, replayed bool) {
	b, err := events.DecodeLimited(payload, s.cfg.Limits.Decode)
	s.handOver(seq, &b, err, replayed)
}

// limitClears drops the AllBlocksCleared events beyond the stream's clear
// limit from b, counting each; b is copied before it changes.
func (s *sequencer) limitClears(seq uint64, b *events.Batch) *events.Batch {
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
			s.refuse(RefusedClearRate, "AllBlocksCleared arrived more often than the clear limit allows", "seq", seq)
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
func (s *sequencer) handOver(seq uint64, b *events.Batch, err error, replayed bool) {
	if r, ok := limitRefusal(err); ok {
		s.refuse(r, "a batch exceeds the stream's bounds: "+err.Error(), "seq", seq)
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

func (s *sequencer) decodeFailed(seq uint64, err error) {
	s.update(func(st *SubscriberStatus) { st.DecodeErrors++ })
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.decodeErrors.WithLabelValues(s.label).Inc()
	}
	s.log.Warn("skipping undecodable event batch", "seq", seq, "err", err)
	if s.cfg.DecodeFailed != nil {
		s.cfg.DecodeFailed(seq, err)
	}
}

// replay asks the pod's replay socket for batches from start and delivers
// those before stop (the live batch that revealed the gap is delivered by the
// caller). It returns the next sequence expected after what it delivered.
// Failures are logged and counted; the stream then continues with the gap.
func (s *sequencer) replay(ctx context.Context, start, stop uint64) uint64 {
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
	} else if err := replayRange(ctx, s.cfg.Replay, start, s.cfg.ReplayTimeout, s.cfg.MaxMessageBytes, func(seq uint64, payload []byte) bool {
		return take(seq, payload, nil)
	}); err != nil {
		s.log.Warn("replay failed", "replay", s.cfg.Replay, "from", start, "err", err)
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
