package brain

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/speculative"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// Policy is how the router picks a target among the routable candidates.
type Policy uint8

// Policies. Speculative is precise plus predicted placements: the blocks
// a target was just sent and has not announced yet count, weighted by how
// often that target's predictions were confirmed.
const (
	PolicyRoundRobin Policy = iota + 1
	PolicyLeastLoad
	PolicyApproximate
	PolicyPrecise
	PolicySpeculative
)

var policyNames = map[Policy]string{
	PolicyRoundRobin:  "round-robin",
	PolicyLeastLoad:   "least-load",
	PolicyApproximate: "approximate",
	PolicyPrecise:     "precise",
	PolicySpeculative: "speculative",
}

func (p Policy) String() string { return policyNames[p] }

// ReadsPrompt reports whether the policy routes on the prompt's blocks.
func (p Policy) ReadsPrompt() bool { return p == PolicyPrecise || p == PolicySpeculative }

// ParsePolicy accepts the names PolicyNames lists.
func ParsePolicy(s string) (Policy, error) {
	for p, n := range policyNames {
		if n == s {
			return p, nil
		}
	}
	names := PolicyNames()
	return 0, fmt.Errorf("unknown policy %q (want %s or %s)", s, strings.Join(names[:len(names)-1], ", "), names[len(names)-1])
}

// PolicyNames lists the accepted policy names.
func PolicyNames() []string {
	return []string{"round-robin", "least-load", "approximate", "precise", "speculative"}
}

// CostConfig weights the terms of the precise cost, all in prefill-token
// units (docs/architecture.md, "Decision rules"):
//
//	cost(t) = queued_uncached(t)
//	        + (prompt_tokens − cached_estimate(t)) × (1 + RecomputeWeight × (1 − spare))
//	        + DecodeWeight × running(t)
//	        + KVPressure × prompt_tokens × max(0, kv_usage(t) − KVThreshold) / (1 − KVThreshold)
//
// queued_uncached is the router's own count of uncached prompt tokens it has
// dispatched to t without a first byte yet, plus, when the pod's scraped
// queue is longer than the router's own (other routers, direct clients), the
// excess waiting requests at the mean uncached size seen recently. running is
// the larger of the scraped running gauge and the router's own decoding
// requests. cached_estimate is the tier-weighted confirmed run (plus trusted
// predicted blocks under the speculative policy) times the block size,
// counted only while t's event stream is trusted.
//
// spare is the fleet's capacity to spare (chooser.spareCapacity): 1 while
// some pod is idle, 0 once the least busy one has two prompts' worth of
// work. RecomputeWeight prices the prompt tokens a pod must compute as the
// spare capacity falls: each is work the requests queued behind it wait
// for, so a prefix computed again on a second pod costs the fleet, not
// only the request that moves (see preciseCost).
//
// ReuseWait weighs, under the speculative policy, a follower's reuse of the
// prefill its predicted blocks are queued for on their target while the
// fleet has capacity to spare (see preciseCost).
type CostConfig struct {
	DecodeWeight    float64
	KVThreshold     float64
	KVPressure      float64
	ReuseWait       float64
	RecomputeWeight float64
}

// DefaultCostConfig returns the defaults: a running sequence costs about as
// much as 32 prefill tokens per scheduling step it shares; a pod whose KV
// cache is above 90% full charges up to one extra prompt's worth (the request
// may wait for memory or evict someone's prefix); a follower waits for
// the prefill it reuses only as far as the fleet lacks spare capacity:
// while a pod is idle, siblings sent at one instant compute in parallel
// there, as precise would send them (docs/performance.md, "Followers
// beside an idle pod" and "Speculative against precise over twelve
// seeds": 0.5 caches more at an idle fan-out for up to 18% of its TTFT
// p90); and a
// prompt token to compute costs 17 once no pod has capacity to spare
// (docs/performance.md, "Recomputation on a busy fleet": 8 and 64 did
// worse on the llm-d ladder).
func DefaultCostConfig() CostConfig {
	return CostConfig{DecodeWeight: 32, KVThreshold: 0.9, KVPressure: 1, ReuseWait: 0, RecomputeWeight: 16}
}

