package bench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/prefixrouter/prefixrouter/bench/des"
	"github.com/prefixrouter/prefixrouter/bench/report"
	"github.com/prefixrouter/prefixrouter/bench/workload"
	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/sim"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// The faults the faults workload injects.
const (
	// FaultDead kills the pod's engine (/health 503, requests 500, no
	// events); lifting it brings the pod back as a fresh process.
	FaultDead = "dead"
	// FaultDropEvents drops every KV-event batch the pod publishes (they
	// stay in its replay buffer).
	FaultDropEvents = "drop events"
	// FaultDelayEvents holds the pod's event batches back by
	// faultEventDelay.
	FaultDelayEvents = "delay events"
	// FaultRestart restarts the pod's process: in-flight requests lose
	// their connections, the cache is lost without an event, sequence
	// numbers start again.
	FaultRestart = "restart"
	// FaultUnlisted takes the pod out of the router's endpoints file and
	// puts it back: the router forgets the target, then adds it anew.
	FaultUnlisted = "unlisted"
	// FaultSevered cuts the router's event subscriber off the pod (a
	// relay between them closes its connections and refuses new ones,
	// as a network cut would) and lets it reconnect at the end: the
	// batches published meanwhile must come back through replay.
	FaultSevered = "severed subscriber"
)

// faultPlan is one fault of the schedule, on pod (modulo the fleet's
// size) from start to end, fractions of the workload's span; an instant
// fault has end equal to start.
type faultPlan struct {
	kind       string
	pod        int
	start, end float64
}

// faultSchedule overlaps the faults so that the router meets more than
// one at a time, on different pods (a pod's two faults apart in time),
// all while requests arrive. The
// drop lasts 60% of the span: on the quick preset's 20 s, longer than the
// router's 10 s stale-after, so that the silence is seen.
var faultSchedule = []faultPlan{
	{FaultDead, 0, 0.10, 0.30},
	{FaultDropEvents, 1, 0.20, 0.80},
	{FaultUnlisted, 3, 0.25, 0.40},
	{FaultDelayEvents, 2, 0.40, 0.60},
	{FaultSevered, 0, 0.55, 0.70},
	{FaultRestart, 3, 0.70, 0.70},
}

const (
	// faultEventDelay is FaultDelayEvents' delay (model time).
	faultEventDelay = 2 * time.Second
	// convergeBound bounds (model time) how long after a fault's end the
	// router's view of the pod is awaited.
	convergeBound = 15 * time.Second
	// convergePoll is how often (wall time) the view is compared.
	convergePoll = 20 * time.Millisecond
)

