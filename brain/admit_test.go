package brain

import (
	"strconv"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/flow"
	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/internal/manualclock"
	"github.com/prefixrouter/prefixrouter/speculative"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// admitFleet is a virtual router under flow control in front of pods
// whose pace the test sets, on a clock the test moves: every pod works
// off admitPerToken seconds a prompt token, so that with the 1 s budget
// a pod has room while it holds at most 10,000 queued tokens.
type admitFleet struct {
	t   *testing.T
	clk *manualclock.Clock
	v   *Virtual
}

const (
	admitPerToken = 1e-4
	admitPods     = 2
)

func newAdmitFleet(t *testing.T, p Policy, line flow.Config) *admitFleet {
	t.Helper()
	f := &admitFleet{t: t, clk: manualclock.New()}
	var ids []targetid.ID
	for i := range admitPods {
		ids = append(ids, targetid.ID{Endpoint: "http://pod-" + strconv.Itoa(i) + ":8000"})
	}
	ev := eventplane.DefaultConfig()
	ev.BlockSize = 16
	adm := AdmissionConfig{Line: line, Budget: time.Second}
	var err error
	f.v, err = NewVirtual(VirtualConfig{Policy: p, Cost: DefaultCostConfig(), Events: ev, Speculative: speculative.DefaultConfig(),
		Health: health.DefaultConfig(), Model: "m", Targets: ids, NumGPUBlocks: 100_000, Now: f.clk.Now, MaxRetries: 2,
		Admission: &adm, TieSeed: 1})
	if err != nil {
		t.Fatal(err)
	}
	// Each pod's pace, from first bytes of every queue length.
	for _, tg := range f.v.targets {
		for i := range 40 {
			n := 500 * (1 + i%8)
			fl := tg.Dispatch(n, n)
			fl.Ahead(0)
			f.clk.Advance(time.Duration(float64(n) * admitPerToken * float64(time.Second)))
			fl.FirstByte()
			fl.Finish(health.OutcomeSuccess)
		}
		if p := tg.Pace(); !p.Known() {
			t.Fatalf("pace %+v not known", p)
		}
	}
	return f
}

// lineConfig is the default classes with objectives the test's pods can
// meet or miss by design: interactive 2 s, batch 60 s.
func lineConfig() flow.Config {
	c := flow.DefaultConfig()
	c.Classes = []flow.Class{{Name: "interactive", Objective: 2 * time.Second}, {Name: "batch", Objective: time.Minute}}
	return c
}

var admitSeed uint32

// submit sends a prompt of n tokens of its own.
func (f *admitFleet) submit(n, class int, tenant string) *VirtualRequest {
	f.t.Helper()
	admitSeed += 100_000
	r, err := f.v.Submit(promptOf(n, admitSeed), nil, "", class, tenant, 10)
	if err != nil {
		f.t.Fatal(err)
	}
	return r
}

// answer gives r its first byte and end.
func (f *admitFleet) answer(r *VirtualRequest) {
	r.FirstByte()
	r.Finish(true, 0)
}

func TestAdmissionBelowSaturationDecidesAsBefore(t *testing.T) {
	for _, p := range []Policy{PolicyRoundRobin, PolicyLeastLoad, PolicyPrecise, PolicySpeculative} {
		t.Run(p.String(), func(t *testing.T) {
			on := newAdmitFleet(t, p, lineConfig())
			off := newAdmitFleet(t, p, lineConfig())
			off.v.adm = nil
			var prevOn, prevOff *VirtualRequest
			for i := range 30 {
				// Two in flight at a time: well within the budget.
				n := 800 + 37*i
				a, b := on.submit(n, i%2, "t"), off.submit(n, i%2, "t")
				if a.Verdict() != Admitted {
					t.Fatalf("request %d: %v below saturation", i, a.Verdict())
				}
				if a.Target() != b.Target() || a.PredictedCached() != b.PredictedCached() {
					t.Fatalf("request %d: to %s (%d cached) under flow control, %s (%d) without", i, a.Target(), a.PredictedCached(), b.Target(), b.PredictedCached())
				}
				if prevOn != nil {
					on.answer(prevOn)
					off.answer(prevOff)
				}
				prevOn, prevOff = a, b
			}
		})
	}
}

// saturate fills both pods to the budget with requests of 4,000 tokens:
// three each (0, 4,000 and 8,000 queued ahead are within 1 s at 10,000
// tokens a second; 12,000 is not).
func (f *admitFleet) saturate() []*VirtualRequest {
	f.t.Helper()
	var in []*VirtualRequest
	for range 3 * admitPods {
		r := f.submit(4000, 0, "warm")
		if r.Verdict() != Admitted {
			f.t.Fatalf("request %d of the pods' budget: %v", len(in), r.Verdict())
		}
		in = append(in, r)
	}
	return in
}

func TestAdmissionReleasesByPriorityThenShare(t *testing.T) {
	f := newAdmitFleet(t, PolicyLeastLoad, lineConfig())
	admitted := f.saturate()
	var queued []*VirtualRequest
	name := map[*VirtualRequest]string{}
	add := func(class int, tenant string, n int) {
		r := f.submit(n, class, tenant)
		if r.Verdict() != Queued {
			t.Fatalf("%s's request past the budget: %v (%s)", tenant, r.Verdict(), r.Waiter().ShedReason())
		}
		name[r] = strconv.Itoa(class) + "/" + tenant
		queued = append(queued, r)
	}
	for range 4 {
		add(1, "noisy", 1000)
	}
	add(1, "quiet", 1000)
	add(0, "urgent", 1000)
	if n := f.v.adm.View()[0].Classes[1].Waiting; n != 5 {
		t.Fatalf("%d batch requests waiting, want 5", n)
	}
	var order []string
	for _, r := range admitted {
		f.answer(r)
		for _, rel := range f.v.Release() {
			if rel.Verdict() != Admitted {
				t.Fatalf("%s released %v (%s)", name[rel], rel.Verdict(), rel.Waiter().ShedReason())
			}
			order = append(order, name[rel])
			f.answer(rel)
		}
	}
	want := []string{"0/urgent", "1/noisy", "1/quiet", "1/noisy", "1/noisy", "1/noisy"}
	if len(order) != len(want) {
		t.Fatalf("released %v, want %v", order, want)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("released %v, want %v", order, want)
		}
	}
	for _, r := range queued {
		if r.Waiter().QueueTime() < 0 || r.Waiter().Decision().Target().Target == nil {
			t.Fatalf("%s: queue time %v", name[r], r.Waiter().QueueTime())
		}
	}
}

