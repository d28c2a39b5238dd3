package sim

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/prefixrouter/prefixrouter/kvindex/events"
)

// publisher is one rank's KV-event publisher, vLLM's ZmqEventPublisher: a
// PUB socket sending three-frame messages (topic, 8-byte big-endian sequence
// number, msgpack EventBatch), sequence numbers from 0 per process, and a
// ROUTER socket answering replay requests from a bounded buffer of the last
// batches. One goroutine owns each socket.
type publisher struct {
	topic    []byte
	encoding events.Encoding
	legacy   bool // pre-#45177 replay framing: no topic frame
	rank     int
	scale    float64
	faults   *faultBox
	log      *slog.Logger

	pub, router *zmq.Socket
	in          chan pubMsg
	stop        chan struct{}
	wg          sync.WaitGroup

	mu       sync.Mutex
	buf      []bufEntry // ring, oldest first after head
	head     int
	capacity int

	// Owned by run.
	seq   uint64
	queue []pending
	rng   *rand.Rand
	stats *pubStats
}

type pubStats struct {
	mu                    sync.Mutex
	sent, dropped, replay uint64
}

type bufEntry struct {
	seq     uint64
	payload []byte
}

type pubMsg struct {
	batch   events.Batch
	restart bool
}

type pending struct {
	due     time.Time
	payload []byte
}

// publisherOptions configure a rank's publisher.
type publisherOptions struct {
	topic       string
	encoding    events.Encoding
	legacy      bool
	rank        int
	scale       float64
	bufferSteps int
	faults      *faultBox
	log         *slog.Logger
	seed        uint64
}

func newPublisher(pub, router *zmq.Socket, o publisherOptions) *publisher {
	p := &publisher{
		topic: []byte(o.topic), encoding: o.encoding, legacy: o.legacy, rank: o.rank, scale: o.scale,
		faults: o.faults, log: o.log, pub: pub, router: router,
		in: make(chan pubMsg, 4096), stop: make(chan struct{}),
		capacity: max(o.bufferSteps, 1),
		rng:      rand.New(rand.NewPCG(o.seed, uint64(o.rank)+101)),
		stats:    &pubStats{},
	}
	p.wg.Add(2)
	go p.run()
	go p.serveReplay()
	return p
}

// publish queues one step's events as a batch.
func (p *publisher) publish(evs []events.Event) {
	b := events.Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: evs, DPRank: p.rank, HasDPRank: true}
	p.in <- pubMsg{batch: b}
}

// restart makes the publisher behave as a fresh process: batches not yet
// sent are lost, the sequence starts again at 0 and the replay buffer is
// empty.
func (p *publisher) restart() { p.in <- pubMsg{restart: true} }

func (p *publisher) close() {
	close(p.in)
	close(p.stop)
	p.wg.Wait()
}

func (p *publisher) run() {
	defer p.wg.Done()
	defer p.pub.Close()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var last time.Time
	for {
		var tc <-chan time.Time
		if len(p.queue) > 0 {
			d := time.Until(p.queue[0].due)
			if d <= 0 {
				p.send(p.queue[0].payload)
				p.queue[0] = pending{}
				p.queue = p.queue[1:]
				continue
			}
			timer.Reset(d)
			tc = timer.C
		}
		select {
		case m, ok := <-p.in:
			timer.Stop()
			if !ok {
				return
			}
			if m.restart {
				p.queue = p.queue[:0]
				p.seq = 0
				p.mu.Lock()
				p.buf, p.head = p.buf[:0], 0
				p.mu.Unlock()
				continue
			}
			payload, err := events.Encode(&m.batch, p.encoding)
			if err != nil {
				p.log.Error("encode event batch", "rank", p.rank, "err", err)
				continue
			}
			f := p.faults.get()
			due := time.Now()
			if delay := f.EventDelay + time.Duration(p.rng.Float64()*float64(f.EventJitter)); delay > 0 {
				due = due.Add(time.Duration(float64(delay) / p.scale))
			}
			if due.Before(last) {
				due = last // one socket: batches leave in order
			}
			last = due
			p.queue = append(p.queue, pending{due: due, payload: payload})
		case <-tc:
		}
	}
}

// send numbers a batch, keeps it for replay and puts it on the wire unless
// the drop fault says otherwise.
func (p *publisher) send(payload []byte) {
	seq := p.seq
	p.seq++
	p.mu.Lock()
	if len(p.buf) < p.capacity {
		p.buf = append(p.buf, bufEntry{seq, payload})
	} else {
		p.buf[p.head] = bufEntry{seq, payload}
		p.head = (p.head + 1) % p.capacity
	}
	p.mu.Unlock()
	if f := p.faults.get(); f.DropEvents > 0 && p.rng.Float64() < f.DropEvents {
		p.stats.mu.Lock()
		p.stats.dropped++
		p.stats.mu.Unlock()
		return
	}
	if _, err := p.pub.SendMessageDontwait(p.topic, events.SeqFrame(seq), payload); err != nil {
		p.log.Warn("publish event batch", "rank", p.rank, "seq", seq, "err", err)
		return
	}
	p.stats.mu.Lock()
	p.stats.sent++
	p.stats.mu.Unlock()
}

