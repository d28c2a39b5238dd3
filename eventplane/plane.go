package eventplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/kvtransport"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// Source is where a target publishes its KV events.
type Source struct {
	// Events is the target's ZMQ PUB address; empty: it publishes none.
	Events string
	// EventsImplied says the endpoint did not name Events (it is vLLM's
	// default): with a bus configured (Config.EventsListen) the target is
	// expected there instead, and no subscriber connects to Events.
	EventsImplied bool
	// Replay is its replay (ROUTER) address; empty: gaps cannot be
	// replayed (on a bus, Config.ReplayPort may give one).
	Replay string
	// Topic is the topic the target publishes on a bus when its
	// HOST:PORT does not find it (the endpoint's topic=); empty: found by
	// the topic's HOST:PORT.
	Topic string
	// InProcess says the target's batches are handed to Deliver by the
	// caller (the benchmark's discrete-event engine), not received from a
	// socket: the plane follows them through a kvindex.Direct stream.
	InProcess bool
}

// Cache is what health reports about a target's pod, as far as the plane
// needs it: whether it serves, and its KV cache (vllm:cache_config_info).
type Cache struct {
	// Serving is set while the pod answers HTTP (health's state routable
	// or degraded): a stream that stays disconnected is then a wiring
	// fault, not a pod still starting.
	Serving bool
	// Reported is set when the pod reported its cache configuration;
	// BlockSize and HashAlgo are then its own.
	Reported bool
	// BlockSize is the pod's block size; for a pod that did not report, the
	// size its model's pods agree on (0: unknown).
	BlockSize    int
	HashAlgo     string
	NumGPUBlocks int
	// PrefixCachingDisabled is set when the pod runs without prefix
	// caching; PrefixCaching is the value it reported, for the verdict's
	// detail.
	PrefixCachingDisabled bool
	PrefixCaching         string
}

// Keys is the fleet's block-key derivation, fixed once block size (and, in
// exact mode, the hash algorithm) are known.
type Keys struct {
	Keyer     kvindex.Keyer
	Mode      kvindex.KeyMode
	BlockSize int
	// Algo names the hash algorithm, or "token-derived".
	Algo string
}

// Deps are the plane's collaborators. Every field is optional.
type Deps struct {
	// Registerer receives the prefixrouter_kv_* series and the plane's
	// event-stream series; nil: none.
	Registerer prometheus.Registerer
	// Logger; nil: slog.Default().
	Logger *slog.Logger
	// Now is the clock; nil: time.Now.
	Now func() time.Time
	// Observer is told of every placement change once the index has it
	// (the speculative placements confirm and invalidate from it); its
	// callbacks run on the subscribers' goroutines.
	Observer kvindex.Observer
	// Replay reads an InProcess target's replay buffer (nil, or nil for
	// a target: its gaps are unrecovered).
	Replay func(targetid.ID) kvindex.ReplayBuffer
	// Lookup resolves the host names of bus-fed pods to the addresses
	// their publishers connect from (nil: DNS); a test seam.
	Lookup func(ctx context.Context, host string) ([]netip.Addr, error)
}

// Plane owns what each target's KV-event stream says and how far to trust
// it: the confirmed index, the ingestor that applies event batches to it,
// one kvindex subscriber per target, the freshness verdict on each stream
// and the expectations that tell an idle pod from a broken pipe.
//
// The router feeds it: targets from health's registry changes (SetTarget,
// RemoveTarget, TargetRestarted), cache configurations from health's
// snapshots (SetCaches), and each request's dispatch and first byte
// (Dispatch). Create it with New, run it with Run.
//
// The ingestor needs the fleet's block size (and, in exact mode, its hash
// algorithm). When the configuration does not give them they are learned
// from the pods' reports; until then no subscriber runs and Keys is nil.
// Late subscribers lose nothing: a first connect replays the pod's buffer
// from sequence 0.
type Plane struct {
	cfg     Config
	log     *slog.Logger
	now     func() time.Time
	metrics *kvindex.Metrics
	index   *kvindex.Index
	algo    kvindex.HashAlgo // from the configuration; 0: learn
	// observer is Deps.Observer, handed to the ingestor.
	observer kvindex.Observer

	keys atomic.Pointer[Keys]
	// view is what request goroutines read without locks, rebuilt by
	// publishLocked.
	view atomic.Pointer[view]
	// statusFn replaces the subscribers' status in tests.
	statusFn func(targetid.ID) (kvindex.SubscriberStatus, bool)

	// buses are the bound collection sockets (Config.EventsListen), bound
	// by Listen.
	buses []*kvtransport.Bus

	mu       sync.Mutex
	ctx      context.Context // while Run runs; nil otherwise
	ingestor *kvindex.Ingestor
	learnErr bool // the pods' configuration could not be used; logged once
	streams  map[targetid.ID]*stream
	caches   map[targetid.ID]Cache
	caps     map[targetid.ID]int
	// replay reads InProcess targets' replay buffers (Deps.Replay).
	replay func(targetid.ID) kvindex.ReplayBuffer
}

