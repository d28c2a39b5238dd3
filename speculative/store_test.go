package speculative

import (
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex"
)

// outcomes are one target's mature predictions by outcome, and the
// latency samples they left.
type outcomes struct {
	inserted, confirmed, expired, early, invalidated, withdrawn, unknown int64
	inTime, late                                                         int
}

func matureOutcomes(tv TargetView) outcomes {
	m := tv.MatureTotal
	return outcomes{inserted: m.Inserted, confirmed: m.Confirmed, expired: m.Expired, early: m.ExpiredEarly,
		invalidated: m.Invalidated, withdrawn: m.Withdrawn, unknown: m.Unknown,
		inTime: tv.Latency.Confirmed.Samples, late: tv.Latency.Late.Samples}
}

// TestTransitions drives one request's four predictions through each path
// of their life, then lets every cohort mature, and checks where they
// ended. The TTL is the initial 2 s and the grace window 5 s.
func TestTransitions(t *testing.T) {
	keys := keyRange(100, 4)
	unfresh := Stream{Fresh: false}
	tests := []transition{
		{"confirmed before the deadline", func(r *rig, _ *Placement) {
			r.step(300 * time.Millisecond)
			r.confirm(podA, keys)
		}, outcomes{inserted: 4, confirmed: 4, inTime: 4}},
		{"confirmed at the deadline", func(r *rig, _ *Placement) {
			r.clock.Advance(2 * time.Second)
			r.confirm(podA, keys)
		}, outcomes{inserted: 4, confirmed: 4, inTime: 4}},
		{"partly confirmed, the rest expires", func(r *rig, _ *Placement) {
			r.step(300 * time.Millisecond)
			r.confirm(podA, keys[:2])
		}, outcomes{inserted: 4, confirmed: 2, expired: 2, inTime: 2}},
		{"expired stale: never confirmed", func(*rig, *Placement) {},
			outcomes{inserted: 4, expired: 4}},
		{"expired early: confirmed within the grace window after the deadline", func(r *rig, _ *Placement) {
			r.step(2500 * time.Millisecond)
			r.confirm(podA, keys)
		}, outcomes{inserted: 4, expired: 4, early: 4, late: 4}},
		{"expired early without a tick in between", func(r *rig, _ *Placement) {
			r.clock.Advance(2500 * time.Millisecond)
			r.confirm(podA, keys)
		}, outcomes{inserted: 4, expired: 4, early: 4, late: 4}},
		{"a confirmation past the grace window leaves the expiry stale", func(r *rig, _ *Placement) {
			r.settle(7500 * time.Millisecond)
			r.confirm(podA, keys)
		}, outcomes{inserted: 4, expired: 4}},
		{"withdrawn: the pod rejected the request", func(r *rig, h *Placement) {
			r.step(100 * time.Millisecond)
			h.Withdraw()
			r.step(200 * time.Millisecond)
			r.confirm(podA, keys)
		}, outcomes{inserted: 4, withdrawn: 4}},
		{"a client cancel keeps the predictions", func(r *rig, _ *Placement) {
			r.step(time.Second)
			r.confirm(podA, keys)
		}, outcomes{inserted: 4, confirmed: 4, inTime: 4}},
		{"cleared: the new generation confirms nothing", func(r *rig, _ *Placement) {
			r.step(100 * time.Millisecond)
			r.Invalidate(podA, ReasonCleared)
			r.step(200 * time.Millisecond)
			r.confirm(podA, keys)
		}, outcomes{inserted: 4, invalidated: 4}},
		{"restarted: the new process confirms nothing", func(r *rig, _ *Placement) {
			r.step(100 * time.Millisecond)
			r.Invalidate(podA, ReasonRestarted)
			r.confirm(podA, keys)
		}, outcomes{inserted: 4, invalidated: 4}},
		{"unknown: the deadline passed while the stream was not fresh", func(r *rig, _ *Placement) {
			r.streams.set(podA, unfresh)
			r.step(time.Second)
		}, outcomes{inserted: 4, unknown: 4}},
		{"unknown: the stream was not fresh during the prediction's life", func(r *rig, _ *Placement) {
			r.streams.set(podA, unfresh)
			r.step(500 * time.Millisecond)
			r.streams.set(podA, Stream{Fresh: true})
			r.step(500 * time.Millisecond)
		}, outcomes{inserted: 4, unknown: 4}},
		{"confirmed after the stream was not fresh: counted, but no latency sample", func(r *rig, _ *Placement) {
			r.streams.set(podA, unfresh)
			r.step(100 * time.Millisecond)
			r.streams.set(podA, Stream{Fresh: true})
			r.step(900 * time.Millisecond) // a replay delivers what was missed
			r.confirm(podA, keys[:3])
		}, outcomes{inserted: 4, confirmed: 3, unknown: 1}},
	}
	runTransitions(t, dispatch(podA, "req-1"), keys, tests)
}

