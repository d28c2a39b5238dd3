package sim

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
)

// engine is one data-parallel rank: vLLM's EngineCore with its scheduler and
// block pool, driven by a virtual clock. One goroutine (run) owns all of its
// scheduling state; the HTTP side talks to it through inbox and reads the
// atomic gauges.
type engine struct {
	prof Profile
	rank int
	// hasher is read by HTTP goroutines hashing prompts and swapped by a
	// restart when the root is random (PYTHONHASHSEED unset).
	hasher atomic.Pointer[kvindex.Hasher]
	// newHasher, when set, draws a fresh random root for every process
	// generation: vLLM without PYTHONHASHSEED seeds each EngineCore process
	// (so each data-parallel rank) with os.urandom(32).
	newHasher func() (*kvindex.Hasher, error)
	scale     float64
	output    []uint32 // generated tokens cycle through these ids
	pub       eventSink
	enc       events.Encoding
	faults    *faultBox
	rng       *rand.Rand

	// specKind is group 0's kv_cache_spec_kind (full_attention,
	// mla_attention, sink_full_attention).
	specKind string
	// sw is a hybrid model's sliding-window group (group 1): same block
	// hashes, its own blocks, and blocks that fall out of the window are
	// freed while the request runs, so they are evicted sooner. nil
	// otherwise.
	sw     *blockPool
	window int // sliding window in tokens
	swNeed int // contiguous cached blocks a sliding-window hit needs
	// cpu is the CPU offloading tier, nil without one; loading a block from
	// it costs cpuLoad instead of the block's prefill.
	cpu     *cpuTier
	cpuLoad time.Duration
	// kvTransfer is the time to pull one block from a remote prefill
	// engine (Config.KVTransferPerBlock).
	kvTransfer time.Duration
	// dp is the pod's data-parallel size: with several ranks vLLM suffixes
	// each rank's engine id with _dp<rank>.
	dp int
	// engineID is the current process generation's KV-connector engine id
	// (nil for a Rank, which has no process): drawn when the pod starts the
	// engine and by the engine's goroutine at a restart, read by
	// Pod.EngineID.
	engineID atomic.Pointer[string]

	// streamEvery is the least model time between two wake-ups of a
	// stream's writer after its first token (Config.StreamInterval): the
	// tokens of the steps in between reach the client in one chunk.
	streamEvery time.Duration

	inbox chan engineMsg
	// probes are answered between steps and while a step's time passes,
	// never in the middle of one (Pod.Probe).
	probes chan probeMsg
	done   chan struct{}
	start  time.Time

	// Owned by run.
	pool    *blockPool
	waiting []*seq
	running []*seq
	vnow    time.Duration
	sched   []scheduled
	scratch []int32
	dead    bool

	stats engineStats
}

type scheduled struct {
	s       *seq
	n       int
	prefill bool
}

type engineMsg struct {
	kind  msgKind
	s     *seq
	reply chan bool
}

type msgKind uint8

const (
	msgAdd msgKind = iota
	msgAbort
	msgRestart
	msgReset
	msgDie
	// msgSync does nothing: its reply says every step before it has been
	// applied and published (a barrier for tests and for the pod).
	msgSync
)

// eventSink receives one batch per engine step (publish.Publisher;
// nil in engine-only tests).
type eventSink interface {
	Submit(b events.Batch, enc events.Encoding) error
	Restart()
}

// engineSetup carries the options that shape an engine beyond its profile.
type engineSetup struct {
	enc       events.Encoding
	kvSpec    string // full_attention, mla_attention, sink_full_attention or hybrid
	window    int    // sliding window (tokens) of the hybrid group
	cpuBlocks int
	cpuLoad   time.Duration
	// kvTransfer is the time to pull one block from a remote prefill engine.
	kvTransfer time.Duration
	dp         int
	newHasher  func() (*kvindex.Hasher, error)
	// streamEvery is Config.StreamInterval.
	streamEvery time.Duration
}

