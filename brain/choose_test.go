package brain

import (
	"cmp"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/targetid"
)

func cand(name string, confirmed int, verdict eventplane.Verdict, l LoadView) Candidate {
	return Candidate{
		Target:          &health.Target{ID: targetid.ID{Endpoint: name}},
		Routable:        true,
		ConfirmedBlocks: confirmed, Weighted: float64(confirmed),
		Trust: verdict.ConfirmedWeight(),
		Load:  l,
	}
}

// planeWithIndex is an event plane that is not run, for tests that fill
// its index by hand.
func planeWithIndex(t testing.TB) (*eventplane.Plane, *kvindex.Index) {
	t.Helper()
	ev, err := eventplane.New(eventplane.Config{}, eventplane.Deps{Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	return ev, ev.Index()
}

// TestPreciseCost pins the cost model of docs/architecture.md on small
// fleets where the right answer is clear.
// predictedCand gives c a predicted run of blocks weighted by trust.
// predictedCand is c with blocks predicted (at trust) by requests still
// waiting for their prefill there.
func predictedCand(c Candidate, blocks int, trust float64) Candidate {
	c.SpeculativeBlocks, c.PredictionWeight, c.queuedPredicted = blocks, trust, blocks
	return c
}

func TestPreciseCost(t *testing.T) {
	idle := LoadView{}
	cases := []struct {
		name   string
		cands  []Candidate
		prompt int
		want   string
	}{
		{"longest confirmed run wins when idle", []Candidate{
			cand("a", 2, eventplane.VerdictFresh, idle), cand("b", 10, eventplane.VerdictFresh, idle), cand("c", 0, eventplane.VerdictFresh, idle)},
			1000, "b"},
		{"a replaying stream still counts", []Candidate{
			cand("a", 2, eventplane.VerdictFresh, idle), cand("b", 10, eventplane.VerdictReplaying, idle)},
			1000, "b"},
		{"a disconnected stream does not count", []Candidate{
			cand("a", 2, eventplane.VerdictFresh, idle), cand("b", 10, eventplane.VerdictDisconnected, idle)},
			1000, "a"},
		{"the holder's queue outweighs its hit", []Candidate{
			cand("a", 0, eventplane.VerdictFresh, idle),
			cand("b", 40, eventplane.VerdictFresh, LoadView{InFlight: 3, Prefilling: 3, QueuedUncachedTokens: 5000})},
			1000, "a"},
		{"a small queue does not", []Candidate{
			cand("a", 0, eventplane.VerdictFresh, idle),
			cand("b", 40, eventplane.VerdictFresh, LoadView{InFlight: 1, Prefilling: 1, QueuedUncachedTokens: 100})},
			1000, "b"},
		{"scraped waiting requests count when fresh", []Candidate{
			cand("a", 0, eventplane.VerdictFresh, LoadView{Waiting: 10}),
			cand("b", 0, eventplane.VerdictFresh, idle)},
			100, "b"},
		{"stale scrapes are ignored", []Candidate{
			cand("a", 0, eventplane.VerdictFresh, LoadView{Waiting: 10, Running: 50, Stale: true}),
			cand("b", 0, eventplane.VerdictFresh, LoadView{InFlight: 1})},
			100, "a"},
		{"on a busy fleet a follower is not charged the queued prefill of its predicted blocks", []Candidate{
			cand("a", 0, eventplane.VerdictFresh, LoadView{InFlight: 1, Prefilling: 1, QueuedUncachedTokens: 2500}),
			predictedCand(cand("b", 0, eventplane.VerdictFresh, LoadView{InFlight: 2, Prefilling: 2, QueuedUncachedTokens: 2100}), 125, 0.8)},
			2050, "b"},
		{"but the rest of the holder's queue is", []Candidate{
			cand("a", 0, eventplane.VerdictFresh, LoadView{InFlight: 1, Prefilling: 1, QueuedUncachedTokens: 2500}),
			predictedCand(cand("b", 0, eventplane.VerdictFresh, LoadView{InFlight: 4, Prefilling: 4, QueuedUncachedTokens: 8000}), 125, 0.8)},
			2050, "a"},
		{"at equal cost the longer cached run wins", []Candidate{
			cand("a", 0, eventplane.VerdictFresh, idle),
			predictedCand(cand("b", 0, eventplane.VerdictFresh, LoadView{InFlight: 1, Prefilling: 1, QueuedUncachedTokens: 2000}), 125, 1)},
			2050, "b"},
		{"a nearly full KV cache costs", []Candidate{
			cand("a", 4, eventplane.VerdictFresh, LoadView{KVUsage: 0.99}),
			cand("b", 0, eventplane.VerdictFresh, LoadView{KVUsage: 0.2})},
			1000, "b"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// The speculative policy: its cost is precise's, and it weighs
			// the predicted cases' discount by the spare capacity. The
			// recompute price is left out here (TestRecomputeWeight).
			cost := DefaultCostConfig()
			cost.RecomputeWeight = 0
			ch := newChooser(PolicySpeculative, cost)
			d := ch.choose(c.cands, c.prompt, 16, false)
			if d.idx < 0 || c.cands[d.idx].Target.ID.Endpoint != c.want {
				for _, cd := range c.cands {
					t.Logf("%s cost %.1f", cd.Target.ID.Endpoint, cd.Cost)
				}
				t.Fatalf("chose %d, want %s", d.idx, c.want)
			}
		})
	}
}

// TestReuseWait: beside an idle pod, a follower stays on the holder still
// computing its prefix only while the extra wait there (the other
// followers' own prefill stacked with it) is at most --reuse-wait of the
// prefill it reuses; on a busy fleet it always stays.
func TestReuseWait(t *testing.T) {
	holder := func(queued int64) Candidate {
		return predictedCand(cand("holder", 0, eventplane.VerdictFresh, LoadView{InFlight: 2, Prefilling: 2, QueuedUncachedTokens: queued}), 125, 1)
	}
	idle := cand("idle", 0, eventplane.VerdictFresh, LoadView{})
	busy := cand("busy", 0, eventplane.VerdictFresh, LoadView{InFlight: 2, Prefilling: 2, QueuedUncachedTokens: 4100})
	computed := func(c Candidate) Candidate {
		c.queuedPredicted = 0
		return c
	}
	cases := []struct {
		name  string
		wait  float64
		cands []Candidate
		want  string
	}{
		// 2,000 reused tokens queued, 50 × 2 of other followers' suffixes.
		{"never wait: the idle pod computes the prefix again", 0, []Candidate{idle, holder(2100)}, "idle"},
		{"a wait of 100 is within half of 2,000", 0.5, []Candidate{idle, holder(2100)}, "holder"},
		{"a wait of 1,100 is not", 0.5, []Candidate{idle, holder(3100)}, "idle"},
		{"always wait", 1, []Candidate{idle, holder(3100)}, "holder"},
		{"no pod idle: stay whatever the setting", 0, []Candidate{busy, holder(3100)}, "holder"},
		// The same predictions once their request had its first byte:
		// the prefix is computed and the 2,100 queued tokens are other
		// requests' prefill, which a follower waits for like any other.
		{"computed predictions reuse no queue", 1, []Candidate{idle, computed(holder(2100))}, "idle"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cost := DefaultCostConfig()
			cost.ReuseWait = c.wait
			d := newChooser(PolicySpeculative, cost).choose(c.cands, 2050, 16, false)
			if got := c.cands[d.idx].Target.ID.Endpoint; got != c.want {
				for _, cd := range c.cands {
					t.Logf("%s cost %.1f", cd.Target.ID.Endpoint, cd.Cost)
				}
				t.Fatalf("chose %s, want %s", got, c.want)
			}
		})
	}
}