// stream is one target's event stream: its subscription and the state
// freshness is judged from. Guarded by Plane.mu, except live.
type stream struct {
	id  targetid.ID
	src Source
	sub *subscription
	// direct is the in-process stream of a Source.InProcess target.
	direct *kvindex.Direct
	live   *live
	// onBus: the target's events arrive on a bus, not on a subscriber of
	// its own. host and port are its endpoint's, which topics name.
	onBus bool
	host  string
	port  int

	fresh  Freshness
	faults map[FaultKind]*faultRecord
	// servingSince is when health last reported the pod serving; zero
	// while it does not.
	servingSince time.Time
	await        awaitLedger
	routes       []routeSample
	// Unrecoverable loss: the subscriber's Unrecovered counter as last
	// seen, when it last grew, and by how much since the window opened.
	lastUnrecovered uint64
	unrecoveredAt   time.Time
	unrecoveredN    uint64
	// Refusals: the count last seen and when it last changed.
	lastRefused uint64
	refusedAt   time.Time
}

type routeSample struct {
	at time.Time
	n  uint64
}

type subscription struct {
	src    Source
	sub    *kvtransport.Subscriber
	cancel context.CancelFunc
	done   chan struct{}
}

// view is an immutable per-target picture for the request path.
type view map[targetid.ID]*viewEntry

type viewEntry struct {
	fresh Freshness
	trust Trust
	live  *live
}

// New validates cfg (taking a zero that Validate refuses as its default)
// and returns a plane with an empty index. With block size (and, in exact
// mode, algorithm) configured, Keys is set at once.
func New(cfg Config, deps Deps) (*Plane, error) {
	cfg.fill()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("event plane: %w", err)
	}
	p := &Plane{
		cfg:     cfg,
		log:     deps.Logger,
		now:     deps.Now,
		index:   kvindex.NewIndex(kvindex.IndexConfig{}),
		streams: make(map[targetid.ID]*stream),
		caches:  make(map[targetid.ID]Cache),
		caps:    make(map[targetid.ID]int),

		observer: deps.Observer,
		replay:   deps.Replay,
	}
	if p.log == nil {
		p.log = slog.Default()
	}
	if p.now == nil {
		p.now = time.Now
	}
	if cfg.HashAlgo != "" {
		var err error
		if p.algo, err = kvindex.ParseHashAlgo(cfg.HashAlgo); err != nil {
			return nil, fmt.Errorf("event plane: %w", err)
		}
	}
	// The plane's own collector first: registered twice, it fails with an
	// error where kvindex's series would panic.
	if deps.Registerer != nil {
		if err := deps.Registerer.Register(&collector{p: p}); err != nil {
			return nil, fmt.Errorf("event plane: metrics: %w", err)
		}
	}
	p.metrics = kvindex.NewMetrics(deps.Registerer)
	busMetrics := kvtransport.NewMetrics(deps.Registerer)
	for _, addr := range cfg.EventsListen {
		b, err := kvtransport.NewBus(kvtransport.BusConfig{Listen: addr, Route: p.routeTopic, Logger: p.log, Metrics: p.metrics, BusMetrics: busMetrics,
			MaxMessageBytes: int64(cfg.MaxMessageBytes), MaxTopics: cfg.MaxTopics, OwnerIdle: cfg.OwnerIdle, Limits: cfg.streamLimits(), Lookup: deps.Lookup})
		if err != nil {
			return nil, fmt.Errorf("event plane: --events-listen %w", err)
		}
		p.buses = append(p.buses, b)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if cfg.BlockSize > 0 {
		if _, err := p.configureLocked(cfg.BlockSize, cfg.HashAlgo); err != nil {
			return nil, err
		}
	}
	p.publishLocked()
	return p, nil
}