// configure applies setup; call it before run.
func (e *engine) configure(c engineSetup) {
	e.enc = c.enc
	e.newHasher = c.newHasher
	e.streamEvery = c.streamEvery
	e.kvTransfer = c.kvTransfer
	e.dp = c.dp
	e.specKind = c.kvSpec
	if c.kvSpec == KVSpecHybrid {
		e.specKind = events.SpecFullAttention
		e.sw = newBlockPool(e.prof.NumGPUBlocks)
		e.sw.group = 1
		e.window = c.window
		// vLLM's SlidingWindowManager: a hit needs the last
		// cdiv(window - 1, block_size) blocks before it cached.
		e.swNeed = (c.window - 1 + e.prof.BlockSize - 1) / e.prof.BlockSize
	}
	if e.specKind == "" {
		e.specKind = events.SpecFullAttention
	}
	if c.cpuBlocks > 0 {
		e.cpu = newCPUTier(c.cpuBlocks)
		e.cpuLoad = c.cpuLoad
		e.pool.onEvict = e.cpu.put
	}
}

// engineStats are read by /metrics and by the data-parallel balancer.
type engineStats struct {
	running, waiting atomic.Int64
	usageBits        atomic.Uint64
	queries, hits    atomic.Int64 // prefix-cache tokens
	preemptions      atomic.Int64
	cpuHits          atomic.Int64 // prompt tokens loaded from the CPU tier
	kvLoaded         atomic.Int64 // prompt tokens pulled from a remote prefill engine
	kvFailures       atomic.Int64 // decodes whose prefill engine was gone: recomputed
	promptTokens     atomic.Int64
	genTokens        atomic.Int64
	success          atomic.Int64
	failed           atomic.Int64
	steps            atomic.Int64
	lagNanos         atomic.Int64 // how far the model clock trails the wall clock
	ttft             histogram
}

func (s *engineStats) usage() float64 { return math.Float64frombits(s.usageBits.Load()) }

func (s *engineStats) reset() {
	s.queries.Store(0)
	s.hits.Store(0)
	s.preemptions.Store(0)
	s.cpuHits.Store(0)
	s.kvLoaded.Store(0)
	s.kvFailures.Store(0)
	s.promptTokens.Store(0)
	s.genTokens.Store(0)
	s.success.Store(0)
	s.failed.Store(0)
	s.steps.Store(0)
	s.ttft.reset()
}

// load is the data-parallel balancer's score, vLLM's waiting × 4 + running.
func (e *engine) load() int64 { return e.stats.waiting.Load()*4 + e.stats.running.Load() }

func newEngine(prof Profile, rank int, hasher *kvindex.Hasher, scale float64, output []uint32, pub eventSink, faults *faultBox, seed uint64) *engine {
	e := &engine{
		prof: prof, rank: rank, scale: scale, output: output, pub: pub, faults: faults,
		specKind: events.SpecFullAttention,
		rng:      rand.New(rand.NewPCG(seed, uint64(rank)+1)),
		inbox:    make(chan engineMsg, 1024),
		probes:   make(chan probeMsg, 64),
		done:     make(chan struct{}),
		pool:     newBlockPool(prof.NumGPUBlocks),
	}
	e.hasher.Store(hasher)
	return e
}

// modelNow maps the wall clock to model time.
func (e *engine) modelNow() time.Duration {
	return time.Duration(float64(time.Since(e.start)) * e.scale)
}

// wallAt maps model time to the wall clock.
func (e *engine) wallAt(v time.Duration) time.Time {
	return e.start.Add(time.Duration(float64(v) / e.scale))
}

// submit hands a request to the engine. It fails when ctx ends first or the
// engine has stopped.
func (e *engine) submit(ctx context.Context, m engineMsg) error {
	select {
	case e.inbox <- m:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-e.done:
		return errClosed
	}
}