func TestAdmissionSheds(t *testing.T) {
	t.Run("deadline unmeetable at arrival", func(t *testing.T) {
		line := lineConfig()
		line.Classes[0].Objective = 500 * time.Millisecond
		f := newAdmitFleet(t, PolicyLeastLoad, line)
		f.saturate()
		r := f.submit(4000, 0, "late")
		if r.Verdict() != Shed || r.Waiter().ShedReason() != ShedDeadline {
			t.Fatalf("verdict %v (%q), want shed for its deadline", r.Verdict(), r.Waiter().ShedReason())
		}
		// The pods hold 24,000 tokens at 20,000 a second.
		if ra := r.Waiter().RetryAfter(); ra < time.Second || ra > 2*time.Second {
			t.Fatalf("retry after %v, want the pods' 1.2 s drain, at least 1 s", ra)
		}
		if f.v.adm.View()[0].Classes[0].Waiting != 0 {
			t.Fatal("a shed request waits in the line")
		}
	})
	t.Run("deadline passed while waiting", func(t *testing.T) {
		f := newAdmitFleet(t, PolicyLeastLoad, lineConfig())
		f.saturate()
		r := f.submit(1000, 0, "t")
		if r.Verdict() != Queued {
			t.Fatalf("verdict %v", r.Verdict())
		}
		f.clk.Advance(2*time.Second + time.Millisecond)
		rel := f.v.Release()
		if len(rel) != 1 || rel[0] != r || r.Verdict() != Shed || r.Waiter().ShedReason() != ShedDeadline {
			t.Fatalf("released %d, verdict %v (%q): want it shed past its deadline", len(rel), r.Verdict(), r.Waiter().ShedReason())
		}
		if r.Waiter().QueueTime() < 2*time.Second {
			t.Fatalf("queue time %v", r.Waiter().QueueTime())
		}
	})
	t.Run("line full", func(t *testing.T) {
		line := lineConfig()
		line.MaxRequests = 2
		f := newAdmitFleet(t, PolicyLeastLoad, line)
		f.saturate()
		for i := range 3 {
			r := f.submit(1000, 1, "t")
			want, reason := Queued, ""
			if i == 2 {
				want, reason = Shed, ShedQueueFull
			}
			if r.Verdict() != want || r.Waiter().ShedReason() != reason {
				t.Fatalf("request %d: %v (%q), want %v (%q)", i, r.Verdict(), r.Waiter().ShedReason(), want, reason)
			}
		}
	})
}

