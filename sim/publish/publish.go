// Package publish is the sending side of vLLM's KV-event transport, modelled
// on vLLM's ZmqEventPublisher: a ZMQ PUB socket emitting three-frame messages
// (topic, 8-byte big-endian sequence, msgpack payload) with sequence numbers
// from 0 per process (or Config.FirstSeq), and a ROUTER replay socket answering from a bounded
// buffer of recent batches, in the current or the legacy reply layout.
//
// Two ways to send:
//   - Publish and PublishRaw send at once on the caller's goroutine and
//     return the sequence number; PublishRaw(payload, false) models a
//     dropped batch (sequence consumed, batch replayable, nothing on the
//     wire). Tests that need exact control use these.
//   - Submit queues a batch for a sender goroutine, as vLLM's engine core
//     hands batches to its publisher thread. Queued batches obey the
//     publisher's Faults (delay, jitter, drop probability), keep their order
//     and get their sequence number when they leave. The simulator uses it.
//
// Restart models a new pod process on the same ports: queued batches are
// lost, the sequence starts again at 0 and the replay buffer is empty.
//
// The simulator (package sim, its parent) publishes through this package
// and tests use it as a stand-in pod; it is the only KV-event publisher in
// the repository.
package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/prefixrouter/prefixrouter/internal/zmqwait"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
)

// Config sets up a publisher.
type Config struct {
	// Bind is the PUB address, e.g. tcp://127.0.0.1:5557 (port 0 is not
	// supported by libzmq's tcp transport; use tcp://127.0.0.1:* for an
	// ephemeral port and read Endpoint()).
	Bind string
	// Connect, instead of Bind, makes the PUB socket connect to a collector
	// that binds (vLLM connects when its endpoint names no wildcard);
	// libzmq reconnects on its own while the collector is away.
	Connect string
	// ReplayBind is the ROUTER address; empty disables replay.
	ReplayBind string
	Topic      string
	// BufferSize is how many batches the replay buffer keeps (vLLM's
	// default is 10,000).
	BufferSize int
	// LegacyReplay answers replays as ["", seq, payload] (vLLM before the
	// topic frame was added) instead of ["", topic, seq, payload].
	LegacyReplay bool
	// FirstSeq is the sequence number of each process's first batch: 0 as
	// vLLM numbers them (default), 1 as some other publishers do.
	FirstSeq uint64
	// Faults apply to batches queued with Submit (see SetFaults).
	Faults Faults
	// Seed makes the jitter and drop decisions reproducible.
	Seed uint64
	// QueueSize bounds the batches Submit may have waiting (default 4096);
	// Submit blocks when it is full, as backpressure on the producer.
	QueueSize int
	Logger    *slog.Logger
}

// Faults are misbehaviours of the transport, in wall-clock time. They apply
// only to batches queued with Submit.
type Faults struct {
	// Delay holds every batch back this long before it is sent.
	Delay time.Duration
	// Jitter adds a uniform random extra delay in [0, Jitter). Batches still
	// leave in submission order, as from one socket.
	Jitter time.Duration
	// Drop is the probability that a batch is not put on the PUB socket. Its
	// sequence number is still consumed and it stays in the replay buffer, so
	// a subscriber sees a gap it can repair.
	Drop float64
}

// Validate rejects faults that mean nothing.
func (f Faults) Validate() error {
	switch {
	case f.Delay < 0 || f.Jitter < 0:
		return errors.New("publish faults: delay and jitter must not be negative")
	case f.Drop < 0 || f.Drop > 1 || f.Drop != f.Drop:
		return fmt.Errorf("publish faults: drop probability %v outside [0, 1]", f.Drop)
	}
	return nil
}

// Stats count what the publisher did since it was created (restarts do not
// reset them: they describe the socket, not the process).
type Stats struct {
	Sent, Dropped, Replays uint64
}