// TestRecomputeWeight: a prompt token a pod must compute costs 1 +
// weight × (1 − spare): once every pod is busy, a request stays with the
// pod holding its prefix although a shorter queue is elsewhere, since a
// prefix computed again is work the queued requests wait for; an idle pod
// takes it at the plain price. 7,200-token prompts, 6,000 of them cached
// on the holder.
func TestRecomputeWeight(t *testing.T) {
	busy := func(name string, blocks int, queued int64) Candidate {
		return cand(name, blocks, eventplane.VerdictFresh, LoadView{InFlight: 8, Prefilling: 8, QueuedUncachedTokens: queued})
	}
	holder, elsewhere := busy("holder", 375, 20000), busy("elsewhere", 0, 10000)
	idle := cand("idle", 0, eventplane.VerdictFresh, LoadView{})
	// 100,000 tokens apart, no capacity to spare: a token costs 1 + 8 or
	// 1 + 16, and 6,000 recomputed tokens are worth 48,000 or 96,000 of
	// queue.
	far, farther := busy("holder", 375, 300000), busy("elsewhere", 0, 200000)
	cases := []struct {
		name   string
		weight float64
		cands  []Candidate
		want   string
		prompt int // 0: 7,200
	}{
		{"weight 0: the shorter queue wins", 0, []Candidate{holder, elsewhere}, "elsewhere", 0},
		{"1.4 prompts' work everywhere keeps the group on its holder", 16, []Candidate{holder, elsewhere}, "holder", 0},
		{"an idle pod takes it whatever the weight", 16, []Candidate{holder, elsewhere, idle}, "idle", 0},
		{"a far longer queue still loses", 16, []Candidate{busy("holder", 375, 200000), elsewhere}, "elsewhere", 0},
		{"at 8, 100,000 tokens of queue outweigh the recomputation", 8, []Candidate{far, farther}, "elsewhere", 0},
		{"at 16, they do not", 16, []Candidate{far, farther}, "holder", 0},
		// A 2,050-token follower of 1,600 trusted predicted tokens on a
		// holder with 8,000 queued, against a pod with 2,500: priced by
		// its own wait it goes to the shorter queue (TestPreciseCost); on
		// a fleet this busy the default keeps it with the holder.
		{"the default keeps a follower on its busy holder", DefaultCostConfig().RecomputeWeight, []Candidate{
			cand("other", 0, eventplane.VerdictFresh, LoadView{InFlight: 1, Prefilling: 1, QueuedUncachedTokens: 2500}),
			predictedCand(cand("holder", 0, eventplane.VerdictFresh, LoadView{InFlight: 4, Prefilling: 4, QueuedUncachedTokens: 8000}), 125, 0.8)},
			"holder", 2050},
	}
	for _, c := range cases {
		for _, policy := range []Policy{PolicyPrecise, PolicySpeculative} {
			t.Run(c.name+"/"+policy.String(), func(t *testing.T) {
				cost := DefaultCostConfig()
				cost.RecomputeWeight = c.weight
				cands := slices.Clone(c.cands)
				prompt := cmp.Or(c.prompt, 7200)
				d := newChooser(policy, cost).choose(cands, prompt, 16, false)
				if got := cands[d.idx].Target.ID.Endpoint; got != c.want {
					for _, cd := range cands {
						t.Logf("%s cost %.1f", cd.Target.ID.Endpoint, cd.Cost)
					}
					t.Fatalf("chose %s, want %s", got, c.want)
				}
			})
		}
	}
}