// transition is one path of a request's predictions: what happens to
// them, and where they end once every cohort matured.
type transition struct {
	name string
	run  func(r *rig, h *Placement)
	want outcomes
}

// runTransitions predicts keys for d on a fresh store for each path, runs
// it, lets every cohort mature and checks the outcomes.
func runTransitions(t *testing.T, d Dispatch, keys []kvindex.Key, tests []transition) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, DefaultConfig())
			h := r.Predict(d, keys)
			tt.run(r, h)
			r.settle(15 * time.Second)
			tv := r.targetView(t, podA)
			if got := matureOutcomes(tv); got != tt.want {
				t.Fatalf("outcomes\n got %+v\nwant %+v", got, tt.want)
			}
			if tv.Pending.Live != 0 || tv.Pending.Inserted != 0 {
				t.Fatalf("pending %+v after every cohort matured", tv.Pending)
			}
		})
	}
}

// TestQueuedRequest: a placement whose caller settles it (Dispatch.Settles)
// does not expire while its request waits at the pod, however long past
// the TTL (2 s here); once settled it lives one TTL more. Latencies that
// include the queue do not size the TTL.
func TestQueuedRequest(t *testing.T) {
	keys := keyRange(100, 4)
	tests := []transition{
		{"confirmed after 10 s in the queue", func(r *rig, h *Placement) {
			r.settle(10 * time.Second)
			h.Settle()
			r.step(300 * time.Millisecond)
			r.confirm(podA, keys)
		}, outcomes{inserted: 4, confirmed: 4}},
		{"settled, then a TTL without its event: expired", func(r *rig, h *Placement) {
			r.settle(10 * time.Second)
			h.Settle()
			r.step(2100 * time.Millisecond)
			r.confirm(podA, keys)
		}, outcomes{inserted: 4, expired: 4, early: 4}},
		{"settled in time: the deadline stays insert + TTL", func(r *rig, h *Placement) {
			r.step(300 * time.Millisecond)
			h.Settle()
			r.step(2 * time.Second)
			r.confirm(podA, keys)
		}, outcomes{inserted: 4, expired: 4, early: 4, late: 4}},
		{"withdrawn while queued", func(r *rig, h *Placement) {
			r.settle(5 * time.Second)
			h.Withdraw()
			r.confirm(podA, keys)
		}, outcomes{inserted: 4, withdrawn: 4}},
		{"the target restarted while it queued", func(r *rig, h *Placement) {
			r.settle(5 * time.Second)
			r.Invalidate(podA, ReasonRestarted)
			r.confirm(podA, keys)
		}, outcomes{inserted: 4, invalidated: 4}},
	}
	d := dispatch(podA, "req-1")
	d.Settles = true
	runTransitions(t, d, keys, tests)
}

// TestQueuedPredictionsLeadNoFollower: a prediction moved while its
// request queued stays pending but extends no run until the request
// settles; then it does, until its moved deadline.
func TestQueuedPredictionsLeadNoFollower(t *testing.T) {
	keys := keyRange(100, 4)
	r := newRig(t, DefaultConfig())
	d := dispatch(podA, "req-1")
	d.Settles = true
	h := r.Predict(d, keys)
	if got := r.Lookup(podA, keys, 0).Blocks; got != 4 {
		t.Fatalf("a fresh prediction extends the run by %d, want 4", got)
	}
	r.settle(5 * time.Second)
	if got := r.Lookup(podA, keys, 0).Blocks; got != 0 {
		t.Fatalf("queued past the TTL it extends the run by %d, want 0", got)
	}
	if tv := r.targetView(t, podA); tv.Pending.Live != 4 {
		t.Fatalf("%d predictions pending, want the 4 still queued", tv.Pending.Live)
	}
	h.Settle()
	if got := r.Lookup(podA, keys, 0).Blocks; got != 4 {
		t.Fatalf("settled it extends the run by %d, want 4", got)
	}
}

