package router

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/target"
)

// placements is the router's event plane: the confirmed index, the ingestor
// that applies event batches to it and one kvindex subscriber per target,
// started and stopped as health reports targets added and removed.
//
// The ingestor needs the fleet's block size (and, in exact mode, its hash
// algorithm). When the flags do not give them they are learned from the pods'
// vllm:cache_config_info; until then no subscriber runs and the precise
// policy scores on load alone. Late subscribers lose nothing: a first connect
// replays the pod's buffer from sequence 0.
type placements struct {
	log     *slog.Logger
	metrics *kvindex.Metrics
	index   *kvindex.Index

	hashSeed  string
	exact     bool // a seed was given: vLLM-exact keys
	blockSize int  // from the flag; 0: learn
	hashAlgo  kvindex.HashAlgo

	// keys is the active keyer, nil until the block size is known.
	keyer atomic.Pointer[keyerState]

	mu       sync.Mutex
	ctx      context.Context // set by start
	ingestor *kvindex.Ingestor
	targets  map[target.ID]health.TargetSpec
	subs     map[target.ID]*subscription
}

// keyerState is the fleet's key derivation, fixed once known.
type keyerState struct {
	keyer     kvindex.Keyer
	mode      kvindex.KeyMode
	blockSize int
	algo      string
}

type subscription struct {
	spec   health.TargetSpec
	sub    *kvindex.Subscriber
	cancel context.CancelFunc
	done   chan struct{}
}

func newPlacements(cfg *Config, metrics *kvindex.Metrics, log *slog.Logger) (*placements, error) {
	p := &placements{
		log:       log,
		metrics:   metrics,
		index:     kvindex.NewIndex(kvindex.IndexConfig{}),
		hashSeed:  cfg.HashSeed,
		exact:     cfg.HasHashSeed,
		blockSize: cfg.BlockSize,
		targets:   make(map[target.ID]health.TargetSpec),
		subs:      make(map[target.ID]*subscription),
	}
	if cfg.HashAlgo != "" {
		a, err := kvindex.ParseHashAlgo(cfg.HashAlgo)
		if err != nil {
			return nil, err
		}
		p.hashAlgo = a
	}
	return p, nil
}

// configure builds the keyer and ingestor once block size (and algorithm in
// exact mode) are known; later calls are no-ops. It reports whether the
// plane is configured.
func (p *placements) configure(blockSize int, algo string) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ingestor != nil {
		return true, nil
	}
	if p.blockSize > 0 {
		blockSize = p.blockSize
	}
	if blockSize <= 0 {
		return false, nil
	}
	ks := &keyerState{blockSize: blockSize}
	icfg := kvindex.IngestConfig{Metrics: p.metrics, Logger: p.log}
	if p.exact {
		a := p.hashAlgo
		if a == 0 {
			if algo == "" {
				return false, nil
			}
			var err error
			if a, err = kvindex.ParseHashAlgo(algo); err != nil {
				return false, fmt.Errorf("router: pods report hash algorithm: %w", err)
			}
		}
		h, err := kvindex.NewHasher(a, p.hashSeed, blockSize)
		if err != nil {
			return false, fmt.Errorf("router: hasher: %w", err)
		}
		ks.keyer, ks.mode, ks.algo = h, kvindex.ModeExact, a.String()
		icfg.Mode, icfg.Hasher = kvindex.ModeExact, h
	} else {
		tk, err := kvindex.NewTokenKeyer(blockSize)
		if err != nil {
			return false, fmt.Errorf("router: token keyer: %w", err)
		}
		ks.keyer, ks.mode, ks.algo = tk, kvindex.ModeTokenDerived, "token-derived"
		icfg.Mode, icfg.TokenKeyer = kvindex.ModeTokenDerived, tk
	}
	in, err := kvindex.NewIngestor(p.index, icfg, kvindex.Observer{})
	if err != nil {
		return false, fmt.Errorf("router: ingestor: %w", err)
	}
	p.ingestor = in
	p.keyer.Store(ks)
	p.log.Info("block keys configured", "mode", ks.mode.String(), "block_size", blockSize, "algo", ks.algo)
	if p.ctx != nil {
		for id, spec := range p.targets {
			p.startLocked(id, spec)
		}
	}
	return true, nil
}

// start lets subscribers run under ctx (they run only once configured).
func (p *placements) start(ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ctx = ctx
	if p.ingestor != nil {
		for id, spec := range p.targets {
			p.startLocked(id, spec)
		}
	}
}