func TestAdmissionClientLeaves(t *testing.T) {
	f := newAdmitFleet(t, PolicyLeastLoad, lineConfig())
	admitted := f.saturate()
	r := f.submit(1000, 1, "t")
	if r.Verdict() != Queued {
		t.Fatalf("verdict %v", r.Verdict())
	}
	if !r.Leave() {
		t.Fatal("a waiting request could not leave")
	}
	if r.Leave() {
		t.Fatal("left twice")
	}
	if n := f.v.adm.View()[0].Classes[1].Waiting; n != 0 {
		t.Fatalf("%d waiting after the client left", n)
	}
	f.answer(admitted[0])
	if rel := f.v.Release(); len(rel) != 0 {
		t.Fatalf("released %d after the only waiting client left", len(rel))
	}
	select {
	case <-r.Waiter().Done():
		t.Fatal("a request that left was released")
	default:
	}
}

// TestAdmissionOffDispatchesEverything: with flow control off, past the
// budget every request still goes at once.
func TestAdmissionOffDispatchesEverything(t *testing.T) {
	f := newAdmitFleet(t, PolicyLeastLoad, lineConfig())
	f.v.adm.cfg.Off = true
	for i := range 20 {
		if r := f.submit(4000, i%2, "t"); r.Verdict() != Admitted {
			t.Fatalf("request %d: %v with flow control off", i, r.Verdict())
		}
	}
}

// TestAdmitHandsOverWhatItLetGo: an Admit that finds a waiting request
// past its deadline sheds it, and the next Release hands it over, so that
// a driver that waits on no channel (the discrete-event engine) still
// learns of it; the newcomer itself is not handed over twice.
func TestAdmitHandsOverWhatItLetGo(t *testing.T) {
	f := newAdmitFleet(t, PolicyLeastLoad, lineConfig())
	f.saturate()
	late := f.submit(1000, 0, "t")
	if late.Verdict() != Queued {
		t.Fatalf("verdict %v", late.Verdict())
	}
	f.clk.Advance(2*time.Second + time.Millisecond)
	next := f.submit(1000, 1, "t")
	if late.Verdict() != Shed || next.Verdict() != Queued {
		t.Fatalf("verdicts %v and %v, want the late one shed by the newcomer's Admit", late.Verdict(), next.Verdict())
	}
	rel := f.v.Release()
	if len(rel) != 1 || rel[0] != late {
		t.Fatalf("released %d requests, want the one the Admit shed", len(rel))
	}
	if rel := f.v.Release(); len(rel) != 0 {
		t.Fatalf("handed over again: %d", len(rel))
	}
}

// TestReleaseCountsWhatItLetGo: one release pass lets go only what the
// pods have room for, counting on each pod the requests it let go before
// (their drivers book them after the pass): with both pods emptied, three
// requests of 4,000 tokens each (0, 4,000 and 8,000 queued ahead) of the
// ten waiting, not all ten onto the pods' empty ledgers.
func TestReleaseCountsWhatItLetGo(t *testing.T) {
	f := newAdmitFleet(t, PolicyLeastLoad, lineConfig())
	in := f.saturate()
	for i := range 10 {
		if r := f.submit(4000, 1, "t"); r.Verdict() != Queued {
			t.Fatalf("request %d past the budget: %v", i, r.Verdict())
		}
	}
	for _, r := range in {
		f.answer(r)
	}
	per := map[targetid.ID]int{}
	for _, r := range f.v.Release() {
		if r.Verdict() != Admitted {
			t.Fatalf("released %v (%s)", r.Verdict(), r.Waiter().ShedReason())
		}
		per[r.Target()]++
	}
	if len(per) != admitPods || per[f.v.targets[0].ID] != 3 || per[f.v.targets[1].ID] != 3 {
		t.Fatalf("released %v, want three on each pod", per)
	}
	if n := f.v.adm.View()[0].Classes[1].Waiting; n != 4 {
		t.Fatalf("%d still waiting, want 4", n)
	}
}

// TestEmptyPodHasRoomWhateverItsPace: a pod whose fitted floor alone
// passed the budget (first bytes of a queue since gone) still takes a
// request while nothing is queued on it; otherwise no request would go
// there again and no first byte could correct its pace.
func TestEmptyPodHasRoomWhateverItsPace(t *testing.T) {
	f := newAdmitFleet(t, PolicyLeastLoad, lineConfig())
	for _, tg := range f.v.targets {
		for i := range 60 {
			n := 500 * (1 + i%8)
			fl := tg.Dispatch(n, n)
			fl.Ahead(0)
			f.clk.Advance(3*time.Second + time.Duration(float64(n)*admitPerToken*float64(time.Second)))
			fl.FirstByte()
			fl.Finish(health.OutcomeSuccess)
		}
		if p := tg.Pace(); !p.Known() || p.Time(0) <= time.Second {
			t.Fatalf("pace %+v: want a floor past the 1 s budget", p)
		}
	}
	if r := f.submit(1000, 0, "t"); r.Verdict() != Admitted {
		t.Fatalf("verdict %v (%s) on empty pods", r.Verdict(), r.Waiter().ShedReason())
	}
}