// runFaults runs the workload's requests under one policy while the
// schedule's faults come and go, then accounts for every request.
func (o *Options) runFaults(ctx context.Context, policy string, prog *progress) (*liveRun, *report.Faults, error) {
	dir, err := os.MkdirTemp("", "prefixrouter-faults-")
	if err != nil {
		return nil, nil, fmt.Errorf("faults: %w", err)
	}
	defer os.RemoveAll(dir)
	fr, err := startFleetRun(ctx, o.Fleet, policy, o.Seed, o.routerSettings(), dir, o.Logger)
	if err != nil {
		return nil, nil, err
	}
	defer fr.close()
	c := newClient(fr.fleet.Config().Model)
	defer c.close()
	fi, err := newFaultInjector(fr, o)
	if err != nil {
		return nil, nil, err
	}
	d := &driver{w: o.Workload, scale: o.Fleet.TimeScale, route: fr.route, client: c, podOf: fr.podOf, drain: o.Drain, prog: prog}
	prog.begin(policy, o.Workload.Requests())
	injected, faultErrs := fi.start(ctx, time.Now())
	recs := d.run(ctx)
	prog.end()
	o.logErrors(policy, prog)
	if err := faultErrs(); err != nil {
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	f := faultOutcomes(recs)
	f.Injected = injected
	run := &liveRun{recs: recs, spec: fr.speculativeSummary(ctx, o.Settle)}
	run.lag, run.preemptions = fr.stats()
	return run, f, ctx.Err()
}

// faultOutcomes sorts every request by how it ended: a response, an
// OpenAI-shaped error, given up by the client at the drain bound, or lost
// silently (anything else).
func faultOutcomes(recs []report.Record) *report.Faults {
	f := &report.Faults{APIErrors: map[string]int{}, Lost: map[string]int{}}
	for i := range recs {
		r := &recs[i]
		switch {
		case !r.Failed():
			f.Responses++
		case r.APIError != "" && r.Status != 0 && r.Err != errStream:
			f.APIErrors[fmt.Sprintf("HTTP %d %s", r.Status, r.APIError)]++
		case r.APIError != "":
			f.APIErrors["stream "+r.APIError]++
		case r.Err == errUnfinished:
			f.Unfinished++
		default:
			f.Lost[r.Err]++
		}
	}
	return f
}

// faultInjector applies the schedule to one fleet and measures how the
// router's view of each faulted pod converges back.
type faultInjector struct {
	fr    *fleetRun
	scale float64
	span  time.Duration
	// probes are one prompt per sharing group, as token ids.
	probes [][]uint32
}

func newFaultInjector(fr *fleetRun, o *Options) (*faultInjector, error) {
	w := o.Workload
	fi := &faultInjector{fr: fr, scale: o.Fleet.TimeScale}
	for _, st := range w.Stages {
		fi.span += st.Duration
	}
	seen := map[int]bool{}
	for i := range w.Sessions {
		s := &w.Sessions[i]
		if seen[s.Group] {
			continue
		}
		seen[s.Group] = true
		ids, err := fr.fleet.Pods[0].Encode(s.Prompt(0, nil))
		if err != nil {
			return nil, fmt.Errorf("faults: probe prompt: %w", err)
		}
		fi.probes = append(fi.probes, ids)
	}
	return fi, nil
}

func (fi *faultInjector) wall(model time.Duration) time.Duration {
	return time.Duration(float64(model) / fi.scale)
}

func (fi *faultInjector) model(wall time.Duration) float64 { return wall.Seconds() * fi.scale }

// start runs every fault of the schedule on its own goroutine from t0;
// wait returns once all have ended and been measured, with the first
// error.
func (fi *faultInjector) start(ctx context.Context, t0 time.Time) ([]report.Fault, func() error) {
	out := make([]report.Fault, len(faultSchedule))
	errs := make([]error, len(faultSchedule))
	var wg sync.WaitGroup
	for i, plan := range faultSchedule {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = fi.inject(ctx, t0, plan)
		}()
	}
	return out, func() error {
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				return fmt.Errorf("fault %s: %w", faultSchedule[i].kind, err)
			}
		}
		return nil
	}
}

// inject applies one fault at its time, lifts it at its end and measures
// the convergence after.
func (fi *faultInjector) inject(ctx context.Context, t0 time.Time, plan faultPlan) (report.Fault, error) {
	i := plan.pod % len(fi.fr.fleet.Pods)
	pod := fi.fr.fleet.Pods[i]
	f := report.Fault{Kind: plan.kind, Pod: podName(i)}
	at := func(frac float64) time.Time { return t0.Add(fi.wall(time.Duration(frac * float64(fi.span)))) }
	if !sleepCtx(ctx, time.Until(at(plan.start))) {
		return f, nil
	}
	f.StartS = fi.model(time.Since(t0))
	base := pod.Faults()
	set := func(change func(*sim.Faults)) error {
		nf := base
		change(&nf)
		return pod.SetFaults(ctx, nf)
	}
	var err error
	switch plan.kind {
	case FaultDead:
		err = set(func(f *sim.Faults) { f.Dead = true })
	case FaultDropEvents:
		err = set(func(f *sim.Faults) { f.DropEvents = 1 })
	case FaultDelayEvents:
		err = set(func(f *sim.Faults) { f.EventDelay = faultEventDelay })
	case FaultRestart:
		err = pod.Restart(ctx)
	case FaultUnlisted:
		// Without a router (the oracle) there is no file to take it out of.
		if fi.fr.endpointsFile != "" {
			err = fi.fr.listEndpoints(i)
		}
	case FaultSevered:
		// Without a router there is no subscriber to sever.
		if fi.fr.relays != nil {
			fi.fr.relays[i].sever()
		}
	default:
		err = fmt.Errorf("unknown fault")
	}
	if err != nil {
		return f, err
	}
	if plan.end > plan.start {
		for time.Now().Before(at(plan.end)) {
			fi.observe(i, &f)
			if !sleepCtx(ctx, min(convergePoll, time.Until(at(plan.end)))) {
				return f, nil
			}
		}
		lift := func() error { return pod.SetFaults(ctx, base) }
		switch plan.kind {
		case FaultUnlisted:
			lift = func() error {
				if fi.fr.endpointsFile == "" {
					return nil
				}
				return fi.fr.listEndpoints(-1)
			}
		case FaultSevered:
			lift = func() error {
				if fi.fr.relays != nil {
					fi.fr.relays[i].mend()
				}
				return nil
			}
		}
		if err := lift(); err != nil {
			return f, err
		}
	}
	end := time.Now()
	f.EndS = fi.model(end.Sub(t0))
	fi.converge(ctx, i, end, &f)
	return f, nil
}

