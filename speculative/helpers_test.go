package speculative

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixrouter/prefixrouter/internal/manualclock"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// fakeStreams is what the router would report of each target's stream:
// fresh unless set otherwise.
type fakeStreams struct {
	mu sync.Mutex
	m  map[targetid.ID]Stream
}

func (f *fakeStreams) get(id targetid.ID) Stream {
	f.mu.Lock()
	defer f.mu.Unlock()
	if st, ok := f.m[id]; ok {
		return st
	}
	return Stream{Fresh: true}
}

func (f *fakeStreams) set(id targetid.ID, st Stream) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[targetid.ID]Stream{}
	}
	f.m[id] = st
}

// rig is a store on a fake clock and fake streams.
type rig struct {
	*Store
	clock   *manualclock.Clock
	streams *fakeStreams
}

func newRig(t testing.TB, cfg Config) *rig { return newRigOn(t, cfg, nil) }

// newRigOn is newRig with its metrics registered on reg.
func newRigOn(t testing.TB, cfg Config, reg prometheus.Registerer) *rig {
	t.Helper()
	r := &rig{clock: manualclock.New(), streams: &fakeStreams{}}
	s, err := New(cfg, Deps{Now: r.clock.Now, Stream: r.streams.get, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	r.Store = s
	return r
}

// step advances the clock by d and runs one round of Run.
func (r *rig) step(d time.Duration) {
	r.clock.Advance(d)
	r.tick()
}

// settle runs Run's rounds a second apart until d has passed.
func (r *rig) settle(d time.Duration) {
	for passed := time.Duration(0); passed < d; passed += time.Second {
		r.step(time.Second)
	}
}

// confirm confirms keys on id now.
func (r *rig) confirm(id targetid.ID, keys []kvindex.Key) { r.Confirm(id, keys, r.clock.Now()) }

func (r *rig) targetView(t testing.TB, id targetid.ID) TargetView {
	t.Helper()
	for _, tv := range r.View().Targets {
		if tv.Target == id.String() {
			return tv
		}
	}
	t.Fatalf("no target %s in the view", id)
	return TargetView{}
}

var (
	podA = targetid.ID{Endpoint: "http://10.0.0.1:8000"}
	podB = targetid.ID{Endpoint: "http://10.0.0.2:8000"}
)

// keyRange is n distinct keys starting at from.
func keyRange(from, n int) []kvindex.Key {
	keys := make([]kvindex.Key, n)
	for i := range keys {
		keys[i] = kvindex.Key(from + i)
	}
	return keys
}

func dispatch(id targetid.ID, req string) Dispatch {
	return Dispatch{Target: id, RequestID: req, Namespace: Namespace{Model: "m", BlockSize: 16}}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func val(p *float64) float64 {
	if p == nil {
		return math.NaN()
	}
	return *p
}

// round3 rounds to three decimals: a rate as reported, 86.3%.
func round3(v float64) float64 { return math.Round(v*1000) / 1000 }