// Index is the confirmed placement index the subscribers fill.
func (p *Plane) Index() *kvindex.Index { return p.index }

// Keys is the fleet's block-key derivation, nil until known. Lock-free.
func (p *Plane) Keys() *Keys { return p.keys.Load() }

// Verdict is the verdict on id's event stream; a target the plane does not
// know is disconnected. Lock-free.
func (p *Plane) Verdict(id targetid.ID) Verdict {
	if e := (*p.view.Load())[id]; e != nil {
		return e.fresh.Verdict
	}
	return noSubscriber.Verdict
}

// Trust is how far routing may lean on id's event stream: its verdict,
// unless a wiring fault makes its keys worthless. Lock-free.
func (p *Plane) Trust(id targetid.ID) Trust {
	if e := (*p.view.Load())[id]; e != nil {
		return e.trust
	}
	return noSubscriber.Trust()
}

// Freshness is the verdict on id's event stream with its evidence.
// Lock-free.
func (p *Plane) Freshness(id targetid.ID) Freshness {
	if e := (*p.view.Load())[id]; e != nil {
		return e.fresh
	}
	return noSubscriber
}

// Dispatch records that the router sent a request to id: it counts in the
// target's routing volume, and the request's KV event is awaited from now
// once its first byte says what the pod computed (Expectation.FirstByte).
// Lock-free.
func (p *Plane) Dispatch(id targetid.ID) Expectation {
	e := (*p.view.Load())[id]
	if e == nil {
		return Expectation{}
	}
	e.live.dispatched.Add(1)
	return Expectation{l: e.live, dispatched: p.now().UnixNano()}
}

// SetTarget adds a target or changes where it publishes. A changed address
// restarts the target's subscriber and resets its event translation. It
// must not block for long: starting a subscriber only spawns its goroutine;
// stopping one waits for it, which takes at most one receive poll.
func (p *Plane) SetTarget(id targetid.ID, src Source) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.streams[id]
	if !ok {
		s = &stream{id: id, src: src, live: &live{now: p.now}, onBus: p.fedByBus(src)}
		s.host, s.port = endpointHostPort(id.Endpoint)
		s.live.blockSize.Store(int64(p.blockSizeOf(id)))
		p.bindRankLocked(s)
		if p.caches[id].Serving {
			s.servingSince = p.now()
		}
		p.streams[id] = s
		p.metrics.AddTarget(id)
		p.startLocked(s)
		p.judge(s, p.now())
		p.publishLocked()
		return
	}
	old := s.src
	s.src = src
	if old == src {
		return
	}
	// A changed address or topic starts the target's stream over.
	if s.onBus {
		p.dropFromBusesLocked(id)
	}
	p.stopLocked(s)
	if p.ingestor != nil {
		p.ingestor.Reset(id)
	}
	s.onBus = p.fedByBus(src)
	p.bindRankLocked(s)
	p.startLocked(s)
}

// fedByBus says whether a target with src publishes on a bus: buses are
// configured and its endpoint names no events address of its own.
func (p *Plane) fedByBus(src Source) bool { return len(p.buses) > 0 && src.EventsImplied }

// bindRankLocked makes every bus bind the socket s's rank publishes to
// when s is fed by a bus.
func (p *Plane) bindRankLocked(s *stream) {
	if !s.onBus {
		return
	}
	for _, b := range p.buses {
		if err := b.BindRank(s.id.Rank); err != nil {
			p.log.Error("cannot collect a data-parallel rank's KV events", "target", s.id.String(), "err", err)
		}
	}
}