// Publisher sends batches with consecutive sequence numbers starting at
// Config.FirstSeq (0, as vLLM).
// Every method is safe for concurrent use.
type Publisher struct {
	cfg Config
	log *slog.Logger

	mu     sync.Mutex
	pub    *zmq.Socket
	seq    uint64
	buffer []stored // ring of the last BufferSize batches
	head   int
	gen    uint64 // bumped by Restart: queued batches of older generations are lost
	faults Faults
	rng    *rand.Rand
	stats  Stats
	queue  []queued // Submit's batches, in order, due times non-decreasing
	// sending is 1 while the sender encodes a batch it took off the
	// queue: not sent, nor in the replay buffer, yet.
	sending int
	last    time.Time

	wake  chan struct{} // a batch was queued (capacity 1)
	space chan struct{} // the queue shrank (capacity 1)

	pubEndpoint, replayEndpoint string
	stop                        chan struct{}
	done                        sync.WaitGroup
}

type stored struct {
	seq     uint64
	payload []byte
}

type queued struct {
	due     time.Time
	gen     uint64
	batch   events.Batch
	enc     events.Encoding
	payload []byte // set instead of batch by SubmitRaw
	drop    bool   // decided at submission, under the faults then in force
}

// New binds the sockets and starts the replay server and the sender.
func New(cfg Config) (*Publisher, error) {
	if cfg.BufferSize <= 0 {
		cfg.BufferSize = 10000
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 4096
	}
	if err := cfg.Faults.Validate(); err != nil {
		return nil, err
	}
	if (cfg.Bind == "") == (cfg.Connect == "") {
		return nil, errors.New("publish: give one of Bind and Connect")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	p := &Publisher{
		cfg: cfg, log: log, faults: cfg.Faults,
		rng:  rand.New(rand.NewPCG(cfg.Seed, 0x9e3779b97f4a7c15)),
		wake: make(chan struct{}, 1), space: make(chan struct{}, 1),
		stop: make(chan struct{}),
		seq:  cfg.FirstSeq,
	}
	pub, err := zmq.NewSocket(zmq.PUB)
	if err != nil {
		return nil, fmt.Errorf("publish: %w", err)
	}
	// Linger 0: a closing pod must not hang on a subscriber that went away.
	_ = pub.SetLinger(0)
	// A high-water mark well above a burst of steps, so a slow subscriber
	// loses batches (a gap it repairs by replay) only under real overload.
	_ = pub.SetSndhwm(100000)
	if cfg.Connect != "" {
		if err := pub.Connect(cfg.Connect); err != nil {
			pub.Close()
			return nil, fmt.Errorf("connect %s: %w", cfg.Connect, err)
		}
		p.pubEndpoint = cfg.Connect
	} else {
		if err := pub.Bind(cfg.Bind); err != nil {
			pub.Close()
			return nil, fmt.Errorf("bind %s: %w", cfg.Bind, err)
		}
		if p.pubEndpoint, err = pub.GetLastEndpoint(); err != nil {
			pub.Close()
			return nil, fmt.Errorf("publish endpoint: %w", err)
		}
	}
	p.pub = pub
	var router *zmq.Socket
	if cfg.ReplayBind != "" {
		if router, err = zmq.NewSocket(zmq.ROUTER); err != nil {
			pub.Close()
			return nil, fmt.Errorf("replay: %w", err)
		}
		_ = router.SetLinger(0)
		if err := router.Bind(cfg.ReplayBind); err != nil {
			pub.Close()
			router.Close()
			return nil, fmt.Errorf("bind %s: %w", cfg.ReplayBind, err)
		}
		if p.replayEndpoint, err = router.GetLastEndpoint(); err != nil {
			pub.Close()
			router.Close()
			return nil, fmt.Errorf("replay endpoint: %w", err)
		}
		p.done.Add(1)
		go p.serveReplay(router)
	}
	p.done.Add(1)
	go p.sender()
	return p, nil
}

// Endpoint is the PUB socket's bound address (resolved wildcard port), or
// the address it connects to.
func (p *Publisher) Endpoint() string { return p.pubEndpoint }

// ReplayEndpoint is the ROUTER socket's bound address, or "".
func (p *Publisher) ReplayEndpoint() string { return p.replayEndpoint }

// Publish encodes and sends one batch now, returning its sequence number.
func (p *Publisher) Publish(b *events.Batch, enc events.Encoding) (uint64, error) {
	payload, err := events.Encode(b, enc)
	if err != nil {
		return 0, fmt.Errorf("publish: %w", err)
	}
	return p.PublishRaw(payload, true)
}

// PublishRaw sends an already encoded payload now. With send false the batch
// only enters the replay buffer and consumes a sequence number: a dropped
// batch, as a lossy network or a full queue would make it.
func (p *Publisher) PublishRaw(payload []byte, send bool) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sendLocked(payload, send)
}

