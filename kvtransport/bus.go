package kvtransport

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/prefixrouter/prefixrouter/internal/zmqwait"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/targetid"
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

	ReplayTimeout time.Duration // one replay exchange (default 5 s)
	// QueueSize bounds the batches waiting per topic (default 4096);
	// beyond it a batch is refused (RefusedQueueFull) rather than stall
	// every topic of the rank.
	QueueSize int
	// MaxMessageBytes makes libzmq drop the connection of a peer sending a
	// larger frame before allocating for it (default 4 MiB).
	MaxMessageBytes int64
	// MaxTopics bounds the distinct topics the bus tracks beyond the
	// streams it follows (routed topics whose batches were refused, and
	// unknown ones); beyond it a new topic's batches are dropped, counted
	// as topics_cap (default 1024).
	MaxTopics int
	// OwnerIdle is how long the connection that owns a topic must have
	// been silent before another connection may take the topic over
	// without a restart health saw (default 10 s).
	OwnerIdle time.Duration
	// Limits bound each stream's batches (kvindex.StreamLimits).
	Limits kvindex.StreamLimits
	// Lookup resolves a host name of a topic or endpoint to the addresses
	// its pod publishes from; nil: DNS.
	Lookup func(ctx context.Context, host string) ([]netip.Addr, error)
	Logger *slog.Logger
	// Metrics are the streams' (kvindex's); BusMetrics the bus's own.
	Metrics    *kvindex.Metrics
	BusMetrics *Metrics
}

// BusRoute is where one topic's batches go.
type BusRoute struct {
	Target targetid.ID
	// Sources are the hosts (IP addresses or names) whose addresses may
	// publish this route's batches: the topic's host and the target's
	// endpoint host. A batch from any other address is refused.
	Sources []string
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

// unknownForget is how long an unknown topic stays listed after its last
// batch.
const unknownForget = 10 * time.Minute

// restartTakeover is how long after health saw a pod's process restart a
// new connection may take over the pod's topic.
const restartTakeover = 2 * time.Minute

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

	resolver *sourceResolver

	mu  sync.Mutex
	ctx context.Context
	// zctx is the bus's own ZeroMQ context: its ZAP handler (zap) numbers
	// the connections of this bus's sockets alone.
	zctx     *zmq.Context
	termOnce sync.Once
	conns    uint64
	sockets  map[int]*zmq.Socket // rank → bound SUB socket
	wanted   map[int]bool        // ranks to bind at Start
	streams  map[busKey]*busStream
	byTarget map[targetid.ID]*busStream
	unknown  map[busKey]*unknownTopic
	// refusedTopics are routed topics none of whose batches was accepted
	// yet, kept so that a refused publisher is not routed anew per batch.
	refusedTopics map[busKey]*refusedTopic
	// refusals are each target's refusals the bus itself made (its
	// stream's sequencer counts its own).
	refusals map[targetid.ID]*kvindex.RefusalLog
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
	seq    *kvindex.Sequencer
	ctx    context.Context // ends when the stream is dropped
	cancel context.CancelFunc
	// owner is the connection whose batches the stream follows (ownerAddr
	// its address); lastOwned is when its last batch arrived; restartAt
	// is when health last saw the pod restart (Resync).
	owner     string
	ownerAddr netip.Addr
	lastOwned time.Time
	restartAt time.Time
	// takenOver says the batch streamFor just routed comes from a new
	// owner: the stream starts over before it (dispatch marks it).
	takenOver bool
}

// refusedTopic is a routed topic whose batches were refused; until
// retryAt its batches are checked against it without routing again.
type refusedTopic struct {
	route   BusRoute
	retryAt time.Time
}

type unknownTopic struct {
	batches  uint64
	lastSeen time.Time
	why      string
	retryAt  time.Time
}

