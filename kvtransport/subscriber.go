package kvtransport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/prefixrouter/prefixrouter/internal/zmqwait"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// SubscriberConfig describes one target's event stream.
type SubscriberConfig struct {
	Target targetid.ID
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
	// a larger frame (live or replayed) instead of allocating for it
	// (default 4 MiB); the subscriber reconnects, counted in Reconnects.
	MaxMessageBytes int64
	// Limits bound each batch and the stream's clears, resets and gaps.
	Limits  kvindex.StreamLimits
	Logger  *slog.Logger
	Metrics *kvindex.Metrics
}

// Subscriber follows one target's KV-event stream: a SUB socket connected
// to the pod's PUB with a topic filter, reconnection with backoff, and the
// stream's sequence tracking and replay (kvindex.Sequencer, replaying from
// the pod's replay socket).
type Subscriber struct {
	cfg SubscriberConfig
	log *slog.Logger
	seq *kvindex.Sequencer
}

// NewSubscriber validates the configuration; Run does the work.
func NewSubscriber(cfg SubscriberConfig) (*Subscriber, error) {
	if cfg.Endpoint == "" {
		return nil, errors.New("subscriber: events endpoint is empty")
	}
	if cfg.Handle == nil {
		return nil, errors.New("subscriber: no batch handler")
	}
	if cfg.ReconnectMin <= 0 {
		cfg.ReconnectMin = 100 * time.Millisecond
	}
	if cfg.ReconnectMax < cfg.ReconnectMin {
		cfg.ReconnectMax = 5 * time.Second
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = 4 << 20
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("target", cfg.Target.String(), "events", cfg.Endpoint)
	return &Subscriber{
		cfg: cfg,
		log: log,
		seq: kvindex.NewSequencer(kvindex.SequencerConfig{
			Target: cfg.Target, Handle: cfg.Handle, Restarted: cfg.Restarted, DecodeFailed: cfg.DecodeFailed,
			QueueSize: cfg.QueueSize, Logger: log, Metrics: cfg.Metrics, Limits: cfg.Limits,
			Replay: ReplaySocket(cfg.Replay, cfg.ReplayTimeout, cfg.MaxMessageBytes),
		}),
	}, nil
}

// Status returns a snapshot of the stream's state and counters.
func (s *Subscriber) Status() kvindex.SubscriberStatus { return s.seq.Status() }

// Resync tells the subscriber that the pod is known to have restarted
// (health saw its process start time change, for instance) even though the
// sequence numbers did not reveal it: placements are cleared and rebuilt
// from the replay buffer. It does not block.
func (s *Subscriber) Resync() { s.seq.Resync() }

// Run receives and applies batches until ctx ends. It returns nil on
// cancellation and an error only when the socket cannot be set up at all
// (for example a malformed endpoint).
func (s *Subscriber) Run(ctx context.Context) error {
	s.seq.Started(time.Now())
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	recvErr := make(chan error, 1)
	go func() { recvErr <- s.receive(ctx) }()
	s.seq.Run(ctx)
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
	defer s.seq.Close()
	sub, err := zmq.NewSocket(zmq.SUB)
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", s.cfg.Endpoint, err)
	}
	defer sub.Close()
	_ = sub.SetLinger(0)
	_ = sub.SetRcvhwm(100000)
	if err := sub.SetMaxmsgsize(s.cfg.MaxMessageBytes); err != nil {
		return fmt.Errorf("subscribe %s: max message size: %w", s.cfg.Endpoint, err)
	}
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
	redialAfter := s.cfg.ReconnectMax + s.cfg.ReconnectMin
	var redialed time.Time
	for {
		ready, err := subWait.Wait(ctx, redialPoll)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("subscribe %s: %w", s.cfg.Endpoint, err)
		}
		if !ready {
			// libzmq ends a connection whose peer broke the protocol (a
			// message beyond MaxMessageBytes) for good instead of
			// reconnecting: past its own backoff, dial again.
			st := s.seq.Status()
			if st.EverConnected && !st.Connected && time.Since(st.ConnectionChanged) >= redialAfter && time.Since(redialed) >= redialAfter {
				redialed = time.Now()
				_ = sub.Disconnect(s.cfg.Endpoint)
				if err := sub.Connect(s.cfg.Endpoint); err != nil {
					return fmt.Errorf("subscribe %s: %w", s.cfg.Endpoint, err)
				}
				s.log.Info("event stream dialled again after its connection ended")
			}
			continue
		}
		for {
			frames, err := sub.RecvMessageBytes(zmq.DONTWAIT)
			if err != nil {
				break // drained (EAGAIN); the next wait asks the socket again
			}
			if err := s.seq.Queue(ctx, frameMessage(frames)); err != nil {
				return err
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
				if connectedOnce {
					s.seq.Reconnected()
					s.log.Info("event stream reconnected")
				}
				connectedOnce = true
				s.seq.SetConnected(true, time.Now())
				if s.seq.Queue(ctx, kvindex.Message{Connected: true}) != nil {
					return
				}
			case zmq.EVENT_DISCONNECTED:
				s.seq.SetConnected(false, time.Now())
				s.log.Warn("event stream disconnected")
			}
		}
	}
}

// redialPoll is how often a disconnected subscriber checks whether to dial
// again.
const redialPoll = 250 * time.Millisecond

// monitorSeq names each subscriber's inproc monitor endpoint uniquely.
var monitorSeq atomic.Uint64

// frameMessage checks the three-frame layout: topic, sequence, payload.
func frameMessage(frames [][]byte) kvindex.Message {
	if len(frames) != 3 {
		return kvindex.Message{Err: fmt.Errorf("message of %d frames (want topic, seq, payload)", len(frames))}
	}
	seq, err := events.ParseSeq(frames[1])
	if err != nil {
		return kvindex.Message{Err: err}
	}
	return kvindex.Message{Seq: seq, Payload: frames[2]}
}

// ReplaySocket is a pod's ROUTER replay socket as its stream's replay
// source: each replay dials it anew (a DEALER), one exchange bounded by
// timeout (default 5 s) and each reply by maxBytes (default 64 MiB). An
// empty endpoint is no replay (nil).
func ReplaySocket(endpoint string, timeout time.Duration, maxBytes int64) kvindex.ReplayFunc {
	if endpoint == "" {
		return nil
	}
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	if maxBytes <= 0 {
		maxBytes = 64 << 20
	}
	return func(ctx context.Context, start uint64, fn func(seq uint64, payload []byte) bool) error {
		return replayRange(ctx, endpoint, start, timeout, maxBytes, fn)
	}
}

// ReplayRange requests every batch from start from a vLLM replay socket and
// calls fn for each, in order, until the end marker, fn returning false, the
// timeout or ctx ending. It accepts both reply layouts: [“”, topic, seq,
// payload] (current vLLM) and [“”, seq, payload] (older).
func ReplayRange(ctx context.Context, endpoint string, start uint64, timeout time.Duration, fn func(seq uint64, payload []byte) bool) error {
	return replayRange(ctx, endpoint, start, timeout, 64<<20, fn)
}

// replayRange is ReplayRange with replies larger than maxBytes dropped by
// libzmq before they are allocated.
func replayRange(ctx context.Context, endpoint string, start uint64, timeout time.Duration, maxBytes int64, fn func(seq uint64, payload []byte) bool) error {
	d, err := zmq.NewSocket(zmq.DEALER)
	if err != nil {
		return fmt.Errorf("replay %s: %w", endpoint, err)
	}
	defer d.Close()
	_ = d.SetLinger(0)
	_ = d.SetMaxmsgsize(maxBytes)
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
