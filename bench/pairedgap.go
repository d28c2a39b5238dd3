package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prefixrouter/prefixrouter/bench/des"
	"github.com/prefixrouter/prefixrouter/bench/report"
	"github.com/prefixrouter/prefixrouter/bench/workload"
	"github.com/prefixrouter/prefixrouter/sim"
	"github.com/prefixrouter/prefixrouter/speculative"
)

// pairTiming is where paired-gap's gaps fall, in model time: the
// route-to-confirmation latency the fleet is known to have (its event
// delay plus the prefill step that stores the prefix) and the prediction
// TTL.
type pairTiming struct {
	latency, ttl time.Duration
	// delayed is the event delay of the delayed-events condition: beyond
	// every gap, so that even the last is sent before the first's event.
	eventDelay, delayed time.Duration
	gaps                map[string]time.Duration
}

// newPairTiming sizes the gaps: below p50 at half the latency, near p95
// just after it (the event is in by then), near the TTL just before it,
// beyond it half a TTL later.
func newPairTiming(fleet sim.Config, promptTokens int, ttl time.Duration) pairTiming {
	lat := fleet.Faults.EventDelay + fleet.Profile.StepTime(promptTokens, 0)
	return pairTiming{latency: lat, ttl: ttl, eventDelay: fleet.Faults.EventDelay, delayed: 2 * ttl,
		gaps: map[string]time.Duration{
			workload.GapBelowP50: lat / 2, workload.GapNearP95: lat * 6 / 5,
			workload.GapNearTTL: ttl * 9 / 10, workload.GapBeyondTTL: ttl * 3 / 2,
		}}
}

// settleAfter is how long after its start a cell waits before the next:
// until its events are in (and a fault undone) and every prediction of
// the cell has ended (confirmed, or expired at its TTL), so that the
// speculative view's changes over the cell are the cell's.
func (tm pairTiming) settleAfter(cell workload.Cell) time.Duration {
	eventDelay := tm.eventDelay
	if cell.Condition == workload.CondDelayedEvents {
		eventDelay = tm.delayed
	}
	return max(eventDelay+tm.latency*3/2, tm.gaps[cell.Gap]+tm.latency, tm.ttl+tm.latency)
}

// pairTTL is the TTL paired-gap gives the speculative policy when none is
// fixed: the cells sit at known offsets from it only if it stays put.
func pairTTL(fleet sim.Config, promptTokens int) time.Duration {
	lat := fleet.Faults.EventDelay + fleet.Profile.StepTime(promptTokens, 0)
	return (lat * 5 / 2).Round(10 * time.Millisecond)
}

// pairRunner runs paired-gap's cells one by one on one policy's fleet.
type pairRunner struct {
	o      *Options
	fr     *fleetRun
	c      *client
	tm     pairTiming
	scale  float64
	start  time.Time
	recs   []report.Record
	policy string
}

func (pr *pairRunner) wall(model time.Duration) time.Duration {
	return time.Duration(float64(model) / pr.scale)
}

func (pr *pairRunner) model(wall time.Duration) float64 { return wall.Seconds() * pr.scale }

// runPairs runs the cells under one policy.
func (o *Options) runPairs(ctx context.Context, policy string, tm pairTiming, prog *progress) (*liveRun, []report.Pair, error) {
	fr, err := startFleetRun(ctx, o.Fleet, policy, o.Seed, o.routerSettings(), "", o.Logger)
	if err != nil {
		return nil, nil, err
	}
	defer fr.close()
	pr := &pairRunner{o: o, fr: fr, c: newClient(fr.fleet.Config().Model), tm: tm, scale: o.Fleet.TimeScale, start: time.Now(), policy: policy}
	defer pr.c.close()
	prog.begin(policy, o.Workload.Requests())
	var pairs []report.Pair
	for i, cell := range o.Workload.Cells {
		p, err := pr.cell(ctx, i, cell, prog)
		if err != nil {
			prog.end()
			return nil, nil, fmt.Errorf("cell %s, %s: %w", cell.Condition, cell.Gap, err)
		}
		pairs = append(pairs, p)
	}
	prog.end()
	o.logErrors(policy, prog)
	run := &liveRun{recs: pr.recs, spec: fr.speculativeSummary(ctx, o.Settle)}
	run.lag, run.preemptions = fr.stats()
	return run, pairs, ctx.Err()
}

