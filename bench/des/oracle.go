package des

import (
	"fmt"
	"math/rand/v2"

	"github.com/prefixrouter/prefixrouter/router"
)

// oracleRouter sends each request to the pod whose true state
// (sim.Rank.State) scores cheapest by sim.RankState.OracleCost, as the
// live engine's oracle does with sim.Pod.Probe; ties break at random.
type oracleRouter struct {
	cost router.CostConfig
	rng  *rand.Rand
	best []int
}

func (o *oracleRouter) route(pods []*pod, ids []uint32) (int, error) {
	o.best = o.best[:0]
	bestCost := 0.0
	for i, p := range pods {
		st, err := p.rank.State(ids)
		if err != nil {
			return 0, fmt.Errorf("oracle: %w", err)
		}
		c := st.OracleCost(len(ids), o.cost.DecodeWeight)
		switch {
		case len(o.best) == 0 || c < bestCost:
			o.best, bestCost = append(o.best[:0], i), c
		case c == bestCost:
			o.best = append(o.best, i)
		}
	}
	return o.best[o.rng.IntN(len(o.best))], nil
}
