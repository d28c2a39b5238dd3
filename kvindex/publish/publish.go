// Package publish is the sending side of vLLM's KV-event transport: a ZMQ PUB
// socket emitting three-frame messages (topic, sequence, payload) and a ROUTER
// replay socket answering from a bounded buffer of recent batches, in the
// current or the legacy reply layout. The simulator publishes through it and
// tests use it as a stand-in pod.
package publish

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/prefixrouter/prefixrouter/kvindex/events"
)

// Config sets up a publisher.
type Config struct {
	// Bind is the PUB address, e.g. tcp://127.0.0.1:5557 (port 0 is not
	// supported by libzmq's tcp transport; use tcp://127.0.0.1:* for an
	// ephemeral port and read Endpoint()).
	Bind string
	// ReplayBind is the ROUTER address; empty disables replay.
	ReplayBind string
	Topic      string
	// BufferSize is how many batches the replay buffer keeps (vLLM's
	// default is 10,000).
	BufferSize int
	// LegacyReplay answers replays as ["", seq, payload] (vLLM before the
	// topic frame was added) instead of ["", topic, seq, payload].
	LegacyReplay bool
	Logger       *slog.Logger
}

// Publisher sends batches with consecutive sequence numbers starting at 0.
// Publish is safe for concurrent use.
type Publisher struct {
	cfg Config
	log *slog.Logger

	mu     sync.Mutex
	pub    *zmq.Socket
	seq    uint64
	buffer []stored // ring of the last BufferSize batches
	head   int

	pubEndpoint, replayEndpoint string
	stop                        chan struct{}
	done                        chan struct{}
}

type stored struct {
	seq     uint64
	payload []byte
}

// New binds the sockets and starts the replay server.
func New(cfg Config) (*Publisher, error) {
	if cfg.BufferSize <= 0 {
		cfg.BufferSize = 10000
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	p := &Publisher{cfg: cfg, log: log, stop: make(chan struct{}), done: make(chan struct{})}
	pub, err := zmq.NewSocket(zmq.PUB)
	if err != nil {
		return nil, fmt.Errorf("publish: %w", err)
	}
	_ = pub.SetLinger(0)
	_ = pub.SetSndhwm(100000)
	if err := pub.Bind(cfg.Bind); err != nil {
		pub.Close()
		return nil, fmt.Errorf("bind %s: %w", cfg.Bind, err)
	}
	p.pub = pub
	p.pubEndpoint, _ = pub.GetLastEndpoint()
	if cfg.ReplayBind == "" {
		close(p.done)
		return p, nil
	}
	router, err := zmq.NewSocket(zmq.ROUTER)
	if err != nil {
		pub.Close()
		return nil, fmt.Errorf("replay: %w", err)
	}
	_ = router.SetLinger(0)
	if err := router.Bind(cfg.ReplayBind); err != nil {
		pub.Close()
		router.Close()
		return nil, fmt.Errorf("bind %s: %w", cfg.ReplayBind, err)
	}
	p.replayEndpoint, _ = router.GetLastEndpoint()
	go p.serveReplay(router)
	return p, nil
}

// Endpoint is the PUB socket's bound address (resolved wildcard port).
func (p *Publisher) Endpoint() string { return p.pubEndpoint }

// ReplayEndpoint is the ROUTER socket's bound address, or "".
func (p *Publisher) ReplayEndpoint() string { return p.replayEndpoint }

// Publish encodes and sends one batch, returning its sequence number.
func (p *Publisher) Publish(b *events.Batch, enc events.Encoding) (uint64, error) {
	payload, err := events.Encode(b, enc)
	if err != nil {
		return 0, err
	}
	return p.PublishRaw(payload, true)
}

// PublishRaw sends an already encoded payload. With send false the batch
// only enters the replay buffer and consumes a sequence number: a dropped
// batch, as a lossy network or a full queue would make it.
func (p *Publisher) PublishRaw(payload []byte, send bool) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pub == nil {
		return 0, errors.New("publisher closed")
	}
	seq := p.seq
	p.seq++
	p.remember(seq, payload)
	if !send {
		return seq, nil
	}
	if _, err := p.pub.SendMessage(p.cfg.Topic, events.SeqFrame(seq), payload); err != nil {
		return seq, fmt.Errorf("publish seq %d: %w", seq, err)
	}
	return seq, nil
}

// Restart models a pod process restart: the sequence starts again at 0 and
// the replay buffer is empty.
func (p *Publisher) Restart() {
	p.mu.Lock()
	p.seq = 0
	p.buffer = p.buffer[:0]
	p.head = 0
	p.mu.Unlock()
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

func (p *Publisher) serveReplay(router *zmq.Socket) {
	defer close(p.done)
	defer router.Close()
	poller := zmq.NewPoller()
	poller.Add(router, zmq.POLLIN)
	for {
		select {
		case <-p.stop:
			return
		default:
		}
		polled, err := poller.Poll(50 * time.Millisecond)
		if err != nil || len(polled) == 0 {
			continue
		}
		frames, err := router.RecvMessageBytes(0)
		if err != nil {
			continue
		}
		// ROUTER prepends the peer identity; a DEALER request is then
		// ["", start] and a REQ request the same after its envelope.
		if len(frames) < 2 {
			continue
		}
		id, startFrame := frames[0], frames[len(frames)-1]
		start, err := events.ParseSeq(startFrame)
		if err != nil {
			p.log.Warn("bad replay request", "err", err)
			continue
		}
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
		if p.cfg.LegacyReplay {
			_, _ = router.SendMessage(id, "", events.SeqFrame(events.EndOfReplay), "")
		} else {
			_, _ = router.SendMessage(id, "", "", events.SeqFrame(events.EndOfReplay), "")
		}
	}
}

// Close stops the replay server and closes the sockets.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.pub == nil {
		p.mu.Unlock()
		return nil
	}
	p.pub.Close()
	p.pub = nil
	p.mu.Unlock()
	close(p.stop)
	<-p.done
	return nil
}
