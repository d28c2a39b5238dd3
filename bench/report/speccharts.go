package report

import "fmt"

// specOf returns the first policy of the run with predicted placements.
func (r *Results) specOf() (string, *Speculative) {
	for _, n := range r.Order {
		if p := r.Policies[n]; p != nil && p.Speculative != nil {
			return n, p.Speculative
		}
	}
	return "", nil
}

// funnelStages are the funnel's block stages, in order.
var funnelStages = []string{"inserted", "confirmed", "referenced", "followed"}

// specFunnel is the predicted blocks at each stage of the funnel.
func specFunnel(policy string, s *Speculative) chart {
	f := &s.Funnel
	vals := []float64{float64(f.Inserted), float64(f.Confirmed), float64(f.Referenced), float64(f.Followed)}
	colors := []string{"#9ccf9c", "#2ca02c", "#1f7a1f", "#0f4d0f"}
	return chart{ID: "speculative-funnel", Title: "Predicted placements: the funnel", Series: funnelStages,
		SVG: barChart("Predicted blocks at each stage of the funnel", "predicted blocks", funnelStages, colors, vals,
			func(v float64) string { return fmt.Sprintf("%.0f", v) }),
		Caption: fmt.Sprintf("Blocks %s predicted on the pod it routed to (inserted), those a KV event then confirmed before their deadline, "+
			"those a later request's lookup found pending (referenced), and those a request was routed on (followed): %d routes, "+
			"which the pods answered with %d cached tokens; %d routes were false-warm (their prediction expired unconfirmed or was withdrawn).",
			policy, f.FollowerRoutes, f.FollowerCachedTokens, s.FalseWarm.Routes)}
}

// specHoldback compares the arms' server-reported cached tokens per
// request.
func specHoldback(policy string, s *Speculative) chart {
	var names, colors []string
	var vals []float64
	for _, a := range s.Arms {
		names = append(names, a.Arm)
		c := "#2ca02c"
		if a.Arm != "speculative" {
			c = "#8c8c8c"
		}
		colors = append(colors, c)
		v := 0.0
		if a.CachedPerRequest != nil {
			v = *a.CachedPerRequest
		}
		vals = append(vals, v)
	}
	inc := "not measured (an arm has no request whose usage the pod reported)"
	if t := s.IncrementalText(); t != "" {
		inc = t + " over the speculative arm's requests"
	}
	return chart{ID: "speculative-holdback", Title: "Holdback comparison", Series: names,
		SVG: barChart("Cached tokens per request, by arm", "cached tokens per request", names, colors, vals,
			func(v float64) string { return fmt.Sprintf("%.0f", v) }),
		Caption: fmt.Sprintf("%s routes %.0f%% of conversations without predictions (the holdback); each bar is the arm's server-reported "+
			"cached tokens per request. The difference at equal volume is the benefit of predictions: %s.", policy, 100*s.HoldbackFraction, inc)}
}
