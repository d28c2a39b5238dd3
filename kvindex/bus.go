package kvindex

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/prefixrouter/prefixrouter/internal/hostname"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/kvindex/zmqwait"
	"github.com/prefixrouter/prefixrouter/target"
)

// BusConfig describes one bound collection socket: every pod's publisher
// connects to it (vLLM connects when its --kv-events-config endpoint names
// no wildcard) and the topic frame tells the pods apart.
type BusConfig struct {
	// Listen is the address rank 0's publishers connect to,
	// tcp://ADDR:PORT. vLLM offsets a data-parallel rank's endpoint port by
	// its rank whether it binds or connects, so rank r's publishers
	// arrive on PORT+r: the bus binds one socket per rank (BindRank).
	Listen string
	// Route maps a topic arriving on a rank's socket to the target its
	// batches belong to. An error leaves the topic unknown (counted and
	// listed with the error's text, never applied); ErrRouteDeferred
	// drops the batch without counting the topic unknown (the router is
	// not ready to apply batches: the first one applied later replays
	// what was missed).
	Route func(rank int, topic string) (BusRoute, error)

	ReplayTimeout   time.Duration // one replay exchange (default 5 s)
	QueueSize       int           // batches waiting per topic (default 4096)
	MaxMessageBytes int64         // larger frames drop the peer (default 64 MiB)
	Logger          *slog.Logger
	Metrics         *Metrics
}

// BusRoute is where one topic's batches go.
type BusRoute struct {
	Target target.ID
	// Replay is the pod's replay socket for this rank; empty: gaps are
	// counted, not recovered.
	Replay    string
	Handle    func(seq uint64, b *events.Batch, replayed bool)
	Restarted func()
}

// ErrRouteDeferred is what BusConfig.Route returns while no batch can be
// applied yet (block keys unknown).
var ErrRouteDeferred = errors.New("batches cannot be applied yet")

// maxUnknownTopics bounds the unknown topics a bus lists; beyond it they
// are only counted.
const maxUnknownTopics = 64

// unknownRetry is how long an unknown topic stays unknown before its next
// batch is routed again (a target may have been added meanwhile).
const unknownRetry = time.Second

// Bus collects the KV events of every publisher that connects to its bound
// SUB sockets (one per data-parallel rank) and follows each topic as its
// own stream, with the per-pod subscriber's sequence tracking and replay.
// Create it with NewBus, bind with Start, and end it by cancelling Start's
// context; Wait waits for its goroutines.
type Bus struct {
	cfg  BusConfig
	log  *slog.Logger
	host string
	port int

	mu       sync.Mutex
	ctx      context.Context
	sockets  map[int]*zmq.Socket // rank → bound SUB socket
	wanted   map[int]bool        // ranks to bind at Start
	streams  map[busKey]*busStream
	byTarget map[target.ID]*busStream
	unknown  map[busKey]*unknownTopic
	// unlisted counts batches of unknown topics past maxUnknownTopics.
	unlisted       int
	unknownBatches uint64
	deferred       uint64
	malformed      uint64
	wg             sync.WaitGroup
}

type busKey struct {
	rank  int
	topic string
}

type busStream struct {
	key    busKey
	route  BusRoute
	seq    *sequencer
	ctx    context.Context // ends when the stream is dropped
	cancel context.CancelFunc
}

type unknownTopic struct {
	batches  uint64
	lastSeen time.Time
	why      string
	retryAt  time.Time
}