func TestPoliciesAndTies(t *testing.T) {
	mk := func() []Candidate {
		return []Candidate{cand("a", 0, eventplane.VerdictFresh, LoadView{}), cand("b", 0, eventplane.VerdictFresh, LoadView{}), cand("c", 0, eventplane.VerdictFresh, LoadView{})}
	}
	// Round-robin cycles; a dry run (peek) does not advance it.
	rr := newChooser(PolicyRoundRobin, DefaultCostConfig())
	var got []int
	for i := 0; i < 4; i++ {
		peek := rr.choose(mk(), 10, 16, true).idx
		real := rr.choose(mk(), 10, 16, false).idx
		if peek != real {
			t.Fatalf("dry run said %d, the request went to %d", peek, real)
		}
		got = append(got, real)
	}
	if got[0] != 0 || got[1] != 1 || got[2] != 2 || got[3] != 0 {
		t.Fatalf("round-robin order %v", got)
	}
	// Least load, and excluded or unroutable candidates are never chosen.
	ll := newChooser(PolicyLeastLoad, DefaultCostConfig())
	cs := mk()
	cs[0].Load.InFlight, cs[1].Load.InFlight, cs[2].Load.InFlight = 3, 1, 0
	cs[2].Routable = false
	if d := ll.choose(cs, 10, 16, false); d.idx != 1 {
		t.Fatalf("least-load chose %d", d.idx)
	}
	cs[1].excluded = true
	if d := ll.choose(cs, 10, 16, false); d.idx != 0 {
		t.Fatalf("least-load with exclusions chose %d", d.idx)
	}
	cs[0].excluded = true
	if d := ll.choose(cs, 10, 16, false); d.idx != -1 {
		t.Fatalf("nothing routable but chose %d", d.idx)
	}
	// Equal costs spread over every candidate.
	seen := map[int]bool{}
	pr := newChooser(PolicyPrecise, DefaultCostConfig())
	for i := 0; i < 200 && len(seen) < 3; i++ {
		seen[pr.choose(mk(), 10, 16, false).idx] = true
	}
	if len(seen) != 3 {
		t.Fatalf("ties did not spread: %v", seen)
	}
}

