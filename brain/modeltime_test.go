package brain

import (
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/speculative"
)

// TestModelSpeculativePairedGaps is the paired-gap matrix on model time
// (the live TestSimSpeculativePairedGaps raced its sleeps against the
// pods' clocks): a pair of requests sharing the prefix, the second sent a
// gap after the first's answer, against the pods' event delay and a fixed
// TTL. Below the delay the second request is routed on the prediction;
// once the event arrived, on the confirmed run. With events later than
// the TTL, the gap between expiry and event is the blind spot the
// predictions cannot cover, and the route says so.
func TestModelSpeculativePairedGaps(t *testing.T) {
	type cell struct {
		gap  time.Duration
		want string // prediction, confirmed or nothing
	}
	for _, tc := range []struct {
		name       string
		delay, ttl time.Duration
		cells      []cell
	}{
		{"events before the TTL", 400 * time.Millisecond, time.Second, []cell{
			{0, "prediction"},
			{100 * time.Millisecond, "prediction"},
			{399 * time.Millisecond, "prediction"}, // a hair before the event
			{400 * time.Millisecond, "confirmed"},  // the event arrived
			{700 * time.Millisecond, "confirmed"},
			{900 * time.Millisecond, "confirmed"},  // near the TTL
			{1500 * time.Millisecond, "confirmed"}, // beyond the TTL
		}},
		{"events after the TTL", 1500 * time.Millisecond, 600 * time.Millisecond, []cell{
			{100 * time.Millisecond, "prediction"}, // well within the TTL
			{1000 * time.Millisecond, "nothing"},   // expired, the event not yet in
			{2300 * time.Millisecond, "confirmed"}, // the late event arrived
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newModelFleet(t, 3, 1, tc.delay, false, func(c *speculative.Config) { c.TTL, c.MaxStale = tc.ttl, 3*time.Second })
			for i, c := range tc.cells {
				first, _ := f.serve(0, pairPrompt(i, 0))
				f.wait(c.gap)
				second, _ := f.serve(0, pairPrompt(i, 1))
				got := basis(second)
				if got != c.want || got != "nothing" && second.Target() != first.Target() {
					t.Errorf("gap %v (event delay %v, TTL %v): routed to %s on %s (%s), want %s on the holder %s",
						c.gap, tc.delay, tc.ttl, second.Target(), got, second.d.reason, c.want, first.Target())
				}
				// Every batch of the pair in before the next pair.
				f.wait(tc.delay)
			}
		})
	}
}

// TestModelSpeculativeLateEventsExpireEarly: events delayed beyond a fixed
// TTL arrive after the predictions expired, within the grace window: the
// expiries are early, not stale, and the late latency is the delay (from
// the route: the delay plus the prefill).
func TestModelSpeculativeLateEventsExpireEarly(t *testing.T) {
	t.Parallel()
	f := newModelFleet(t, 1, 1, 700*time.Millisecond, false, func(c *speculative.Config) { c.TTL = 200 * time.Millisecond })
	start := f.now
	f.serve(0, pairPrompt(0, 0))
	prefill := f.now - start
	f.mature()
	v := f.targetView(0, 0)
	if out := v.MatureTotal; out.ExpiredEarly < modelPrefixBlocks || out.ExpiredStale != 0 || out.Confirmed != 0 {
		t.Fatalf("outcomes %+v, want every prediction expired early", out)
	}
	late := v.Latency.Late
	if late.Samples == 0 || *late.P50 < 0.7 || *late.P50 > (700*time.Millisecond+prefill).Seconds() {
		t.Fatalf("late latency %+v, want samples at the 700ms delay after a %v prefill", late, prefill)
	}
}