// sent is one request of a pair as it ended.
type sent struct {
	answer
	pod  string
	sent time.Time
}

func (pr *pairRunner) send(ctx context.Context, prompt string, maxTokens int, prog *progress) sent {
	s := sent{sent: time.Now()}
	prog.sent()
	to, err := pr.fr.route(ctx, prompt)
	if err != nil {
		s.answer = answer{err: errNoAnswer, detail: err}
	} else {
		s.answer = pr.c.do(ctx, to, prompt, maxTokens, false)
		s.pod = pr.fr.podOf(s.answer, to)
	}
	if s.detail != nil {
		prog.failure(s.err, s.detail)
	}
	prog.done(s.err != "")
	return s
}

func (pr *pairRunner) record(i, session int, s *sent) {
	r := report.Record{Session: session, Group: i, Stage: -1, Sent: pr.model(s.sent.Sub(pr.start)), Status: s.status, Err: s.err}
	if s.err == "" {
		r.TTFT, r.E2E = pr.model(s.ttft), pr.model(s.e2e)
		r.PromptTokens, r.CachedTokens, r.OutputTokens, r.Pod = s.prompt, s.cached, s.output, s.pod
	}
	pr.recs = append(pr.recs, r)
}

// setFaults changes every pod's faults.
func (pr *pairRunner) setFaults(ctx context.Context, change func(*sim.Faults)) error {
	for _, p := range pr.fr.fleet.Pods {
		f := p.Faults()
		change(&f)
		if err := p.SetFaults(ctx, f); err != nil {
			return err
		}
	}
	return nil
}

// cell runs one pair: the condition, the first request, the gap, the
// second, then waits until the cell's events are in so that the next cell
// starts from a quiet fleet.
func (pr *pairRunner) cell(ctx context.Context, i int, cell workload.Cell, prog *progress) (report.Pair, error) {
	w := pr.o.Workload
	first, second := &w.Sessions[2*i], &w.Sessions[2*i+1]
	out := report.Pair{Condition: cell.Condition, Gap: cell.Gap}
	before, _ := pr.specView()
	switch cell.Condition {
	case workload.CondDelayedEvents:
		if err := pr.setFaults(ctx, func(f *sim.Faults) { f.EventDelay = pr.tm.delayed }); err != nil {
			return out, err
		}
	case workload.CondFailPrefill:
		if err := pr.setFaults(ctx, func(f *sim.Faults) { f.FailPrefill = 1 }); err != nil {
			return out, err
		}
	}
	t0 := time.Now()
	firstCtx, cancelFirst := context.WithCancel(ctx)
	defer cancelFirst()
	done := make(chan sent, 1)
	go func() { done <- pr.send(firstCtx, first.Prompt(0, nil), first.Turns[0].MaxTokens, prog) }()
	var a1 *sent
	wait1 := func() *sent {
		if a1 == nil {
			s := <-done
			a1 = &s
		}
		return a1
	}
	switch cell.Condition {
	case workload.CondCancel:
		// The client goes away halfway through the first request's prefill
		// step: the pod has scheduled it (and so cached its blocks) but
		// not computed them.
		half := pr.fr.fleet.Config().Profile.StepTime(len(first.Prompt(0, nil)), 0) / 2
		if !sleepCtx(ctx, pr.wall(half)) {
			return out, ctx.Err()
		}
		cancelFirst()
	case workload.CondFailPrefill:
		wait1()
		if err := pr.setFaults(ctx, func(f *sim.Faults) { f.FailPrefill = 0 }); err != nil {
			return out, err
		}
	case workload.CondRestart:
		if s := wait1(); s.pod != "" {
			if err := pr.podNamed(s.pod).Restart(ctx); err != nil {
				return out, err
			}
		}
	}
	if !sleepCtx(ctx, time.Until(t0.Add(pr.wall(pr.tm.gaps[cell.Gap])))) {
		return out, ctx.Err()
	}
	out.GapS = pr.model(time.Since(t0))
	a2 := pr.send(ctx, second.Prompt(0, nil), second.Turns[0].MaxTokens, prog)
	wait1()
	pr.record(i, 2*i, a1)
	pr.record(i, 2*i+1, &a2)
	out.FirstPod, out.FirstErr = a1.pod, a1.err
	if out.FirstPod == "" {
		// A cancelled request names no pod: the one holding its prompt
		// is where it went.
		out.FirstPod = pr.holderOf(ctx, first.Prompt(0, nil))
	}
	out.Pod, out.SamePod, out.Err = a2.pod, a2.pod != "" && a2.pod == out.FirstPod, a2.err
	out.ConfirmedBlocks, out.PredictedTokens, out.CachedTokens = a2.routed.confirmedBlocks, a2.routed.predictedTokens, a2.cached
	out.TTFTS = pr.model(a2.ttft)
	out.Basis = basisOf(a2.routed, pr.fr.fleet.Config().Profile.BlockSize)

	// The cell's events are in (and a fault undone) before the next cell.
	// Every prediction of the cell has ended too (confirmed, or expired at
	// its TTL), so that the view's changes over the cell are the cell's.
	if !sleepCtx(ctx, time.Until(t0.Add(pr.wall(pr.tm.settleAfter(cell))))) {
		return out, ctx.Err()
	}
	if cell.Condition == workload.CondDelayedEvents {
		if err := pr.setFaults(ctx, func(f *sim.Faults) { f.EventDelay = pr.tm.eventDelay }); err != nil {
			return out, err
		}
	}
	if cell.Condition == workload.CondRestart || cell.Condition == workload.CondFailPrefill {
		if pr.fr.router != nil {
			if err := waitRouterReady(ctx, pr.fr.router, pr.fr.fleet.Config().Model, len(pr.fr.fleet.Pods)); err != nil {
				return out, err
			}
		}
	}
	if after, ok := pr.specView(); ok {
		out.Spec = pairSpec(&before, &after)
	}
	return out, nil
}

