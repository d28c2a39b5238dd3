package speculative

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/logbuf"
	"github.com/prefixrouter/prefixrouter/internal/manualclock"
)

// TestFalseWarm: a follower routed on predictions is false-warm when one
// of them later expires unconfirmed or is withdrawn, whichever of its
// failure and its outcome comes first; its cost is predicted minus
// reported cached tokens.
func TestFalseWarm(t *testing.T) {
	keys := keyRange(0, 4)
	tests := []struct {
		name string
		// fate happens to the predictions after the follower was routed.
		fate          func(r *rig, h *Placement)
		outcomeFirst  bool
		reported      bool
		routes, tokns uint64
	}{
		{"confirmed: warm", func(r *rig, _ *Placement) { r.confirm(podA, keys) }, false, true, 0, 0},
		{"expired, outcome after", func(r *rig, _ *Placement) { r.step(3 * time.Second) }, false, true, 1, 600},
		{"expired, outcome before", func(r *rig, _ *Placement) { r.step(3 * time.Second) }, true, true, 1, 600},
		{"expired early is still false-warm", func(r *rig, _ *Placement) {
			r.step(3 * time.Second)
			r.confirm(podA, keys)
		}, false, true, 1, 600},
		{"expired, usage not reported: the route counts, not the tokens", func(r *rig, _ *Placement) { r.step(3 * time.Second) }, false, false, 1, 0},
		{"withdrawn", func(_ *rig, h *Placement) { h.Withdraw() }, false, true, 1, 600},
		{"invalidated: the cache was lost, not mispredicted", func(r *rig, _ *Placement) { r.Invalidate(podA, ReasonRestarted) }, false, true, 0, 0},
		{"unknown: the stream broke", func(r *rig, _ *Placement) {
			r.streams.set(podA, Stream{})
			r.step(3 * time.Second)
		}, false, true, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, DefaultConfig())
			h := r.Predict(dispatch(podA, "leader"), keys)
			r.step(100 * time.Millisecond)
			ext := r.Lookup(podA, keys, 0)
			f := r.Follow(ext.Ref, "follower")
			if f == nil {
				t.Fatal("no follower")
			}
			out := Outcome{Model: "m", PromptTokens: 1000, PredictedCached: 640, ReportedCached: 40, CachedReported: tt.reported, Follower: f}
			if tt.outcomeFirst {
				r.Record(out)
			}
			tt.fate(r, h)
			if !tt.outcomeFirst {
				r.Record(out)
			}
			r.Record(out) // a second record changes nothing
			fw := r.targetView(t, podA).FalseWarm
			if fw.Routes != tt.routes || fw.Tokens != tt.tokns {
				t.Fatalf("false-warm %+v, want %d routes and %d tokens", fw, tt.routes, tt.tokns)
			}
			fn := r.targetView(t, podA).Funnel
			if fn.Followed != 4 || fn.FollowerRoutes != 1 || fn.Referenced != 4 {
				t.Fatalf("funnel %+v", fn)
			}
			if tt.reported && (fn.FollowerReported != 1 || fn.FollowerCachedTokens != 40) {
				t.Fatalf("funnel %+v, want the follower's 40 reported cached tokens", fn)
			}
		})
	}
}

// TestFollowAfterTheLookup: what ended between a lookup and the routing
// on it is still what the follower was routed on.
func TestFollowAfterTheLookup(t *testing.T) {
	r := newRig(t, DefaultConfig())
	keys := keyRange(0, 3)
	h := r.Predict(dispatch(podA, "leader"), keys)
	ext := r.Lookup(podA, keys, 0)
	r.clock.Advance(time.Millisecond)
	h.Withdraw()
	// A new prediction of the same keys made since is not what it saw.
	r.clock.Advance(time.Millisecond)
	r.Predict(dispatch(podA, "other"), keys)
	f := r.Follow(ext.Ref, "follower")
	if f == nil {
		t.Fatal("the withdrawn predictions were forgotten")
	}
	if fw := r.targetView(t, podA).FalseWarm; fw.Routes != 1 {
		t.Fatalf("false-warm %+v, want the route counted at once", fw)
	}

	// An invalidation between lookup and routing leaves no follower.
	r2 := newRig(t, DefaultConfig())
	r2.Predict(dispatch(podA, "leader"), keys)
	ext = r2.Lookup(podA, keys, 0)
	r2.Invalidate(podA, ReasonCleared)
	if f := r2.Follow(ext.Ref, "follower"); f != nil {
		t.Fatal("a follower of invalidated predictions")
	}
	if f := r2.Follow(Ref{}, "follower"); f != nil {
		t.Fatal("a follower of nothing")
	}
}