// control sends a message that expects a reply and waits for it.
func (e *engine) control(ctx context.Context, kind msgKind) (bool, error) {
	m := engineMsg{kind: kind, reply: make(chan bool, 1)}
	if err := e.submit(ctx, m); err != nil {
		return false, err
	}
	select {
	case ok := <-m.reply:
		return ok, nil
	case <-ctx.Done():
		return false, ctx.Err()
	case <-e.done:
		return false, errClosed
	}
}

func (e *engine) run(ctx context.Context) {
	defer close(e.done)
	// The caller registered the engine (rejoin) before starting it.
	defer e.leave()
	defer e.failAll(errClosed)
	e.start = time.Now()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		if len(e.waiting) == 0 && len(e.running) == 0 {
			select {
			case m := <-e.inbox:
				e.vnow = max(e.vnow, e.modelNow())
				e.stats.lagNanos.Store(0)
				e.handle(m)
			case q := <-e.probes:
				e.answer(q)
				continue
			case <-ctx.Done():
				return
			}
		}
	drain:
		for {
			select {
			case m := <-e.inbox:
				e.handle(m)
			case q := <-e.probes:
				e.answer(q)
			default:
				break drain
			}
		}
		if len(e.waiting) == 0 && len(e.running) == 0 {
			e.publishStats()
			continue
		}
		dur := e.step()
		e.vnow += dur
		if d := time.Until(e.wallAt(e.vnow)); d > 0 {
			e.stats.lagNanos.Store(0)
			timer.Reset(d)
		sleep:
			for {
				select {
				case <-timer.C:
					break sleep
				case q := <-e.probes:
					e.answer(q)
				case <-ctx.Done():
					timer.Stop()
					return
				}
			}
		} else {
			e.stats.lagNanos.Store(int64(-d))
		}
		e.finishStep()
	}
}

func (e *engine) handle(m engineMsg) {
	switch m.kind {
	case msgAdd:
		if !e.add(m.s, min(e.modelNow(), e.vnow)) {
			return
		}
	case msgAbort:
		e.abort(m.s)
	case msgRestart:
		e.restart()
		m.reply <- true
	case msgDie:
		e.die()
		m.reply <- true
	case msgSync:
		m.reply <- true
	case msgReset:
		// Every group must be idle; AllBlocksCleared covers all of them.
		// The CPU tier is not the prefix cache and survives, as vLLM's
		// reset_prefix_cache leaves the offloading connector alone.
		ok := (e.sw == nil || e.sw.idle()) && e.pool.reset()
		if ok && e.sw != nil {
			e.sw.clear()
		}
		e.publishEvents()
		m.reply <- ok
	}
	e.publishStats()
}

// restart starts the engine's process anew: every request fails, the
// cache is lost without an event, and a pod drawing random hash roots
// draws a new one.
func (e *engine) restart() {
	e.failAll(errRestarted)
	e.pool.clear()
	if e.sw != nil {
		e.sw.clear()
	}
	if e.cpu != nil {
		e.cpu.clear()
	}
	if e.newHasher != nil {
		// A new process, a new random root: hashes of the old one
		// match nothing any more.
		if h, err := e.newHasher(); err == nil {
			e.hasher.Store(h)
		}
	}
	e.stats.reset()
	e.dead = false
	if e.engineID.Load() != nil {
		e.rejoin()
	}
	if e.pub != nil {
		e.pub.Restart()
	}
}

// die fails every request and every later one until a restart.
func (e *engine) die() {
	e.failAll(errEngineDead)
	e.dead = true
	e.leave()
}

// rejoin gives the engine a new process identity: a fresh engine id in the
// registry of live engines, the old one (if any) leaving it. A decode that
// names the old id then finds nothing to pull, as a vLLM decode pod's NIXL
// handshake with a restarted prefill engine fails.
func (e *engine) rejoin() {
	e.leave()
	id := newEngineID(e.rank, e.dp)
	e.engineID.Store(&id)
	liveEngines.add(id)
}

// leave takes the engine's id out of the registry of live engines.
func (e *engine) leave() {
	if id := e.engineID.Load(); id != nil {
		liveEngines.remove(*id)
	}
}