func (pr *pairRunner) specView() (speculative.View, bool) {
	if pr.fr.router == nil {
		return speculative.View{}, false
	}
	return pr.fr.router.SpeculativeView()
}

// holderOf names the pod that caches most of prompt ("" when none does),
// from the simulator's own state.
func (pr *pairRunner) holderOf(ctx context.Context, prompt string) string {
	pods := pr.fr.fleet.Pods
	ids, err := pods[0].Encode(prompt)
	if err != nil {
		return ""
	}
	best, most := "", 0
	for i, p := range pods {
		ranks, err := p.Probe(ctx, ids)
		if err != nil {
			continue
		}
		for _, r := range ranks {
			if r.CachedTokens > most {
				best, most = podName(i), r.CachedTokens
			}
		}
	}
	return best
}

func (pr *pairRunner) podNamed(name string) *sim.Pod {
	for i, p := range pr.fr.fleet.Pods {
		if podName(i) == name {
			return p
		}
	}
	return nil
}

// basisOf reads what the decision counted: predicted tokens beyond the
// confirmed run mean predictions counted.
func basisOf(r routedOn, blockSize int) string {
	switch {
	case !r.known:
		return report.BasisUnknown
	case r.predictedTokens > r.confirmedBlocks*blockSize:
		return report.BasisPrediction
	case r.confirmedBlocks > 0:
		return report.BasisConfirmed
	}
	return report.BasisNone
}

// pairSpec is the change of the view over a cell.
func pairSpec(a, b *speculative.View) *report.PairSpec {
	return &report.PairSpec{
		FollowerRoutes:   b.Overall.Funnel.FollowerRoutes - a.Overall.Funnel.FollowerRoutes,
		FalseWarmRoutes:  b.Overall.FalseWarm.Routes - a.Overall.FalseWarm.Routes,
		Inserted:         b.Overall.Funnel.Inserted - a.Overall.Funnel.Inserted,
		EndedUnconfirmed: endedUnconfirmed(b) - endedUnconfirmed(a),
		ConfirmedLate:    b.Overall.Funnel.ConfirmedLate - a.Overall.Funnel.ConfirmedLate,
	}
}

// endedUnconfirmed counts the predictions that ended without their event
// (expired, invalidated, withdrawn, unknown), mature or not: a cohort that
// matures moves its counts from one side to the other.
func endedUnconfirmed(v *speculative.View) int64 {
	p, m := &v.Overall.Pending, &v.Overall.MatureTotal
	return p.Ended - p.Confirmed + m.Expired + m.Invalidated + m.Withdrawn + m.Unknown
}

var errNoCells = errors.New("paired-gap: the workload has no cells")

// desPairs runs paired-gap's cells one after another on the des engine,
// as pairRunner does on a live fleet: the same conditions, gaps and
// settling, in model time.
type desPairs struct {
	w     *workload.Workload
	tm    pairTiming
	prof  sim.Profile
	c     *des.Control
	pairs []report.Pair
	err   error
}

