package brain

import (
	"strconv"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/internal/manualclock"
	"github.com/prefixrouter/prefixrouter/sim"
	"github.com/prefixrouter/prefixrouter/speculative"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// virtualFleet is a Virtual router in front of ranks it steps by hand.
type virtualFleet struct {
	t     *testing.T
	clk   *manualclock.Clock
	v     *Virtual
	ids   []targetid.ID
	ranks map[targetid.ID]*sim.Rank
	seqs  map[targetid.ID]uint64
	now   time.Duration
}

// virtualMaxRetries is the serve command's --max-retries default.
const virtualMaxRetries = 2

func newVirtualFleet(t *testing.T, p Policy, pods int) *virtualFleet {
	t.Helper()
	prof, err := sim.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	f := &virtualFleet{t: t, clk: manualclock.New(), ranks: map[targetid.ID]*sim.Rank{}, seqs: map[targetid.ID]uint64{}}
	for i := range pods {
		id := targetid.ID{Endpoint: "http://pod-" + strconv.Itoa(i) + ":8000"}
		f.ids = append(f.ids, id)
		if f.ranks[id], err = sim.NewRank(sim.Config{Profile: prof}, i); err != nil {
			t.Fatal(err)
		}
	}
	// The serve command's defaults (router.DefaultConfig's sections).
	ev := eventplane.DefaultConfig()
	ev.BlockSize = prof.BlockSize
	f.v, err = NewVirtual(VirtualConfig{Policy: p, Cost: DefaultCostConfig(), Events: ev, Speculative: speculative.DefaultConfig(),
		Health: health.DefaultConfig(), Model: prof.Model, Targets: f.ids, NumGPUBlocks: prof.NumGPUBlocks, Now: f.clk.Now, MaxRetries: virtualMaxRetries})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// serve routes a prompt, runs it on its rank to the end and, with
// deliver, hands the rank's KV events to the router. It returns the
// request.
func (f *virtualFleet) serve(prompt []uint32, deliver bool) *VirtualRequest {
	f.t.Helper()
	vr, err := f.v.Route(prompt, nil, "")
	if err != nil {
		f.t.Fatal(err)
	}
	r := f.ranks[vr.Target()]
	q, err := r.Add(prompt, 2, f.now)
	if err != nil {
		f.t.Fatal(err)
	}
	f.run(r, func() {
		if q.Snapshot().Generated > 0 {
			vr.FirstByte()
		}
	})
	vr.Finish(true, q.Snapshot().CachedTokens)
	f.events(vr.Target(), deliver)
	return vr
}

// run steps rank r until it is idle, calling stepped after each step.
func (f *virtualFleet) run(r *sim.Rank, stepped func()) {
	for !r.Idle() {
		d := r.Step(f.now)
		f.now += d
		f.clk.Advance(d)
		r.FinishStep(f.now)
		stepped()
	}
}

// events takes pod id's KV events from its rank and, with deliver, hands
// them to the router.
func (f *virtualFleet) events(id targetid.ID, deliver bool) {
	for _, b := range f.ranks[id].Events() {
		if deliver {
			f.v.Deliver(id, f.seqs[id], &b)
		}
		f.seqs[id]++
	}
	f.v.Evaluate()
}

func promptOf(n int, seed uint32) []uint32 {
	p := make([]uint32, n)
	for i := range p {
		p[i] = seed + uint32(i)
	}
	return p
}

func TestVirtualRoutesToTheConfirmedHolder(t *testing.T) {
	for _, p := range []Policy{PolicyPrecise, PolicySpeculative} {
		t.Run(p.String(), func(t *testing.T) {
			f := newVirtualFleet(t, p, 3)
			prompt := promptOf(200, 7)
			first := f.serve(prompt, true)
			if first.PredictedCached() != 0 {
				t.Fatalf("a first prompt predicted %d cached tokens", first.PredictedCached())
			}
			for range 4 {
				again := f.serve(prompt, true)
				if again.Target() != first.Target() {
					t.Fatalf("the same prompt went to %s, not its holder %s", again.Target(), first.Target())
				}
				if again.PredictedCached() != 192 {
					t.Errorf("predicted %d cached tokens, want the 12 full blocks before the last token", again.PredictedCached())
				}
			}
			if v := f.v.Verdict(first.Target()); v != eventplane.VerdictFresh {
				t.Errorf("holder's stream %s, want fresh", v)
			}
		})
	}
}

func TestVirtualSpeculativeFollowsItsPredictions(t *testing.T) {
	// Without the first request's events, only predictions can keep the
	// second on the first's pod. The first has had its first byte: its
	// prefix is computed, so following it costs no wait (an idle fleet
	// does not stack a follower behind a prefill still queued).
	for _, tc := range []struct {
		p    Policy
		same bool
	}{{PolicySpeculative, true}, {PolicyPrecise, false}} {
		t.Run(tc.p.String(), func(t *testing.T) {
			f := newVirtualFleet(t, tc.p, 8)
			prompt := promptOf(400, 3)
			vr, err := f.v.Route(prompt, nil, "")
			if err != nil {
				t.Fatal(err)
			}
			vr.FirstByte()
			next, err := f.v.Route(prompt, nil, "")
			if err != nil {
				t.Fatal(err)
			}
			same := next.Target() == vr.Target()
			if tc.same && (!same || next.PredictedCached() == 0) {
				t.Errorf("follower went to %s predicting %d cached tokens, want %s on its predictions", next.Target(), next.PredictedCached(), vr.Target())
			}
			if !tc.same && next.PredictedCached() != 0 {
				t.Errorf("precise predicted %d cached tokens with no event", next.PredictedCached())
			}
			if v, ok := f.v.Speculative(); ok != (tc.p == PolicySpeculative) || (ok && v.Overall.Funnel.Inserted == 0) {
				t.Errorf("speculative view %v, inserted %d", ok, v.Overall.Funnel.Inserted)
			}
		})
	}
}

func TestVirtualRoundRobinAndLoad(t *testing.T) {
	f := newVirtualFleet(t, PolicyRoundRobin, 3)
	seen := map[targetid.ID]int{}
	for range 6 {
		vr, err := f.v.Route(promptOf(50, 1), nil, "")
		if err != nil {
			t.Fatal(err)
		}
		seen[vr.Target()]++
	}
	for _, id := range f.ids {
		if seen[id] != 2 {
			t.Errorf("round-robin sent %d of 6 to %s, want 2", seen[id], id)
		}
	}

	ll := newVirtualFleet(t, PolicyLeastLoad, 2)
	ll.v.Scrape(ll.ids[0], 9, 4, 0.5, time.Time{})
	for range 3 {
		vr, err := ll.v.Route(promptOf(50, 1), nil, "")
		if err != nil {
			t.Fatal(err)
		}
		if vr.Target() != ll.ids[1] {
			t.Errorf("least load chose %s, whose scrape says 13 requests", vr.Target())
		}
	}
}

func TestNewVirtualRefusesAnIncompleteConfig(t *testing.T) {
	ids := []targetid.ID{{Endpoint: "http://a:8000"}}
	for name, cfg := range map[string]VirtualConfig{
		"no clock":      {Policy: PolicyPrecise, Events: eventplane.Config{BlockSize: 16}, Targets: ids},
		"no block size": {Policy: PolicyPrecise, Targets: ids, Now: time.Now},
		"no targets":    {Policy: PolicyPrecise, Events: eventplane.Config{BlockSize: 16}, Now: time.Now},
	} {
		if _, err := NewVirtual(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestVirtualFleetChanges: what the des engine's faults do to a virtual
// router: failed probes take a target down and a good one brings it back;
// an unlisted target gets no request and comes back awaiting its probe
// with its placements forgotten; a retry avoids the targets its request
// failed on, up to MaxRetries; a new process start time clears the
// target's placements.
func TestVirtualFleetChanges(t *testing.T) {
	f := newVirtualFleet(t, PolicyPrecise, 3)
	prompt := promptOf(200, 5)
	holder := f.serve(prompt, true).Target()
	held := func() int {
		n, err := f.v.ConfirmedBlocks(holder, prompt)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if held() != 12 {
		t.Fatalf("holder holds %d blocks, want 12", held())
	}

	for range health.DefaultConfig().FailureThreshold {
		f.v.Probe(holder, false)
	}
	if f.v.Routable(holder) || f.v.Reason(holder) != "probe_failed" {
		t.Fatalf("after failed probes: routable %v, reason %q", f.v.Routable(holder), f.v.Reason(holder))
	}
	if vr := f.serve(prompt, false); vr.Target() == holder {
		t.Fatal("a request went to a target whose probes fail")
	}
	for range health.DefaultConfig().SuccessThreshold {
		f.v.Probe(holder, true)
	}
	if !f.v.Routable(holder) {
		t.Fatalf("after good probes: reason %q", f.v.Reason(holder))
	}

	f.v.Unlist(holder)
	for range 4 {
		if vr := f.serve(promptOf(50, 9), false); vr.Target() == holder {
			t.Fatal("a request went to an unlisted target")
		}
	}
	if f.v.Routable(holder) || f.v.Reason(holder) != "removed" || held() != 0 {
		t.Fatalf("unlisted: routable %v, reason %q, %d blocks held", f.v.Routable(holder), f.v.Reason(holder), held())
	}
	if err := f.v.List(holder); err != nil {
		t.Fatal(err)
	}
	if f.v.Routable(holder) || f.v.Reason(holder) != "awaiting_probe" {
		t.Fatalf("listed again: routable %v, reason %q", f.v.Routable(holder), f.v.Reason(holder))
	}
	// As health's prober brings up an endpoint it never saw up: on its
	// first good probe.
	f.v.Probe(holder, true)
	if !f.v.Routable(holder) {
		t.Fatalf("listed and probed once: reason %q", f.v.Reason(holder))
	}

	prompt = promptOf(200, 11)
	holder = f.serve(prompt, true).Target()
	f.v.Scrape(holder, 0, 0, 0, time.Unix(1, 0))
	if held() != 12 {
		t.Fatalf("holder holds %d blocks, want 12", held())
	}
	f.v.Scrape(holder, 0, 0, 0, time.Unix(2, 0))
	if held() != 0 {
		t.Fatalf("after a new process start time the index holds %d blocks on it", held())
	}

	vr, err := f.v.Route(prompt, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	tried := map[targetid.ID]bool{vr.Target(): true}
	for n := range virtualMaxRetries + 1 {
		vr.Finish(false, 0)
		next := vr.Retry()
		if n == virtualMaxRetries || len(tried) == len(f.ids) {
			if next != nil {
				t.Fatalf("retry %d went to %s after %d targets failed", n+1, next.Target(), len(tried))
			}
			break
		}
		if next == nil || tried[next.Target()] {
			t.Fatalf("retry %d: %v, after %v", n+1, next, tried)
		}
		tried[next.Target()] = true
		vr = next
	}
}

// TestVirtualRetryIsTheSameRequest: a retry on another target is the same
// request, as the API's is: its id, and so its holdback arm, stay those
// of its first attempt (a new draw would move a conversation between the
// arms the holdback compares).
func TestVirtualRetryIsTheSameRequest(t *testing.T) {
	f := newVirtualFleet(t, PolicySpeculative, 3)
	ev := eventplane.DefaultConfig()
	ev.BlockSize = 16
	spec := speculative.DefaultConfig()
	spec.Holdback = 0.5
	hc := health.DefaultConfig()
	hc.BreakerFailures = 1000 // each request's first attempt fails on purpose
	v, err := NewVirtual(VirtualConfig{Policy: PolicySpeculative, Cost: DefaultCostConfig(), Events: ev, Speculative: spec, Health: hc,
		Model: "m", Targets: f.ids, NumGPUBlocks: 1000, Now: f.clk.Now, MaxRetries: 2})
	if err != nil {
		t.Fatal(err)
	}
	arms := map[speculative.Arm]int{}
	for i := range 40 {
		prompt := promptOf(64, uint32(1000*i))
		vr, err := v.Route(prompt, nil, "")
		if err != nil {
			t.Fatal(err)
		}
		vr.Finish(false, 0)
		next := vr.Retry()
		if next == nil {
			t.Fatal("no retry")
		}
		if next.id != vr.id || next.d.arm != vr.d.arm {
			t.Fatalf("request %d: retried as %s in arm %v, first %s in arm %v", i, next.id, next.d.arm, vr.id, vr.d.arm)
		}
		arms[vr.d.arm]++
		next.Finish(true, 0)
	}
	if len(arms) < 2 {
		t.Fatalf("every request drew one arm (%v): the test shows nothing", arms)
	}
}

// TestRetryReadsTheFleetAsItIsNow: a retry is decided on the index as it
// stands when the first target failed, not as the first decision read it:
// a pod that reported the prompt's blocks in between holds the retry,
// with its confirmed run. Both drivers retry so: the HTTP path among the
// first decision's targets (Offered), the engine among the fleet.
func TestRetryReadsTheFleetAsItIsNow(t *testing.T) {
	for _, drv := range []string{"offered", "fleet"} {
		t.Run(drv, func(t *testing.T) {
			f := newVirtualFleet(t, PolicyPrecise, 3)
			prompt := promptOf(200, 7)
			holder := f.serve(prompt, true).Target()
			vr, err := f.v.Route(prompt, nil, "")
			if err != nil {
				t.Fatal(err)
			}
			if vr.Target() != holder {
				t.Fatalf("the prompt went to %s, not its holder %s", vr.Target(), holder)
			}
			full, err := f.v.dec.Decide(Input{Model: f.v.model, Targets: f.v.listed(), Prompt: IDsPrompt(prompt)})
			if err != nil {
				t.Fatal(err)
			}
			// Another pod computes the prompt for a client this router
			// did not see, and says so, while the request is on its way.
			other := f.ids[0]
			if other == holder {
				other = f.ids[1]
			}
			f.runAlone(other, prompt)
			vr.Finish(false, 0)
			var target targetid.ID
			var confirmed int
			switch drv {
			case "offered":
				d, ok := full.Retry(full.Offered())
				if !ok {
					t.Fatal("no retry")
				}
				target, confirmed = d.Target().Target.ID, d.Target().ConfirmedBlocks
				if d.Attempts() != 2 {
					t.Fatalf("the retry is attempt %d, want 2", d.Attempts())
				}
			case "fleet":
				next := vr.Retry()
				if next == nil {
					t.Fatal("no retry")
				}
				target, confirmed = next.Target(), next.ConfirmedBlocks()
				next.Finish(true, 0)
			}
			if target != other || confirmed != 12 {
				t.Fatalf("retried on %s with %d confirmed blocks, want %s with its 12", target, confirmed, other)
			}
		})
	}
}

// runAlone runs prompt on pod id's rank without the router, and hands the
// router the KV events the rank published.
func (f *virtualFleet) runAlone(id targetid.ID, prompt []uint32) {
	f.t.Helper()
	r := f.ranks[id]
	if _, err := r.Add(prompt, 2, f.now); err != nil {
		f.t.Fatal(err)
	}
	f.run(r, func() {})
	f.events(id, true)
}
