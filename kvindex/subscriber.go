package kvindex

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/kvindex/zmqwait"
	"github.com/prefixrouter/prefixrouter/target"
)

// SubscriberConfig describes one target's event stream.
type SubscriberConfig struct {
	Target target.ID
	// Endpoint is the pod's PUB socket, e.g. tcp://10.0.0.7:5557.
	Endpoint string
	// Replay is the pod's ROUTER replay socket; empty disables replay (gaps
	// are then counted but not recovered).
	Replay string
	// Topic is the subscription prefix; empty receives every topic.
	Topic string
	// Handle is called for every decoded batch in sequence order, from the
	// subscriber's goroutine. replayed says the batch came through replay.
	Handle func(seq uint64, b *events.Batch, replayed bool)
	// Restarted is called when the sequence goes backwards: the pod's
	// process restarted and everything it held is gone. It runs before the
	// new process's batches are handled.
	Restarted func()
	// DecodeFailed, if set, sees each payload that could not be decoded.
	DecodeFailed func(seq uint64, err error)

	// ReplayTimeout bounds one replay exchange (default 5 s).
	ReplayTimeout time.Duration
	// ReconnectMin/Max bound libzmq's reconnect backoff (defaults 100 ms, 5 s).
	ReconnectMin, ReconnectMax time.Duration
	// QueueSize is how many received batches may wait to be applied
	// (default 4096); the receiver blocks beyond it and ZMQ buffers.
	QueueSize int
	// MaxMessageBytes makes libzmq drop the connection of a peer sending
	// a larger frame instead of allocating for it (default 64 MiB).
	MaxMessageBytes int64
	Logger          *slog.Logger
	Metrics         *Metrics
}

// Subscriber follows one target's KV-event stream: a SUB socket with a topic
// filter, sequence tracking, replay through a DEALER on gaps, first connect
// and restarts, and reconnection with backoff.
type Subscriber struct {
	cfg   SubscriberConfig
	log   *slog.Logger
	label string

	mu     sync.Mutex
	status SubscriberStatus

	queue  chan rawMessage
	resync chan struct{}
}

type rawMessage struct {
	seq     uint64
	payload []byte
	err     error // malformed framing
	// connected marks the socket (re)connecting rather than a message:
	// the moment to catch up through replay.
	connected bool
}

// NewSubscriber validates the configuration; Run does the work.
func NewSubscriber(cfg SubscriberConfig) (*Subscriber, error) {
	if cfg.Endpoint == "" {
		return nil, errors.New("subscriber: events endpoint is empty")
	}
	if cfg.Handle == nil {
		return nil, errors.New("subscriber: no batch handler")
	}
	if cfg.ReplayTimeout <= 0 {
		cfg.ReplayTimeout = 5 * time.Second
	}
	if cfg.ReconnectMin <= 0 {
		cfg.ReconnectMin = 100 * time.Millisecond
	}
	if cfg.ReconnectMax < cfg.ReconnectMin {
		cfg.ReconnectMax = 5 * time.Second
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 4096
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = 64 << 20
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	label := cfg.Target.String()
	return &Subscriber{
		cfg:    cfg,
		label:  label,
		log:    log.With("target", label, "events", cfg.Endpoint),
		status: SubscriberStatus{Target: cfg.Target},
		queue:  make(chan rawMessage, cfg.QueueSize),
		resync: make(chan struct{}, 1),
	}, nil
}

// Status returns a snapshot of the stream's state and counters.
func (s *Subscriber) Status() SubscriberStatus {
	s.mu.Lock()
	st := s.status
	s.mu.Unlock()
	st.QueueDepth = len(s.queue)
	return st
}

func (s *Subscriber) update(fn func(*SubscriberStatus)) {
	s.mu.Lock()
	fn(&s.status)
	s.mu.Unlock()
}

// Run receives and applies batches until ctx ends. It returns nil on
// cancellation and an error only when the socket cannot be set up at all
// (for example a malformed endpoint).
func (s *Subscriber) Run(ctx context.Context) error {
	started := time.Now()
	s.update(func(st *SubscriberStatus) {
		if st.ConnectionChanged.IsZero() {
			st.ConnectionChanged = started
		}
	})
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	recvErr := make(chan error, 1)
	go func() { recvErr <- s.receive(ctx) }()
	s.apply(ctx)
	cancel()
	err := <-recvErr
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return nil
	}
	return err
}

