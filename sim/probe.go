package sim

import (
	"context"
	"fmt"
	"math"

	"github.com/prefixrouter/prefixrouter/kvindex"
)

// RankState is what an all-knowing router would read off one rank before
// sending it a prompt: how much of the prompt the rank's prefix cache holds
// right now and how much work is queued ahead of it. The benchmark's oracle
// policy routes on it; nothing in it is visible to a real router.
type RankState struct {
	// CachedTokens is the prompt tokens the rank would serve from its
	// cache if the prompt were scheduled now: the GPU run from block 0 and
	// the CPU tier's blocks after it, never the last token.
	CachedTokens int
	// QueuedPrefillTokens is the prompt tokens of waiting and prefilling
	// requests not yet computed, net of the cache hits a waiting request
	// had when it joined the queue.
	QueuedPrefillTokens int
	// Running and Waiting count requests; KVUsage is the fraction of GPU
	// blocks in use.
	Running, Waiting int
	KVUsage          float64
}

// oracleMissWeight is what an uncached prompt token costs the oracle at
// least.
const oracleMissWeight = 2

// OracleCosts is the benchmark's oracle policy's score of each rank in
// states (every rank of the fleet) for a prompt of promptTokens tokens, in
// prefill tokens, appended to dst: the router's precise cost
// (brain.CostConfig: decodeWeight and recomputeWeight its DecodeWeight
// and RecomputeWeight) with the true queue and cached prefix. It leaves
// out the KV-pressure term: that term is the router's guess that a full
// cache makes a request wait for memory, and the oracle sees those waits
// in the true queue (requests waiting for blocks are waiting requests).
// An uncached token costs at least twice: a miss costs its prefill now
// and, by pushing a prefix out, a later request's prefill (with the
// precise policy's weight of one, the greedy choice tipped under load into
// spreading every group over every pod and did not come back: measured in
// docs/performance.md); and, as the router's does, 1 + recomputeWeight ×
// (1 − spare) as the fleet's spare capacity falls (spare: 1 while some rank
// is idle, 0 once the least busy has two prompts' worth of queued prefill
// and decoding).
func OracleCosts(dst []float64, states []RankState, promptTokens int, decodeWeight, recomputeWeight float64) []float64 {
	work := func(st RankState) float64 {
		return float64(st.QueuedPrefillTokens) + decodeWeight*float64(st.Running)
	}
	spare := 1.0
	if promptTokens > 0 && len(states) > 0 {
		least := math.Inf(1)
		for _, st := range states {
			least = math.Min(least, work(st))
		}
		spare = 1 - math.Min(1, least/(2*float64(promptTokens)))
	}
	miss := math.Max(oracleMissWeight, 1+recomputeWeight*(1-spare))
	for _, st := range states {
		cost := work(st) + miss*float64(promptTokens-min(st.CachedTokens, promptTokens))
		dst = append(dst, math.Max(cost, 0))
	}
	return dst
}

// probeMsg asks an engine for its RankState for a prompt's block hashes.
type probeMsg struct {
	hashes    []kvindex.Digest
	promptLen int
	reply     chan RankState
}

// Encode tokenizes a completions prompt as the pod does (special tokens
// added), for Probe.
func (p *Pod) Encode(text string) ([]uint32, error) {
	ids, err := p.tok.Encode(text, true)
	if err != nil {
		return nil, fmt.Errorf("pod %d: encode: %w", p.index, err)
	}
	return ids, nil
}

// Probe returns every rank's state for a prompt of token ids (no LoRA, no
// cache salt). Each engine answers between steps or while a step's model
// time passes, so a probe waits at most for one step's computation.
func (p *Pod) Probe(ctx context.Context, ids []uint32) ([]RankState, error) {
	out := make([]RankState, len(p.engines))
	for r, e := range p.engines {
		hashes, err := e.hasher.Load().Digests(nil, ids, kvindex.RequestExtras{})
		if err != nil {
			return nil, fmt.Errorf("pod %d: hashing prompt: %w", p.index, err)
		}
		m := probeMsg{hashes: hashes, promptLen: len(ids), reply: make(chan RankState, 1)}
		select {
		case e.probes <- m:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-e.done:
			return nil, fmt.Errorf("pod %d: %w", p.index, errClosed)
		}
		select {
		case out[r] = <-m.reply:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-e.done:
			return nil, fmt.Errorf("pod %d: %w", p.index, errClosed)
		}
	}
	return out, nil
}

// answer is the engine's side of Probe; it runs on the engine goroutine.
func (e *engine) answer(m probeMsg) { m.reply <- e.state(m.hashes, m.promptLen) }

// state is the engine's RankState for a prompt of promptLen tokens with
// these block hashes.
func (e *engine) state(hashes []kvindex.Digest, promptLen int) RankState {
	st := RankState{Running: len(e.running), Waiting: len(e.waiting), KVUsage: e.pool.usage()}
	if !e.dead {
		bs := e.prof.BlockSize
		hit := e.cachedRun(hashes, promptLen)
		if e.cpu != nil {
			hit += e.cpu.run(hashes, hit, (promptLen-1)/bs)
		}
		st.CachedTokens = hit * bs
		for _, s := range e.waiting {
			if s.numComputed == 0 {
				st.QueuedPrefillTokens += max(0, s.promptLen-s.expectHits*bs)
			} else {
				st.QueuedPrefillTokens += max(0, s.promptLen-s.numComputed)
			}
		}
		for _, s := range e.running {
			st.QueuedPrefillTokens += max(0, s.promptLen-s.numComputed)
		}
	}
	return st
}

// cachedRun is the prefix hit, in blocks, of a prompt of promptLen tokens
// with these block hashes: the GPU run from block 0 (and, for a hybrid
// model, what its sliding-window group allows), never the last token.
func (e *engine) cachedRun(hashes []kvindex.Digest, promptLen int) int {
	var n int
	e.scratch, n = e.cachedBlocks(e.scratch[:0], hashes, promptLen)
	return n
}

// cachedBlocks is cachedRun with the GPU run's blocks, appended to dst.
func (e *engine) cachedBlocks(dst []int32, hashes []kvindex.Digest, promptLen int) ([]int32, int) {
	hits := e.pool.lookup(dst, hashes, (promptLen-1)/e.prof.BlockSize)
	n := len(hits)
	if e.sw != nil {
		n = e.swHit(hashes, n)
	}
	return hits, n
}