// TestTrustPrior: trust starts at the prior's mean, one early failure does
// not zero it, one success does not make it 1, and a stream that is not
// fresh takes it to 0.
func TestTrustPrior(t *testing.T) {
	const blocks = 125 // a 2,000-token prompt at block size 16
	tests := []struct {
		name      string
		confirmed bool
		want      float64
	}{
		{"one failed request", false, 204.8 / 381},
		{"one confirmed request", true, 329.8 / 381},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, DefaultConfig())
			if got := r.Trust(podA); got != priorMean {
				t.Fatalf("trust before any prediction %v, want the prior mean %v", got, priorMean)
			}
			r.Predict(dispatch(podA, "r"), keyRange(0, blocks))
			r.step(100 * time.Millisecond)
			if tt.confirmed {
				r.confirm(podA, keyRange(0, blocks))
			}
			if got := r.Trust(podA); got != priorMean {
				t.Fatalf("trust moved before the cohort matured: %v", got)
			}
			r.settle(15 * time.Second)
			got := r.Trust(podA)
			if !near(got, tt.want) || got == 0 || got == 1 {
				t.Fatalf("trust %v, want %v", got, tt.want)
			}
			if tv := r.targetView(t, podA); !near(tv.Trust.Value, got) || !tv.Trust.StreamFresh {
				t.Fatalf("trust view %+v", tv.Trust)
			}
			r.streams.set(podA, Stream{Backlog: time.Second})
			if got := r.Trust(podA); got != 0 {
				t.Fatalf("trust %v while the stream is not fresh", got)
			}
			if tv := r.targetView(t, podA); tv.Trust.Value != 0 || !near(tv.Trust.Posterior, tt.want) {
				t.Fatalf("trust view %+v", tv.Trust)
			}
		})
	}
	// Evidence outweighs the prior.
	r := newRig(t, DefaultConfig())
	for i := range 100 {
		r.Predict(dispatch(podA, "r"), keyRange(i*100, 100))
	}
	r.step(100 * time.Millisecond)
	r.confirm(podA, keyRange(0, 9900))
	r.settle(15 * time.Second)
	if got := r.Trust(podA); got < 0.98 || got > 0.99 {
		t.Fatalf("trust after 9,900 of 10,000 blocks confirmed: %v", got)
	}
}

// TestExposureEstimate: λ·p·T from the target's recent request rate,
// failure probability and TTL.
func TestExposureEstimate(t *testing.T) {
	r := newRig(t, DefaultConfig())
	// 10 requests a second for 2 minutes, every prediction confirmed.
	for range 120 {
		for i := range 10 {
			r.Predict(dispatch(podA, "r"), keyRange(i, 1))
			r.confirm(podA, keyRange(i, 1))
		}
		r.step(time.Second)
	}
	e := r.targetView(t, podA).Exposure
	if e.RatePerS < 9.5 || e.RatePerS > 10.5 {
		t.Fatalf("rate %v requests/s, want about 10", e.RatePerS)
	}
	if !near(e.Estimate, Exposure(e.RatePerS, val(e.FailureProbability), time.Duration(val(e.TTLS)*float64(time.Second)))) || val(e.FailureProbability) <= 0 || e.Live != 0 {
		t.Fatalf("exposure %+v", e)
	}
}

// TestDebugLogsCorrelate: a withdrawal and a false-warm route are logged
// at debug level with the requests' correlation ids, which no metric
// carries.
func TestDebugLogsCorrelate(t *testing.T) {
	var buf logbuf.Buffer
	clock := manualclock.New()
	s, err := New(DefaultConfig(), Deps{Now: clock.Now, Logger: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	h := s.Predict(dispatch(podA, "req-leader"), keyRange(0, 3))
	f := s.Follow(s.Lookup(podA, keyRange(0, 3), 0).Ref, "req-follower")
	h.Withdraw()
	s.Record(Outcome{Model: "m", PredictedCached: 48, CachedReported: true, Follower: f})
	if len(buf.Lines("predictions withdrawn", "request_id=req-leader", "blocks=3")) != 1 ||
		len(buf.Lines("false-warm route", "request_id=req-follower")) != 1 {
		t.Fatalf("log:\n%s", buf.String())
	}
}