// TestStaleStreamBeforeInsertion: a stream that was not fresh before a
// prediction was inserted, and has been since, does not make its expiry
// unknown.
func TestStaleStreamBeforeInsertion(t *testing.T) {
	r := newRig(t, DefaultConfig())
	r.streams.set(podA, Stream{Fresh: false})
	r.step(100 * time.Millisecond)
	r.streams.set(podA, Stream{Fresh: true})
	r.step(100 * time.Millisecond)
	r.Predict(dispatch(podA, "r"), keyRange(0, 3))
	r.settle(15 * time.Second)
	if got := matureOutcomes(r.targetView(t, podA)); got != (outcomes{inserted: 3, expired: 3}) {
		t.Fatalf("outcomes %+v, want 3 expired", got)
	}
}

// TestUniqueness: a repeated prediction of a pending placement is not a
// new one: it keeps the first deadline, and is withdrawn only when every
// placement that predicted it is.
func TestUniqueness(t *testing.T) {
	r := newRig(t, DefaultConfig())
	keys := keyRange(0, 4)
	first := r.Predict(dispatch(podA, "first"), keys)
	r.step(1500 * time.Millisecond)
	second := r.Predict(dispatch(podA, "second"), keyRange(0, 6)) // two more blocks
	tv := r.targetView(t, podA)
	if tv.Funnel.Inserted != 6 || tv.Pending.Live != 6 {
		t.Fatalf("inserted %d, live %d; want 6 (4 + 2 new)", tv.Funnel.Inserted, tv.Pending.Live)
	}
	second.Withdraw()
	if got := r.Lookup(podA, keys, 0).Blocks; got != 4 {
		t.Fatalf("after the repeat's withdrawal the first's 4 blocks are pending, lookup says %d", got)
	}
	second.Withdraw() // twice is once
	first.Withdraw()
	if got := r.Lookup(podA, keys, 0).Blocks; got != 0 {
		t.Fatalf("every claim withdrawn, lookup says %d", got)
	}

	// The repeat does not stretch the deadline.
	r2 := newRig(t, DefaultConfig())
	r2.Predict(dispatch(podA, "first"), keys)
	r2.step(1500 * time.Millisecond)
	r2.Predict(dispatch(podA, "second"), keys)
	r2.clock.Advance(600 * time.Millisecond) // 2.1 s after the first
	if got := r2.Lookup(podA, keys, 0).Blocks; got != 0 {
		t.Fatalf("a repeat stretched the deadline: %d blocks alive at 2.1 s", got)
	}

	// Confirmation by one event ends it for both.
	r3 := newRig(t, DefaultConfig())
	r3.Predict(dispatch(podA, "first"), keys)
	r3.Predict(dispatch(podA, "second"), keys)
	r3.step(200 * time.Millisecond)
	r3.confirm(podA, keys)
	r3.settle(15 * time.Second)
	if got := matureOutcomes(r3.targetView(t, podA)); got != (outcomes{inserted: 4, confirmed: 4, inTime: 4}) {
		t.Fatalf("outcomes %+v", got)
	}
}