// converge polls the router's view of pod i from end until every rank is
// routable with a fresh event stream and every probe prompt's confirmed
// run there equals the pod's true cached run, or convergeBound passes.
func (fi *faultInjector) converge(ctx context.Context, i int, end time.Time, f *report.Fault) {
	rt := fi.fr.router
	if rt == nil {
		return
	}
	f.Probes = len(fi.probes)
	pod := fi.fr.fleet.Pods[i]
	dp := fi.fr.fleet.Config().DP
	deadline := end.Add(fi.wall(convergeBound))
	// A view that turns bad again before converging (a breaker opening on
	// the restarted pod's failed requests) restarts its clock: the times
	// are when each became true for good.
	var routableSince, freshSince *float64
	defer func() { f.RoutableAfterS, f.FreshAfterS = routableSince, freshSince }()
	for {
		fresh, routable := fi.observe(i, f)
		since := fi.model(time.Since(end))
		routableSince = sinceIf(routable, routableSince, since)
		freshSince = sinceIf(fresh, freshSince, since)
		switch {
		case !routable:
			f.Mismatch = "a rank not routable"
		case !fresh:
			f.Mismatch = "an event stream not fresh"
		default:
			ok, why := fi.matches(ctx, pod, dp)
			if ok {
				f.ConvergedAfterS, f.Mismatch = &since, ""
				return
			}
			f.Mismatch = why
		}
		if time.Now().After(deadline) || !sleepCtx(ctx, convergePoll) {
			return
		}
	}
}

// noteSaw adds what the router made of a faulted pod to f.RouterSaw,
// once, in the order first seen.
func noteSaw(f *report.Fault, what string) {
	if !slices.Contains(f.RouterSaw, what) {
		f.RouterSaw = append(f.RouterSaw, what)
	}
}

// sinceIf keeps since while ok holds, starts it at now when ok begins,
// and clears it when ok ends.
func sinceIf(ok bool, since *float64, now float64) *float64 {
	switch {
	case !ok:
		return nil
	case since == nil:
		return &now
	}
	return since
}

// observe adds what the router makes of pod i now to f.RouterSaw (each
// stream verdict, and health's reason while it does not route a rank)
// and reports whether every rank's event stream is fresh and every rank
// routable.
func (fi *faultInjector) observe(i int, f *report.Fault) (fresh, routable bool) {
	rt := fi.fr.router
	if rt == nil {
		return false, false
	}
	saw := func(what string) { noteSaw(f, what) }
	snap := rt.Monitor().Snapshot()
	fresh, routable = true, true
	for r := range fi.fr.fleet.Config().DP {
		id := targetid.ID{Endpoint: fi.fr.fleet.Pods[i].URL(), Rank: r}
		v := rt.EventPlane().Verdict(id)
		saw(string(v))
		fresh = fresh && v == eventplane.VerdictFresh
		t, ok := snap.Target(id)
		switch {
		case !ok:
			routable = false
			saw("removed")
		case !t.CanRoute():
			routable = false
			saw(string(t.Reason))
		case t.State != health.StateRoutable:
			saw(string(t.Reason))
		}
	}
	return fresh, routable
}