// TestApproximatePolicy: the character-chunk table sends a repeated prefix
// back where it went and forgets a removed target.
func TestApproximatePolicy(t *testing.T) {
	ch := newChooser(PolicyApproximate, DefaultCostConfig())
	text := make([]byte, 64*20)
	for i := range text {
		text[i] = byte('a' + i%26)
	}
	chunks := approxChunks(nil, text)
	if len(chunks) != 20 {
		t.Fatalf("%d chunks", len(chunks))
	}
	cs := []Candidate{cand("a", 0, eventplane.VerdictFresh, LoadView{}), cand("b", 0, eventplane.VerdictFresh, LoadView{})}
	ch.approx.record(cs[1].Target.ID, chunks[:12])
	ch.approx.match(cs, chunks)
	if cs[0].ApproxChunks != 0 || cs[1].ApproxChunks != 12 {
		t.Fatalf("matches %d %d", cs[0].ApproxChunks, cs[1].ApproxChunks)
	}
	if d := ch.choose(cs, 320, 16, false); d.idx != 1 {
		t.Fatalf("approximate chose %d", d.idx)
	}
	ch.approx.forget(cs[1].Target.ID)
	ch.approx.match(cs, chunks)
	if cs[1].ApproxChunks != 0 {
		t.Fatal("forgotten target still matches")
	}
	// Capacity bounds the table.
	small := newApproxTable(8)
	small.record(cs[0].Target.ID, chunks)
	if len(small.m) > 8 {
		t.Fatalf("table holds %d hashes, capacity 8", len(small.m))
	}
}

// TestSettled: reading a prompt stops early only when the cheapest
// candidate is strictly cheapest and no other routable candidate still
// holds every block read, so more blocks could only help the winner.
func TestSettled(t *testing.T) {
	keys := make([]kvindex.Key, 8)
	for i := range keys {
		keys[i] = kvindex.Key(1000 + i)
	}
	queued := LoadView{InFlight: 3, Prefilling: 3, QueuedUncachedTokens: 5000}
	cases := []struct {
		name string
		held map[string]int // target: blocks of keys it holds from block 0
		load map[string]LoadView
		down string // not routable
		dead string // events disconnected: its run counts nothing
		want bool
	}{
		{"one holder, idle", map[string]int{"a": 8, "b": 3}, nil, "", "", true},
		{"two holders may both grow", map[string]int{"a": 8, "b": 8}, nil, "", "", false},
		{"the other holder cannot take the request", map[string]int{"a": 8, "b": 8}, nil, "b", "", true},
		{"the holder is not cheapest yet", map[string]int{"a": 8}, map[string]LoadView{"a": queued}, "", "", false},
		{"a tie is not settled", map[string]int{"a": 8}, nil, "", "a", false},
		{"nobody holds it", map[string]int{"b": 2}, nil, "", "", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ev, ix := planeWithIndex(t)
			d := &Decision{blockSize: 16, chain: kvindex.KeyChain{Keys: keys}}
			for _, name := range []string{"a", "b", "c"} {
				verdict := eventplane.VerdictFresh
				if name == c.dead {
					verdict = eventplane.VerdictDisconnected
				}
				cd := cand(name, 0, verdict, c.load[name])
				cd.Weighted = 0
				cd.Routable = name != c.down
				d.cands = append(d.cands, cd)
				ix.AddTarget(cd.Target.ID)
				ix.Store(cd.Target.ID, kvindex.TierGPU, keys[:c.held[name]])
			}
			var reach kvindex.Reach
			ix.Extend(&reach, keys)
			dc := &Decider{policy: PolicyPrecise, plane: ev, ch: newChooser(PolicyPrecise, DefaultCostConfig())}
			if got, _ := dc.settles(d, &reach, 1000); got != c.want {
				for _, cd := range d.cands {
					t.Logf("%s run %d cost %.1f", cd.Target.ID.Endpoint, cd.ConfirmedBlocks, cd.Cost)
				}
				t.Fatalf("settled %v, want %v", got, c.want)
			}
		})
	}
}