func TestLookup(t *testing.T) {
	r := newRig(t, DefaultConfig())
	prompt := keyRange(0, 10)
	// Blocks 3..6 and 8 pending on A: the confirmed run is 3.
	r.Predict(dispatch(podA, "r"), prompt[3:7])
	r.Predict(dispatch(podA, "r2"), prompt[8:9])
	tests := []struct {
		name      string
		keys      []int // indexes into prompt; nil: all
		confirmed int
		want      int
	}{
		{"from the confirmed run to the first gap", nil, 3, 4},
		{"a run that does not start at a prediction", nil, 2, 0},
		{"from inside the predicted run", nil, 5, 2},
		{"after the gap", nil, 8, 1},
		{"confirmed covers every key", nil, 10, 0},
		{"confirmed beyond the keys", nil, 12, 0},
		{"negative confirmed run", nil, -1, 0},
	}
	for _, tt := range tests {
		if got := r.Lookup(podA, prompt, tt.confirmed).Blocks; got != tt.want {
			t.Errorf("%s: Lookup(confirmed %d) = %d blocks, want %d", tt.name, tt.confirmed, got, tt.want)
		}
	}
	if got := r.Lookup(podB, prompt, 3); got.Blocks != 0 || got.Ref.t != nil {
		t.Errorf("a target without predictions: %+v", got)
	}
	if got := r.Lookup(podA, nil, 0).Blocks; got != 0 {
		t.Errorf("no keys: %d", got)
	}
	// Each prediction counts as referenced once, however often it is
	// looked up.
	if got := r.targetView(t, podA).Funnel.Referenced; got != 5 {
		t.Errorf("referenced %d, want 5 distinct predictions", got)
	}
	// A deadline passed without a tick: no longer counted.
	r.clock.Advance(2*time.Second + time.Nanosecond)
	if got := r.Lookup(podA, prompt, 3).Blocks; got != 0 {
		t.Errorf("expired predictions counted: %d", got)
	}
}

// TestRequestWeighted: a request weighs one in the request-weighted rate
// whatever its length.
func TestRequestWeighted(t *testing.T) {
	r := newRig(t, DefaultConfig())
	r.Predict(dispatch(podA, "short"), keyRange(0, 10))
	r.Predict(dispatch(podA, "long"), keyRange(100, 90))
	r.step(200 * time.Millisecond)
	r.confirm(podA, keyRange(0, 10))
	r.settle(15 * time.Second)
	rates := r.targetView(t, podA).MatureTotal.Rates
	if !near(val(rates.Block), 0.1) || !near(val(rates.Request), 0.5) || !near(val(rates.Token), 0.1) {
		t.Fatalf("rates block %v request %v token %v; want 0.1, 0.5, 0.1", val(rates.Block), val(rates.Request), val(rates.Token))
	}
}

// TestRemovedTarget: removal invalidates and forgets the target; the view
// lists known targets without predictions too.
func TestRemovedTarget(t *testing.T) {
	r := newRig(t, DefaultConfig())
	r.AddTarget(podB)
	h := r.Predict(dispatch(podA, "r"), keyRange(0, 3))
	if n := len(r.View().Targets); n != 2 {
		t.Fatalf("%d targets in the view, want 2 (one without predictions)", n)
	}
	r.Invalidate(podA, ReasonRemoved)
	v := r.View()
	if len(v.Targets) != 1 || v.Targets[0].Target != podB.String() {
		t.Fatalf("targets after removal: %+v", v.Targets)
	}
	h.Withdraw() // a request still in flight
	if got := r.Lookup(podA, keyRange(0, 6), 0).Blocks; got != 0 {
		t.Fatalf("a removed target has %d predicted blocks", got)
	}
	r.Invalidate(podA, ReasonRemoved) // unknown now: nothing happens
}

// TestObserver: the ingestor's seam confirms and invalidates.
func TestObserver(t *testing.T) {
	r := newRig(t, DefaultConfig())
	obs := r.Observer()
	r.Predict(dispatch(podA, "r"), keyRange(0, 4))
	r.step(100 * time.Millisecond)
	obs.Stored(podA, 0, keyRange(0, 2))
	obs.Cleared(podA)
	r.settle(15 * time.Second)
	tv := r.targetView(t, podA)
	if got := matureOutcomes(tv); got != (outcomes{inserted: 4, confirmed: 2, invalidated: 2, inTime: 2}) {
		t.Fatalf("outcomes %+v", got)
	}
	if tv.Generation != 1 || tv.Invalidations["cleared"] != 1 {
		t.Fatalf("generation %d, invalidations %v", tv.Generation, tv.Invalidations)
	}
}