// TestModelSpeculativeFollowerFindsThePrediction: a request that shares a
// prefix with one just answered, sent before the holder's KV events can
// arrive, goes to the holder on its predicted run and the pod serves the
// prefix from cache; the events then confirm every prediction before its
// deadline, the event delay the route-to-confirmation latency, and no
// route was false-warm.
func TestModelSpeculativeFollowerFindsThePrediction(t *testing.T) {
	t.Parallel()
	f := newModelFleet(t, 3, 1, 400*time.Millisecond, false, nil)
	first, _ := f.serve(0, pairPrompt(0, 0))
	second, cached := f.serve(0, pairPrompt(0, 1))
	if second.Target() != first.Target() || basis(second) != "prediction" {
		t.Fatalf("follower routed to %s (%s); the prefix was just computed on %s", second.Target(), second.d.reason, first.Target())
	}
	if cached < modelPrefixTokens {
		t.Fatalf("follower served %d cached tokens, want the %d-token prefix", cached, modelPrefixTokens)
	}
	f.mature()
	v := f.targetView(0, f.pod(first.Target()))
	if out := v.MatureTotal; out.Confirmed < modelPrefixBlocks || out.Expired != 0 || out.Withdrawn != 0 || out.Unknown != 0 {
		t.Fatalf("outcomes %+v, want every prediction confirmed", out)
	}
	if v.FalseWarm.Routes != 0 || v.Funnel.FollowerRoutes != 1 || v.Funnel.FollowerCachedTokens != uint64(cached) {
		t.Fatalf("funnel %+v, false warm %+v: want one follower with its %d cached tokens", v.Funnel, v.FalseWarm, cached)
	}
	if p50 := v.Latency.Confirmed.P50; p50 == nil || *p50 < 0.4 {
		t.Fatalf("confirmation latency p50 %v, want at least the 400ms event delay", p50)
	}
}

// replicaFollowers is how many of the followers of groups prefixes, sent
// back to back to replicas router replicas in turn (leader on the first,
// followers on the second, first, second...), each after the previous one
// answered, landed on their leader's pod, in front of four pods whose
// events are held back 600 ms. It fails the test if a follower saw a
// confirmed run: every one must come inside the event gap, so that only a
// prediction can lead it to the holder.
func replicaFollowers(t *testing.T, replicas int, share bool) (onHolder, followers int) {
	t.Helper()
	const groups, perGroup = 12, 3
	f := newModelFleet(t, 4, replicas, 600*time.Millisecond, share, nil)
	n := 0
	next := func() int {
		ri := n % replicas
		n++
		return ri
	}
	for g := range groups {
		leader, _ := f.serve(next(), pairPrompt(g, 0))
		for i := 1; i <= perGroup; i++ {
			// As the live test waits until what each replica shared has
			// reached the others: the predictions, and the in-flight work
			// of the request just answered, gone.
			f.wait(f.peerDelay)
			got, _ := f.serve(next(), pairPrompt(g, i))
			if got.ConfirmedBlocks() != 0 {
				t.Fatalf("group %d's follower %d saw a confirmed run of %d blocks: it came after the events", g, i, got.ConfirmedBlocks())
			}
			followers++
			if got.Target() == leader.Target() {
				onHolder++
			}
		}
	}
	return onHolder, followers
}

// TestModelReplicasSharePredictions (the timing of the live
// TestSimReplicasSharePredictions): followers of a prefix sent alternately
// to two router replicas inside the event gap land on the pod that holds
// the prefix when the replicas share their predictions as often as one
// replica alone does, and miss it without sharing (the second replica sees
// no holder and picks on load).
func TestModelReplicasSharePredictions(t *testing.T) {
	t.Parallel()
	aloneOn, aloneN := replicaFollowers(t, 1, false)
	sharedOn, sharedN := replicaFollowers(t, 2, true)
	apartOn, apartN := replicaFollowers(t, 2, false)
	t.Logf("followers on the holder: one replica %d/%d, two sharing %d/%d, two apart %d/%d", aloneOn, aloneN, sharedOn, sharedN, apartOn, apartN)
	if aloneOn != aloneN {
		t.Errorf("one replica put %d of %d followers on the holder, want all", aloneOn, aloneN)
	}
	if sharedOn != aloneOn {
		t.Errorf("sharing put %d of %d followers on the holder, one replica %d", sharedOn, sharedN, aloneOn)
	}
	// Apart, the followers the second replica routes first in a group
	// (one in three) see no holder.
	if float64(apartOn) >= 0.9*float64(aloneOn) {
		t.Errorf("without sharing %d of %d followers found the holder, as many as one replica's %d: the test shows nothing", apartOn, apartN, aloneOn)
	}
}