// sendLocked numbers a batch, keeps it for replay and, when send is true,
// puts it on the wire. p.mu is held.
func (p *Publisher) sendLocked(payload []byte, send bool) (uint64, error) {
	if p.pub == nil {
		return 0, errors.New("publisher closed")
	}
	seq := p.seq
	p.seq++
	p.remember(seq, payload)
	if !send {
		p.stats.Dropped++
		return seq, nil
	}
	// Don't wait: a PUB socket never blocks (it drops at the high-water
	// mark), and the flag keeps a misbehaving transport from stalling the
	// engine that called us.
	if _, err := p.pub.SendMessageDontwait(p.cfg.Topic, events.SeqFrame(seq), payload); err != nil {
		return seq, fmt.Errorf("publish seq %d: %w", seq, err)
	}
	p.stats.Sent++
	return seq, nil
}

// Submit queues one batch for the sender goroutine: it is encoded there,
// leaves after the configured delay and jitter (in submission order), gets
// its sequence number when it leaves, and is dropped from the wire with the
// configured probability. The batch's slices must not change afterwards.
// Submit blocks while QueueSize batches are waiting.
func (p *Publisher) Submit(b events.Batch, enc events.Encoding) error {
	return p.enqueue(queued{batch: b, enc: enc})
}

// SubmitRaw is Submit for an already encoded payload.
func (p *Publisher) SubmitRaw(payload []byte) error {
	return p.enqueue(queued{payload: payload})
}

func (p *Publisher) enqueue(q queued) error {
	for {
		p.mu.Lock()
		if p.pub == nil {
			p.mu.Unlock()
			return errors.New("publisher closed")
		}
		if len(p.queue) < p.cfg.QueueSize {
			break
		}
		p.mu.Unlock()
		select {
		case <-p.space:
		case <-p.stop:
			return errors.New("publisher closed")
		}
	}
	defer p.mu.Unlock()
	due := time.Now()
	if d := p.faults.Delay + time.Duration(p.rng.Float64()*float64(p.faults.Jitter)); d > 0 {
		due = due.Add(d)
	}
	// One socket: a batch never overtakes the one submitted before it.
	if due.Before(p.last) {
		due = p.last
	}
	p.last = due
	q.due, q.gen = due, p.gen
	q.drop = p.faults.Drop > 0 && p.rng.Float64() < p.faults.Drop
	p.queue = append(p.queue, q)
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return nil
}

// SetFaults replaces the faults applied to batches submitted from now on;
// batches already queued keep the delay and drop decision they got.
func (p *Publisher) SetFaults(f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	p.mu.Lock()
	p.faults = f
	p.mu.Unlock()
	return nil
}

// Stats returns the counters.
func (p *Publisher) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Pending is the number of submitted batches not yet sent (and in the
// replay buffer), the one being encoded included.
func (p *Publisher) Pending() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue) + p.sending
}

// sender sends queued batches when they are due.
func (p *Publisher) sender() {
	defer p.done.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		p.mu.Lock()
		var wait time.Duration = -1 // -1: nothing queued
		var next queued
		if len(p.queue) > 0 {
			if d := time.Until(p.queue[0].due); d > 0 {
				wait = d
			} else {
				next = p.queue[0]
				p.queue[0] = queued{}
				p.queue = p.queue[1:]
				p.sending = 1
				wait = 0
			}
		}
		p.mu.Unlock()
		if wait == 0 {
			select {
			case p.space <- struct{}{}:
			default:
			}
			p.sendQueued(next)
			continue
		}
		var tc <-chan time.Time
		if wait > 0 {
			timer.Reset(wait)
			tc = timer.C
		}
		select {
		case <-p.wake:
			timer.Stop()
		case <-tc:
		case <-p.stop:
			return
		}
	}
}

