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
	prof   Profile
	rank   int
	hasher *kvindex.Hasher
	scale  float64
	output []uint32 // generated tokens cycle through these ids
	pub    *publisher
	faults *faultBox
	rng    *rand.Rand

	inbox chan engineMsg
	done  chan struct{}
	start time.Time

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
)

// engineStats are read by /metrics and by the data-parallel balancer.
type engineStats struct {
	running, waiting atomic.Int64
	usageBits        atomic.Uint64
	queries, hits    atomic.Int64 // prefix-cache tokens
	preemptions      atomic.Int64
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
	s.promptTokens.Store(0)
	s.genTokens.Store(0)
	s.success.Store(0)
	s.failed.Store(0)
	s.steps.Store(0)
	s.ttft.reset()
}

// load is the data-parallel balancer's score, vLLM's waiting × 4 + running.
func (e *engine) load() int64 { return e.stats.waiting.Load()*4 + e.stats.running.Load() }

func newEngine(prof Profile, rank int, hasher *kvindex.Hasher, scale float64, output []uint32, pub *publisher, faults *faultBox, seed uint64) *engine {
	return &engine{
		prof: prof, rank: rank, hasher: hasher, scale: scale, output: output, pub: pub, faults: faults,
		rng:   rand.New(rand.NewPCG(seed, uint64(rank)+1)),
		inbox: make(chan engineMsg, 1024),
		done:  make(chan struct{}),
		pool:  newBlockPool(prof.NumGPUBlocks),
	}
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
			case <-ctx.Done():
				return
			}
		}
	drain:
		for {
			select {
			case m := <-e.inbox:
				e.handle(m)
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
			select {
			case <-timer.C:
			case <-ctx.Done():
				timer.Stop()
				return
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
		s := m.s
		if e.dead {
			e.finish(s, "", errEngineDead)
			return
		}
		s.arrival = min(e.modelNow(), e.vnow)
		s.state = stateWaiting
		e.waiting = append(e.waiting, s)
	case msgAbort:
		e.abort(m.s)
	case msgRestart:
		e.failAll(errRestarted)
		e.pool.clear()
		e.stats.reset()
		e.dead = false
		if e.pub != nil {
			e.pub.restart()
		}
		m.reply <- true
	case msgDie:
		e.failAll(errEngineDead)
		e.dead = true
		m.reply <- true
	case msgReset:
		ok := e.pool.reset()
		e.publishEvents()
		m.reply <- ok
	}
	e.publishStats()
}

// step schedules one batch as vLLM v1's scheduler does and returns its model
// time: running requests first (decodes and unfinished prefill chunks), then,
// when nothing was preempted, waiting requests in FCFS order until the token
// budget, the sequence limit or the KV cache runs out.
func (e *engine) step() time.Duration {
	p := &e.prof
	e.sched = e.sched[:0]
	budget := p.MaxNumBatchedTokens
	prefillTokens, decodes := 0, 0
	preempted := false
	for i := 0; i < len(e.running) && budget > 0; i++ {
		s := e.running[i]
		n := min(s.numTokens()-s.numComputed, budget)
		if n <= 0 {
			continue
		}
		ok := e.allocate(s, n, nil)
		for !ok {
			victim := e.running[len(e.running)-1]
			e.preempt(victim)
			preempted = true
			if victim == s {
				break
			}
			ok = e.allocate(s, n, nil)
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
			if s.numComputed == 0 {
				// vLLM never serves the whole prompt from cache: the last
				// token is always recomputed to produce logits.
				hits = e.pool.lookup(hits, s.hashes, (s.numTokens()-1)/p.BlockSize)
				if !s.looked {
					s.looked = true
					cached := len(hits) * p.BlockSize
					e.stats.queries.Add(int64(s.promptLen))
					e.stats.promptTokens.Add(int64(s.promptLen))
					e.stats.hits.Add(int64(cached))
					s.out.mu.Lock()
					s.out.cached = cached
					s.out.mu.Unlock()
				}
			}
			n := min(s.numTokens()-len(hits)*p.BlockSize, budget)
			if !e.allocate(s, n, hits) {
				e.scratch = hits
				break
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
	d := p.StepTime(prefillTokens, decodes)
	if slow := e.faults.get().Slow; slow > 1 {
		d = time.Duration(float64(d) * slow)
	}
	e.publishStats()
	return d
}

// allocate reserves the blocks s needs to compute n more tokens, taking
// references on cache hits first (only for a request that has computed
// nothing yet), and registers every block that becomes full in the prefix
// cache. It fails without side effects when the free queue is too short.
func (e *engine) allocate(s *seq, n int, hits []int32) bool {
	bs := e.prof.BlockSize
	computed := s.numComputed
	if len(s.blocks) == 0 {
		computed = len(hits) * bs
	}
	total := computed + n
	need := (total+bs-1)/bs - len(s.blocks) - len(hits)
	need = max(need, 0)
	if need+e.pool.evictable(hits) > e.pool.numFree {
		return false
	}
	if len(s.blocks) == 0 {
		e.pool.touch(hits)
		s.blocks = append(s.blocks, hits...)
		s.numCachedBlocks = len(hits)
		s.numComputed = computed
	}
	s.blocks = e.pool.allocate(s.blocks, need)
	e.cacheFull(s, min(total/bs, len(s.hashes)))
	return true
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
		SpecKind: events.SpecFullAttention,
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
	s.numCachedBlocks = upTo
	e.pool.pending = append(e.pool.pending, ev)
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
		parent := e.hasher.Root()
		if i > 0 {
			parent = s.hashes[i-1]
		}
		var buf [4]any
		d, err := e.hasher.HashBlock(parent, s.tokens[i*bs:(i+1)*bs], s.extras.AppendBlockExtra(buf[:0], i, i*bs, (i+1)*bs))
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
	o.poke()
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
	slices.Reverse(s.blocks)
	e.pool.free(s.blocks)
	s.blocks = nil
	o := s.out
	o.mu.Lock()
	o.done, o.finish, o.err = true, reason, err
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
	} else {
		e.publishEvents()
	}
}

func (e *engine) publishEvents() {
	evs := e.pool.takeEvents()
	if len(evs) == 0 || e.pub == nil || e.dead {
		return
	}
	e.pub.publish(evs)
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