// Validate reports every weight out of its range at once (joined), each
// naming the serve flag that sets it.
func (c CostConfig) Validate() error {
	var errs []error
	finite := func(flag string, v float64) {
		if !(v >= 0) || math.IsInf(v, 0) {
			errs = append(errs, fmt.Errorf("--%s %v must be a finite number, not negative", flag, v))
		}
	}
	fraction := func(flag string, v float64) {
		if !(v >= 0 && v <= 1) {
			errs = append(errs, fmt.Errorf("--%s %v must be within [0, 1]", flag, v))
		}
	}
	finite("decode-weight", c.DecodeWeight)
	fraction("kv-threshold", c.KVThreshold)
	finite("kv-pressure", c.KVPressure)
	fraction("reuse-wait", c.ReuseWait)
	finite("recompute-weight", c.RecomputeWeight)
	return errors.Join(errs...)
}

// LoadView is a candidate's load as the cost model saw it.
type LoadView struct {
	InFlight             int64   `json:"in_flight"`
	Prefilling           int64   `json:"prefilling"`
	QueuedUncachedTokens int64   `json:"queued_uncached_tokens"`
	Running              int     `json:"running"`
	Waiting              int     `json:"waiting"`
	KVUsage              float64 `json:"kv_cache_usage"`
	Stale                bool    `json:"scrape_stale"`
	// Events is the target's event-stream verdict (fresh, stale,
	// disconnected, replaying), which weights its confirmed run.
	Events string `json:"events"`
}

// Candidate is one target considered for a request.
type Candidate struct {
	Target   *health.Target
	Routable bool
	// ConfirmedBlocks is the run of prompt blocks from block 0 the index
	// says the target holds; Weighted is the same run weighted by tier.
	ConfirmedBlocks int
	Weighted        float64
	// SpeculativeBlocks extends the run with predicted placements
	// (speculative policy): blocks sent to the target and not announced
	// yet; PredictionWeight weighs them (speculative.Store.Trust: the
	// target's confirmation rate, 0 while its event stream is not fresh).
	SpeculativeBlocks int
	PredictionWeight  float64
	// Trust weights the confirmed run by the verdict on the target's event
	// stream (eventplane.Verdict.ConfirmedWeight).
	Trust float64
	// ApproxChunks is the approximate policy's matched prefix chunks.
	ApproxChunks int
	Cost         float64
	Load         LoadView
	excluded     bool
	// predicted refers to the predictions SpeculativeBlocks counted, for
	// the follower accounting; queuedPredicted is how many of them wait
	// for a prefill still queued on the target.
	predicted       speculative.Ref
	queuedPredicted int
}

// choice is the chooser's answer: a candidate and why.
type choice struct {
	idx    int // into candidates; -1: none
	reason string
}

// chooser holds policy state (round-robin position, approximate table).
type chooser struct {
	policy Policy
	cost   CostConfig
	rr     atomic.Uint64
	approx *approxTable
	// meanUncached is an EWMA of uncached tokens per dispatched request,
	// stored as float64 bits, used to size queues the router did not fill.
	meanUncached atomic.Uint64
	// tie draws a number in [0, n) to break cost ties: the process's
	// generator (safe for every request's goroutine), or a seeded one
	// for a caller deciding on one goroutine (Virtual).
	tie func(n int) int
}

func newChooser(p Policy, cost CostConfig) *chooser {
	c := &chooser{policy: p, cost: cost, tie: rand.IntN}
	if p == PolicyApproximate {
		c.approx = newApproxTable(defaultApproxCapacity)
	}
	c.meanUncached.Store(math.Float64bits(512))
	return c
}

func (c *chooser) observeUncached(n int) {
	old := math.Float64frombits(c.meanUncached.Load())
	c.meanUncached.Store(math.Float64bits(old*0.95 + float64(n)*0.05))
}

// loadOf is t's load as health knows it, with its event stream's verdict
// as the event plane judges it.
func loadOf(t *health.Target, v eventplane.Verdict) LoadView {
	b := t.Busy()
	return LoadView{
		InFlight: b.InFlight, Prefilling: b.Prefilling, QueuedUncachedTokens: b.QueuedUncachedTokens,
		Running: b.Running, Waiting: b.Waiting, KVUsage: b.KVUsage, Stale: b.Stale,
		Events: string(v),
	}
}

// queuedTokens is what the cost model counts as waiting ahead of a new
// request on the candidate, in prefill tokens: the router's own
// dispatched-but-unanswered uncached tokens and, when a fresh scrape shows
// more waiting requests than the router has in flight there, the excess at
// the mean uncached size seen recently.
func (c *chooser) queuedTokens(l LoadView) float64 {
	queued := float64(l.QueuedUncachedTokens)
	if !l.Stale {
		if extra := int64(l.Waiting) - l.Prefilling; extra > 0 {
			queued += float64(extra) * math.Float64frombits(c.meanUncached.Load())
		}
	}
	return queued
}