// TestModelPeerPredictionsAccounted (the timing of the live
// TestSimPeerPredictionsAccounted): a prediction one replica shares
// reaches the other long before the pod's events and is counted there
// under its origin, apart from the local ones, and confirmed by the
// events; the other's in-flight work on a pod shows in this one's load
// and goes when answered; a withdrawal reaches the other replica.
func TestModelPeerPredictionsAccounted(t *testing.T) {
	t.Parallel()
	f := newModelFleet(t, 2, 2, 300*time.Millisecond, true, nil)
	f.serve(0, pairPrompt(0, 0))
	f.mature()
	p := f.peerView(1, "router-0")
	if p.Inserted < modelPrefixBlocks || p.Confirmed < modelPrefixBlocks || p.MatureTotal.Confirmed < modelPrefixBlocks || p.ArrivedExpired != 0 {
		t.Fatalf("router-1's view of router-0's predictions %+v, want the prompt's inserted and confirmed", p)
	}
	for pod := range f.ids {
		if tv := f.targetView(1, pod); tv.Funnel.Inserted != 0 || tv.MatureTotal.Inserted != 0 {
			t.Fatalf("router-1 counted router-0's predictions as its own on pod %d: %+v", pod, tv.Funnel)
		}
	}

	// Work router-0 dispatched and that has no first byte yet shows in
	// router-1's load of its pod, apart from its own, a peer delay later.
	vr := f.route(0, pairPrompt(1, 0))
	pod := f.pod(vr.Target())
	peers := func() (queued, prefilling int64) {
		b := f.rts[1].targets[pod].Busy()
		return b.Peers.QueuedUncachedTokens, b.Peers.Prefilling
	}
	if q, _ := peers(); q != 0 {
		t.Fatalf("router-1 knows router-0's dispatch before the peer delay: %d queued tokens", q)
	}
	f.wait(f.peerDelay)
	own := f.rts[0].Flights(f.ids[pod])
	if q, n := peers(); q != own.QueuedUncachedTokens || q == 0 || n != 1 {
		t.Fatalf("router-1 sees %d queued tokens in %d prefills of router-0's on pod %d; router-0 has %+v", q, n, pod, own)
	}
	f.run(0, vr, pairPrompt(1, 0))
	f.wait(f.peerDelay)
	if b := f.rts[1].targets[pod].Busy(); !b.Peers.IsZero() {
		t.Fatalf("router-0's answered work still in router-1's load: %+v", b.Peers)
	}

	// A request the pod turns down before its first byte withdraws its
	// predictions at router-0 and, through its withdrawal, at router-1.
	before := f.peerView(1, "router-0").MatureTotal.Withdrawn
	f.fail(0, f.route(0, pairPrompt(2, 0)))
	f.mature()
	if got := f.peerView(1, "router-0").MatureTotal.Withdrawn - before; got < modelPrefixBlocks {
		t.Fatalf("router-1 matured %d of router-0's predictions withdrawn, want the prompt's %d", got, modelPrefixBlocks)
	}
}