// newSeq builds a request for e of prompt ids and maxTokens output
// tokens, its prompt's block hashes computed by the caller.
func (e *engine) newSeq(id string, ids []uint32, maxTokens int, extras kvindex.RequestExtras, loraID int64, notify chan struct{}) (*seq, error) {
	bs := e.prof.BlockSize
	total := len(ids) + maxTokens
	// Each rank is its own EngineCore process: with a random root its
	// hashes are its own.
	hasher := e.hasher.Load()
	hashes, err := hasher.Digests(make([]kvindex.Digest, 0, total/bs+1), ids, extras)
	if err != nil {
		return nil, fmt.Errorf("hashing prompt: %w", err)
	}
	tokens := make([]uint32, len(ids), total)
	copy(tokens, ids)
	return &seq{
		id: id, tokens: tokens, promptLen: len(ids), maxTokens: maxTokens,
		extras: extras, loraID: loraID, hashes: hashes, hasher: hasher,
		out: &output{notify: notify},
	}, nil
}

// add queues s, arrived at model time at; it reports false when s ended
// at once (a dead engine, a prompt that cannot be hashed).
func (e *engine) add(s *seq, at time.Duration) bool {
	if e.dead {
		e.finish(s, "", errEngineDead)
		return false
	}
	// A prompt hashed before a restart drew a new random root carries
	// the old process's hashes: hash it again, as the new process would.
	if h := e.hasher.Load(); s.hasher != h {
		hashes, err := h.Digests(s.hashes[:0], s.tokens[:s.promptLen], s.extras)
		if err != nil {
			e.finish(s, "", fmt.Errorf("hashing prompt: %w", err))
			return false
		}
		s.hashes, s.hasher = hashes, h
	}
	s.arrival = at
	s.state = stateWaiting
	// The run found here is the first scheduling attempt's memo.
	s.hitMemo, s.expectHits = e.cachedBlocks(s.hitMemo[:0], s.hashes, s.promptLen)
	s.hitMemoAt = e.pool.losses
	e.waiting = append(e.waiting, s)
	return true
}