// runningOf is the candidate's decoding sequences: the router's own, or
// the fresh scrape's when it says more.
func (c *chooser) runningOf(l LoadView) float64 {
	running := float64(l.InFlight - l.Prefilling)
	if !l.Stale {
		running = math.Max(running, float64(l.Running))
	}
	return running
}

// spareCapacity says how far a second computation of a prefix would cost
// the fleet nothing, from 1 when some usable pod is idle down to 0 once the
// least busy one has two prompts' worth of work. A pod's work is its queued
// prefill and its decoding sequences in the cost's units: a pod that is
// decoding is not idle however short its queue is at this instant.
func (c *chooser) spareCapacity(cands []Candidate, usable []int, promptTokens int) float64 {
	if promptTokens <= 0 {
		return 1
	}
	least := math.Inf(1)
	for _, i := range usable {
		least = math.Min(least, c.queuedTokens(cands[i].Load)+c.cost.DecodeWeight*c.runningOf(cands[i].Load))
	}
	return 1 - math.Min(1, least/(2*float64(promptTokens)))
}

// preciseCost is the cost model of CostConfig for one candidate; spare is
// the fleet's spareCapacity.
func (c *chooser) preciseCost(cd *Candidate, promptTokens, blockSize int, spare float64) float64 {
	l := cd.Load
	queued := c.queuedTokens(l)
	running := c.runningOf(l)
	predicted := float64(cd.SpeculativeBlocks*blockSize) * cd.PredictionWeight
	// A follower of predictions waits on their target for the queued
	// prefill that computes them: its first token comes no sooner than if
	// it computed those blocks itself on an idle pod, and later by the
	// other followers' own prefill stacked with it. What it saves is the
	// capacity a second computation would spend. Under load that capacity
	// is what every later request waits for, and the queued prefill of
	// the follower's blocks is not charged to it (else a sibling arriving
	// during its prefix's prefill costs as much on the holder as on a busy
	// pod, 2,000 queued + 50 own against 2,050, and siblings scatter, each
	// pod computing the prefix again). While a pod is idle only ReuseWait
	// of it is taken off: the follower stays with the holder as long as it
	// waits there no more than that share of the reused prefill beyond
	// what the idle pod would take (docs/architecture.md, "Followers").
	// Only the blocks whose prefill is still queued are reused from the
	// queue: once their request has its first byte they are computed, and
	// what is queued on the target is other requests' work.
	reuse := c.cost.ReuseWait + (1-c.cost.ReuseWait)*(1-spare)
	queuedPredicted := float64(cd.queuedPredicted*blockSize) * cd.PredictionWeight
	queued -= reuse * math.Min(float64(l.QueuedUncachedTokens), queuedPredicted)
	cached := cd.Weighted*cd.Trust*float64(blockSize) + predicted
	cached = math.Min(cached, float64(promptTokens))
	// While no pod has capacity to spare, what the candidate must compute
	// delays every request queued behind it, and a prefix computed again
	// takes memory its holder would have shared: a shorter queue is not
	// worth a recomputation. (On the llm-d ladder, pricing recomputation
	// only by the request's own wait spread groups over the pods once
	// queues built, and cost output throughput; a price rising only with
	// the least busy pod's queue, 1 + backlog in prompts, did worse than
	// this one: docs/performance.md, "Recomputation on a busy fleet".)
	recompute := 1 + c.cost.RecomputeWeight*(1-spare)
	cost := queued + (float64(promptTokens)-cached)*recompute + c.cost.DecodeWeight*running
	if !l.Stale && l.KVUsage > c.cost.KVThreshold && c.cost.KVThreshold < 1 {
		cost += c.cost.KVPressure * float64(promptTokens) * (l.KVUsage - c.cost.KVThreshold) / (1 - c.cost.KVThreshold)
	}
	return cost
}

// cachedRun is the candidate's run the precise cost counted, in blocks:
// confirmed and trusted, plus trusted predictions.
func cachedRun(cd *Candidate) float64 {
	return cd.Weighted*cd.Trust + float64(cd.SpeculativeBlocks)*cd.PredictionWeight
}

// leastLoadCost counts requests: the router's own in flight, or the pod's
// running + waiting when a fresh scrape says it is busier.
func leastLoadCost(l LoadView) float64 {
	n := float64(l.InFlight)
	if !l.Stale {
		n = math.Max(n, float64(l.Running+l.Waiting))
	}
	return n
}

