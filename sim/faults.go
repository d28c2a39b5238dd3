package sim

import (
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"
)

// Faults are the misbehaviours a pod can be told to show. Durations are model
// time (divided by the time scale on the wall clock). The zero value is a
// healthy pod.
type Faults struct {
	// EventDelay holds every event batch back before it is published.
	EventDelay time.Duration `json:"event_delay"`
	// EventJitter adds a uniform random extra delay in [0, EventJitter);
	// batches still leave in sequence order, as from one PUB socket.
	EventJitter time.Duration `json:"event_jitter"`
	// DropEvents is the probability that a batch is not sent on the PUB
	// socket. Its sequence number is still consumed and the batch stays in
	// the replay buffer, so subscribers see a gap they can repair.
	DropEvents float64 `json:"drop_events"`
	// FailPrefill is the probability that a request fails in its first
	// prefill step.
	FailPrefill float64 `json:"fail_prefill"`
	// Slow multiplies every step time (values ≤ 1 mean normal speed).
	Slow float64 `json:"slow"`
	// Dead makes the engine fail: /health answers 503, requests fail with
	// 500 and no events flow. Clearing it brings the pod back as a restart.
	Dead bool `json:"dead"`
}

// Validate rejects values that mean nothing.
func (f Faults) Validate() error {
	switch {
	case f.EventDelay < 0 || f.EventJitter < 0:
		return fmt.Errorf("event delay and jitter must not be negative")
	case f.DropEvents < 0 || f.DropEvents > 1:
		return fmt.Errorf("drop_events %v outside [0, 1]", f.DropEvents)
	case f.FailPrefill < 0 || f.FailPrefill > 1:
		return fmt.Errorf("fail_prefill %v outside [0, 1]", f.FailPrefill)
	case f.Slow < 0:
		return fmt.Errorf("slow %v must not be negative", f.Slow)
	}
	return nil
}

// faultPatch is the body of POST /sim/faults: every field optional,
// durations as Go duration strings ("50ms") or milliseconds (number).
type faultPatch struct {
	EventDelay  *jsonDuration `json:"event_delay"`
	EventJitter *jsonDuration `json:"event_jitter"`
	DropEvents  *float64      `json:"drop_events"`
	FailPrefill *float64      `json:"fail_prefill"`
	Slow        *float64      `json:"slow"`
	Dead        *bool         `json:"dead"`
}

func (p faultPatch) apply(f Faults) Faults {
	if p.EventDelay != nil {
		f.EventDelay = time.Duration(*p.EventDelay)
	}
	if p.EventJitter != nil {
		f.EventJitter = time.Duration(*p.EventJitter)
	}
	if p.DropEvents != nil {
		f.DropEvents = *p.DropEvents
	}
	if p.FailPrefill != nil {
		f.FailPrefill = *p.FailPrefill
	}
	if p.Slow != nil {
		f.Slow = *p.Slow
	}
	if p.Dead != nil {
		f.Dead = *p.Dead
	}
	return f
}

type jsonDuration time.Duration

func (d *jsonDuration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("duration %q: %w", s, err)
		}
		*d = jsonDuration(v)
		return nil
	}
	var ms float64
	if err := json.Unmarshal(b, &ms); err != nil {
		return fmt.Errorf("duration: want a string like \"50ms\" or milliseconds")
	}
	if ms < 0 || ms > float64(time.Hour/time.Millisecond)*24 {
		return fmt.Errorf("duration %v ms out of range", ms)
	}
	*d = jsonDuration(ms * float64(time.Millisecond))
	return nil
}

// faultView is how GET /sim/faults reports the current faults.
type faultView struct {
	EventDelay  string  `json:"event_delay"`
	EventJitter string  `json:"event_jitter"`
	DropEvents  float64 `json:"drop_events"`
	FailPrefill float64 `json:"fail_prefill"`
	Slow        float64 `json:"slow"`
	Dead        bool    `json:"dead"`
}

func (f Faults) view() faultView {
	return faultView{f.EventDelay.String(), f.EventJitter.String(), f.DropEvents, f.FailPrefill, f.Slow, f.Dead}
}

// faultBox shares the current faults between the HTTP side, the engines and
// the publishers.
type faultBox struct{ p atomic.Pointer[Faults] }

func newFaultBox(f Faults) *faultBox {
	b := &faultBox{}
	b.p.Store(&f)
	return b
}

func (b *faultBox) get() Faults {
	if b == nil {
		return Faults{}
	}
	return *b.p.Load()
}

func (b *faultBox) set(f Faults) { b.p.Store(&f) }
