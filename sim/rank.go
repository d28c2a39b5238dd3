package sim

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
)

// Rank is one data-parallel rank's engine without its goroutine, its wall
// clock or its sockets: the scheduler and block pool a live pod runs,
// stepped by a caller that owns the clock (the benchmark's discrete-event
// engine). The caller adds requests at model times, asks for a step's
// duration (Step), and applies it once that much of its time has passed
// (FinishStep); the step's KV-event batch is then waiting in Events. A
// Rank is not safe for concurrent use.
type Rank struct {
	e    *engine
	sink *batchSink
	tok  Tokenizer
	next uint64
	// reqs are the requests not yet done, by their engine request.
	reqs map[*seq]*Request
	ran  []*Request
}

// NewRank builds pod's rank 0 of cfg (defaulted as StartFleet does): the
// profile, hashing, KV-cache layout and offloading tier of a live pod. The
// engine's outputs are cfg's tokenizer's, so answers read as a live pod's.
func NewRank(cfg Config, pod int) (*Rank, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if cfg.RandomHashSeed {
		return nil, fmt.Errorf("pod %d: a rank without a process has no random hash seed: give HashSeed", pod)
	}
	tok := cfg.TokenizerImpl
	if tok == nil {
		if cfg.Tokenizer != "" && cfg.Tokenizer != "bytes" {
			return nil, fmt.Errorf("pod %d: a rank takes its tokenizer as TokenizerImpl (got %q)", pod, cfg.Tokenizer)
		}
		tok = BytesTokenizer()
	}
	hasher, err := kvindex.NewHasher(cfg.HashAlgo, cfg.HashSeed, cfg.Profile.BlockSize)
	if err != nil {
		return nil, fmt.Errorf("pod %d: %w", pod, err)
	}
	sink := &batchSink{}
	seed := cfg.Seed*1000003 + uint64(pod)
	e := newEngine(cfg.Profile, 0, hasher, 1, outputTokens(tok), sink, newFaultBox(Faults{}), seed)
	e.configure(engineSetup{enc: cfg.EventEncoding, kvSpec: cfg.KVSpec, window: cfg.SlidingWindow,
		cpuBlocks: cfg.CPUOffloadBlocks, cpuLoad: cfg.CPULoadPerBlock, streamEvery: cfg.StreamInterval})
	return &Rank{e: e, sink: sink, tok: tok, reqs: map[*seq]*Request{}}, nil
}

// batchSink keeps a Rank's published batches until the caller takes them.
type batchSink struct{ batches []events.Batch }

func (s *batchSink) Submit(b events.Batch, _ events.Encoding) error {
	s.batches = append(s.batches, b)
	return nil
}

func (s *batchSink) Restart() {}

// Request is one request a Rank runs. Tag is the caller's.
type Request struct {
	s   *seq
	n   uint64 // the order it was added in
	Tag any
}

// Snapshot is the request's progress.
func (q *Request) Snapshot() Snapshot { return q.s.out.snapshot() }

// Answer is the text the request generated so far, decoded as a live
// pod's stream delivers it.
func (r *Rank) Answer(q *Request) (string, error) {
	s := q.s
	text, err := r.tok.Decode(s.tokens[s.promptLen:], true)
	if err != nil {
		return "", fmt.Errorf("decode answer: %w", err)
	}
	return text, nil
}

// Add queues a completions request of prompt ids for maxTokens tokens,
// arrived at model time now.
func (r *Rank) Add(ids []uint32, maxTokens int, now time.Duration) (*Request, error) {
	r.next++
	s, err := r.e.newSeq("rank-"+strconv.FormatUint(r.next, 10), ids, maxTokens, kvindex.RequestExtras{}, 0, nil)
	if err != nil {
		return nil, err
	}
	r.e.vnow = max(r.e.vnow, now)
	if !r.e.add(s, now) {
		return nil, s.out.snapshot().Err
	}
	q := &Request{s: s, n: r.next}
	s.rankReq = q
	r.reqs[s] = q
	return q, nil
}

// Idle reports whether the rank has nothing to run.
func (r *Rank) Idle() bool { return len(r.e.waiting) == 0 && len(r.e.running) == 0 }

// Step schedules one step at model time now and returns its model
// duration; FinishStep applies it once that much time has passed.
func (r *Rank) Step(now time.Duration) time.Duration {
	r.e.vnow = now
	return r.e.step()
}

// FinishStep applies the step Step scheduled, at model time now (its
// start plus its duration), and returns the requests it ran: those with
// a first token or at their end now say so in their Snapshot.
// The slice is reused by the next call.
func (r *Rank) FinishStep(now time.Duration) []*Request {
	r.e.vnow = now
	r.e.finishStep()
	r.ran = r.ran[:0]
	for _, sc := range r.e.sched {
		q := sc.s.rankReq
		if q == nil {
			continue
		}
		r.ran = append(r.ran, q)
		if sc.s.state == stateDone {
			delete(r.reqs, sc.s)
		}
	}
	return r.ran
}

// Events returns the KV-event batches the rank published since the last
// call, one per step that stored or removed blocks.
func (r *Rank) Events() []events.Batch {
	b := r.sink.batches
	r.sink.batches = nil
	return b
}

// State is the rank's RankState for a prompt of token ids (Pod.Probe's
// answer, for the oracle).
func (r *Rank) State(ids []uint32) (RankState, error) {
	hashes, err := r.e.hasher.Load().Digests(nil, ids, kvindex.RequestExtras{})
	if err != nil {
		return RankState{}, fmt.Errorf("hashing prompt: %w", err)
	}
	return r.e.state(hashes, len(ids)), nil
}

// Gauges are what the rank's /metrics reports now: requests running and
// waiting, and the fraction of KV blocks in use.
func (r *Rank) Gauges() (running, waiting int, kvUsage float64) {
	return len(r.e.running), len(r.e.waiting), r.e.pool.usage()
}

// Preemptions counts the requests the rank preempted.
func (r *Rank) Preemptions() int64 { return r.e.stats.preemptions.Load() }

// SetFaults sets the faults the engine itself models: FailPrefill and
// Slow. A caller stepping ranks models the others (event delay, dropped
// batches) on the events' way out, and a dead engine with Die.
func (r *Rank) SetFaults(f Faults) { r.e.faults.set(f) }

// Abort ends q as vLLM does when its client goes away: its blocks go back
// to the pool (cached, as a finished request's). Like every change of
// the rank, it belongs between steps.
func (r *Rank) Abort(q *Request) {
	r.e.abort(q.s)
	delete(r.reqs, q.s)
}

// Restart starts the rank's process anew: every request not done fails,
// the cache is lost without an event, and the caller's event stream
// should start its sequence again. It returns the failed requests in the
// order they were added; their Snapshot says why.
func (r *Rank) Restart() []*Request {
	failed := r.Pending()
	r.e.restart()
	clear(r.reqs)
	return failed
}

// Die kills the rank's engine: every request not done fails and every
// later one is refused (Add's error) until Restart. It returns the failed
// requests as Restart does.
func (r *Rank) Die() []*Request {
	failed := r.Pending()
	r.e.die()
	clear(r.reqs)
	return failed
}

// Pending returns the requests not yet done, in the order they were added.
func (r *Rank) Pending() []*Request {
	out := make([]*Request, 0, len(r.reqs))
	for _, q := range r.reqs {
		out = append(out, q)
	}
	slices.SortFunc(out, func(a, b *Request) int { return cmp.Compare(a.n, b.n) })
	return out
}