// choose scores the candidates and picks one among the routable, not
// excluded ones. peek leaves round-robin state untouched (dry run).
func (c *chooser) choose(cands []Candidate, promptTokens, blockSize int, peek bool) choice {
	var usable []int
	for i := range cands {
		if cands[i].Routable && !cands[i].excluded {
			usable = append(usable, i)
		}
	}
	if len(usable) == 0 {
		return choice{idx: -1, reason: "no routable target"}
	}
	switch c.policy {
	case PolicyRoundRobin:
		var n uint64
		if peek {
			n = c.rr.Load()
		} else {
			n = c.rr.Add(1) - 1
		}
		for _, i := range usable {
			cands[i].Cost = 0
		}
		return choice{idx: usable[n%uint64(len(usable))], reason: "round-robin"}
	case PolicyLeastLoad:
		for _, i := range usable {
			cands[i].Cost = leastLoadCost(cands[i].Load)
		}
		return choice{idx: c.minCost(cands, usable, nil), reason: "least load"}
	case PolicyApproximate:
		// Gateways' prefix-aware scoring: matched characters stand in for
		// cached tokens (about four characters a token), minus load.
		for _, i := range usable {
			cd := &cands[i]
			saved := float64(cd.ApproxChunks*approxChunkChars) / 4
			cd.Cost = c.cost.DecodeWeight*leastLoadCost(cd.Load) + math.Max(0, float64(promptTokens)-saved)
		}
		i := c.minCost(cands, usable, nil)
		if cands[i].ApproxChunks > 0 {
			return choice{idx: i, reason: fmt.Sprintf("approximate prefix match of %d chunks", cands[i].ApproxChunks)}
		}
		return choice{idx: i, reason: "no approximate prefix match; least load"}
	}
	spare := c.spareCapacity(cands, usable, promptTokens)
	for _, i := range usable {
		cands[i].Cost = c.preciseCost(&cands[i], promptTokens, blockSize, spare)
	}
	// At equal cost the longer cached run wins: the same wait, and the
	// fleet computes the prefix once.
	i := c.minCost(cands, usable, cachedRun)
	cd := &cands[i]
	predicted := cd.SpeculativeBlocks > 0 && cd.PredictionWeight > 0
	switch {
	case predicted:
		return choice{idx: i, reason: fmt.Sprintf("lowest cost; confirmed run of %d blocks and %d predicted (trust %.2f)",
			cd.ConfirmedBlocks, cd.SpeculativeBlocks, cd.PredictionWeight)}
	case cd.ConfirmedBlocks > 0 && cd.Trust > 0:
		return choice{idx: i, reason: fmt.Sprintf("lowest cost; confirmed run of %d blocks", cd.ConfirmedBlocks)}
	case blockSize == 0:
		return choice{idx: i, reason: "lowest cost; block keys not configured yet (load only)"}
	}
	return choice{idx: i, reason: "lowest cost; no cached prefix"}
}

// minCost returns the usable candidate with the lowest cost. Among equal
// costs, the highest prefer (when not nil) wins, and what is still tied
// breaks uniformly at random so equal pods share the work.
func (c *chooser) minCost(cands []Candidate, usable []int, prefer func(*Candidate) float64) int {
	better := func(i, best int) int {
		if d := cands[i].Cost - cands[best].Cost; d < -1e-9 {
			return 1
		} else if d > 1e-9 {
			return -1
		}
		if prefer != nil {
			if d := prefer(&cands[i]) - prefer(&cands[best]); d > 1e-9 {
				return 1
			} else if d < -1e-9 {
				return -1
			}
		}
		return 0
	}
	best, ties := -1, 0
	for _, i := range usable {
		if best < 0 {
			best, ties = i, 1
			continue
		}
		switch better(i, best) {
		case 1:
			best, ties = i, 1
		case 0:
			ties++
			if c.tie(ties) == 0 {
				best = i
			}
		}
	}
	return best
}

// matchInto copies index matches into the candidates by target.
func matchInto(cands []Candidate, matches []kvindex.Match) {
	for _, m := range matches {
		if i := candidateOf(cands, m.Target); i >= 0 {
			cands[i].ConfirmedBlocks = m.Blocks
			cands[i].Weighted = m.Weighted
		}
	}
}

// candidateOf is the index of the candidate for target id, or -1.
func candidateOf(cands []Candidate, id targetid.ID) int {
	return slices.IndexFunc(cands, func(c Candidate) bool { return c.Target.ID == id })
}