// step schedules one batch as vLLM v1's scheduler does and returns its model
// time: running requests first (decodes and unfinished prefill chunks), then,
// when nothing was preempted, waiting requests in FCFS order until the token
// budget, the sequence limit or the KV cache runs out.
func (e *engine) step() time.Duration {
	p := &e.prof
	e.sched = e.sched[:0]
	budget := p.MaxNumBatchedTokens
	prefillTokens, decodes, loadBlocks, pullBlocks := 0, 0, 0, 0
	preempted := false
	for i := 0; i < len(e.running) && budget > 0; i++ {
		s := e.running[i]
		n := min(s.numTokens()-s.numComputed, budget)
		if n <= 0 {
			continue
		}
		ok := e.allocate(s, n, nil, 0)
		for !ok {
			victim := e.running[len(e.running)-1]
			e.preempt(victim)
			preempted = true
			if victim == s {
				break
			}
			ok = e.allocate(s, n, nil, 0)
		}
		if !ok {
			break
		}
		prefill := s.numComputed < s.promptLen || n > 1
		e.sched = append(e.sched, scheduled{s: s, n: n, prefill: prefill})
		budget -= n
		if prefill {
			prefillTokens += n
		} else {
			decodes++
		}
	}
	if !preempted {
		fail := e.faults.get().FailPrefill
		for len(e.waiting) > 0 && budget > 0 && len(e.running) < p.MaxNumSeqs {
			s := e.waiting[0]
			hits := e.scratch[:0]
			// loaded are blocks after the GPU hit that the KV connector
			// loads instead of computing: pulled from a remote prefill
			// engine when the request is the decode of a disaggregated
			// one (remote), else read from the CPU tier.
			loaded := 0
			remote := s.remoteBlocks > 0
			if s.numComputed == 0 {
				// vLLM never serves the whole prompt from cache: the last
				// token is always recomputed to produce logits.
				limit := (s.numTokens() - 1) / p.BlockSize
				hits = e.pool.lookupFrom(hits, s.hashes, limit, s.hitMemo, s.hitMemoAt)
				s.hitMemo, s.hitMemoAt = append(s.hitMemo[:0], hits...), e.pool.losses
				if e.sw != nil {
					hits = hits[:e.swHit(s.hashes, len(hits))]
				}
				switch {
				case remote:
					// The prefill engine holds the prompt's full blocks;
					// the last token is computed here all the same.
					loaded = max(0, min(s.remoteBlocks, limit)-len(hits))
				case e.cpu != nil:
					loaded = e.cpu.run(s.hashes, len(hits), limit)
				}
				if !s.looked {
					s.looked = true
					// cached_tokens counts connector (CPU or remote) hits
					// as vLLM's num_cached_tokens does; the prefix-cache
					// hit counter counts the GPU's only.
					cached := (len(hits) + loaded) * p.BlockSize
					e.stats.queries.Add(int64(s.promptLen))
					e.stats.promptTokens.Add(int64(s.promptLen))
					e.stats.hits.Add(int64(len(hits) * p.BlockSize))
					if remote {
						e.stats.kvLoaded.Add(int64(loaded * p.BlockSize))
					} else {
						e.stats.cpuHits.Add(int64(loaded * p.BlockSize))
					}
					s.out.mu.Lock()
					s.out.cached = cached
					s.out.mu.Unlock()
				}
			}
			n := min(s.numTokens()-(len(hits)+loaded)*p.BlockSize, budget)
			if loaded > 0 && !remote {
				// Most recently used before the allocation, whose GPU
				// evictions may push older blocks out of the tier.
				e.cpu.touch(s.hashes[len(hits) : len(hits)+loaded])
			}
			if !e.allocate(s, n, hits, loaded) {
				e.scratch = hits
				break
			}
			if remote {
				// Pulled once: recomputed after a preemption, from
				// whatever of it this engine has cached by then.
				s.remoteBlocks = 0
				pullBlocks += loaded
			} else {
				loadBlocks += loaded
			}
			e.scratch = hits
			e.waiting = e.waiting[1:]
			s.state = stateRunning
			e.running = append(e.running, s)
			e.sched = append(e.sched, scheduled{s: s, n: n, prefill: true})
			budget -= n
			prefillTokens += n
			if fail > 0 && e.rng.Float64() < fail {
				s.failPrefill = true
			}
		}
	}
	e.stats.steps.Add(1)
	// Loading from the CPU tier or pulling from a remote engine replaces
	// the prefill of those blocks.
	d := p.StepTime(prefillTokens, decodes) + time.Duration(loadBlocks)*e.cpuLoad + time.Duration(pullBlocks)*e.kvTransfer
	if slow := e.faults.get().Slow; slow > 1 {
		d = time.Duration(float64(d) * slow)
	}
	e.publishStats()
	return d
}

// allocate reserves the blocks s needs to compute n more tokens, taking
// references on cache hits first (only for a request that has computed
// nothing yet; loaded more blocks come from the CPU tier into fresh GPU
// blocks), and registers every block that becomes full in the prefix cache.
// It fails without side effects on the cache when the free queue is too
// short (a sliding-window group may have released blocks out of its window,
// as vLLM does before allocating).
func (e *engine) allocate(s *seq, n int, hits []int32, loaded int) bool {
	bs := e.prof.BlockSize
	computed := s.numComputed
	fresh := len(s.blocks) == 0
	if fresh {
		computed = (len(hits) + loaded) * bs
	}
	total := computed + n
	need := (total+bs-1)/bs - len(s.blocks) - len(hits)
	need = max(need, 0)
	// need alone too many spares the walk over the hits.
	if need > e.pool.numFree || need+e.pool.evictable(hits) > e.pool.numFree {
		return false
	}
	var swHits []int32
	if e.sw != nil {
		if fresh {
			swHits = e.swHitBlocks(s.hashes, len(hits))
		} else {
			e.removeSkipped(s)
		}
		if need+e.sw.evictable(swHits) > e.sw.numFree {
			return false
		}
	}
	if fresh {
		e.pool.touch(hits)
		s.blocks = append(s.blocks, hits...)
		if e.sw != nil {
			e.sw.touch(swHits)
			for range len(hits) - len(swHits) {
				s.swBlocks = append(s.swBlocks, noBlock)
			}
			s.swBlocks = append(s.swBlocks, swHits...)
		}
		s.numCachedBlocks = len(hits)
		s.numComputed = computed
	}
	s.blocks = e.pool.allocate(s.blocks, need)
	if e.sw != nil {
		s.swBlocks = e.sw.allocate(s.swBlocks, need)
	}
	e.cacheFull(s, min(total/bs, len(s.hashes)))
	return true
}

