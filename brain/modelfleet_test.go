package brain

import (
	"slices"
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

// modelFleet is router replicas (Virtual) in front of sim.Rank pods on
// one manual clock, with the ways between them modelled: a pod's KV-event
// batches reach every replica eventDelay after the step that published
// them, and replicas that share see each other's predictions, withdrawals
// and in-flight work peerDelay after the change, as router/peers.go
// carries them between live replicas. Time moves only in advance, which
// delivers what falls due on the way and paces the replicas' periodic
// work (Evaluate, Tick) as the live routers' goroutines do. The scenarios
// the live sim tests once ran against the wall clock run here, where a
// gap is exactly as long as the test says whatever the machine's load.
type modelFleet struct {
	t     *testing.T
	clk   *manualclock.Clock
	now   time.Duration
	ids   []targetid.ID
	ranks []*sim.Rank
	rts   []*Virtual
	seqs  []uint64
	// gens count each pod's processes: a batch held back when its process
	// ended (restart, close) never leaves.
	gens []int
	// eventDelay holds the pods' batches back (sim.Faults.EventDelay);
	// peerDelay is the replicas' lag (the des engine's Delivery.PeerDelay
	// default, the mean two live replicas measured on loopback).
	eventDelay, peerDelay time.Duration
	share                 bool
	due                   []dueItem
	nextTick, nextEval    time.Duration
	// peerPlacements are the placements each request's predictions made
	// at the other replicas, which its withdrawal ends there.
	peerPlacements map[*VirtualRequest][]*speculative.Placement
	// peerFlights[to][from][pod] is what replica to last heard of
	// replica from's in-flight work on pod.
	peerFlights [][][]health.Flights
}

// dueItem is something that happens at model time at.
type dueItem struct {
	at time.Duration
	fn func()
}

// modelBlockSize is the tiny profile's block, in tokens.
const modelBlockSize = 16

// newModelFleet builds replicas speculative routers in front of pods
// tiny-profile ranks whose events are held back eventDelay; tune changes
// the speculative config (no holdback: every request in the speculative
// arm, as the live specRig's).
func newModelFleet(t *testing.T, pods, replicas int, eventDelay time.Duration, share bool, tune func(*speculative.Config)) *modelFleet {
	t.Helper()
	prof, err := sim.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	if prof.BlockSize != modelBlockSize {
		t.Fatalf("tiny profile's block is %d tokens, the tests count %d", prof.BlockSize, modelBlockSize)
	}
	f := &modelFleet{t: t, clk: manualclock.New(), eventDelay: eventDelay, peerDelay: 500 * time.Microsecond, share: share,
		seqs: make([]uint64, pods), gens: make([]int, pods), peerPlacements: map[*VirtualRequest][]*speculative.Placement{}}
	for i := range pods {
		f.ids = append(f.ids, targetid.ID{Endpoint: "http://pod-" + strconv.Itoa(i) + ":8000"})
		r, err := sim.NewRank(sim.Config{Profile: prof}, i)
		if err != nil {
			t.Fatal(err)
		}
		f.ranks = append(f.ranks, r)
	}
	spec := speculative.DefaultConfig()
	spec.Holdback = 0
	spec.MaxStale = time.Second
	if tune != nil {
		tune(&spec)
	}
	ev := eventplane.DefaultConfig()
	ev.BlockSize = prof.BlockSize
	for ri := range replicas {
		v, err := NewVirtual(VirtualConfig{Policy: PolicySpeculative, Cost: DefaultCostConfig(), Events: ev, Speculative: spec,
			Health: health.DefaultConfig(), Model: prof.Model, Targets: f.ids, NumGPUBlocks: prof.NumGPUBlocks, Now: f.clk.Now,
			MaxRetries: virtualMaxRetries, TieSeed: uint64(ri + 1)})
		if err != nil {
			t.Fatal(err)
		}
		f.rts = append(f.rts, v)
		fl := make([][]health.Flights, replicas)
		for j := range fl {
			fl[j] = make([]health.Flights, pods)
		}
		f.peerFlights = append(f.peerFlights, fl)
	}
	// As the live rig waits for fresh pods before its first request: a
	// prediction inserted at the instant its target was added, before the
	// plane followed the target's stream, would count as made on a stream
	// not fresh.
	f.wait(time.Second)
	return f
}

func replicaName(ri int) string { return "router-" + strconv.Itoa(ri) }

// at schedules fn at model time t, after whatever is due at t already.
func (f *modelFleet) at(t time.Duration, fn func()) {
	i := len(f.due)
	for i > 0 && f.due[i-1].at > t {
		i--
	}
	f.due = slices.Insert(f.due, i, dueItem{at: t, fn: fn})
}

// advance moves the clock to t, running on the way what falls due: the
// deliveries and, at their paces, the replicas' freshness evaluations and
// the predictions' timer.
func (f *modelFleet) advance(t time.Duration) {
	evalEvery := eventplane.DefaultConfig().EvalInterval
	for {
		next := min(f.nextTick, f.nextEval)
		if len(f.due) > 0 {
			next = min(next, f.due[0].at)
		}
		if next > t {
			break
		}
		f.setNow(next)
		switch {
		case len(f.due) > 0 && f.due[0].at == next:
			it := f.due[0]
			f.due = f.due[1:]
			it.fn()
		case f.nextEval == next:
			for _, v := range f.rts {
				v.Evaluate()
			}
			f.nextEval += evalEvery
		default:
			for _, v := range f.rts {
				v.Tick()
			}
			f.nextTick += speculative.TimerResolution
		}
	}
	f.setNow(t)
}

func (f *modelFleet) setNow(t time.Duration) {
	if t > f.now {
		f.clk.Advance(t - f.now)
		f.now = t
	}
}

// wait advances the clock by d.
func (f *modelFleet) wait(d time.Duration) { f.advance(f.now + d) }

func (f *modelFleet) pod(id targetid.ID) int {
	i := slices.Index(f.ids, id)
	if i < 0 {
		f.t.Fatalf("no pod %s", id)
	}
	return i
}

// route decides and dispatches prompt at replica ri; a sharing replica's
// prediction reaches the others peerDelay later.
func (f *modelFleet) route(ri int, prompt []uint32) *VirtualRequest {
	f.t.Helper()
	vr, err := f.rts[ri].Route(prompt, nil, "")
	if err != nil {
		f.t.Fatal(err)
	}
	if p, ok := vr.Prediction(); ok && f.share {
		for oj := range f.rts {
			if oj == ri {
				continue
			}
			f.at(f.now+f.peerDelay, func() {
				h, err := f.rts[oj].PredictFrom(replicaName(ri), p)
				if err != nil {
					f.t.Error(err)
				}
				if h != nil {
					f.peerPlacements[vr] = append(f.peerPlacements[vr], h)
				}
			})
		}
	}
	f.flightsChanged(ri, f.pod(vr.Target()))
	return vr
}

// flightsChanged shares replica ri's in-flight work on pod with the
// others, as a live replica does whenever it changes.
func (f *modelFleet) flightsChanged(ri, pod int) {
	if !f.share {
		return
	}
	fl := f.rts[ri].Flights(f.ids[pod])
	for oj := range f.rts {
		if oj == ri {
			continue
		}
		f.at(f.now+f.peerDelay, func() {
			f.peerFlights[oj][ri][pod] = fl
			var sum health.Flights
			for _, o := range f.peerFlights[oj] {
				sum = sum.Add(o[pod])
			}
			f.rts[oj].SetPeerFlights(f.ids[pod], sum)
		})
	}
}

// run runs vr's prompt on its pod to its one output token, the clock
// following the pod's steps and each step's batches leaving for the
// replicas, and returns the tokens the pod served from its cache.
func (f *modelFleet) run(ri int, vr *VirtualRequest, prompt []uint32) int {
	f.t.Helper()
	pod := f.pod(vr.Target())
	r := f.ranks[pod]
	q, err := r.Add(prompt, 1, f.now)
	if err != nil {
		f.t.Fatal(err)
	}
	first := false
	for !r.Idle() {
		d := r.Step(f.now)
		f.advance(f.now + d)
		r.FinishStep(f.now)
		f.publish(pod)
		if !first && q.Snapshot().Generated > 0 {
			first = true
			vr.FirstByte()
			f.flightsChanged(ri, pod)
		}
	}
	s := q.Snapshot()
	if s.Err != nil {
		f.t.Fatalf("pod %d: %s", pod, s.Err)
	}
	vr.Finish(true, s.CachedTokens)
	f.flightsChanged(ri, pod)
	return s.CachedTokens
}

// serve routes prompt at replica ri and runs it.
func (f *modelFleet) serve(ri int, prompt []uint32) (*VirtualRequest, int) {
	f.t.Helper()
	vr := f.route(ri, prompt)
	return vr, f.run(ri, vr, prompt)
}

// fail ends vr at replica ri as a request its pod turned down before its
// first byte: its predictions are withdrawn there and, peerDelay later,
// at the other replicas.
func (f *modelFleet) fail(ri int, vr *VirtualRequest) {
	vr.Finish(false, 0)
	if f.share {
		f.at(f.now+f.peerDelay, func() {
			for _, h := range f.peerPlacements[vr] {
				h.Withdraw()
			}
		})
	}
	f.flightsChanged(ri, f.pod(vr.Target()))
}

// publish sends the batches pod's last step published, each reaching
// every replica eventDelay later.
func (f *modelFleet) publish(pod int) {
	gen := f.gens[pod]
	for _, b := range f.ranks[pod].Events() {
		seq := f.seqs[pod]
		f.seqs[pod]++
		f.at(f.now+f.eventDelay, func() {
			if f.gens[pod] != gen {
				return
			}
			for _, v := range f.rts {
				v.Deliver(f.ids[pod], seq, &b)
			}
		})
	}
}

// restart starts pod's process anew, as sim.Pod.Restart does: the batches
// it held back are lost with the old process, its stream starts its
// sequence again, and every replica's next scrape reads the new process
// start time (after a last scrape of the old one).
func (f *modelFleet) restart(pod int) {
	f.ranks[pod].Restart()
	f.gens[pod]++
	f.seqs[pod] = 0
	for _, v := range f.rts {
		v.Scrape(f.ids[pod], 0, 0, 0, time.Unix(int64(f.gens[pod]), 0))
		v.Scrape(f.ids[pod], 0, 0, 0, time.Unix(int64(f.gens[pod]+1), 0))
	}
}

// disconnect ends pod's event stream, as closing the pod does: the
// batches it held back never leave and every replica's subscriber loses
// the publisher.
func (f *modelFleet) disconnect(pod int) {
	f.gens[pod]++
	for _, v := range f.rts {
		v.SetConnected(f.ids[pod], false)
	}
}

// mature advances the clock until every prediction on every replica has
// ended and its cohort matured (the cohort window and the grace after it).
func (f *modelFleet) mature() {
	f.t.Helper()
	for range 60 {
		f.wait(time.Second)
		done := true
		for _, v := range f.rts {
			view, _ := v.Speculative()
			p := view.Overall.Pending
			done = done && p.Live == 0 && p.Inserted == 0
			for _, pv := range view.Peers {
				done = done && pv.Pending.Live == 0 && pv.Pending.Inserted == 0
			}
		}
		if done {
			return
		}
	}
	f.t.Fatal("predictions still pending a model minute on")
}

// targetView is replica ri's speculative view of pod.
func (f *modelFleet) targetView(ri, pod int) speculative.TargetView {
	f.t.Helper()
	v, _ := f.rts[ri].Speculative()
	for _, tv := range v.Targets {
		if tv.Endpoint == f.ids[pod].Endpoint {
			return tv
		}
	}
	f.t.Fatalf("no target %s in router-%d's speculative view", f.ids[pod], ri)
	return speculative.TargetView{}
}

// peerView is replica ri's view of origin's predictions.
func (f *modelFleet) peerView(ri int, origin string) speculative.PeerView {
	v, _ := f.rts[ri].Speculative()
	for _, p := range v.Peers {
		if p.Origin == origin {
			return p
		}
	}
	return speculative.PeerView{}
}

// modelPrefixTokens is the live specRig's shared prefix: 2,000 tokens, 125
// blocks.
const (
	modelPrefixTokens = 2000
	modelPrefixBlocks = modelPrefixTokens / modelBlockSize
)

// pairPrompt is the live rig's body in token ids: a head of its own for
// group g (8 tokens), the 2,000-token prefix, and a suffix of its own for
// request n (8 tokens).
func pairPrompt(g, n int) []uint32 {
	p := make([]uint32, 0, 8+modelPrefixTokens+8)
	for i := range 8 {
		p = append(p, uint32(100000+8*g+i))
	}
	for i := range modelPrefixTokens {
		p = append(p, uint32(7+i%200))
	}
	for i := range 8 {
		p = append(p, uint32(900000+8*n+i))
	}
	return p
}

// basis is what the decision counted, as paired-gap reads it: predicted
// tokens beyond the confirmed run, a confirmed run, or nothing.
func basis(vr *VirtualRequest) string {
	switch {
	case vr.PredictedCached() > vr.ConfirmedBlocks()*modelBlockSize:
		return "prediction"
	case vr.ConfirmedBlocks() > 0:
		return "confirmed"
	}
	return "nothing"
}
