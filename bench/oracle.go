package bench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"

	"github.com/prefixrouter/prefixrouter/bench/sim"
	"github.com/prefixrouter/prefixrouter/router"
)

// Oracle is the policy that routes on the simulator's truth: the upper
// bound of what a router can do with perfect knowledge of every pod.
const Oracle = "oracle"

// oracle scores every rank of every pod with the precise policy's cost
// (router.CostConfig), fed with the true cached prefix and queue
// (sim.Pod.Probe) instead of what events and scrapes let a router infer,
// and sends the request straight to the cheapest rank. It leaves out the
// KV-pressure term: that term is the router's guess that a full cache
// makes a request wait for memory, and the oracle sees those waits in the
// true queue (requests waiting for blocks are waiting requests). And it
// counts uncached tokens twice (missWeight): a miss costs its prefill now
// and, by pushing a prefix out, a later request's prefill. With the
// precise policy's weight of one, the greedy choice tips under load into
// spreading every group over every pod and does not come back (measured:
// docs/performance.md).
type oracle struct {
	fleet *sim.Fleet
	cost  router.CostConfig
	mu    sync.Mutex
	rng   *rand.Rand
}

// missWeight is what an uncached prompt token costs the oracle.
const missWeight = 2

func newOracle(f *sim.Fleet, seed uint64) *oracle {
	return &oracle{fleet: f, cost: router.DefaultCostConfig(), rng: rand.New(rand.NewPCG(seed, 0x6f7261636c65 /* "oracle" */))}
}

func (o *oracle) route(ctx context.Context, prompt string) (dest, error) {
	pods := o.fleet.Pods
	ids, err := pods[0].Encode(prompt) // every pod of a fleet tokenizes alike
	if err != nil {
		return dest{}, err
	}
	type cand struct {
		pod, rank int
		cost      float64
	}
	var best []cand
	for i, p := range pods {
		ranks, err := p.Probe(ctx, ids)
		if err != nil {
			return dest{}, fmt.Errorf("oracle: %w", err)
		}
		for r, st := range ranks {
			c := cand{pod: i, rank: r, cost: o.score(st, len(ids))}
			switch {
			case len(best) == 0 || c.cost < best[0].cost:
				best = append(best[:0], c)
			case c.cost == best[0].cost:
				best = append(best, c)
			}
		}
	}
	o.mu.Lock()
	c := best[o.rng.IntN(len(best))] // ties break at random, as the router's do
	o.mu.Unlock()
	return dest{
		url:    pods[c.pod].URL() + "/v1/completions",
		header: map[string]string{"X-data-parallel-rank": strconv.Itoa(c.rank)},
		pod:    podName(c.pod),
	}, nil
}

// score is router.CostConfig's cost with true inputs, in prefill tokens.
func (o *oracle) score(st sim.RankState, promptTokens int) float64 {
	cost := float64(st.QueuedPrefillTokens) + missWeight*float64(promptTokens-min(st.CachedTokens, promptTokens)) +
		o.cost.DecodeWeight*float64(st.Running)
	return math.Max(cost, 0)
}

func podName(i int) string { return "pod-" + strconv.Itoa(i) }
