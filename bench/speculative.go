package bench

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/prefixrouter/prefixrouter/bench/report"
	"github.com/prefixrouter/prefixrouter/speculative"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// speculativeSummary reads the router's predicted placements once the
// run's cohorts have matured (waiting at most settle, wall time), so that
// the rates cover the whole run; nil when the router has none (any policy
// but speculative). Times become model seconds.
func (fr *fleetRun) speculativeSummary(ctx context.Context, settle time.Duration) *report.Speculative {
	if fr.router == nil {
		return nil
	}
	v, ok := fr.router.SpeculativeView()
	if !ok {
		return nil
	}
	deadline := time.Now().Add(settle)
	for !settled(&v) && time.Now().Before(deadline) && sleepCtx(ctx, 200*time.Millisecond) {
		v, _ = fr.router.SpeculativeView()
	}
	return summarizeSpeculative(&v, fr.fleet.Config().TimeScale, fr.podOfTarget)
}

// settled reports that no prediction is live and every cohort has matured.
func settled(v *speculative.View) bool {
	p := v.Overall.Pending
	return p.Live == 0 && p.Cohorts == 0
}

// summarizeSpeculative is the report's part of the view; scale turns the
// router's wall seconds into model seconds, pod names a target.
func summarizeSpeculative(v *speculative.View, scale float64, pod func(targetid.ID) string) *report.Speculative {
	o := &v.Overall
	m := o.MatureTotal
	s := &report.Speculative{
		Settled: settled(v), Immature: o.Pending.Inserted,
		Funnel: report.SpecFunnel{Inserted: o.Funnel.Inserted, Confirmed: o.Funnel.Confirmed, ConfirmedLate: o.Funnel.ConfirmedLate,
			Referenced: o.Funnel.Referenced, Followed: o.Funnel.Followed, FollowerRoutes: o.Funnel.FollowerRoutes,
			FollowerCachedTokens: o.Funnel.FollowerCachedTokens},
		Mature: report.SpecMature{Inserted: m.Inserted, Confirmed: m.Confirmed, ExpiredEarly: m.ExpiredEarly, ExpiredStale: m.ExpiredStale,
			Invalidated: m.Invalidated, Withdrawn: m.Withdrawn, Unknown: m.Unknown,
			BlockRate: m.Rates.Block, RequestRate: m.Rates.Request, TokenRate: m.Rates.Token},
		ConfirmationS:    modelLatency(o.Latency.Confirmed, scale),
		LateS:            modelLatency(o.Latency.Late, scale),
		FalseWarm:        report.SpecFalseWarm{Routes: o.FalseWarm.Routes, Tokens: o.FalseWarm.Tokens},
		HoldbackFraction: v.Holdback.Fraction,
	}
	for _, t := range v.Targets {
		s.Pods = append(s.Pods, report.SpecPod{Pod: pod(targetid.ID{Endpoint: t.Endpoint, Rank: t.Rank}), TTLS: t.TTL.S * scale,
			TTLWhy: t.TTL.Why, Trust: t.Trust.Value, BlockRate: t.Mature.Rates.Block})
	}
	for _, mv := range v.Holdback.Models {
		for _, a := range mv.Arms {
			s.Arms = append(s.Arms, report.SpecArm{Arm: a.Arm, Requests: a.Requests, ReportedRequests: a.ReportedRequests,
				PromptTokens: a.PromptTokens, CachedTokens: a.CachedTokens, CachedPerRequest: a.CachedPerRequest,
				TTFTP50: scaled(a.TTFTP50, scale), TTFTP90: scaled(a.TTFTP90, scale)})
		}
		if mv.Incremental != nil {
			inc := *mv.Incremental
			if s.IncrementalCachedTokens != nil {
				inc += *s.IncrementalCachedTokens
			}
			s.IncrementalCachedTokens = &inc
		}
		if mv.IncrementalStdErr != nil {
			// The models' arms are apart: their variances add, and the
			// fewest groups bound the draws.
			se := *mv.IncrementalStdErr
			groups := mv.IncrementalGroups
			if s.IncrementalStdErr != nil {
				se = math.Hypot(se, *s.IncrementalStdErr)
				groups = min(groups, s.IncrementalGroups)
			}
			s.IncrementalStdErr, s.IncrementalGroups = &se, groups
		}
	}
	return s
}

func modelLatency(p speculative.Percentiles, scale float64) report.SpecLatency {
	return report.SpecLatency{Samples: p.Samples, P50: scaled(p.P50, scale), P95: scaled(p.P95, scale), P99: scaled(p.P99, scale)}
}

func scaled(v *float64, scale float64) *float64 {
	if v == nil {
		return nil
	}
	s := *v * scale
	return &s
}

// speculativeNote is the terminal's and the report's line on a
// speculative run.
func speculativeNote(policy string, s *report.Speculative) string {
	var b strings.Builder
	f, m := &s.Funnel, &s.Mature
	fmt.Fprintf(&b, "%s: %d blocks predicted, %d confirmed by their event (%d late); mature block confirmation %s, token %s",
		policy, f.Inserted, f.Confirmed, f.ConfirmedLate, ratePct(m.BlockRate), ratePct(m.TokenRate))
	if !s.Settled {
		fmt.Fprintf(&b, " (%d predictions not mature yet, left out)", s.Immature)
	}
	fmt.Fprintf(&b, "; %d routes on predictions (%d cached tokens reported); %d false-warm (%d prefill tokens)",
		f.FollowerRoutes, f.FollowerCachedTokens, s.FalseWarm.Routes, s.FalseWarm.Tokens)
	if len(s.Pods) > 0 {
		lo, hi := s.Pods[0].TTLS, s.Pods[0].TTLS
		for _, p := range s.Pods {
			lo, hi = min(lo, p.TTLS), max(hi, p.TTLS)
		}
		if lo == hi {
			fmt.Fprintf(&b, "; TTL %s", report.Seconds(lo))
		} else {
			fmt.Fprintf(&b, "; TTL %s to %s", report.Seconds(lo), report.Seconds(hi))
		}
	}
	for _, a := range s.Arms {
		fmt.Fprintf(&b, "; %s arm %d requests, %s cached tokens each", a.Arm, a.Requests, perRequest(a.CachedPerRequest))
	}
	if inc := s.IncrementalText(); inc != "" {
		fmt.Fprintf(&b, "; incremental reuse %s", inc)
	}
	return b.String()
}

func ratePct(r *float64) string {
	if r == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.1f%%", 100**r)
}

func perRequest(v *float64) string {
	if v == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.0f", *v)
}