// NewBus checks the configuration; Start binds.
func NewBus(cfg BusConfig) (*Bus, error) {
	host, port, err := kvindex.ParseListenAddr(cfg.Listen)
	if err != nil {
		return nil, err
	}
	if cfg.Route == nil {
		return nil, errors.New("bus: no topic router")
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = 4 << 20
	}
	if cfg.MaxTopics <= 0 {
		cfg.MaxTopics = 1024
	}
	if cfg.OwnerIdle <= 0 {
		cfg.OwnerIdle = 10 * time.Second
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
		byTarget: make(map[targetid.ID]*busStream),
		unknown:  make(map[busKey]*unknownTopic),

		refusedTopics: make(map[busKey]*refusedTopic),
		refusals:      make(map[targetid.ID]*kvindex.RefusalLog),
		resolver:      newSourceResolver(cfg.Lookup),
	}, nil
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
	zctx, err := zmq.NewContext()
	if err != nil {
		return fmt.Errorf("bus %s: %w", b.cfg.Listen, err)
	}
	if err := b.startZAP(ctx, zctx); err != nil {
		_ = zctx.Term()
		return fmt.Errorf("bus %s: %w", b.cfg.Listen, err)
	}
	b.ctx, b.zctx = ctx, zctx
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
	sub, err := b.zctx.NewSocket(zmq.SUB)
	if err != nil {
		return fmt.Errorf("bus %s: %w", addr, err)
	}
	_ = sub.SetLinger(0)
	_ = sub.SetRcvhwm(100000)
	if err := sub.SetMaxmsgsize(b.cfg.MaxMessageBytes); err != nil {
		sub.Close()
		return fmt.Errorf("bus %s: max message size: %w", addr, err)
	}
	// A ZAP domain makes every connection's handshake ask the bus's ZAP
	// handler, which names the connection: its messages carry the name
	// as their User-Id.
	if err := sub.SetZapDomain(zapDomain); err != nil {
		sub.Close()
		return fmt.Errorf("bus %s: zap domain: %w", addr, err)
	}
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
func (b *Bus) Wait() {
	b.wg.Wait()
	b.mu.Lock()
	zctx := b.zctx
	b.mu.Unlock()
	if zctx != nil {
		b.termOnce.Do(func() { _ = zctx.Term() })
	}
}

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
			frames, md, err := sub.RecvMessageBytesWithMetadata(zmq.DONTWAIT, "Peer-Address", "User-Id")
			if err != nil {
				break // drained
			}
			if !b.dispatch(ctx, r, frames, peerOf(md)) {
				return
			}
		}
	}
}

// peer is the connection a message arrived on: its name (from the bus's
// ZAP handler; the address when there is none) and its address.
type peer struct {
	conn string
	addr netip.Addr
}

func peerOf(md map[string]string) peer {
	a, _ := netip.ParseAddr(md["Peer-Address"])
	p := peer{conn: md["User-Id"], addr: a.Unmap()}
	if p.conn == "" {
		p.conn = p.addr.String()
	}
	return p
}

// dispatch queues one message on its topic's stream, creating the stream
// on the topic's first routed batch from the pod's own address. It
// reports false once ctx ended.
func (b *Bus) dispatch(ctx context.Context, r int, frames [][]byte, from peer) bool {
	if len(frames) != 3 {
		b.mu.Lock()
		b.malformed++
		b.mu.Unlock()
		b.countBus("malformed")
		b.log.Debug("skipping a message that is not topic, seq, payload", "rank", r, "frames", len(frames))
		return true
	}
	msg := frameMessage(frames)
	st := b.streamFor(ctx, busKey{rank: r, topic: string(frames[0])}, from)
	if st == nil {
		return true
	}
	if st.takenOver {
		// Only this goroutine routes the rank's messages: the flag is
		// read and cleared here, after streamFor set it.
		msg.StartOver = "a new connection took over the topic"
		st.takenOver = false
	}
	if !st.seq.Offer(msg) {
		// One stream's backlog must not stall the rank's other topics:
		// the batch is missing, a gap the next batch replays.
		st.seq.Refuse(kvindex.RefusedQueueFull, "the stream's queue is full", "queue", st.seq.QueueCap())
		st.takenOver = st.takenOver || msg.StartOver != "" // the next one starts over
	}
	return ctx.Err() == nil
}