// swHit is vLLM's SlidingWindowManager.find_longest_cache_hit bounded by the
// full-attention hit of n blocks: scanning from the right, the first run of
// swNeed cached blocks ending at k makes k the hit; failing that, the run
// of cached blocks from block 0.
func (e *engine) swHit(hashes []kvindex.Digest, n int) int {
	if e.swNeed <= 0 {
		return n
	}
	run := 0
	for i := n - 1; i >= 0; i-- {
		if !e.sw.has(hashes[i]) {
			run = 0
			continue
		}
		run++
		if run >= e.swNeed {
			return i + e.swNeed
		}
	}
	return run
}

// swHitBlocks returns the sliding-window group's cached blocks a hit of k
// blocks uses: the last swNeed of them (the earlier ones are outside the
// window and stay null).
func (e *engine) swHitBlocks(hashes []kvindex.Digest, k int) []int32 {
	from := max(0, k-e.swNeed)
	out := make([]int32, 0, k-from)
	for i := from; i < k; i++ {
		out = append(out, e.sw.first(hashes[i]))
	}
	return out
}

// removeSkipped frees s's sliding-window blocks that no longer hold a token
// within the window of its next token (vLLM's remove_skipped_blocks), last
// first, stopping at the first already-null block.
func (e *engine) removeSkipped(s *seq) {
	skippedTokens := s.numComputed - e.window + 1
	if skippedTokens <= 0 {
		return
	}
	for i := min(skippedTokens/e.prof.BlockSize, len(s.swBlocks)) - 1; i >= 0; i-- {
		if s.swBlocks[i] == noBlock {
			break
		}
		e.sw.free(s.swBlocks[i : i+1])
		s.swBlocks[i] = noBlock
	}
}

// cacheFull registers s's blocks [numCachedBlocks, upTo) and reports them in
// one BlockStored event, as vLLM's cache_full_blocks does.
func (e *engine) cacheFull(s *seq, upTo int) {
	from := s.numCachedBlocks
	if upTo <= from {
		return
	}
	bs := e.prof.BlockSize
	ev := events.Event{
		Kind:        events.KindBlockStored,
		BlockHashes: make([]uint64, 0, upTo-from),
		TokenIDs:    s.tokens[from*bs : upTo*bs : upTo*bs],
		BlockSize:   bs,
		LoRAName:    s.extras.LoRAName,
		Medium:      events.MediumGPU,
		ExtraKeys:   make([][]any, 0, upTo-from), HasExtraKeys: true,
		GroupIdx: 0, HasGroupIdx: true,
		SpecKind: e.specKind,
	}
	if s.loraID != 0 {
		ev.LoRAID, ev.HasLoRAID = s.loraID, true
	}
	if from > 0 {
		ev.ParentHash, ev.HasParentHash = s.hashes[from-1].Wire(), true
	}
	for i := from; i < upTo; i++ {
		e.pool.cache(s.blocks[i], s.hashes[i])
		ev.BlockHashes = append(ev.BlockHashes, s.hashes[i].Wire())
		ev.ExtraKeys = append(ev.ExtraKeys, s.extras.AppendBlockExtra(nil, i, i*bs, (i+1)*bs))
	}
	e.pool.pending = append(e.pool.pending, ev)
	if e.sw != nil {
		// vLLM's hybrid coordinator caches the same block hashes in every
		// group and reports each group's blocks in its own event.
		sev := ev
		sev.GroupIdx = 1
		sev.SpecKind = specSlidingWindow
		sev.SlidingWindow, sev.HasSlidingWindow = int64(e.window), true
		for i := from; i < upTo; i++ {
			if id := s.swBlocks[i]; id != noBlock {
				e.sw.cache(id, s.hashes[i])
			}
		}
		e.sw.pending = append(e.sw.pending, sev)
	}
	s.numCachedBlocks = upTo
}