// TestModelSpeculativeRejectionWithdraws (the timing of the live
// TestSimSpeculativeRejectionWithdraws, which raced a 500 ms event delay
// against a 1 s TTL): a request its pod turns down before its first byte
// withdraws its predictions at once — one retried on the other pod, whose
// predictions the events confirm, and one answered with the pod's error
// (no retry) — and no follower is routed on them.
func TestModelSpeculativeRejectionWithdraws(t *testing.T) {
	t.Parallel()
	f := newModelFleet(t, 2, 1, 500*time.Millisecond, false, func(c *speculative.Config) { c.TTL = time.Second })

	// A failed prefill step, retried.
	prompt := pairPrompt(0, 0)
	vr := f.route(0, prompt)
	bad := f.pod(vr.Target())
	if basis(vr) != "nothing" || f.targetView(0, bad).Pending.Live < modelPrefixBlocks {
		t.Fatalf("first request routed on %s with %d live predictions, want nothing and its prompt predicted", basis(vr), f.targetView(0, bad).Pending.Live)
	}
	f.fail(0, vr)
	if live := f.targetView(0, bad).Pending.Live; live != 0 {
		t.Fatalf("%d predictions still live on the pod that failed before its first byte", live)
	}
	retry := vr.Retry()
	if retry == nil {
		t.Fatal("no retry")
	}
	good := f.pod(retry.Target())
	if good == bad {
		t.Fatalf("retried on the pod that failed, %s", retry.Target())
	}
	f.run(0, retry, prompt)
	f.mature()
	if out := f.targetView(0, bad).MatureTotal; out.Withdrawn < modelPrefixBlocks || out.Confirmed != 0 || out.Expired != 0 {
		t.Fatalf("failing pod's outcomes %+v, want the prompt's predictions withdrawn", out)
	}
	if out := f.targetView(0, good).MatureTotal; out.Confirmed < modelPrefixBlocks || out.Withdrawn != 0 {
		t.Fatalf("retried pod's outcomes %+v, want the prompt's predictions confirmed", out)
	}

	// A request the pod refuses (beyond its context), its error relayed:
	// a follower sent at once, long before any TTL, finds no prediction.
	before, _ := f.rts[0].Speculative()
	rejected := f.route(0, pairPrompt(1, 0))
	f.fail(0, rejected)
	if v, _ := f.rts[0].Speculative(); v.Overall.Pending.Live != 0 {
		t.Fatalf("%d predictions live after the rejection", v.Overall.Pending.Live)
	}
	if follower, _ := f.serve(0, pairPrompt(1, 1)); basis(follower) == "prediction" {
		t.Fatalf("a follower of the rejected request was routed on its predictions: %s", follower.d.reason)
	}
	f.mature()
	after, _ := f.rts[0].Speculative()
	if got := after.Overall.MatureTotal.Withdrawn - before.Overall.MatureTotal.Withdrawn; got < modelPrefixBlocks || after.Overall.MatureTotal.Expired != 0 {
		t.Fatalf("the rejection matured %d predictions withdrawn (outcomes %+v), want the prompt's %d, none expired", got, after.Overall.MatureTotal, modelPrefixBlocks)
	}
}

// TestModelSpeculativeClientCancelKeepsPredictions: a client that goes
// away at its first byte, its event 300 ms away (the live test's delay,
// which raced the TTL there), leaves the prompt's predictions live; the
// pod's events then confirm every one, none withdrawn or expired.
func TestModelSpeculativeClientCancelKeepsPredictions(t *testing.T) {
	t.Parallel()
	f := newModelFleet(t, 2, 1, 300*time.Millisecond, false, func(c *speculative.Config) { c.TTL = time.Second })
	prompt := pairPrompt(0, 0)
	vr := f.route(0, prompt)
	pod := f.pod(vr.Target())
	r := f.ranks[pod]
	q, err := r.Add(prompt, 1, f.now)
	if err != nil {
		t.Fatal(err)
	}
	for q.Snapshot().Generated == 0 {
		d := r.Step(f.now)
		f.advance(f.now + d)
		r.FinishStep(f.now)
		f.publish(pod)
	}
	vr.FirstByte()
	vr.Cancel()
	if v := f.targetView(0, pod).Pending; v.Live < modelPrefixBlocks || v.Confirmed != 0 {
		t.Fatalf("predictions at the cancel %+v, want the prompt's live and none confirmed yet", v)
	}
	f.mature()
	if out := f.targetView(0, pod).MatureTotal; out.Confirmed < modelPrefixBlocks || out.Withdrawn != 0 || out.Expired != 0 {
		t.Fatalf("outcomes after a client cancel %+v, want the prompt's predictions confirmed", out)
	}
}