// streamFor returns the stream a message from peer under key feeds; nil
// when the topic is unknown, the batch is deferred or refused. Route runs
// without the bus's lock: the router's side takes its own lock, under
// which it calls Drop and BindRank. So do the lookups of host names.
func (b *Bus) streamFor(ctx context.Context, key busKey, from peer) *busStream {
	now := time.Now()
	b.mu.Lock()
	if st := b.streams[key]; st != nil {
		route := st.route
		b.mu.Unlock()
		if !b.fromPod(ctx, route, from) {
			b.refuseTarget(route.Target, kvindex.RefusedSource, fmt.Sprintf("a batch under topic %q arrived from %s, which is not the pod's address (%s)", key.topic, from.addr, strings.Join(route.Sources, ", ")))
			return nil
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.streams[key] != st {
			return nil // dropped meanwhile; the next batch is routed anew
		}
		if from.conn != st.owner {
			switch {
			case !st.restartAt.IsZero() && now.Sub(st.restartAt) < restartTakeover:
				b.log.Info("a new connection takes over a restarted pod's topic", "target", st.route.Target.String(), "topic", key.topic, "from", from.addr.String())
				st.restartAt = time.Time{}
			case now.Sub(st.lastOwned) >= b.cfg.OwnerIdle:
				b.log.Info("a new connection takes over a topic its owner left silent", "target", st.route.Target.String(), "topic", key.topic, "from", from.addr.String(),
					"silent", now.Sub(st.lastOwned).Round(time.Millisecond))
			default:
				b.refuseTargetLocked(st.route.Target, kvindex.RefusedConnection, fmt.Sprintf("a second connection (from %s) publishes under topic %q, which the connection from %s owns", from.addr, key.topic, st.ownerAddr))
				return nil
			}
			st.owner, st.ownerAddr = from.conn, from.addr
			// What the old connection stored is not the new one's to
			// vouch for, nor are its sequence numbers: the stream starts
			// over from the pod's replay buffer (replay= is the pod's,
			// not the connection's), as after a restart.
			st.takenOver = true
		}
		st.lastOwned = now
		return st
	}
	if u := b.unknown[key]; u != nil && now.Before(u.retryAt) {
		u.batches++
		u.lastSeen = now
		b.unknownBatches++
		b.mu.Unlock()
		return nil
	}
	rt := b.refusedTopics[key]
	if rt == nil && b.unknown[key] == nil && len(b.refusedTopics)+len(b.unknown) >= b.cfg.MaxTopics {
		b.mu.Unlock()
		b.countBus("topics_cap")
		return nil
	}
	b.mu.Unlock()
	var route BusRoute
	var err error
	if rt != nil && now.Before(rt.retryAt) {
		route = rt.route
	} else {
		route, err = b.cfg.Route(key.rank, key.topic)
	}
	if err == nil && !b.fromPod(ctx, route, from) {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.keepRefusedLocked(key, route, now)
		b.refuseTargetLocked(route.Target, kvindex.RefusedSource, fmt.Sprintf("a batch under topic %q arrived from %s, which is not the pod's address (%s)", key.topic, from.addr, strings.Join(route.Sources, ", ")))
		return nil
	}
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
			b.forgetUnknownLocked(now)
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
		// One target, one stream: a second topic for a followed pod is
		// refused while the first one's connection lives; a pod whose
		// topic changed restarted (health saw it) or left the old one
		// silent.
		restarted := !old.restartAt.IsZero() && now.Sub(old.restartAt) < restartTakeover
		if !restarted && now.Sub(old.lastOwned) < b.cfg.OwnerIdle {
			b.keepRefusedLocked(key, route, now)
			b.refuseTargetLocked(route.Target, kvindex.RefusedSecondTopic, fmt.Sprintf("topic %q (from %s) names the target already followed under topic %q", key.topic, from.addr, old.key.topic))
			return nil
		}
		b.log.Warn("a second topic claims a target whose first fell silent: following the new one", "target", route.Target.String(), "old_topic", old.key.topic, "topic", key.topic)
		b.dropLocked(old)
	}
	delete(b.refusedTopics, key)
	seq := kvindex.NewSequencer(kvindex.SequencerConfig{
		Target: route.Target, Handle: route.Handle, Restarted: route.Restarted,
		QueueSize: b.cfg.QueueSize, Metrics: b.cfg.Metrics, Limits: b.cfg.Limits,
		Replay: ReplaySocket(route.Replay, b.cfg.ReplayTimeout, b.cfg.MaxMessageBytes),
		Logger: b.log.With("target", route.Target.String(), "topic", key.topic, "rank", key.rank),
	})
	seq.SetConnected(true, now)
	sctx, cancel := context.WithCancel(ctx)
	st := &busStream{key: key, route: route, seq: seq, ctx: sctx, cancel: cancel, owner: from.conn, ownerAddr: from.addr, lastOwned: now}
	b.streams[key], b.byTarget[route.Target] = st, st
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		seq.Run(sctx)
	}()
	b.log.Info("KV events of a target arrive on the bus", "target", route.Target.String(), "topic", key.topic, "rank", key.rank, "from", from.addr.String())
	return st
}