// finishStep applies the step's results once its model time has passed:
// computed tokens advance, requests whose known tokens are all computed
// sample one token, finished requests free their blocks.
func (e *engine) finishStep() {
	for _, sc := range e.sched {
		s := sc.s
		if s.state != stateRunning {
			continue
		}
		s.numComputed += sc.n
		if s.failPrefill {
			e.finish(s, "", errPrefillFailed)
			continue
		}
		if s.numComputed < s.numTokens() {
			continue
		}
		e.sample(s)
	}
	e.running = slices.DeleteFunc(e.running, func(s *seq) bool { return s.state != stateRunning })
	e.publishEvents()
	e.publishStats()
}

// sample appends one generated token to s and finishes it at max_tokens.
func (e *engine) sample(s *seq) {
	gen := s.numTokens() - s.promptLen
	s.tokens = append(s.tokens, e.output[gen%len(e.output)])
	gen++
	bs := e.prof.BlockSize
	if s.numTokens()%bs == 0 {
		i := s.numTokens()/bs - 1
		h := e.hasher.Load()
		parent := h.Root()
		if i > 0 {
			parent = s.hashes[i-1]
		}
		var buf [4]any
		d, err := h.HashBlock(parent, s.tokens[i*bs:(i+1)*bs], s.extras.AppendBlockExtra(buf[:0], i, i*bs, (i+1)*bs))
		if err == nil {
			s.hashes = append(s.hashes, d)
		}
	}
	e.stats.genTokens.Add(1)
	o := s.out
	o.mu.Lock()
	o.generated = gen
	if gen == 1 {
		o.ttft = e.vnow - s.arrival
		e.stats.ttft.observe(o.ttft.Seconds())
	}
	o.mu.Unlock()
	if gen >= s.maxTokens {
		e.stats.success.Add(1)
		e.finish(s, "length", nil)
		return
	}
	// The first token leaves at once; later ones wake the writer at most
	// once per streamEvery, which coalesces them into fewer chunks.
	if gen == 1 || e.vnow >= s.nextPoke {
		s.nextPoke = e.vnow + e.streamEvery
		o.poke()
	}
}

// finish ends s: its blocks return to the free queue tail first, so the
// prompt's beginning is evicted last.
func (e *engine) finish(s *seq, reason string, err error) {
	if s.state == stateDone {
		return
	}
	if err != nil && err != errAborted {
		e.stats.failed.Add(1)
	}
	s.state = stateDone
	var kvBlocks []int32
	var kvEngine string
	if s.kvAnswer && err == nil {
		// The prefill of a disaggregated request answers where its
		// prompt's full blocks are. (vLLM holds them until the decode
		// has read them; here they return to the free queue at once and
		// the decode pulls them by count.)
		n := min(s.promptLen/e.prof.BlockSize, len(s.blocks))
		kvBlocks = append(make([]int32, 0, n), s.blocks[:n]...)
		if id := e.engineID.Load(); id != nil {
			kvEngine = *id
		}
	}
	slices.Reverse(s.blocks)
	e.pool.free(s.blocks)
	s.blocks = nil
	if e.sw != nil {
		slices.Reverse(s.swBlocks)
		e.sw.free(s.swBlocks)
		s.swBlocks = nil
	}
	o := s.out
	o.mu.Lock()
	o.done, o.finish, o.err = true, reason, err
	o.kvBlocks, o.kvEngine = kvBlocks, kvEngine
	o.mu.Unlock()
	o.poke()
}