// routableBound bounds (model time) the wait for every pod to be routable
// again after a cell that failed requests (the breaker's cooldown).
const routableBound = time.Minute

func (dp *desPairs) conduct(c *des.Control) {
	dp.c = c
	dp.cell(0)
}

// cell runs cell i, then the next once it settled.
func (dp *desPairs) cell(i int) {
	if i == len(dp.w.Cells) {
		return
	}
	c, tm, cell := dp.c, dp.tm, dp.w.Cells[i]
	out := report.Pair{Condition: cell.Condition, Gap: cell.Gap}
	before, _ := c.Speculative()
	t0 := c.Now()
	allPods := func(change func(pod int)) {
		for p := range c.Pods() {
			change(p)
		}
	}
	switch cell.Condition {
	case workload.CondDelayedEvents:
		allPods(func(p int) { c.SetEventDelay(p, tm.delayed) })
	case workload.CondFailPrefill:
		allPods(func(p int) { c.SetFaults(p, sim.Faults{FailPrefill: 1}) })
	}
	var first, second *des.Sent
	ended := 0
	settle := func() {
		out.FirstPod, out.FirstErr = first.Record.Pod, first.Record.Err
		if out.FirstPod == "" {
			// A canceled request names no pod: the one holding its
			// prompt is where it went, as on the live engine.
			if h := c.HolderOf(2 * i); h >= 0 {
				out.FirstPod = des.PodName(h)
			}
		}
		r := second.Record
		out.Pod, out.Err = r.Pod, r.Err
		out.SamePod = r.Pod != "" && r.Pod == out.FirstPod
		out.ConfirmedBlocks, out.PredictedTokens, out.CachedTokens = second.ConfirmedBlocks, second.PredictedTokens, r.CachedTokens
		out.TTFTS = r.TTFT
		out.Basis = basisOf(routedOn{known: second.Routed, confirmedBlocks: second.ConfirmedBlocks, predictedTokens: second.PredictedTokens}, dp.prof.BlockSize)
		c.At(t0+tm.settleAfter(cell), func() {
			allPods(func(p int) { c.SetEventDelay(p, tm.eventDelay) })
			dp.whenRoutable(c.Now()+routableBound, func() {
				if after, ok := c.Speculative(); ok {
					out.Spec = pairSpec(&before, &after)
				}
				dp.pairs = append(dp.pairs, out)
				dp.cell(i + 1)
			})
		})
	}
	bothEnded := func(*des.Sent) {
		if ended++; ended == 2 {
			settle()
		}
	}
	sendSecond := func() {
		out.GapS = (c.Now() - t0).Seconds()
		second = c.Send(2*i+1, bothEnded)
	}
	waitsForFirst := cell.Condition == workload.CondFailPrefill || cell.Condition == workload.CondRestart
	first = c.Send(2*i, func(s *des.Sent) {
		switch cell.Condition {
		case workload.CondFailPrefill:
			allPods(func(p int) { c.SetFaults(p, sim.Faults{}) })
		case workload.CondRestart:
			if s.Pod >= 0 && s.Record.Err == "" {
				c.Restart(s.Pod)
			}
		}
		if waitsForFirst {
			c.At(t0+tm.gaps[cell.Gap], sendSecond)
		}
		bothEnded(s)
	})
	if cell.Condition == workload.CondCancel {
		// Halfway through the first request's prefill step, as on the
		// live engine.
		half := dp.prof.StepTime(len(dp.w.Sessions[2*i].Prompt(0, nil)), 0) / 2
		c.At(t0+half, func() { c.Cancel(first) })
	}
	if !waitsForFirst {
		c.At(t0+tm.gaps[cell.Gap], sendSecond)
	}
}

// whenRoutable runs next once every router routes to every pod again,
// polling as the live engine does; past bound the run fails.
func (dp *desPairs) whenRoutable(bound time.Duration, next func()) {
	c := dp.c
	for p := range c.Pods() {
		if !c.Routable(p) {
			if c.Now() >= bound {
				dp.err = fmt.Errorf("paired-gap: %s not routable again within %s", des.PodName(p), routableBound)
				return
			}
			c.At(c.Now()+convergePoll, func() { dp.whenRoutable(bound, next) })
			return
		}
	}
	next()
}
