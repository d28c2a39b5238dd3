package peers

import (
	"cmp"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prefixrouter/prefixrouter/targetid"
)

// In-flight work ("flights"): what each replica has dispatched to a pod and
// not seen answered, which the others add to the pod's queue. A replica
// sends all of it every flights interval (KindFlights, which replaces what
// the receivers held of it, and is the heartbeat) and, as soon as its work
// on a target changes (a request dispatched, answered or ended: Changed),
// that target's alone (KindFlightsUpdate). The values are read when the
// message leaves, by the one goroutine that sends, so the last message
// about a target always carries its latest value, whatever the order in
// which requests changed it: no drift, nothing to reconcile.

// flightsOut is what is due to be sent of this replica's own flights.
type flightsOut struct {
	mu      sync.Mutex
	full    bool
	changed map[targetid.ID]struct{}
	kick    chan struct{} // capacity 1: wakes the sender
}

func newFlightsOut() *flightsOut {
	return &flightsOut{changed: map[targetid.ID]struct{}{}, kick: make(chan struct{}, 1)}
}

func (f *flightsOut) wake() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// take returns what is due and clears it.
func (f *flightsOut) take() (full bool, ids []targetid.ID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	full, f.full = f.full, false
	if !full && len(f.changed) > 0 {
		ids = slices.Collect(maps.Keys(f.changed))
	}
	clear(f.changed)
	return full, ids
}

// Changed says this replica's in-flight work on id changed: the sender
// tells the peers soon, without waiting for the flights interval, so that
// a sibling request reaching another replica right after its leader was
// dispatched or answered sees the pod's queue as it is. Requests changing
// the same target before the sender wakes make one message. The router
// calls it when a request is dispatched, gets its first byte and ends.
// Safe for concurrent use; it never waits.
func (m *Mesh) Changed(id targetid.ID) {
	if m == nil {
		return
	}
	m.fout.mu.Lock()
	m.fout.changed[id] = struct{}{}
	m.fout.mu.Unlock()
	m.fout.wake()
}

// dueFull makes the next flights message a full report.
func (m *Mesh) dueFull() {
	m.fout.mu.Lock()
	m.fout.full = true
	m.fout.mu.Unlock()
	m.fout.wake()
}

// flightsDue is the flights message due now, its values read now; nil when
// none is.
func (m *Mesh) flightsDue() *Message {
	full, ids := m.fout.take()
	switch {
	case full:
		var own []TargetFlights
		if m.h.Own != nil {
			own = m.h.Own()
		}
		return &Message{Kind: KindFlights, Flights: own}
	case len(ids) > 0 && m.h.OwnOf != nil:
		slices.SortFunc(ids, func(a, b targetid.ID) int {
			return cmp.Or(cmp.Compare(a.Endpoint, b.Endpoint), cmp.Compare(a.Rank, b.Rank))
		})
		list := make([]TargetFlights, 0, len(ids))
		for _, id := range ids {
			f := m.h.OwnOf(id)
			f.Target = id
			list = append(list, f)
		}
		return &Message{Kind: KindFlightsUpdate, Flights: list}
	}
	return nil
}

// originFlights is one peer replica's last known in-flight work.
type originFlights struct {
	at      time.Time // its last report of any kind
	targets map[targetid.ID]TargetFlights
}

func (f TargetFlights) isZero() bool {
	return f.InFlight == 0 && f.Prefilling == 0 && f.QueuedUncachedTokens == 0
}

// applyFlightsLocked takes a flights report from origin and returns the
// targets whose sum may have changed: a full report's every target before
// and after (so that a target the router learned of since is set too), an
// update's listed ones.
func (m *Mesh) applyFlightsLocked(origin string, msg *Message, now time.Time) []targetid.ID {
	of := m.flights[origin]
	if of == nil {
		of = &originFlights{targets: map[targetid.ID]TargetFlights{}}
		m.flights[origin] = of
	}
	of.at = now
	var ids []targetid.ID
	if msg.Kind == KindFlights {
		ids = slices.Collect(maps.Keys(of.targets))
		clear(of.targets)
	}
	for _, f := range msg.Flights {
		ids = append(ids, f.Target)
		if f.isZero() {
			delete(of.targets, f.Target)
		} else {
			of.targets[f.Target] = f
		}
	}
	return ids
}

// dropOriginLocked forgets origin's in-flight work (it went silent, said
// bye or left the list) and returns the targets it had work on.
func (m *Mesh) dropOriginLocked(origin string) []targetid.ID {
	of := m.flights[origin]
	if of == nil {
		return nil
	}
	delete(m.flights, origin)
	return slices.Collect(maps.Keys(of.targets))
}

// handOver hands the router the sum over the live peers of the in-flight
// work on ids. Calls are serialized and each computes its sums inside, so
// that the last one handed over for a target is its latest.
func (m *Mesh) handOver(ids []targetid.ID) {
	if len(ids) == 0 || m.h.Flights == nil {
		return
	}
	m.handMu.Lock()
	defer m.handMu.Unlock()
	sums := make(map[targetid.ID]TargetFlights, len(ids))
	m.mu.Lock()
	for _, id := range ids {
		s := TargetFlights{Target: id}
		for _, of := range m.flights {
			f := of.targets[id]
			s.InFlight += f.InFlight
			s.Prefilling += f.Prefilling
			s.QueuedUncachedTokens += f.QueuedUncachedTokens
		}
		sums[id] = s
	}
	m.mu.Unlock()
	m.h.Flights(sums)
}
