package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"

	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/sim"
)

// Oracle is the policy that routes on the simulator's truth: the upper
// bound of what a router can do with perfect knowledge of every pod.
const Oracle = "oracle"

// oracle scores every rank of every pod with sim.OracleCosts,
// the precise policy's cost fed with the true cached prefix and queue
// (sim.Pod.Probe) instead of what events and scrapes let a router infer,
// and sends the request straight to the cheapest rank.
type oracle struct {
	fleet *sim.Fleet
	cost  brain.CostConfig
	mu    sync.Mutex
	rng   *rand.Rand
}

func newOracle(f *sim.Fleet, seed uint64) *oracle {
	return &oracle{fleet: f, cost: brain.DefaultCostConfig(), rng: rand.New(rand.NewPCG(seed, 0x6f7261636c65 /* "oracle" */))}
}

func (o *oracle) route(ctx context.Context, prompt string) (dest, error) {
	pods := o.fleet.Pods
	ids, err := pods[0].Encode(prompt) // every pod of a fleet tokenizes alike
	if err != nil {
		return dest{}, err
	}
	type cand struct{ pod, rank int }
	var (
		cands  []cand
		states []sim.RankState
	)
	for i, p := range pods {
		ranks, err := p.Probe(ctx, ids)
		if err != nil {
			return dest{}, fmt.Errorf("oracle: %w", err)
		}
		for r, st := range ranks {
			cands, states = append(cands, cand{pod: i, rank: r}), append(states, st)
		}
	}
	var best []cand
	bestCost := 0.0
	for i, cost := range sim.OracleCosts(nil, states, len(ids), o.cost.DecodeWeight, o.cost.RecomputeWeight) {
		switch {
		case len(best) == 0 || cost < bestCost:
			best, bestCost = append(best[:0], cands[i]), cost
		case cost == bestCost:
			best = append(best, cands[i])
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

func podName(i int) string { return "pod-" + strconv.Itoa(i) }