// TestModelSpeculativeRestartInvalidates (the timing of the live
// TestSimSpeculativeRestartInvalidates, whose restart had to come within
// the pod's 2 s event delay): the pod restarts while its predictions wait
// for held-back events; the scrape that reads the new process start
// invalidates them at once, a follower's decision no longer counts them,
// and they mature invalidated, none confirmed.
func TestModelSpeculativeRestartInvalidates(t *testing.T) {
	t.Parallel()
	f := newModelFleet(t, 1, 1, 2*time.Second, false, func(c *speculative.Config) { c.MaxStale = 3 * time.Second })
	f.serve(0, pairPrompt(0, 0))
	// What a follower's decision counts, as the live test's dry run reads
	// it: nothing is dispatched.
	predicted := func() int {
		t.Helper()
		v := f.rts[0]
		d, err := v.dec.Decide(Input{Model: v.model, Targets: v.listed(), Prompt: IDsPrompt(pairPrompt(0, 1))})
		if err != nil {
			t.Fatal(err)
		}
		return d.Candidates()[0].SpeculativeBlocks
	}
	f.wait(time.Second) // the events still a second away
	if n := predicted(); n < modelPrefixBlocks {
		t.Fatalf("before the restart the follower's decision counts %d predicted blocks, want the prefix's %d", n, modelPrefixBlocks)
	}
	f.restart(0)
	if v := f.targetView(0, 0); v.Pending.Live != 0 || v.Invalidations["restarted"] == 0 {
		t.Fatalf("after the restart: %d live predictions, invalidations %v", v.Pending.Live, v.Invalidations)
	}
	if n := predicted(); n != 0 {
		t.Fatalf("after the restart the follower's decision still counts %d predicted blocks", n)
	}
	f.mature()
	if out := f.targetView(0, 0).MatureTotal; out.Invalidated < modelPrefixBlocks || out.Confirmed != 0 {
		t.Fatalf("outcomes %+v, want the old process's predictions invalidated, none confirmed", out)
	}
}

// TestModelSpeculativeDisconnectedStreamPausesTrust (the timing of the
// live TestSimSpeculativeDisconnectedStreamPausesTrust, whose close had to
// come within the pod's 2 s event delay): the pod's event stream goes
// away while its predictions are pending; at the next evaluation its
// trust drops to 0 and the predictions end "unknown", not expired — a
// broken pipe says nothing of how good they were.
func TestModelSpeculativeDisconnectedStreamPausesTrust(t *testing.T) {
	t.Parallel()
	f := newModelFleet(t, 1, 1, 2*time.Second, false, func(c *speculative.Config) { c.MaxStale = 3 * time.Second })
	f.serve(0, pairPrompt(0, 0))
	if tr := f.targetView(0, 0).Trust; !tr.StreamFresh || tr.Value == 0 {
		t.Fatalf("trust before the disconnection %+v, want the fresh stream trusted", tr)
	}
	f.wait(time.Second) // the events still a second away
	f.disconnect(0)
	f.wait(eventplane.DefaultConfig().EvalInterval)
	if tr := f.targetView(0, 0).Trust; tr.StreamFresh || tr.Value != 0 {
		t.Fatalf("trust an evaluation after the disconnection %+v, want paused", tr)
	}
	f.mature()
	if out := f.targetView(0, 0).MatureTotal; out.Unknown < modelPrefixBlocks || out.Expired != 0 || out.Confirmed != 0 {
		t.Fatalf("outcomes %+v, want the predictions unknown", out)
	}
}