// NewBus checks the configuration; Start binds.
func NewBus(cfg BusConfig) (*Bus, error) {
	host, port, err := ParseListenAddr(cfg.Listen)
	if err != nil {
		return nil, err
	}
	if cfg.Route == nil {
		return nil, errors.New("bus: no topic router")
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = 64 << 20
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Bus{
		cfg: cfg, log: log.With("bus", cfg.Listen), host: host, port: port,
		sockets:  make(map[int]*zmq.Socket),
		wanted:   make(map[int]bool),
		streams:  make(map[busKey]*busStream),
		byTarget: make(map[target.ID]*busStream),
		unknown:  make(map[busKey]*unknownTopic),
	}, nil
}

// ParseListenAddr checks a bus address, tcp://ADDR:PORT with ADDR an IP
// address, a host name or * (every interface), and returns its parts.
func ParseListenAddr(addr string) (string, int, error) {
	hp, ok := strings.CutPrefix(addr, "tcp://")
	if !ok {
		return "", 0, fmt.Errorf("%q: want tcp://ADDR:PORT", addr)
	}
	host, ps, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, fmt.Errorf("%q: want tcp://ADDR:PORT: %w", addr, err)
	}
	if host != "*" && !hostname.Valid(host) {
		return "", 0, fmt.Errorf("%q: address %q is neither an IP address, a host name nor *", addr, host)
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 || strconv.Itoa(port) != ps {
		return "", 0, fmt.Errorf("%q: port %q: want 1..65535", addr, ps)
	}
	return host, port, nil
}

// Listen is the bus's configured address (rank 0's).
func (b *Bus) Listen() string { return b.cfg.Listen }

// RankAddr is the address rank r's publishers connect to.
func (b *Bus) RankAddr(r int) string {
	return "tcp://" + net.JoinHostPort(b.host, strconv.Itoa(b.port+r))
}

// Start binds rank 0's socket and those BindRank asked for, and receives
// on every bound socket until ctx ends.
func (b *Bus) Start(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ctx != nil {
		return errors.New("bus: started twice")
	}
	b.ctx = ctx
	b.wanted[0] = true
	var errs []error
	for _, r := range slices.Sorted(maps.Keys(b.wanted)) {
		errs = append(errs, b.bindLocked(r))
	}
	return errors.Join(errs...)
}

// BindRank binds rank r's socket (PORT+r), once; publishers of that rank
// can connect from then on. Before Start it only records the rank.
func (b *Bus) BindRank(r int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ctx == nil {
		b.wanted[r] = true
		return nil
	}
	return b.bindLocked(r)
}

func (b *Bus) bindLocked(r int) error {
	if _, ok := b.sockets[r]; ok {
		return nil
	}
	if b.port+r > 65535 {
		return fmt.Errorf("bus %s: rank %d's port %d exceeds 65535", b.cfg.Listen, r, b.port+r)
	}
	addr := b.RankAddr(r)
	sub, err := zmq.NewSocket(zmq.SUB)
	if err != nil {
		return fmt.Errorf("bus %s: %w", addr, err)
	}
	_ = sub.SetLinger(0)
	_ = sub.SetRcvhwm(100000)
	_ = sub.SetMaxmsgsize(b.cfg.MaxMessageBytes)
	if err := sub.SetSubscribe(""); err != nil {
		sub.Close()
		return fmt.Errorf("bus %s: subscribe: %w", addr, err)
	}
	if err := sub.Bind(addr); err != nil {
		sub.Close()
		return fmt.Errorf("bus: bind %s: %w", addr, err)
	}
	w, err := zmqwait.New(sub)
	if err != nil {
		sub.Close()
		return fmt.Errorf("bus %s: %w", addr, err)
	}
	b.sockets[r] = sub
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer sub.Close()
		defer w.Close()
		b.receive(b.ctx, r, sub, w)
	}()
	b.log.Info("collecting KV events", "rank", r, "addr", addr)
	return nil
}

// Wait waits for every goroutine of the bus after Start's context ended.
func (b *Bus) Wait() { b.wg.Wait() }

// receive owns rank r's socket: it frames each message and hands it to its
// topic's stream.
func (b *Bus) receive(ctx context.Context, r int, sub *zmq.Socket, w *zmqwait.Waiter) {
	for {
		if _, err := w.Wait(ctx, 0); err != nil {
			if ctx.Err() == nil {
				b.log.Error("bus socket failed", "rank", r, "err", err)
			}
			return
		}
		for {
			frames, err := sub.RecvMessageBytes(zmq.DONTWAIT)
			if err != nil {
				break // drained
			}
			if !b.dispatch(ctx, r, frames) {
				return
			}
		}
	}
}

// dispatch queues one message on its topic's stream, creating the stream
// on the topic's first routed batch. It reports false once ctx ended.
func (b *Bus) dispatch(ctx context.Context, r int, frames [][]byte) bool {
	if len(frames) != 3 {
		b.mu.Lock()
		b.malformed++
		b.mu.Unlock()
		b.log.Debug("skipping a message that is not topic, seq, payload", "rank", r, "frames", len(frames))
		return true
	}
	msg := frameMessage(frames)
	st := b.streamFor(ctx, busKey{rank: r, topic: string(frames[0])})
	if st == nil {
		return true
	}
	select {
	case st.seq.queue <- msg:
	case <-st.ctx.Done(): // dropped: the topic's next batch is routed anew
	}
	return ctx.Err() == nil
}