func (p *Plane) dropFromBusesLocked(id targetid.ID) {
	for _, b := range p.buses {
		b.Drop(id)
	}
}

// RemoveTarget stops the target's subscriber and drops its placements and
// state.
func (p *Plane) RemoveTarget(id targetid.ID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s, ok := p.streams[id]; ok {
		p.stopLocked(s)
		if s.onBus {
			p.dropFromBusesLocked(id)
		}
		delete(p.streams, id)
		p.publishLocked()
	}
	if p.ingestor != nil {
		p.ingestor.Forget(id)
	}
	p.metrics.ForgetTarget(id)
	p.index.RemoveTarget(id)
}

// TargetRestarted rebuilds a target's placements from its events after its
// pod process restarted. The sequence numbers may not show it (an idle pod
// publishes nothing after restarting).
func (p *Plane) TargetRestarted(id targetid.ID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.streams[id]
	if !ok {
		return
	}
	if s.sub != nil {
		p.log.Warn("pod process restarted: rebuilding its placements", "target", id.String())
		s.sub.sub.Resync()
	}
	if s.direct != nil {
		s.direct.Resync()
	}
	for _, b := range p.buses {
		if s.onBus && b.Resync(id) {
			p.log.Warn("pod process restarted: rebuilding its placements", "target", id.String())
		}
	}
}

// SetCaches hands the plane every target's reported cache configuration
// (all of health's targets, draining ones included). It configures block
// keys once the fleet's block size (and algorithm) are known, takes each
// pod's block size for its expectations and its prefix-caching flag for
// its verdict, and bounds the index's placements per pod by its GPU block
// count, so that missed removals cannot make it claim far more than the pod
// can hold.
func (p *Plane) SetCaches(caches map[targetid.ID]Cache) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.caches = maps.Clone(caches)
	if p.ingestor == nil && !p.learnErr {
		bs, algo := fleetCacheConfig(p.caches)
		if _, err := p.configureLocked(bs, algo); err != nil {
			p.learnErr = true
			p.log.Error("cannot configure block keys", "err", err)
		}
	}
	now := p.now()
	for id, s := range p.streams {
		s.live.blockSize.Store(int64(p.blockSizeOf(id)))
		switch serving := p.caches[id].Serving; {
		case serving && s.servingSince.IsZero():
			s.servingSince = now
		case !serving:
			s.servingSince = time.Time{}
		}
	}
	for id, c := range p.caches {
		if n := placementCap(c.NumGPUBlocks); n > 0 && p.caps[id] != n {
			p.index.SetTargetCap(id, n)
			p.caps[id] = n
		}
	}
}

// blockSizeOf is the block size a target's requests are counted in: the
// pod's own report, else the configured one, else the size its model's pods
// agree on; 0 when none is known (expectations then assume vLLM's default).
func (p *Plane) blockSizeOf(id targetid.ID) int {
	c := p.caches[id]
	if c.Reported && c.BlockSize > 0 {
		return c.BlockSize
	}
	if p.cfg.BlockSize > 0 {
		return p.cfg.BlockSize
	}
	return c.BlockSize
}

// Listen binds the buses (Config.EventsListen); they receive until ctx
// ends. Call it once, before Run: a port already taken fails it.
func (p *Plane) Listen(ctx context.Context) error {
	var errs []error
	for _, b := range p.buses {
		if err := b.Start(ctx); err != nil {
			errs = append(errs, fmt.Errorf("event plane: --events-listen %s: %w", b.Listen(), err))
		}
	}
	return errors.Join(errs...)
}

// Buses describes what each bus collected: the topics it follows and
// those that match no target.
func (p *Plane) Buses() []kvtransport.BusStatus {
	out := make([]kvtransport.BusStatus, 0, len(p.buses))
	for _, b := range p.buses {
		out = append(out, b.View())
	}
	return out
}