// sendQueued encodes a batch outside the lock (encoding is the expensive
// part) and sends it unless a restart happened meanwhile.
func (p *Publisher) sendQueued(q queued) {
	payload := q.payload
	var encodeErr error
	if payload == nil {
		payload, encodeErr = events.Encode(&q.batch, q.enc)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sending = 0
	if encodeErr != nil {
		p.log.Error("encode event batch", "err", encodeErr)
		return
	}
	if q.gen != p.gen || p.pub == nil {
		return // the process that produced it is gone
	}
	if seq, err := p.sendLocked(payload, !q.drop); err != nil {
		p.log.Warn("publish event batch", "seq", seq, "err", err)
	}
}

// Restart models a pod process restart: batches not yet sent are lost, the
// sequence starts again at FirstSeq and the replay buffer is empty.
func (p *Publisher) Restart() {
	p.mu.Lock()
	p.gen++
	clear(p.queue)
	p.queue = p.queue[:0]
	p.last = time.Time{}
	p.seq = p.cfg.FirstSeq
	clear(p.buffer)
	p.buffer = p.buffer[:0]
	p.head = 0
	p.mu.Unlock()
	select {
	case p.space <- struct{}{}:
	default:
	}
}

// NextSeq is the sequence number the next batch will get.
func (p *Publisher) NextSeq() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq
}

func (p *Publisher) remember(seq uint64, payload []byte) {
	if len(p.buffer) < p.cfg.BufferSize {
		p.buffer = append(p.buffer, stored{seq, payload})
		return
	}
	p.buffer[p.head] = stored{seq, payload}
	p.head = (p.head + 1) % len(p.buffer)
}

// since copies the buffered batches with sequence >= start, oldest first.
func (p *Publisher) since(start uint64) []stored {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []stored
	n := len(p.buffer)
	for i := 0; i < n; i++ {
		s := p.buffer[(p.head+i)%n]
		if s.seq >= start {
			out = append(out, s)
		}
	}
	return out
}

// serveReplay answers DEALER requests ["", start_seq] with every buffered
// batch from start_seq on, then the end marker, as vLLM's replay thread. It
// owns the ROUTER socket.
func (p *Publisher) serveReplay(router *zmq.Socket) {
	defer p.done.Done()
	defer router.Close()
	w, err := zmqwait.New(router)
	if err != nil {
		p.log.Error("replay socket cannot be waited on", "err", err)
		return
	}
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-p.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		if _, err := w.Wait(ctx, 0); err != nil {
			if ctx.Err() == nil {
				p.log.Error("replay socket failed", "err", err)
			}
			return
		}
		frames, err := router.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			continue
		}
		// ROUTER prepends the peer identity; a DEALER request is then
		// ["", start] and a REQ request the same after its envelope.
		if len(frames) < 2 {
			p.log.Warn("replay request with unexpected framing", "frames", len(frames))
			continue
		}
		id, startFrame := frames[0], frames[len(frames)-1]
		start, err := events.ParseSeq(startFrame)
		if err != nil {
			p.log.Warn("bad replay request", "err", err)
			continue
		}
		// Counted before answering so that a client holding the end
		// marker sees its request counted.
		p.mu.Lock()
		p.stats.Replays++
		p.mu.Unlock()
		for _, s := range p.since(start) {
			if p.cfg.LegacyReplay {
				_, err = router.SendMessage(id, "", events.SeqFrame(s.seq), s.payload)
			} else {
				_, err = router.SendMessage(id, "", p.cfg.Topic, events.SeqFrame(s.seq), s.payload)
			}
			if err != nil {
				break
			}
		}
		if err == nil {
			if p.cfg.LegacyReplay {
				_, err = router.SendMessage(id, "", events.SeqFrame(events.EndOfReplay), "")
			} else {
				_, err = router.SendMessage(id, "", "", events.SeqFrame(events.EndOfReplay), "")
			}
		}
		if err != nil {
			p.log.Warn("replay reply", "err", err)
		}
	}
}

// Close stops the sender and the replay server and closes the sockets;
// batches still queued are lost. It is safe to call more than once.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.pub == nil {
		p.mu.Unlock()
		return nil
	}
	p.pub.Close()
	p.pub = nil
	p.queue = nil
	p.mu.Unlock()
	close(p.stop)
	p.done.Wait()
	return nil
}
