package des

import (
	"fmt"
	"math/rand/v2"

	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/sim"
)

// oracleRouter sends each request to the pod whose true state
// (sim.Rank.State) scores cheapest by sim.OracleCosts, as the live
// engine's oracle does with sim.Pod.Probe; ties break at random.
type oracleRouter struct {
	cost   brain.CostConfig
	rng    *rand.Rand
	best   []int
	states []sim.RankState
	costs  []float64
}

func (o *oracleRouter) route(pods []*pod, ids []uint32) (int, error) {
	o.states = o.states[:0]
	for _, p := range pods {
		st, err := p.rank.State(ids)
		if err != nil {
			return 0, fmt.Errorf("oracle: %w", err)
		}
		o.states = append(o.states, st)
	}
	o.costs = sim.OracleCosts(o.costs[:0], o.states, len(ids), o.cost.DecodeWeight, o.cost.RecomputeWeight)
	o.best = o.best[:0]
	bestCost := 0.0
	for i, c := range o.costs {
		switch {
		case len(o.best) == 0 || c < bestCost:
			o.best, bestCost = append(o.best[:0], i), c
		case c == bestCost:
			o.best = append(o.best, i)
		}
	}
	return o.best[o.rng.IntN(len(o.best))], nil
}