// matches compares, for every probe prompt and rank of pod, the router's
// confirmed run (its index, looked up with its block keys) with the pod's
// true cached run (the simulator's probe), both in full blocks short of
// the prompt's last token.
func (fi *faultInjector) matches(ctx context.Context, pod *sim.Pod, dp int) (bool, string) {
	plane := fi.fr.router.EventPlane()
	keys := plane.Keys()
	if keys == nil {
		return false, "the router knows no block keys"
	}
	bs := keys.BlockSize
	for k, ids := range fi.probes {
		truth, err := pod.Probe(ctx, ids)
		if err != nil {
			return false, err.Error()
		}
		chain, err := keys.Keyer.Keys(nil, ids, kvindex.RequestExtras{})
		if err != nil {
			return false, fmt.Sprintf("block keys: %v", err)
		}
		held := map[targetid.ID]int{}
		for _, m := range plane.Index().Lookup(nil, chain) {
			held[m.Target] = m.Blocks
		}
		limit := (len(ids) - 1) / bs
		for r := range dp {
			got, want := min(held[targetid.ID{Endpoint: pod.URL(), Rank: r}], limit), truth[r].CachedTokens/bs
			if got != want {
				return false, fmt.Sprintf("probe %d rank %d: router %d blocks, pod %d", k, r, got, want)
			}
		}
	}
	return true, ""
}

// faultScheduleParams describes the schedule for results.json, in model
// seconds from the run's start.
func faultScheduleParams(w *workload.Workload) []map[string]any {
	var span time.Duration
	for _, st := range w.Stages {
		span += st.Duration
	}
	out := make([]map[string]any, 0, len(faultSchedule))
	for _, p := range faultSchedule {
		m := map[string]any{"kind": p.kind, "pod": p.pod, "start_s": p.start * span.Seconds(), "end_s": p.end * span.Seconds()}
		if p.kind == FaultDelayEvents {
			m["event_delay_s"] = faultEventDelay.Seconds()
		}
		out = append(out, m)
	}
	return out
}

// desFaults runs the schedule on the des engine, as faultInjector does on
// a live fleet: the same faults at the same fractions of the span, and
// the same convergence measured on the first router, in model time.
type desFaults struct {
	w      *workload.Workload
	c      *des.Control
	span   time.Duration
	probes [][]uint32
	out    []report.Fault
	err    error
}

func newDESFaults(w *workload.Workload) *desFaults {
	df := &desFaults{w: w, out: make([]report.Fault, len(faultSchedule))}
	for _, st := range w.Stages {
		df.span += st.Duration
	}
	return df
}

func (df *desFaults) conduct(c *des.Control) {
	df.c = c
	seen := map[int]bool{}
	for i := range df.w.Sessions {
		s := &df.w.Sessions[i]
		if seen[s.Group] {
			continue
		}
		seen[s.Group] = true
		ids, err := c.Encode(s.Prompt(0, nil))
		if err != nil {
			df.err = fmt.Errorf("faults: probe prompt: %w", err)
			return
		}
		df.probes = append(df.probes, ids)
	}
	for i, plan := range faultSchedule {
		c.At(df.at(plan.start), func() { df.inject(i, plan) })
	}
}

func (df *desFaults) at(frac float64) time.Duration { return time.Duration(frac * float64(df.span)) }