// streamFor returns key's stream, routing the topic when it has none; nil
// when the topic is unknown or the batch is deferred. Route runs without
// the bus's lock: the router's side takes its own lock, under which it
// calls Drop and BindRank.
func (b *Bus) streamFor(ctx context.Context, key busKey) *busStream {
	b.mu.Lock()
	if st := b.streams[key]; st != nil {
		b.mu.Unlock()
		return st
	}
	now := time.Now()
	if u := b.unknown[key]; u != nil && now.Before(u.retryAt) {
		u.batches++
		u.lastSeen = now
		b.unknownBatches++
		b.mu.Unlock()
		return nil
	}
	b.mu.Unlock()
	route, err := b.cfg.Route(key.rank, key.topic)
	b.mu.Lock()
	defer b.mu.Unlock()
	u := b.unknown[key]
	switch {
	case errors.Is(err, ErrRouteDeferred):
		b.deferred++
		return nil
	case err != nil:
		b.unknownBatches++
		if u == nil {
			if len(b.unknown) >= maxUnknownTopics {
				b.unlisted++
				return nil
			}
			u = &unknownTopic{}
			b.unknown[key] = u
			b.log.Warn("KV events from a publisher matching no target: not applied", "rank", key.rank, "topic", key.topic, "why", err)
		}
		u.batches++
		u.lastSeen, u.why, u.retryAt = now, err.Error(), now.Add(unknownRetry)
		return nil
	}
	delete(b.unknown, key)
	if st := b.streams[key]; st != nil {
		return st // only this socket's goroutine creates its keys' streams; kept for safety
	}
	if old := b.byTarget[route.Target]; old != nil {
		// One target, one stream: a pod whose topic changed (or two
		// publishers claiming one target) follows the latest.
		b.log.Warn("a second topic claims a target: following the new one", "target", route.Target.String(), "old_topic", old.key.topic, "topic", key.topic)
		b.dropLocked(old)
	}
	seq := newSequencer(sequencerConfig{
		Target: route.Target, Replay: route.Replay, Handle: route.Handle, Restarted: route.Restarted,
		ReplayTimeout: b.cfg.ReplayTimeout, QueueSize: b.cfg.QueueSize, Metrics: b.cfg.Metrics,
		Logger: b.log.With("target", route.Target.String(), "topic", key.topic, "rank", key.rank),
	})
	seq.update(func(s *SubscriberStatus) { s.Connected, s.EverConnected, s.ConnectionChanged = true, true, now })
	sctx, cancel := context.WithCancel(ctx)
	st := &busStream{key: key, route: route, seq: seq, ctx: sctx, cancel: cancel}
	b.streams[key], b.byTarget[route.Target] = st, st
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		seq.apply(sctx)
	}()
	b.log.Info("KV events of a target arrive on the bus", "target", route.Target.String(), "topic", key.topic, "rank", key.rank)
	return st
}

// Drop stops following id's stream, if any: the target was removed or its
// topic or replay address changed. The topic's next batch is routed anew.
func (b *Bus) Drop(id target.ID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if st := b.byTarget[id]; st != nil {
		b.dropLocked(st)
	}
}

func (b *Bus) dropLocked(st *busStream) {
	st.cancel()
	delete(b.streams, st.key)
	delete(b.byTarget, st.route.Target)
}

// Status is id's stream's status and the topic it arrives under; ok is
// false while none of its batches arrived on this bus.
func (b *Bus) Status(id target.ID) (status SubscriberStatus, topic string, ok bool) {
	b.mu.Lock()
	st := b.byTarget[id]
	b.mu.Unlock()
	if st == nil {
		return SubscriberStatus{}, "", false
	}
	return st.seq.Status(), st.key.topic, true
}

// Resync clears id's placements and rebuilds them from the pod's replay
// buffer (its process restarted without the sequence showing it).
func (b *Bus) Resync(id target.ID) bool {
	b.mu.Lock()
	st := b.byTarget[id]
	b.mu.Unlock()
	if st == nil {
		return false
	}
	st.seq.Resync()
	return true
}