// fromPod reports whether from is an address route's batches may come
// from: one its topic's host or its target's endpoint host stands for.
func (b *Bus) fromPod(ctx context.Context, route BusRoute, from peer) bool {
	if !from.addr.IsValid() {
		return false
	}
	for _, h := range route.Sources {
		if b.resolver.allows(ctx, h, from.addr) {
			return true
		}
	}
	return false
}

// keepRefusedLocked remembers a routed topic whose batch was refused, so
// that its next batches within unknownRetry are checked without routing.
func (b *Bus) keepRefusedLocked(key busKey, route BusRoute, now time.Time) {
	if rt := b.refusedTopics[key]; rt != nil {
		rt.route, rt.retryAt = route, now.Add(unknownRetry)
		return
	}
	if len(b.refusedTopics)+len(b.unknown) >= b.cfg.MaxTopics {
		return
	}
	b.refusedTopics[key] = &refusedTopic{route: route, retryAt: now.Add(unknownRetry)}
}

// forgetUnknownLocked drops the unknown topics silent for unknownForget.
func (b *Bus) forgetUnknownLocked(now time.Time) {
	for k, u := range b.unknown {
		if now.Sub(u.lastSeen) >= unknownForget {
			delete(b.unknown, k)
		}
	}
}

func (b *Bus) refuseTarget(id targetid.ID, r kvindex.Refusal, detail string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refuseTargetLocked(id, r, detail)
}

// refuseTargetLocked counts a refusal of a batch routed to id, logged at
// most once per kvindex.RefusalLogEvery per reason.
func (b *Bus) refuseTargetLocked(id targetid.ID, r kvindex.Refusal, detail string) {
	c := b.refusals[id]
	if c == nil {
		c = &kvindex.RefusalLog{}
		b.refusals[id] = c
	}
	log := c.Record(r, detail, time.Now())
	b.cfg.Metrics.CountRefusal(id, r)
	if log {
		b.log.Warn("KV events refused, not applied: "+detail, "target", id.String(), "reason", r.String(), "log_every", kvindex.RefusalLogEvery)
	}
}

func (b *Bus) countBus(reason string) {
	if b.cfg.BusMetrics != nil {
		b.cfg.BusMetrics.refused.WithLabelValues(reason).Inc()
	}
}

// Refused is what the bus refused of id's batches, its stream's
// refusals included.
func (b *Bus) Refused(id targetid.ID) kvindex.RefusalCounts {
	b.mu.Lock()
	var c kvindex.RefusalCounts
	if r := b.refusals[id]; r != nil {
		c = r.RefusalCounts
	}
	st := b.byTarget[id]
	b.mu.Unlock()
	if st != nil {
		c.Add(st.seq.Status().Refused)
	}
	return c
}

// Drop stops following id's stream, if any: the target was removed or its
// topic or replay address changed. The topic's next batch is routed anew.
func (b *Bus) Drop(id targetid.ID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if st := b.byTarget[id]; st != nil {
		b.dropLocked(st)
	}
	delete(b.refusals, id)
	for k, rt := range b.refusedTopics {
		if rt.route.Target == id {
			delete(b.refusedTopics, k)
		}
	}
}

func (b *Bus) dropLocked(st *busStream) {
	st.cancel()
	delete(b.streams, st.key)
	delete(b.byTarget, st.route.Target)
}

// Status is id's stream's status and the topic it arrives under; ok is
// false while none of its batches arrived on this bus.
func (b *Bus) Status(id targetid.ID) (status kvindex.SubscriberStatus, topic string, ok bool) {
	b.mu.Lock()
	st := b.byTarget[id]
	b.mu.Unlock()
	if st == nil {
		return kvindex.SubscriberStatus{}, "", false
	}
	return st.seq.Status(), st.key.topic, true
}