// buffered returns the kept batches with sequence ≥ start, oldest first.
func (p *publisher) buffered(start uint64) []bufEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]bufEntry, 0, len(p.buf))
	for i := range p.buf {
		e := p.buf[(p.head+i)%len(p.buf)]
		if e.seq >= start {
			out = append(out, e)
		}
	}
	return out
}

// serveReplay answers DEALER requests ["", start_seq] with every buffered
// batch from start_seq on, then the end marker, as vLLM's replay thread.
func (p *publisher) serveReplay() {
	defer p.wg.Done()
	defer p.router.Close()
	poller := zmq.NewPoller()
	poller.Add(p.router, zmq.POLLIN)
	end := events.SeqFrame(events.EndOfReplay)
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
		msg, err := p.router.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			continue
		}
		if len(msg) != 3 || len(msg[1]) != 0 {
			p.log.Warn("replay request with unexpected framing", "rank", p.rank, "frames", len(msg))
			continue
		}
		start, err := events.ParseSeq(msg[2])
		if err != nil {
			p.log.Warn("replay request", "rank", p.rank, "err", err)
			continue
		}
		id := msg[0]
		entries := p.buffered(start)
		for _, e := range entries {
			if p.legacy {
				_, err = p.router.SendMessage(id, "", events.SeqFrame(e.seq), e.payload)
			} else {
				_, err = p.router.SendMessage(id, "", p.topic, events.SeqFrame(e.seq), e.payload)
			}
			if err != nil {
				break
			}
		}
		if err == nil {
			if p.legacy {
				_, err = p.router.SendMessage(id, "", end, "")
			} else {
				_, err = p.router.SendMessage(id, "", "", end, "")
			}
		}
		if err != nil {
			p.log.Warn("replay reply", "rank", p.rank, "err", err)
			continue
		}
		p.stats.mu.Lock()
		p.stats.replay++
		p.stats.mu.Unlock()
	}
}

// bindRun binds n sockets of one type on consecutive ports base, base+1, …
// of host. With base 0 it lets the OS pick the first port and retries until
// the following ones are free as well.
func bindRun(typ zmq.Type, host string, base, n int) ([]*zmq.Socket, int, error) {
	attempts := 1
	if base == 0 {
		attempts = 32
	}
	var lastErr error
	for a := 0; a < attempts; a++ {
		socks, port, err := tryBindRun(typ, host, base, n)
		if err == nil {
			return socks, port, nil
		}
		lastErr = err
	}
	return nil, 0, lastErr
}

func tryBindRun(typ zmq.Type, host string, base, n int) ([]*zmq.Socket, int, error) {
	socks := make([]*zmq.Socket, 0, n)
	fail := func(err error) ([]*zmq.Socket, int, error) {
		for _, s := range socks {
			s.Close()
		}
		return nil, 0, err
	}
	port := base
	for i := 0; i < n; i++ {
		s, err := zmq.NewSocket(typ)
		if err != nil {
			return fail(fmt.Errorf("zmq socket: %w", err))
		}
		socks = append(socks, s)
		if err := s.SetLinger(0); err != nil {
			return fail(fmt.Errorf("zmq linger: %w", err))
		}
		if typ == zmq.PUB {
			if err := s.SetSndhwm(100000); err != nil {
				return fail(fmt.Errorf("zmq sndhwm: %w", err))
			}
		}
		addr := "tcp://" + net.JoinHostPort(host, "*")
		if port != 0 {
			addr = "tcp://" + net.JoinHostPort(host, strconv.Itoa(port+i))
		}
		if err := s.Bind(addr); err != nil {
			return fail(fmt.Errorf("bind %s: %w", addr, err))
		}
		if port == 0 {
			ep, err := s.GetLastEndpoint()
			if err != nil {
				return fail(fmt.Errorf("zmq endpoint: %w", err))
			}
			_, ps, err := net.SplitHostPort(ep[len("tcp://"):])
			if err != nil {
				return fail(fmt.Errorf("zmq endpoint %q: %w", ep, err))
			}
			if port, err = strconv.Atoi(ps); err != nil {
				return fail(fmt.Errorf("zmq endpoint %q: %w", ep, err))
			}
		}
	}
	if port == 0 {
		return fail(errors.New("no port bound"))
	}
	return socks, port, nil
}