// Run starts the subscribers (once block keys are known), judges every
// stream's freshness each EvalInterval, and blocks until ctx is done; then
// it stops every subscriber and returns, once the buses Listen started
// (on a context ending with ctx) are done too.
func (p *Plane) Run(ctx context.Context) error {
	p.mu.Lock()
	p.ctx = ctx
	for _, s := range p.streams {
		p.startLocked(s)
	}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.ctx = nil
		for _, s := range p.streams {
			p.stopLocked(s)
		}
	}()
	defer p.Wait()
	tk := time.NewTicker(p.cfg.EvalInterval)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tk.C:
			p.evaluate()
		}
	}
}

// Evaluate judges every stream and publishes the verdicts now, as Run
// does every EvalInterval: a caller on a virtual clock that does not run
// Run calls it at its own pace.
func (p *Plane) Evaluate() { p.evaluate() }

// SetConnected marks an InProcess target's stream connected or not (a
// network cut and its end): reconnected, it catches up from the replay
// buffer as a subscriber does.
func (p *Plane) SetConnected(id targetid.ID, connected bool) {
	p.mu.Lock()
	var d *kvindex.Direct
	if s := p.streams[id]; s != nil {
		d = s.direct
	}
	p.mu.Unlock()
	switch {
	case d == nil:
	case connected:
		d.Connect()
	default:
		d.Disconnect()
	}
}

// Deliver applies batch seq of an in-process target's stream
// (Source.InProcess), in sequence order, before it returns; a batch for a
// target that is not in process, or before block keys are known, is
// dropped. Calls for one target must not overlap.
func (p *Plane) Deliver(id targetid.ID, seq uint64, b *events.Batch) {
	p.mu.Lock()
	var d *kvindex.Direct
	if s := p.streams[id]; s != nil {
		d = s.direct
	}
	p.mu.Unlock()
	if d != nil {
		d.Deliver(seq, b)
	}
}

// evaluate judges every stream and publishes the verdicts.
func (p *Plane) evaluate() {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	for _, s := range p.streams {
		p.judge(s, now)
	}
	p.publishLocked()
}

// publishLocked rebuilds the request path's view.
func (p *Plane) publishLocked() {
	v := make(view, len(p.streams))
	for id, s := range p.streams {
		v[id] = &viewEntry{fresh: s.fresh, trust: s.fresh.Trust(), live: s.live}
	}
	p.view.Store(&v)
}

// configureLocked builds the keyer and ingestor once block size (and
// algorithm in exact mode) are known; later calls are no-ops. It reports
// whether the plane is configured.
func (p *Plane) configureLocked(blockSize int, algo string) (bool, error) {
	if p.ingestor != nil {
		return true, nil
	}
	if p.cfg.BlockSize > 0 {
		blockSize = p.cfg.BlockSize
	}
	if blockSize <= 0 {
		return false, nil
	}
	ks := &Keys{BlockSize: blockSize}
	icfg := kvindex.IngestConfig{Metrics: p.metrics, Logger: p.log}
	if p.cfg.HasHashSeed {
		a := p.algo
		if a == 0 {
			if algo == "" {
				return false, nil
			}
			var err error
			if a, err = kvindex.ParseHashAlgo(algo); err != nil {
				return false, fmt.Errorf("event plane: pods report hash algorithm: %w", err)
			}
		}
		h, err := kvindex.NewHasher(a, p.cfg.HashSeed, blockSize)
		if err != nil {
			return false, fmt.Errorf("event plane: hasher: %w", err)
		}
		ks.Keyer, ks.Mode, ks.Algo = h, kvindex.ModeExact, a.String()
		icfg.Mode, icfg.Hasher = kvindex.ModeExact, h
	} else {
		tk, err := kvindex.NewTokenKeyer(blockSize)
		if err != nil {
			return false, fmt.Errorf("event plane: token keyer: %w", err)
		}
		ks.Keyer, ks.Mode, ks.Algo = tk, kvindex.ModeTokenDerived, "token-derived"
		icfg.Mode, icfg.TokenKeyer = kvindex.ModeTokenDerived, tk
	}
	in, err := kvindex.NewIngestor(p.index, icfg, p.observer)
	if err != nil {
		return false, fmt.Errorf("event plane: ingestor: %w", err)
	}
	p.ingestor = in
	p.keys.Store(ks)
	p.log.Info("block keys configured", "mode", ks.Mode.String(), "block_size", blockSize, "algo", ks.Algo)
	for _, s := range p.streams {
		p.startLocked(s)
	}
	return true, nil
}

