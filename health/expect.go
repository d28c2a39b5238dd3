package health

import (
	"slices"
	"sync/atomic"
	"time"
)

// What tells a broken event pipe from an idle pod: every answered request
// that filled at least one new full block should have made the pod publish
// BlockStored. Such a request leaves an expectation; the first KV-event
// batch the router receives at or after the request's dispatch satisfies it.
// Dispatch, not first byte, is the reference because vLLM publishes a
// step's events before it returns that step's outputs (and with chunked
// prefill, blocks are announced while the prompt is still being computed):
// the confirming batch normally lands before the first byte.
//
// The router pushes expectations lock-free from its request goroutines
// (expectInbox); the monitor drains them into a ledger it owns under its
// lock (awaitLedger) and settles them against the subscriber's last event.

// eventLagAllowance is how long after a request's first byte its events may
// still be in transit before the request counts as unconfirmed. The events
// normally arrive first, but they travel another socket and the
// subscriber's receive loop: a request whose prefill alone outlasted
// EventsStaleAfter must not flip the verdict in the instant between its
// first byte and its batch.
const eventLagAllowance = time.Second

// maxInbox bounds the expectations waiting for the monitor to drain them
// (it drains every evaluation; the bound matters only when nothing
// evaluates, e.g. a monitor that was never Run). Beyond it new expectations
// are dropped: the thousands already waiting say the same thing.
const maxInbox = 4096

// maxPending bounds the ledger. A pipe broken under heavy traffic would
// otherwise keep one entry per request until the next event; beyond the
// bound, neighbouring entries are merged (see compact).
const maxPending = 4096

// expectation is one answered request, or after compaction a run of them,
// awaiting a KV event.
type expectation struct {
	dispatched int64 // unix nanos: the earliest dispatch in the entry
	until      int64 // unix nanos: the latest dispatch (== dispatched unless merged)
	answered   int64 // unix nanos: the latest first byte
	uncached   int64 // uncached prompt tokens
	blocks     int64 // new full blocks expected
	next       *expectation
}

// expectInbox is a lock-free stack: producers push, the monitor takes
// everything at once. Nodes are never reused, so there is no ABA hazard.
type expectInbox struct {
	head atomic.Pointer[expectation]
	n    atomic.Int64
}

// push adds e; it reports false when the inbox is full and e was dropped.
// The node is allocated only once a slot is reserved.
func (b *expectInbox) push(v expectation) bool {
	if b.n.Add(1) > maxInbox {
		b.n.Add(-1)
		return false
	}
	e := new(expectation)
	*e = v
	for {
		old := b.head.Load()
		e.next = old
		if b.head.CompareAndSwap(old, e) {
			return true
		}
	}
}

// drain takes every pushed expectation.
func (b *expectInbox) drain() []expectation {
	var out []expectation
	for e := b.head.Swap(nil); e != nil; e = e.next {
		c := *e
		c.next = nil
		out = append(out, c)
	}
	b.n.Add(-int64(len(out)))
	return out
}

// awaitLedger holds the unsatisfied expectations of one target. It is owned
// by the monitor (guarded by Monitor.mu).
type awaitLedger struct {
	pending []expectation
}

// awaitSummary is what the ledger says at one instant.
type awaitSummary struct {
	// since is the earliest dispatch still awaiting an event (0: none).
	since int64
	// due is the earliest dispatch among expectations answered at least
	// eventLagAllowance ago (0: none): the clock staleness is judged by.
	due      int64
	uncached int64
	blocks   int64
}

// absorb adds drained expectations.
func (a *awaitLedger) absorb(es []expectation) {
	a.pending = append(a.pending, es...)
	if len(a.pending) > maxPending {
		a.compact()
	}
}

// settle drops every expectation satisfied by an event received at
// lastEvent (unix nanos; 0: never). A merged entry partly satisfied keeps
// only its unsatisfied part, whose dispatches are all after lastEvent.
func (a *awaitLedger) settle(lastEvent int64) {
	if lastEvent == 0 {
		return
	}
	a.pending = slices.DeleteFunc(a.pending, func(e expectation) bool { return e.until <= lastEvent })
	for i := range a.pending {
		if a.pending[i].dispatched <= lastEvent {
			// The merged run straddles the event: its requests dispatched
			// up to lastEvent are satisfied, the rest were dispatched
			// after it. Their count is no longer known; the tokens stay.
			a.pending[i].dispatched = lastEvent + 1
		}
	}
}

// summary reports the ledger at now (unix nanos).
func (a *awaitLedger) summary(now int64) awaitSummary {
	var s awaitSummary
	for _, e := range a.pending {
		s.uncached += e.uncached
		s.blocks += e.blocks
		if s.since == 0 || e.dispatched < s.since {
			s.since = e.dispatched
		}
		if now-e.answered >= int64(eventLagAllowance) && (s.due == 0 || e.dispatched < s.due) {
			s.due = e.dispatched
		}
	}
	return s
}

// compact halves the ledger by merging entries adjacent in dispatch order.
// A merged entry is satisfied only by an event after its last dispatch, so
// merging never declares anything satisfied early; it can only keep the
// clock running from the run's first dispatch until settle trims it.
func (a *awaitLedger) compact() {
	slices.SortFunc(a.pending, func(x, y expectation) int {
		switch {
		case x.dispatched < y.dispatched:
			return -1
		case x.dispatched > y.dispatched:
			return 1
		}
		return 0
	})
	out := a.pending[:0]
	for i := 0; i < len(a.pending); i += 2 {
		e := a.pending[i]
		if i+1 < len(a.pending) {
			n := a.pending[i+1]
			e.until = max(e.until, n.until)
			e.answered = max(e.answered, n.answered)
			e.uncached += n.uncached
			e.blocks += n.blocks
		}
		out = append(out, e)
	}
	clear(a.pending[len(out):])
	a.pending = out
}
