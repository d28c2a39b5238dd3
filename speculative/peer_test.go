package speculative

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func peerView(t *testing.T, r *rig, origin string) PeerView {
	t.Helper()
	for _, p := range r.View().Peers {
		if p.Origin == origin {
			return p
		}
	}
	t.Fatalf("no origin %q in the view", origin)
	return PeerView{}
}

// TestPeerPredictions: a peer replica's predictions are looked up like
// local ones, confirmed by the same events and end on their own deadline,
// but every outcome is counted under their origin, never in the target's
// cohorts (trust and TTL rest on local predictions alone).
func TestPeerPredictions(t *testing.T) {
	tests := []struct {
		name string
		// run receives the rig and the origin's placement, and acts.
		run  func(r *rig, h *Placement)
		want func(t *testing.T, p PeerView)
	}{
		{
			name: "confirmed by the target's event",
			run:  func(r *rig, _ *Placement) { r.step(100 * time.Millisecond); r.confirm(podA, keyRange(0, 8)) },
			want: func(t *testing.T, p PeerView) {
				if p.Confirmed != 8 || p.MatureTotal.Confirmed != 8 || p.MatureTotal.Expired != 0 {
					t.Fatalf("confirmed %d, mature %+v", p.Confirmed, p.MatureTotal)
				}
			},
		},
		{
			name: "expires on the origin's deadline",
			run:  func(r *rig, _ *Placement) { r.step(600 * time.Millisecond) },
			want: func(t *testing.T, p PeerView) {
				if p.MatureTotal.Expired != 8 || p.MatureTotal.ExpiredStale != 8 || p.Confirmed != 0 {
					t.Fatalf("mature %+v", p.MatureTotal)
				}
			},
		},
		{
			name: "withdrawn by the origin",
			run:  func(_ *rig, h *Placement) { h.Withdraw() },
			want: func(t *testing.T, p PeerView) {
				if p.MatureTotal.Withdrawn != 8 {
					t.Fatalf("mature %+v", p.MatureTotal)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, Config{MaxStale: time.Second})
			o, err := r.Origin("router-b")
			if err != nil {
				t.Fatal(err)
			}
			h := r.PredictFrom(o, dispatch(podA, ""), keyRange(0, 8), r.clock.Now().Add(500*time.Millisecond))
			if ext := r.Lookup(podA, keyRange(0, 10), 0); ext.Blocks != 8 {
				t.Fatalf("lookup found %d predicted blocks, want the peer's 8", ext.Blocks)
			}
			tc.run(r, h)
			r.settle(8 * time.Second)
			tc.want(t, peerView(t, r, "router-b"))
			tv := r.targetView(t, podA)
			if tv.MatureTotal.Inserted != 0 || tv.Funnel.Inserted != 0 || tv.Funnel.Confirmed != 0 || tv.Latency.Confirmed.Samples != 0 {
				t.Fatalf("the peer's predictions reached the target's own accounting: %+v %+v", tv.MatureTotal, tv.Funnel)
			}
			if tv.Trust.Posterior != priorMean {
				t.Fatalf("trust %v moved on a peer's predictions", tv.Trust.Posterior)
			}
		})
	}
}

// TestPeerClaimsAndDeadlines: a local prediction of a block a peer
// predicted is a claim, not a new one, and survives the peer's
// withdrawal; a deadline already past is not inserted; one beyond the
// stale window is capped at it.
func TestPeerClaimsAndDeadlines(t *testing.T) {
	r := newRig(t, Config{MaxStale: time.Second})
	o, _ := r.Origin("router-b")
	now := r.clock.Now()
	if h := r.PredictFrom(o, dispatch(podA, ""), keyRange(0, 4), now.Add(-time.Millisecond)); h != nil {
		t.Fatal("a prediction past its deadline was inserted")
	}
	h := r.PredictFrom(o, dispatch(podA, ""), keyRange(0, 4), now.Add(time.Hour))
	local := r.Predict(dispatch(podA, "req"), keyRange(0, 6))
	if tv := r.targetView(t, podA); tv.Funnel.Inserted != 2 {
		t.Fatalf("local inserted %d, want the 2 blocks the peer had not predicted", tv.Funnel.Inserted)
	}
	h.Withdraw()
	if ext := r.Lookup(podA, keyRange(0, 6), 0); ext.Blocks != 6 {
		t.Fatalf("after the peer's withdrawal the local claims keep %d blocks, want 6", ext.Blocks)
	}
	r.step(1100 * time.Millisecond)
	if ext := r.Lookup(podA, keyRange(0, 6), 0); ext.Blocks != 0 {
		t.Fatalf("a peer deadline of an hour outlived the 1s stale window: %d blocks", ext.Blocks)
	}
	_ = local
	p := peerView(t, r, "router-b")
	if p.ArrivedExpired != 1 || p.Inserted != 4 {
		t.Fatalf("peer view %+v", p)
	}
}

// TestPeerFalseWarmBlamesTheOrigin: a local follower routed on a peer's
// prediction that expires is false-warm in the target's funnel (it is this
// replica's route) and blamed on the origin.
func TestPeerFalseWarmBlamesTheOrigin(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := newRigOn(t, Config{MaxStale: time.Second}, reg)
	o, _ := r.Origin("router-b")
	r.PredictFrom(o, dispatch(podA, ""), keyRange(0, 4), r.clock.Now().Add(300*time.Millisecond))
	ext := r.Lookup(podA, keyRange(0, 4), 0)
	f := r.Follow(ext.Ref, "follower")
	if f == nil {
		t.Fatal("no follower")
	}
	r.settle(8 * time.Second)
	f.record(64, 0, true)
	p := peerView(t, r, "router-b")
	if p.FalseWarm.Routes != 1 || p.FalseWarm.Tokens != 64 || p.Followed != 4 {
		t.Fatalf("peer view %+v", p)
	}
	if tv := r.targetView(t, podA); tv.FalseWarm.Routes != 1 || tv.Funnel.Followed != 0 {
		t.Fatalf("target false warm %+v, followed %d", tv.FalseWarm, tv.Funnel.Followed)
	}
	want := `
# HELP prefixrouter_speculative_peer_false_warm_routes_total This replica's routes on a peer replica's prediction that later expired unconfirmed or was withdrawn.
# TYPE prefixrouter_speculative_peer_false_warm_routes_total counter
prefixrouter_speculative_peer_false_warm_routes_total{origin="router-b"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "prefixrouter_speculative_peer_false_warm_routes_total"); err != nil {
		t.Fatal(err)
	}
}

// TestOriginsAreBounded: the origin label has at most MaxOrigins values.
func TestOriginsAreBounded(t *testing.T) {
	r := newRig(t, Config{})
	for i := range MaxOrigins {
		if _, err := r.Origin(fmt.Sprint("r", i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Origin("r0"); err != nil {
		t.Fatalf("a known origin refused: %v", err)
	}
	if _, err := r.Origin("one-too-many"); err == nil {
		t.Fatal("origin beyond the bound accepted")
	}
}