// inject applies fault i now, observes the router while it lasts, lifts
// it at its end and measures the convergence after.
func (df *desFaults) inject(i int, plan faultPlan) {
	c := df.c
	pod := plan.pod % c.Pods()
	f := &df.out[i]
	*f = report.Fault{Kind: plan.kind, Pod: des.PodName(pod), StartS: c.Now().Seconds()}
	routers := c.Routers() > 0
	lift := func() error { return nil }
	switch plan.kind {
	case FaultDead:
		c.Kill(pod)
		lift = func() error { c.Restart(pod); return nil }
	case FaultDropEvents:
		c.DropEvents(pod, true)
		lift = func() error { c.DropEvents(pod, false); return nil }
	case FaultDelayEvents:
		base := c.EventDelay(pod)
		c.SetEventDelay(pod, faultEventDelay)
		lift = func() error { c.SetEventDelay(pod, base); return nil }
	case FaultRestart:
		c.Restart(pod)
	case FaultUnlisted:
		// Without a router (the oracle) there is no fleet to take it out of.
		if routers {
			c.Unlist(pod)
			lift = func() error { return c.List(pod) }
		}
	case FaultSevered:
		if routers {
			c.Sever(pod, true)
			lift = func() error { c.Sever(pod, false); return nil }
		}
	default:
		df.err = fmt.Errorf("fault %s: unknown fault", plan.kind)
		return
	}
	end := df.at(plan.end)
	var watch func()
	watch = func() {
		if c.Now() < end {
			df.observe(pod, f)
			c.At(min(c.Now()+convergePoll, end), watch)
			return
		}
		if err := lift(); err != nil {
			df.err = fmt.Errorf("fault %s: %w", plan.kind, err)
			return
		}
		f.EndS = c.Now().Seconds()
		if routers {
			f.Probes = len(df.probes)
			df.converge(pod, c.Now(), f, nil, nil)
		}
	}
	watch()
}

// converge polls the first router's view of pod from end until it is
// routable with a fresh stream and its index holds exactly the pod's
// cached run of every probe prompt, or convergeBound passes. routable and
// fresh are when each became true for good.
func (df *desFaults) converge(pod int, end time.Duration, f *report.Fault, routable, fresh *float64) {
	c := df.c
	isFresh, isRoutable := df.observe(pod, f)
	since := (c.Now() - end).Seconds()
	routable = sinceIf(isRoutable, routable, since)
	fresh = sinceIf(isFresh, fresh, since)
	f.RoutableAfterS, f.FreshAfterS = routable, fresh
	switch {
	case !isRoutable:
		f.Mismatch = "a rank not routable"
	case !isFresh:
		f.Mismatch = "an event stream not fresh"
	default:
		ok, why := df.matches(pod)
		if ok {
			f.ConvergedAfterS, f.Mismatch = &since, ""
			return
		}
		f.Mismatch = why
	}
	if c.Now()-end < convergeBound {
		c.At(c.Now()+convergePoll, func() { df.converge(pod, end, f, routable, fresh) })
	}
}

// observe adds what the first router makes of pod now to f.RouterSaw and
// reports whether its stream is fresh and the pod routable.
func (df *desFaults) observe(pod int, f *report.Fault) (fresh, routable bool) {
	c := df.c
	if c.Routers() == 0 {
		return false, false
	}
	saw := func(what string) { noteSaw(f, what) }
	v := c.Verdict(0, pod)
	saw(v)
	reason := c.Reason(0, pod)
	if reason != "" {
		saw(reason)
	}
	return v == string(eventplane.VerdictFresh), reason == ""
}

// matches compares, for every probe prompt, the first router's confirmed
// run on pod with the pod's true cached run, in full blocks short of the
// prompt's last token.
func (df *desFaults) matches(pod int) (bool, string) {
	c := df.c
	bs := c.BlockSize()
	for k, ids := range df.probes {
		truth, err := c.CachedTokens(pod, ids)
		if err != nil {
			return false, err.Error()
		}
		held, err := c.ConfirmedBlocks(0, pod, ids)
		if err != nil {
			return false, err.Error()
		}
		if got, want := min(held, (len(ids)-1)/bs), truth/bs; got != want {
			return false, fmt.Sprintf("probe %d rank 0: router %d blocks, pod %d", k, got, want)
		}
	}
	return true, ""
}