// Resync clears id's placements and rebuilds them from the pod's replay
// buffer (its process restarted without the sequence showing it).
func (b *Bus) Resync(id targetid.ID) bool {
	b.mu.Lock()
	st := b.byTarget[id]
	if st != nil {
		// The restarted process connects anew: its connection may take
		// the topic over.
		st.restartAt = time.Now()
	}
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
	// From is the address of the connection that owns the topic.
	From string `json:"from"`
	// Refused counts the target's batches refused, by reason.
	Refused map[string]uint64 `json:"refused,omitempty"`
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
	from := make(map[*busStream]string, len(b.streams))
	for _, st := range b.streams {
		streams = append(streams, st)
		from[st] = st.ownerAddr.String()
	}
	for k, u := range b.unknown {
		v.UnknownTopics = append(v.UnknownTopics, UnknownTopicStatus{Topic: k.topic, Rank: k.rank, Batches: u.batches, LastSeen: u.lastSeen, Why: u.why})
	}
	b.mu.Unlock()
	slices.Sort(v.Ranks)
	for _, st := range streams {
		s := st.seq.Status()
		var refused map[string]uint64
		for r, n := range b.Refused(st.route.Target).N {
			if n > 0 {
				if refused == nil {
					refused = map[string]uint64{}
				}
				refused[kvindex.Refusal(r).String()] = n
			}
		}
		v.Topics = append(v.Topics, BusTopicStatus{
			Topic: st.key.topic, Rank: st.key.rank, Target: st.route.Target.String(), Replay: st.route.Replay,
			Batches: s.Batches, LastSeq: s.LastSeq, LastEvent: s.LastEvent, Gaps: s.Gaps, Replays: s.Replays,
			Replayed: s.Replayed, Unrecovered: s.Unrecovered, Restarts: s.Restarts, QueueDepth: s.QueueDepth,
			From: from[st], Refused: refused,
		})
	}
	byKey := func(ta, tb string, ra, rb int) int { return cmp.Or(cmp.Compare(ta, tb), cmp.Compare(ra, rb)) }
	slices.SortFunc(v.Topics, func(x, y BusTopicStatus) int { return byKey(x.Topic, y.Topic, x.Rank, y.Rank) })
	slices.SortFunc(v.UnknownTopics, func(x, y UnknownTopicStatus) int { return byKey(x.Topic, y.Topic, x.Rank, y.Rank) })
	return v
}

// zapDomain is the ZAP domain of the bus's sockets.
const zapDomain = "prefixrouter-kv-bus"

// startZAP binds the ZAP handler of the bus's context: it accepts every
// connection (the address checks are per topic, in streamFor) and names
// each one, so that two connections from one address are told apart.
func (b *Bus) startZAP(ctx context.Context, zctx *zmq.Context) error {
	rep, err := zctx.NewSocket(zmq.REP)
	if err != nil {
		return fmt.Errorf("zap handler: %w", err)
	}
	_ = rep.SetLinger(0)
	if err := rep.Bind("inproc://zeromq.zap.01"); err != nil {
		rep.Close()
		return fmt.Errorf("zap handler: %w", err)
	}
	w, err := zmqwait.New(rep)
	if err != nil {
		rep.Close()
		return fmt.Errorf("zap handler: %w", err)
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer rep.Close()
		defer w.Close()
		for {
			if _, err := w.Wait(ctx, 0); err != nil {
				return
			}
			for {
				req, err := rep.RecvMessage(zmq.DONTWAIT)
				if err != nil {
					break
				}
				// [version, request id, domain, address, identity, mechanism, ...];
				// a REP socket must answer whatever it received.
				req = append(req, "1.0", "")
				b.mu.Lock()
				b.conns++
				name := "c" + strconv.FormatUint(b.conns, 10)
				b.mu.Unlock()
				if b.cfg.BusMetrics != nil {
					b.cfg.BusMetrics.connections.Inc()
				}
				if _, err := rep.SendMessage(req[0], req[1], "200", "OK", name, ""); err != nil {
					b.log.Warn("bus connection handshake not answered", "err", err)
				}
			}
		}
	}()
	return nil
}
