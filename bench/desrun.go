package bench

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prefixrouter/prefixrouter/bench/des"
	"github.com/prefixrouter/prefixrouter/bench/report"
	"github.com/prefixrouter/prefixrouter/bench/workload"
	"github.com/prefixrouter/prefixrouter/sim"
)

// EngineDES is the discrete-event engine (package des).
const EngineDES = "des"

// ParseEngine reads --engine.
func ParseEngine(s string) (string, error) {
	switch s {
	case "", EngineLive:
		return EngineLive, nil
	case EngineDES:
		return EngineDES, nil
	}
	return "", fmt.Errorf("unknown engine %q (want live or des)", s)
}

// ParseRouters reads --routers: replica counts, comma-separated, each
// positive, e.g. "1" or "1,2,4".
func ParseRouters(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 || n > 64 {
			return nil, fmt.Errorf("routers %q: want a count from 1 to 64", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// rowName is a policy's row with n routers when several counts run.
func rowName(policy string, n int, counts []int) string {
	if len(counts) <= 1 {
		return policy
	}
	return fmt.Sprintf("%s/%dr", policy, n)
}

// runDES runs every policy (and every router count) on the discrete-event
// engine and fills res.
func (o *Options) runDES(ctx context.Context, res *report.Results, tm pairTiming, prog *progress) (*report.Results, error) {
	res.Engine, res.TimeScale = EngineDES, 1
	counts := o.Routers
	if len(counts) == 0 {
		counts = []int{1}
	}
	delivery := des.DefaultDelivery()
	if o.Delivery != nil {
		delivery = *o.Delivery
	}
	res.Fleet["delivery"] = map[string]any{"request_s": delivery.Request.Seconds(), "request_jitter_s": delivery.RequestJitter.Seconds(), "transport_s": delivery.Transport.Seconds(),
		"jitter_s": delivery.Jitter.Seconds(), "apply_per_batch_s": delivery.ApplyPerBatch.Seconds(),
		"peer_delay_s": delivery.PeerDelay.Seconds()}
	res.Fleet["routers"] = counts
	res.Fleet["share_predictions"] = o.SharePredictions
	delete(res.Fleet, "stream_interval_s")
	arms := o.FlowControl
	var fc *report.FlowControl
	if len(arms) > 0 {
		fc = o.flowResults()
		res.FlowControl = fc
	} else {
		arms = []bool{false}
	}
	for _, pol := range o.Policies {
		for _, n := range counts {
			for ai, on := range arms {
				if pol == Oracle && (n != counts[0] || ai > 0) {
					continue // the oracle has no router to replicate, nor flow control
				}
				if err := o.runDESRow(ctx, res, pol, n, counts, on, fc, delivery, tm, prog); err != nil {
					return res, err
				}
			}
		}
	}
	return res, nil
}

// runDESRow runs policy pol with n routers, flow control on or off, and
// adds its row to res.
func (o *Options) runDESRow(ctx context.Context, res *report.Results, pol string, n int, counts []int, on bool, fc *report.FlowControl,
	delivery des.Delivery, tm pairTiming, prog *progress) error {
	w := o.Workload
	name := rowName(pol, n, counts)
	if pol == Oracle {
		name = pol
	} else if fc != nil && len(fc.Arms) > 1 {
		name += "/fc-" + armName(on)
	}
	prog.begin(name, w.Requests())
	cfg := des.Config{Workload: w, Fleet: o.Fleet, Policy: pol, Routers: n, SharePredictions: o.SharePredictions, Seed: o.Seed, Delivery: delivery,
		SpeculativeTTL: o.Speculative.TTL, Holdback: o.Speculative.Holdback, Cost: o.Cost,
		Drain: time.Duration(float64(o.Drain) * o.Fleet.TimeScale), Sent: prog.sent, Done: prog.done, Logger: o.Logger}
	if fc != nil {
		a := o.Admission
		a.Off = !on || pol == Oracle
		cfg.Admission = &a
	}
	var (
		pairs  *desPairs
		faults *desFaults
	)
	switch w.Name {
	case workload.KindPairedGap:
		pairs = &desPairs{w: w, tm: tm, prof: o.Fleet.Profile}
		cfg.Conduct, cfg.ManualSends = pairs.conduct, true
	case workload.KindFaults:
		faults = newDESFaults(w)
		cfg.Conduct = faults.conduct
		// Dropped and severed batches come back through replay.
		cfg.ReplayBuffer = o.Fleet.ReplayBuffer
		if cfg.ReplayBuffer == 0 {
			cfg.ReplayBuffer = sim.DefaultReplayBuffer
		}
	}
	r, err := des.Run(ctx, cfg)
	prog.end()
	switch {
	case err != nil:
	case pairs != nil:
		err = pairs.err
	case faults != nil:
		err = faults.err
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	p := report.Summarize(r.Records)
	if fc != nil {
		report.SummarizeFlow(p, r.Records, fc, res.Stages)
		if pol != Oracle {
			p.Policy, p.FlowControl = pol, armName(on)
		}
		if r.Budget > 0 {
			fc.BudgetS = r.Budget.Seconds()
		}
	}
	if pairs != nil {
		p.Pairs = pairs.pairs
	}
	if faults != nil {
		p.Faults = faultOutcomes(r.Records)
		p.Faults.Injected = faults.out
		if n := p.Faults.LostCount(); n > 0 {
			res.Notes = append(res.Notes, fmt.Sprintf("%s: %d requests ended in neither a response nor an OpenAI error (lost silently)", name, n))
		}
	}
	if w.Name == workload.KindBurst {
		p.Holder = report.HolderOf(r.Records)
	}
	p.Preemptions = r.Preemptions
	p.WallS = r.Wall.Seconds()
	if pol != Oracle {
		p.Routers = n
		d := r.Decision
		p.DecisionUS = &d
	}
	if len(r.Speculative) > 0 {
		// The first replica's view: each replica predicts and
		// confirms on its own.
		p.Speculative = summarizeSpeculative(r.Speculative[0], 1, des.PodNameOf)
	}
	res.Policies[name] = p
	res.Order = append(res.Order, name)
	res.Notes = append(res.Notes, unfinishedNote(name, p)...)
	if p.Speculative != nil {
		res.Notes = append(res.Notes, speculativeNote(name, p.Speculative))
	}
	if h := p.Holder; h != nil {
		res.Notes = append(res.Notes, fmt.Sprintf("%s: %d of %d followers (a burst's requests after its first) reached the pod of their burst's first request",
			name, h.OnHolder, h.Followers))
	}
	if p.Shed > 0 && p.FlowControl == "on" {
		res.Notes = append(res.Notes, fmt.Sprintf("%s: flow control shed %d requests (429: %s); they count as errors of kind %q", name, p.Shed, shedReasons(p), report.ErrShed))
	}
	return nil
}

// shedReasons lists a row's sheds by reason.
func shedReasons(p *report.Policy) string {
	n := map[string]int{}
	for _, c := range p.ByPriority {
		for why, k := range c.ShedReasons {
			n[why] += k
		}
	}
	var parts []string
	for _, why := range slices.Sorted(maps.Keys(n)) {
		parts = append(parts, fmt.Sprintf("%s × %d", why, n[why]))
	}
	return strings.Join(parts, ", ")
}