func (e *engine) abort(s *seq) {
	switch s.state {
	case stateWaiting:
		e.waiting = slices.DeleteFunc(e.waiting, func(x *seq) bool { return x == s })
	case stateRunning:
		e.running = slices.DeleteFunc(e.running, func(x *seq) bool { return x == s })
	default:
		return
	}
	e.finish(s, "abort", errAborted)
	e.publishEvents()
}

// preempt returns a running request to the head of the queue, freeing its
// blocks; it recomputes from its longest cached prefix when rescheduled.
func (e *engine) preempt(s *seq) {
	e.running = slices.DeleteFunc(e.running, func(x *seq) bool { return x == s })
	slices.Reverse(s.blocks)
	e.pool.free(s.blocks)
	s.blocks = s.blocks[:0]
	if e.sw != nil {
		slices.Reverse(s.swBlocks)
		e.sw.free(s.swBlocks)
		s.swBlocks = s.swBlocks[:0]
	}
	s.numComputed, s.numCachedBlocks = 0, 0
	s.state = stateWaiting
	e.waiting = slices.Insert(e.waiting, 0, s)
	e.stats.preemptions.Add(1)
}

func (e *engine) failAll(err error) {
	for _, s := range e.running {
		e.finish(s, "", err)
	}
	for _, s := range e.waiting {
		e.finish(s, "", err)
	}
	e.running, e.waiting = e.running[:0], e.waiting[:0]
	if err == errRestarted || err == errEngineDead || err == errClosed {
		// The process is gone: events of this step die with it.
		e.pool.pending = e.pool.pending[:0]
		if e.sw != nil {
			e.sw.pending = e.sw.pending[:0]
		}
		if e.cpu != nil {
			e.cpu.pending = e.cpu.pending[:0]
		}
	} else {
		e.publishEvents()
	}
}

// publishEvents sends the step's events as one batch, group 0 first, then
// the CPU tier's, then the sliding-window group's, as vLLM's engine core
// gathers every manager's events after a step.
func (e *engine) publishEvents() {
	evs := e.pool.takeEvents()
	if e.cpu != nil {
		evs = append(evs, e.cpu.takeEvents()...)
	}
	if e.sw != nil {
		evs = append(evs, e.sw.takeEvents()...)
	}
	if len(evs) == 0 || e.pub == nil || e.dead {
		return
	}
	b := events.Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: evs, DPRank: e.rank, HasDPRank: true}
	// Submit fails only once the publisher is closed: the pod is shutting
	// down and the batch has nobody to go to.
	_ = e.pub.Submit(b, e.enc)
}

func (e *engine) publishStats() {
	e.stats.running.Store(int64(len(e.running)))
	e.stats.waiting.Store(int64(len(e.waiting)))
	e.stats.usageBits.Store(math.Float64bits(e.pool.usage()))
}

// histogram is a Prometheus histogram with vLLM's TTFT buckets, in model
// seconds.
type histogram struct {
	mu     sync.Mutex
	counts [len(ttftBuckets) + 1]uint64
	sum    float64
	n      uint64
}

var ttftBuckets = [...]float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}

func (h *histogram) observe(v float64) {
	h.mu.Lock()
	i, _ := slices.BinarySearch(ttftBuckets[:], v)
	h.counts[i]++
	h.sum += v
	h.n++
	h.mu.Unlock()
}

func (h *histogram) reset() {
	h.mu.Lock()
	h.counts, h.sum, h.n = [len(ttftBuckets) + 1]uint64{}, 0, 0
	h.mu.Unlock()
}

// String is for logs.
func (e *engine) String() string { return fmt.Sprintf("engine rank %d", e.rank) }