// TestSettlingKeepsTheDecision: over random fleets — runs of random length
// in random tiers, random loads, stale and disconnected event streams,
// targets that cannot take requests — reading a prompt a random chunk at a
// time and stopping where readUntilDecided would stop chooses the target
// that looking up the whole prompt chooses.
func TestSettlingKeepsTheDecision(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 6))
	const blocks, count = 64, 64 * 16
	keys := make([]kvindex.Key, blocks)
	for i := range keys {
		keys[i] = kvindex.Key(5000 + i)
	}
	verdicts := []eventplane.Verdict{eventplane.VerdictFresh, eventplane.VerdictFresh, eventplane.VerdictStale, eventplane.VerdictDisconnected}
	settledEarly := 0
	for trial := range 2000 {
		ev, ix := planeWithIndex(t)
		var cands []Candidate
		for i := range 2 + rng.IntN(4) {
			cd := cand(fmt.Sprintf("t%d", i), 0, verdicts[rng.IntN(len(verdicts))], LoadView{
				InFlight: 3, Prefilling: 3, QueuedUncachedTokens: int64(rng.IntN(3 * count)),
			})
			cd.Weighted = 0
			cd.Routable = rng.IntN(6) > 0
			cands = append(cands, cd)
			ix.AddTarget(cd.Target.ID)
			run := rng.IntN(blocks + 1)
			for b := 0; b < run; {
				n := min(run-b, 1+rng.IntN(16))
				ix.Store(cd.Target.ID, kvindex.Tier(rng.IntN(3)), keys[b:b+n])
				b += n
			}
		}
		dc := &Decider{policy: PolicyPrecise, plane: ev, ch: newChooser(PolicyPrecise, DefaultCostConfig())}

		// The whole prompt looked up.
		whole := slices.Clone(cands)
		matchInto(whole, ix.Lookup(nil, keys))
		want := dc.ch.choose(whole, count, 16, true)
		if ties(whole, want.idx) {
			continue // a random tie-break: either answer is right
		}

		// Read a chunk at a time, as readUntilDecided does.
		d := &Decision{blockSize: 16, cands: slices.Clone(cands)}
		var reach kvindex.Reach
		for n := 0; n < blocks; {
			next := min(blocks, n+1+rng.IntN(12))
			d.chain.Keys = keys[:next]
			alive := ix.Extend(&reach, keys[n:next])
			n = next
			if !alive {
				break
			}
			if done, _ := dc.settles(d, &reach, count); n < blocks && done {
				settledEarly++
				break
			}
		}
		matchInto(d.cands, ix.Lookup(nil, d.chain.Keys))
		got := dc.ch.choose(d.cands, count, 16, true)
		if got.idx != want.idx {
			for i := range whole {
				t.Logf("%s: routable %v trust %.1f, whole run %d cost %.0f; read %d blocks, run %d cost %.0f", whole[i].Target.ID.Endpoint,
					whole[i].Routable, whole[i].Trust, whole[i].ConfirmedBlocks, whole[i].Cost, len(d.chain.Keys), d.cands[i].ConfirmedBlocks, d.cands[i].Cost)
			}
			t.Fatalf("trial %d: reading until settled chose %d, the whole prompt %d", trial, got.idx, want.idx)
		}
	}
	t.Logf("settled early in %d trials", settledEarly)
	if settledEarly < 100 {
		t.Fatalf("only %d of 2000 trials settled before the end: the test does not exercise settling", settledEarly)
	}
}

// ties reports whether another usable candidate costs the same as the
// chosen one.
func ties(cands []Candidate, idx int) bool {
	for i := range cands {
		if i != idx && cands[i].Routable && math.Abs(cands[i].Cost-cands[idx].Cost) <= 1e-9 {
			return true
		}
	}
	return false
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