// startLocked starts s's subscriber when the plane runs, block keys are
// known and s has an events address; it does nothing if one runs already.
func (p *Plane) startLocked(s *stream) {
	if s.src.InProcess {
		if s.direct == nil && p.ingestor != nil {
			id, in, l := s.id, p.ingestor, s.live
			var replay kvindex.ReplayBuffer
			if p.replay != nil {
				replay = p.replay(id)
			}
			s.direct = kvindex.NewDirect(kvindex.DirectConfig{
				Replay:    replay,
				Target:    id,
				Handle:    func(_ uint64, b *events.Batch, _ bool) { in.Apply(id, b) },
				Restarted: func() { in.Reset(id); l.processRestarted() },
				Logger:    p.log,
				Metrics:   p.metrics,
				Now:       p.now,
			})
		}
		return
	}
	if s.sub != nil || s.onBus || p.ctx == nil || p.ingestor == nil || s.src.Events == "" {
		return
	}
	id, in, l := s.id, p.ingestor, s.live
	sub, err := kvtransport.NewSubscriber(kvtransport.SubscriberConfig{
		Target:    id,
		Endpoint:  s.src.Events,
		Replay:    s.src.Replay,
		Topic:     s.src.Topic,
		Handle:    func(_ uint64, b *events.Batch, _ bool) { in.Apply(id, b) },
		Restarted: func() { in.Reset(id); l.processRestarted() },
		Logger:    p.log,
		Metrics:   p.metrics,

		MaxMessageBytes: int64(p.cfg.MaxMessageBytes),
		Limits:          p.cfg.streamLimits(),
	})
	if err != nil {
		p.log.Warn("kv-event subscriber not started", "target", id.String(), "err", err)
		return
	}
	ctx, cancel := context.WithCancel(p.ctx)
	sc := &subscription{src: s.src, sub: sub, cancel: cancel, done: make(chan struct{})}
	s.sub = sc
	go func() {
		defer close(sc.done)
		if err := sub.Run(ctx); err != nil {
			p.log.Warn("kv-event subscriber stopped", "target", id.String(), "err", err)
		}
	}()
}

// stopLocked stops s's subscriber, if any, and waits for it briefly.
func (p *Plane) stopLocked(s *stream) {
	s.direct = nil
	sc := s.sub
	if sc == nil {
		return
	}
	s.sub = nil
	sc.cancel()
	select {
	case <-sc.done:
	case <-time.After(2 * time.Second):
		p.log.Warn("kv-event subscriber slow to stop", "target", s.id.String())
	}
}

// placementCap bounds a pod's placements from its GPU block count, leaving
// room for offloading tiers up to three times the GPU cache; 0 when unknown.
func placementCap(numGPUBlocks int) int {
	if numGPUBlocks <= 0 {
		return 0
	}
	return 4*numGPUBlocks + 1024
}

// fleetCacheConfig picks the block size and algorithm most pods report.
// Disagreements are health's to report (debug view and metric); the index
// has one key space, so the majority wins.
func fleetCacheConfig(caches map[targetid.ID]Cache) (int, string) {
	type cfgKey struct {
		bs   int
		algo string
	}
	counts := map[cfgKey]int{}
	for _, c := range caches {
		if c.Reported && c.BlockSize > 0 {
			counts[cfgKey{c.BlockSize, c.HashAlgo}]++
		}
	}
	best, n := cfgKey{}, 0
	for k, c := range counts {
		if c > n || (c == n && (k.bs < best.bs || (k.bs == best.bs && k.algo < best.algo))) {
			best, n = k, c
		}
	}
	return best.bs, best.algo
}

// Wait waits for the buses' goroutines once the context given to Listen
// ended (Run does it too).
func (p *Plane) Wait() {
	for _, b := range p.buses {
		b.Wait()
	}
}
