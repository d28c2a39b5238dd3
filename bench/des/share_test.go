package des

import (
	"context"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/bench/report"
	"github.com/prefixrouter/prefixrouter/bench/workload"
	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/sim"
)

// burstConfig is bursts of four siblings sharing a 2,000-token prefix, a
// burst a second, the siblings spread over 600 ms (after their first's
// prefill, inside the pods' 1 s event gap), on three pods behind two speculative
// routers: the second and fourth siblings reach the router their first
// did not.
func burstConfig(t *testing.T, share bool) Config {
	t.Helper()
	prof, err := sim.LookupProfile("h100x2-32b")
	if err != nil {
		t.Fatal(err)
	}
	spec := workload.Spec{Kind: workload.KindBurst, Seed: 1, Vocab: workload.Bytes, Rates: []float64{1}, StageDuration: 15 * time.Second,
		Arrival: workload.Constant, Siblings: 4, PrefixTokens: 2000, SuffixTokens: 50, OutputTokens: 20, Spread: 600 * time.Millisecond}
	w, err := workload.Build(spec, workload.Limits{KVTokens: 3 * prof.KVTokens(), MaxContext: prof.KVTokens()})
	if err != nil {
		t.Fatal(err)
	}
	holdback := 0.0
	fleet := sim.Config{Pods: 3, Profile: prof}
	fleet.Faults.EventDelay = time.Second
	// A follower waits for the holder's prefill whatever the fleet's
	// load (--reuse-wait 1): the test is about what replicas know of each
	// other's predictions, not about when waiting for a prefill pays.
	cost := brain.DefaultCostConfig()
	cost.ReuseWait = 1
	return Config{Workload: w, Fleet: fleet, Policy: "speculative", Routers: 2, SharePredictions: share, Seed: 1,
		Delivery: DefaultDelivery(), Holdback: &holdback, Drain: time.Minute, Cost: &cost}
}

// A router's predictions and in-flight work reach the other replica
// PeerDelay after its dispatch when they share, and never when they do
// not.
func TestSharedPredictionsReachPeerAfterDelay(t *testing.T) {
	for _, share := range []bool{false, true} {
		r, err := newRun(burstConfig(t, share))
		if err != nil {
			t.Fatal(err)
		}
		first := r.q.pop() // session 0, through router 0
		if first.kind != evSend || first.a != 0 {
			t.Fatalf("first event %+v: want session 0's send", first)
		}
		if err := r.handle(first); err != nil {
			t.Fatal(err)
		}
		sent := r.now
		peerView := func() []string {
			v, _ := r.rts[1].v.Speculative()
			var origins []string
			for _, p := range v.Peers {
				if p.Live > 0 {
					origins = append(origins, p.Origin)
				}
			}
			return origins
		}
		if got := peerView(); len(got) != 0 {
			t.Fatalf("share %v: router 1 holds peer predictions %v at the dispatch", share, got)
		}
		for r.q.len() > 0 && r.q.peek() <= sent+r.cfg.Delivery.PeerDelay {
			if err := r.handle(r.q.pop()); err != nil {
				t.Fatal(err)
			}
		}
		got := peerView()
		if !share {
			if len(got) != 0 || r.rts[1].peerFlights != nil {
				t.Errorf("not sharing: router 1 holds predictions of %v, peer flights %v", got, r.rts[1].peerFlights)
			}
			continue
		}
		if len(got) != 1 || got[0] != "router-0" {
			t.Errorf("sharing: router 1's live peer predictions are from %v %v after the dispatch; want router-0's", got, r.cfg.Delivery.PeerDelay)
		}
		pod := -1
		for _, it := range r.q.items {
			if it.kind == evArrive {
				pod = it.req.pod // still on its way to the pod
			}
		}
		if pod < 0 {
			t.Fatal("session 0's request is not on its way")
		}
		own := r.rts[0].v.Flights(r.pods[pod].id)
		if own.InFlight != 1 || r.rts[1].peerFlights[0][pod] != own {
			t.Errorf("sharing: router 1 knows %+v of router 0's flights on its pod; router 0 has %+v", r.rts[1].peerFlights[0][pod], own)
		}
	}
}

// Followers split across two replicas land on their burst's holder more
// when the replicas share their predictions: the second replica sees the
// first's prediction long before its follower arrives, where apart it sees
// no holder and picks on load.
func TestSharingLeadsFollowersToHolder(t *testing.T) {
	holder := map[bool]*report.Holder{}
	for _, share := range []bool{false, true} {
		res, err := Run(context.Background(), burstConfig(t, share))
		if err != nil {
			t.Fatal(err)
		}
		holder[share] = report.HolderOf(res.Records)
	}
	off, on := holder[false], holder[true]
	t.Logf("followers on the holder: apart %d of %d, sharing %d of %d", off.OnHolder, off.Followers, on.OnHolder, on.Followers)
	if on.Followers == 0 || on.OnHolder <= off.OnHolder || float64(on.OnHolder) < 0.9*float64(on.Followers) {
		t.Errorf("sharing put %d of %d followers on the holder, apart %d of %d: want more, and at least 90%%",
			on.OnHolder, on.Followers, off.OnHolder, off.Followers)
	}
}