// BusStatus is what a bus has collected (GET /debug/targets "event_buses").
type BusStatus struct {
	Listen string `json:"listen"`
	// Ranks are the data-parallel ranks whose sockets are bound (rank r on
	// the listen port + r).
	Ranks  []int            `json:"ranks"`
	Topics []BusTopicStatus `json:"topics"`
	// UnknownTopics are publishers whose topic matches no target, at most
	// 64; UnknownTopicsUnlisted counts batches of further ones.
	UnknownTopics         []UnknownTopicStatus `json:"unknown_topics"`
	UnknownTopicsUnlisted int                  `json:"unknown_topics_unlisted_batches"`
	UnknownBatches        uint64               `json:"unknown_batches"`
	// DeferredBatches arrived before block keys were known; a topic's
	// first batch applied afterwards replays what they held.
	DeferredBatches uint64 `json:"deferred_batches"`
	Malformed       uint64 `json:"malformed_messages"`
}

// BusTopicStatus is one topic followed as a target's stream.
type BusTopicStatus struct {
	Topic       string    `json:"topic"`
	Rank        int       `json:"rank"`
	Target      string    `json:"target"`
	Replay      string    `json:"replay,omitempty"`
	Batches     uint64    `json:"batches"`
	LastSeq     uint64    `json:"last_seq"`
	LastEvent   time.Time `json:"last_event,omitzero"`
	Gaps        uint64    `json:"gaps"`
	Replays     uint64    `json:"replays"`
	Replayed    uint64    `json:"replayed_batches"`
	Unrecovered uint64    `json:"unrecovered_batches"`
	Restarts    uint64    `json:"restarts"`
	QueueDepth  int       `json:"queue_depth"`
}

// UnknownTopicStatus is a publisher the bus does not route.
type UnknownTopicStatus struct {
	Topic    string    `json:"topic"`
	Rank     int       `json:"rank"`
	Batches  uint64    `json:"batches"`
	LastSeen time.Time `json:"last_seen"`
	Why      string    `json:"why"`
}

// View describes the bus: its streams and its unknown topics, sorted.
func (b *Bus) View() BusStatus {
	b.mu.Lock()
	v := BusStatus{
		Listen: b.cfg.Listen, UnknownTopicsUnlisted: b.unlisted, UnknownBatches: b.unknownBatches,
		DeferredBatches: b.deferred, Malformed: b.malformed,
		Topics: []BusTopicStatus{}, UnknownTopics: []UnknownTopicStatus{},
	}
	for r := range b.sockets {
		v.Ranks = append(v.Ranks, r)
	}
	streams := make([]*busStream, 0, len(b.streams))
	for _, st := range b.streams {
		streams = append(streams, st)
	}
	for k, u := range b.unknown {
		v.UnknownTopics = append(v.UnknownTopics, UnknownTopicStatus{Topic: k.topic, Rank: k.rank, Batches: u.batches, LastSeen: u.lastSeen, Why: u.why})
	}
	b.mu.Unlock()
	slices.Sort(v.Ranks)
	for _, st := range streams {
		s := st.seq.Status()
		v.Topics = append(v.Topics, BusTopicStatus{
			Topic: st.key.topic, Rank: st.key.rank, Target: st.route.Target.String(), Replay: st.route.Replay,
			Batches: s.Batches, LastSeq: s.LastSeq, LastEvent: s.LastEvent, Gaps: s.Gaps, Replays: s.Replays,
			Replayed: s.Replayed, Unrecovered: s.Unrecovered, Restarts: s.Restarts, QueueDepth: s.QueueDepth,
		})
	}
	byKey := func(ta, tb string, ra, rb int) int { return cmp.Or(cmp.Compare(ta, tb), cmp.Compare(ra, rb)) }
	slices.SortFunc(v.Topics, func(x, y BusTopicStatus) int { return byKey(x.Topic, y.Topic, x.Rank, y.Rank) })
	slices.SortFunc(v.UnknownTopics, func(x, y UnknownTopicStatus) int { return byKey(x.Topic, y.Topic, x.Rank, y.Rank) })
	return v
}