// onChange follows health's registry. It must not block for long: starting
// a subscriber only spawns its goroutine; stopping one waits for it, which
// takes at most one receive poll.
func (p *placements) onChange(c health.Change) {
	p.mu.Lock()
	defer p.mu.Unlock()
	id := c.Target.ID
	switch c.Kind {
	case health.Added:
		p.targets[id] = c.Target
		if p.ingestor != nil && p.ctx != nil {
			p.startLocked(id, c.Target)
		}
	case health.Updated:
		p.targets[id] = c.Target
		if s, ok := p.subs[id]; ok && (s.spec.Events != c.Target.Events || s.spec.Replay != c.Target.Replay) {
			p.stopLocked(id)
			p.ingestor.Reset(id)
			p.startLocked(id, c.Target)
		}
	case health.Restarted:
		// The sequence numbers may not show it (an idle pod publishes
		// nothing after restarting): rebuild from the new process's events.
		if s, ok := p.subs[id]; ok {
			p.log.Warn("pod process restarted: rebuilding its placements", "target", id.String())
			s.sub.Resync()
		}
	case health.Removed:
		delete(p.targets, id)
		p.stopLocked(id)
		if p.ingestor != nil {
			p.ingestor.Forget(id)
		}
		p.index.RemoveTarget(id)
	}
}

func (p *placements) startLocked(id target.ID, spec health.TargetSpec) {
	if _, ok := p.subs[id]; ok || spec.Events == "" {
		return
	}
	in := p.ingestor
	sub, err := kvindex.NewSubscriber(kvindex.SubscriberConfig{
		Target:    id,
		Endpoint:  spec.Events,
		Replay:    spec.Replay,
		Handle:    func(_ uint64, b *events.Batch, _ bool) { in.Apply(id, b) },
		Restarted: func() { in.Reset(id) },
		Logger:    p.log,
		Metrics:   p.metrics,
	})
	if err != nil {
		p.log.Warn("kv-event subscriber not started", "target", id.String(), "err", err)
		return
	}
	ctx, cancel := context.WithCancel(p.ctx)
	s := &subscription{spec: spec, sub: sub, cancel: cancel, done: make(chan struct{})}
	p.subs[id] = s
	go func() {
		defer close(s.done)
		if err := sub.Run(ctx); err != nil {
			p.log.Warn("kv-event subscriber stopped", "target", id.String(), "err", err)
		}
	}()
}

func (p *placements) stopLocked(id target.ID) {
	s, ok := p.subs[id]
	if !ok {
		return
	}
	delete(p.subs, id)
	s.cancel()
	select {
	case <-s.done:
	case <-time.After(2 * time.Second):
		p.log.Warn("kv-event subscriber slow to stop", "target", id.String())
	}
}

// stop ends every subscriber.
func (p *placements) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id := range p.subs {
		p.stopLocked(id)
	}
}

// status is health's EventStatusFunc.
func (p *placements) status(id target.ID) (kvindex.SubscriberStatus, bool) {
	p.mu.Lock()
	s, ok := p.subs[id]
	p.mu.Unlock()
	if !ok {
		return kvindex.SubscriberStatus{}, false
	}
	return s.sub.Status(), true
}

// learn polls health's snapshot for the fleet's cache configuration until the
// plane is configured or ctx ends.
func (p *placements) learn(ctx context.Context, mon *health.Monitor) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		bs, algo := fleetCacheConfig(mon.Snapshot())
		ok, err := p.configure(bs, algo)
		if err != nil {
			p.log.Error("cannot configure block keys", "err", err)
			return
		}
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// watchCaps bounds how many placements the index may claim for each pod by
// the pod's reported cache size, so that missed removals cannot make it claim
// far more than the pod can hold.
func (p *placements) watchCaps(ctx context.Context, mon *health.Monitor) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	caps := map[target.ID]int{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, tg := range mon.Snapshot().Targets {
			if n := placementCap(tg.Cache.NumGPUBlocks); n > 0 && caps[tg.ID] != n {
				p.index.SetTargetCap(tg.ID, n)
				caps[tg.ID] = n
			}
		}
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

// fleetCacheConfig picks the block size and algorithm most targets report.
// Disagreements are health's to report (debug view and metric); the index
// has one key space, so the majority wins.
func fleetCacheConfig(s *health.Snapshot) (int, string) {
	type cfgKey struct {
		bs   int
		algo string
	}
	counts := map[cfgKey]int{}
	for _, t := range s.Targets {
		if t.Cache.Known && t.Cache.BlockSize > 0 {
			counts[cfgKey{t.Cache.BlockSize, t.Cache.HashAlgo}]++
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
