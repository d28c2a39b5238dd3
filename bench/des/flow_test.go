package des

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/bench/report"
	"github.com/prefixrouter/prefixrouter/bench/workload"
	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/flow"
	"github.com/prefixrouter/prefixrouter/sim"
)

// overloadConfig is a small overload: two pods at three then ten times
// what they serve (500-token prompts, 10 output tokens), one request in
// four interactive (1 s), the rest batch (5 s), four tenants one of
// which sends five times as much, and a drain bound that leaves some
// requests waiting in the routers' lines.
func overloadConfig(t *testing.T, routers int, drain time.Duration) Config {
	t.Helper()
	prof, err := sim.LookupProfile("h100x2-32b")
	if err != nil {
		t.Fatal(err)
	}
	spec := workload.Spec{Kind: workload.KindOverload, Seed: 2, Vocab: workload.Bytes, InputTokens: 500, OutputTokens: 10,
		Rates: []float64{100, 300}, StageDuration: 3 * time.Second, Arrival: workload.Poisson,
		Classes: []workload.Class{{Name: "interactive", Objective: time.Second, Share: 0.25}, {Name: "batch", Objective: 5 * time.Second, Share: 0.75}},
		Tenants: []workload.Tenant{{Name: "a", Weight: 5}, {Name: "b", Weight: 1}, {Name: "c", Weight: 1}, {Name: "d", Weight: 1}}}
	w, err := workload.Build(spec, workload.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	line := flow.DefaultConfig()
	line.Classes = []flow.Class{{Name: "interactive", Objective: time.Second}, {Name: "batch", Objective: 5 * time.Second}}
	return Config{Workload: w, Fleet: sim.Config{Pods: 2, Profile: prof}, Policy: "precise", Routers: routers, Seed: 1,
		Delivery: DefaultDelivery(), Drain: drain, Admission: &brain.AdmissionConfig{Line: line}}
}

// TestOverloadShedsAndLosesNothing: past saturation flow control sheds
// (recorded as errors of kind shed, 429, with their reason), queues, and
// every request sent ends in a record: answered, shed or unfinished at
// the drain bound (those still waiting in a line leave it), with each
// router replica admitting on its own.
func TestOverloadShedsAndLosesNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		routers int
		drain   time.Duration
	}{
		{"one router", 1, time.Minute},
		{"two routers, drained early", 2, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := overloadConfig(t, tc.routers, tc.drain)
			res, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			in := cfg.Workload.Requests()
			answered, shed, unfinished, queued := 0, 0, 0, 0
			for _, r := range res.Records {
				switch {
				case !r.Failed():
					answered++
				case r.Err == report.ErrShed:
					shed++
					if r.Status != 429 || r.ShedReason == "" {
						t.Fatalf("a shed request answered %d for %q", r.Status, r.ShedReason)
					}
				case r.Err == ErrUnfinished:
					unfinished++
				default:
					t.Fatalf("a request failed with %q", r.Err)
				}
				if r.Queued {
					queued++
				}
				if r.Class != "interactive" && r.Class != "batch" || r.Tenant == "" || r.Demand <= 0 {
					t.Fatalf("record without its class, tenant or demand: %+v", r)
				}
			}
			if len(res.Records) != in || answered+shed+unfinished != in {
				t.Fatalf("%d requests in, %d records: %d answered + %d shed + %d unfinished", in, len(res.Records), answered, shed, unfinished)
			}
			if shed == 0 || queued == 0 || answered == 0 {
				t.Fatalf("%d answered, %d shed, %d queued: an overload sheds and queues", answered, shed, queued)
			}
			if tc.drain < time.Minute && unfinished == 0 {
				t.Fatal("nothing unfinished at an early drain bound")
			}
			if res.Budget != 500*time.Millisecond {
				t.Fatalf("budget %v, want half the 1 s objective", res.Budget)
			}
		})
	}
}

// lightConfig is multi-turn conversations on three pods at a tenth of
// what they serve.
func lightConfig(t *testing.T, policy string) Config {
	t.Helper()
	cfg := smallConfig(t, workload.KindMultiTurn, policy, 1)
	spec := workload.Spec{Kind: workload.KindMultiTurn, Seed: 3, Vocab: workload.Bytes, Rates: []float64{1, 2}, StageDuration: 5 * time.Second,
		Arrival: workload.Poisson, SystemTokens: 2000, QuestionTokens: 100, OutputTokens: 20, Turns: 3, Think: time.Second}
	w, err := workload.Build(spec, workload.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Workload = w
	return cfg
}

// TestFlowControlBelowSaturationChangesNothing: a run whose pods never
// fill their budget dispatches every request as without flow control,
// to the same pods at the same times; only the records' classes differ.
func TestFlowControlBelowSaturationChangesNothing(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"least-load", "precise", "speculative"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			off, on := lightConfig(t, policy), lightConfig(t, policy)
			on.Admission = &brain.AdmissionConfig{Line: flow.DefaultConfig()}
			a, err := Run(context.Background(), off)
			if err != nil {
				t.Fatal(err)
			}
			b, err := Run(context.Background(), on)
			if err != nil {
				t.Fatal(err)
			}
			for i := range b.Records {
				if b.Records[i].Class != "interactive" {
					t.Fatalf("record %d of class %q, want the default class", i, b.Records[i].Class)
				}
				b.Records[i].Class = ""
			}
			if !reflect.DeepEqual(a.Records, b.Records) {
				t.Fatal("flow control below saturation changed the run")
			}
		})
	}
}

// A request of a class flow control does not know is refused before the
// run starts.
func TestFlowControlUnknownClass(t *testing.T) {
	cfg := overloadConfig(t, 1, time.Minute)
	cfg.Admission.Line.Classes = cfg.Admission.Line.Classes[:1]
	if _, err := Run(context.Background(), cfg); err == nil {
		t.Fatal("a workload of class batch ran on a line without it")
	}
}

// TestCancelWhileQueued: a client that goes away while its request waits
// in the router's line leaves the line; it is recorded as canceled and
// never reaches a pod.
func TestCancelWhileQueued(t *testing.T) {
	cfg := overloadConfig(t, 1, time.Minute)
	cfg.ManualSends = true
	var canceled *Sent
	sent := 0
	cfg.Conduct = func(c *Control) {
		// Enough first bytes for the pods' pace, then a burst past it.
		for i := range 100 {
			c.At(time.Duration(i)*20*time.Millisecond, func() { c.Send(i, nil); sent++ })
		}
		c.At(3*time.Second, func() {
			for i := 100; i < 300; i++ {
				s := c.Send(i, nil)
				sent++
				if canceled == nil && s.q.queued {
					canceled = s
				}
			}
			if canceled == nil {
				t.Error("nothing queued after 200 requests at once")
				return
			}
			c.Cancel(canceled)
		})
	}
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if canceled == nil {
		return
	}
	if canceled.Record.Err != ErrCanceled || canceled.Record.Pod != "" || !canceled.Record.Queued {
		t.Fatalf("the canceled request's record: %+v", canceled.Record)
	}
	if len(res.Records) != sent {
		t.Fatalf("%d records of %d sent", len(res.Records), sent)
	}
}