// receive owns the SUB and monitor sockets. It only frames and queues
// messages so that a slow replay never makes ZMQ drop live batches.
func (s *Subscriber) receive(ctx context.Context) error {
	defer close(s.queue)
	sub, err := zmq.NewSocket(zmq.SUB)
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", s.cfg.Endpoint, err)
	}
	defer sub.Close()
	_ = sub.SetLinger(0)
	_ = sub.SetRcvhwm(100000)
	_ = sub.SetMaxmsgsize(s.cfg.MaxMessageBytes)
	_ = sub.SetReconnectIvl(s.cfg.ReconnectMin)
	_ = sub.SetReconnectIvlMax(s.cfg.ReconnectMax)
	if err := sub.SetSubscribe(s.cfg.Topic); err != nil {
		return fmt.Errorf("subscribe %s topic %q: %w", s.cfg.Endpoint, s.cfg.Topic, err)
	}
	monAddr := fmt.Sprintf("inproc://kvmon-%d", monitorSeq.Add(1))
	if err := sub.Monitor(monAddr, zmq.EVENT_CONNECTED|zmq.EVENT_DISCONNECTED); err != nil {
		return fmt.Errorf("monitor %s: %w", s.cfg.Endpoint, err)
	}
	mon, err := zmq.NewSocket(zmq.PAIR)
	if err != nil {
		return fmt.Errorf("monitor %s: %w", s.cfg.Endpoint, err)
	}
	defer mon.Close()
	// Monitoring stops before the monitor socket closes. ZeroMQ's I/O
	// thread sends each event to the monitor with a blocking send; an event
	// with no reader (the pod going away as this subscriber stops) blocks
	// that thread for good, and with it every socket of the process.
	defer func() { _ = sub.Monitor("", 0) }()
	_ = mon.SetLinger(0)
	if err := mon.Connect(monAddr); err != nil {
		return fmt.Errorf("monitor %s: %w", s.cfg.Endpoint, err)
	}
	if err := sub.Connect(s.cfg.Endpoint); err != nil {
		return fmt.Errorf("subscribe %s: %w", s.cfg.Endpoint, err)
	}
	subWait, err := zmqwait.New(sub)
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", s.cfg.Endpoint, err)
	}
	defer subWait.Close()
	monWait, err := zmqwait.New(mon)
	if err != nil {
		return fmt.Errorf("monitor %s: %w", s.cfg.Endpoint, err)
	}
	defer monWait.Close()
	wctx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		s.watchConnection(wctx, mon, monWait)
	}()
	// The watcher sends on the queue and owns the monitor socket: it ends
	// before either is closed.
	defer func() { stopWatch(); <-watched }()
	for {
		if _, err := subWait.Wait(ctx, 0); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("subscribe %s: %w", s.cfg.Endpoint, err)
		}
		for {
			frames, err := sub.RecvMessageBytes(zmq.DONTWAIT)
			if err != nil {
				break // drained (EAGAIN); the next wait asks the socket again
			}
			select {
			case s.queue <- frameMessage(frames):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}

// watchConnection reports the SUB socket's connects and disconnects from
// its monitor socket, which it owns, until ctx ends. A connect queues the
// moment to catch up through replay.
func (s *Subscriber) watchConnection(ctx context.Context, mon *zmq.Socket, w *zmqwait.Waiter) {
	connectedOnce := false
	for {
		if _, err := w.Wait(ctx, 0); err != nil {
			if ctx.Err() == nil {
				s.log.Error("monitor socket failed", "err", err)
			}
			return
		}
		for {
			ev, _, _, err := mon.RecvEvent(zmq.DONTWAIT)
			if err != nil {
				break
			}
			switch ev {
			case zmq.EVENT_CONNECTED:
				now := time.Now()
				if connectedOnce {
					s.update(func(st *SubscriberStatus) { st.Reconnects++ })
					if s.cfg.Metrics != nil {
						s.cfg.Metrics.reconnects.WithLabelValues(s.label).Inc()
					}
					s.log.Info("event stream reconnected")
				}
				connectedOnce = true
				s.update(func(st *SubscriberStatus) { st.Connected, st.EverConnected, st.ConnectionChanged = true, true, now })
				select {
				case s.queue <- rawMessage{connected: true}:
				case <-ctx.Done():
					return
				}
			case zmq.EVENT_DISCONNECTED:
				now := time.Now()
				s.update(func(st *SubscriberStatus) { st.Connected, st.ConnectionChanged = false, now })
				s.log.Warn("event stream disconnected")
			}
		}
	}
}

// monitorSeq names each subscriber's inproc monitor endpoint uniquely.
var monitorSeq atomic.Uint64

// frameMessage checks the three-frame layout: topic, sequence, payload.
func frameMessage(frames [][]byte) rawMessage {
	if len(frames) != 3 {
		return rawMessage{err: fmt.Errorf("message of %d frames (want topic, seq, payload)", len(frames))}
	}
	seq, err := events.ParseSeq(frames[1])
	if err != nil {
		return rawMessage{err: err}
	}
	return rawMessage{seq: seq, payload: frames[2]}
}

// Resync tells the subscriber that the pod is known to have restarted
// (health saw its process start time change, for instance) even though the
// sequence numbers did not reveal it: placements are cleared and rebuilt
// from the replay buffer. It does not block.
func (s *Subscriber) Resync() {
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

// apply owns sequence tracking and replay. On connecting it replays what
// the pod's buffer holds (from 0 on first join, so a router joining late
// learns what it can; from the next expected batch after a reconnect); on a
// gap it replays the missing range; when the sequence goes backwards the pod
// restarted, so placements are cleared and replay starts over from 0.
func (s *Subscriber) apply(ctx context.Context) {
	var st stream
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.resync:
			s.restart(ctx, &st, "resync requested")
			if s.cfg.Replay != "" {
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

func (s *Subscriber) handle(ctx context.Context, st *stream, msg rawMessage) {
	if msg.err != nil {
		s.decodeFailed(0, msg.err)
		return
	}
	if msg.connected {
		if s.cfg.Replay != "" {
			s.catchUp(ctx, st)
		}
		return
	}
	switch {
	case st.dupOpen && msg.seq >= st.dupFrom && msg.seq < st.next:
		return // live copy of a batch the replay already delivered
	case !st.have:
		if s.cfg.Replay != "" && msg.seq > 0 {
			st.next = s.replay(ctx, 0, msg.seq)
		}
	case msg.seq < st.next:
		// Sequence numbers only go backwards when a new process starts
		// counting from 0: live batches are never duplicated, and batches
		// replayed ahead of the live stream are filtered below.
		s.restart(ctx, st, "event sequence went backwards")
		if s.cfg.Replay != "" && msg.seq > 0 {
			st.next = s.replay(ctx, 0, msg.seq)
		}
	case msg.seq > st.next:
		missing := msg.seq - st.next
		s.update(func(ss *SubscriberStatus) { ss.Gaps++ })
		if s.cfg.Metrics != nil {
			s.cfg.Metrics.gaps.WithLabelValues(s.label).Inc()
		}
		s.log.Warn("event sequence gap", "expected", st.next, "got", msg.seq, "missing", missing)
		if s.cfg.Replay != "" {
			st.next = s.replay(ctx, st.next, msg.seq)
		} else {
			s.unrecovered(missing)
		}
	}
	if st.have && msg.seq < st.next {
		return // the replay already delivered it
	}
	s.deliver(msg.seq, msg.payload, false)
	st.have, st.next, st.dupOpen = true, msg.seq+1, false
}

// restart forgets the old process: its placements are cleared by the
// Restarted callback and the sequence starts over.
func (s *Subscriber) restart(_ context.Context, st *stream, why string) {
	s.log.Warn(why+": pod restarted, clearing its placements", "expected", st.next)
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
func (s *Subscriber) catchUp(ctx context.Context, st *stream) {
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

func (s *Subscriber) unrecovered(n uint64) {
	s.update(func(ss *SubscriberStatus) { ss.Unrecovered += n })
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.unrecovered.WithLabelValues(s.label).Add(float64(n))
	}
}

// deliver decodes and hands one batch to the handler.
func (s *Subscriber) deliver(seq uint64, payload []byte, replayed bool) {
	b, err := events.Decode(payload)
	if err != nil {
		s.decodeFailed(seq, err)
	} else {
		s.cfg.Handle(seq, &b, replayed)
	}
	now := time.Now()
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

func (s *Subscriber) decodeFailed(seq uint64, err error) {
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
func (s *Subscriber) replay(ctx context.Context, start, stop uint64) uint64 {
	s.update(func(st *SubscriberStatus) { st.Replaying = true; st.Replays++ })
	defer s.update(func(st *SubscriberStatus) { st.Replaying = false })
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.replays.WithLabelValues(s.label).Inc()
	}
	next := start
	err := ReplayRange(ctx, s.cfg.Replay, start, s.cfg.ReplayTimeout, func(seq uint64, payload []byte) bool {
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
		s.deliver(seq, payload, true)
		next = seq + 1
		return true
	})
	if err != nil {
		s.log.Warn("replay failed", "replay", s.cfg.Replay, "from", start, "err", err)
	}
	if stop != events.EndOfReplay && next < stop && !publisherStart(next, stop) {
		s.log.Warn("replay did not reach the live stream", "from", start, "next", next, "live", stop)
		s.unrecovered(stop - next)
	}
	return next
}

// publisherStart reports whether batch got, expected after want, is where
// a publisher's numbering starts rather than a loss: vLLM numbers a
// process's batches from 0, other publishers seen in the field from 1, so
// from the origin (nothing applied since the subscriber joined or the pod
// restarted) a missing batch 0 alone is no loss.
func publisherStart(want, got uint64) bool { return want == 0 && got == 1 }

// ReplayRange requests every batch from start from a vLLM replay socket and
// calls fn for each, in order, until the end marker, fn returning false, the
// timeout or ctx ending. It accepts both reply layouts: [“”, topic, seq,
// payload] (current vLLM) and [“”, seq, payload] (older).
func ReplayRange(ctx context.Context, endpoint string, start uint64, timeout time.Duration, fn func(seq uint64, payload []byte) bool) error {
	d, err := zmq.NewSocket(zmq.DEALER)
	if err != nil {
		return fmt.Errorf("replay %s: %w", endpoint, err)
	}
	defer d.Close()
	_ = d.SetLinger(0)
	_ = d.SetMaxmsgsize(64 << 20)
	if err := d.Connect(endpoint); err != nil {
		return fmt.Errorf("replay %s: %w", endpoint, err)
	}
	if _, err := d.SendMessage([]byte{}, events.SeqFrame(start)); err != nil {
		return fmt.Errorf("replay %s: send request: %w", endpoint, err)
	}
	w, err := zmqwait.New(d)
	if err != nil {
		return fmt.Errorf("replay %s: %w", endpoint, err)
	}
	defer w.Close()
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("replay %s: no end marker within %s", endpoint, timeout)
		}
		ready, err := w.Wait(ctx, left)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("replay %s: %w", endpoint, err)
		}
		if !ready {
			continue
		}
		frames, err := d.RecvMessageBytes(zmq.DONTWAIT)
		if zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN) {
			continue
		}
		if err != nil {
			return fmt.Errorf("replay %s: receive: %w", endpoint, err)
		}
		seq, payload, err := parseReplayReply(frames)
		if err != nil {
			return fmt.Errorf("replay %s: %w", endpoint, err)
		}
		if seq == events.EndOfReplay {
			return nil
		}
		// A reply arriving means the pod is alive: extend the deadline so a
		// long buffer is not cut off midway.
		deadline = time.Now().Add(timeout)
		if !fn(seq, payload) {
			return nil
		}
	}
}

func parseReplayReply(frames [][]byte) (uint64, []byte, error) {
	// The leading empty delimiter frame is what a DEALER sees of the ROUTER
	// envelope; tolerate its absence.
	if len(frames) > 0 && len(frames[0]) == 0 && (len(frames) == 4 || len(frames) == 3) {
		frames = frames[1:]
	}
	switch len(frames) {
	case 3: // topic, seq, payload
		seq, err := events.ParseSeq(frames[1])
		return seq, frames[2], err
	case 2: // seq, payload
		seq, err := events.ParseSeq(frames[0])
		return seq, frames[1], err
	}
	return 0, nil, fmt.Errorf("replay reply of %d frames", len(frames))
}
