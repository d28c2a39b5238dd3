package eventplane

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
// The router tells the plane of each request at its dispatch and at its
// first byte (Expectation); the first byte pushes the expectation lock-free
// from the request goroutine (expectInbox), and the plane's evaluation
// drains it into a ledger it owns under its lock (awaitLedger) and settles
// it against the subscriber's last event.

// eventLagAllowance is how long after a request's first byte its events may
// still be in transit before the request counts as unconfirmed. The events
// normally arrive first, but they travel another socket and the
// subscriber's receive loop: a request whose prefill alone outlasted
// StaleAfter must not flip the verdict in the instant between its
// first byte and its batch.
const eventLagAllowance = time.Second

// maxInbox bounds the expectations waiting for the plane to drain them
// (it drains every evaluation; the bound matters only when nothing
// evaluates, e.g. a plane that was never Run). Beyond it new expectations
// are dropped: the thousands already waiting say the same thing.
const maxInbox = 4096

// maxPending bounds the ledger. A pipe broken under heavy traffic would
// otherwise keep one entry per request until the next event; beyond the
// bound, neighbouring entries are merged (see compact).
const maxPending = 4096

// live is a target's request-path state. Everything is atomic: request
// goroutines update it without locks.
type live struct {
	now func() time.Time
	// dispatched counts requests dispatched to the target (routing volume).
	dispatched atomic.Uint64
	// blockSize is the pod's KV block size in tokens as the plane last
	// learned it (0: unknown, defaultBlockSize is assumed). Read at the
	// first byte to count the full blocks a request filled.
	blockSize atomic.Int64
	// expect receives one expectation per answered request that should
	// have made the pod publish BlockStored; evaluation drains it.
	expect expectInbox
	// restarted is when the stream last found the pod's process restarted
	// (Unix nanoseconds; 0: not since the last evaluation): the old
	// process's unpublished events died with it, so no request dispatched
	// before then awaits any.
	restarted atomic.Int64
}

// processRestarted records that the pod's process restarted now.
func (l *live) processRestarted() { l.restarted.Store(l.now().UnixNano()) }

// Expectation is one dispatched request as the event plane follows it:
// started by Plane.Dispatch, answered by FirstByte. It is a small value:
// keep it with the request, call FirstByte from one goroutine. The zero
// Expectation (a target the plane does not know) is a no-op.
type Expectation struct {
	l          *live
	dispatched int64 // unix nanos
	answered   bool
}

// FirstByte records that the request's first response byte arrived, with
// its prompt tokens and the uncached ones the pod had to compute (as the
// router knows them by now). The cached tokens are taken as a prefix: the
// full blocks beyond it are now due to be announced by a KV event. vLLM
// publishes a step's events before it returns the step's outputs, so those
// events normally reach the router before this first byte does: any event
// received since dispatch counts for this request, not only one received
// after now. Repeated calls are ignored.
func (e *Expectation) FirstByte(prompt, uncached int) {
	if e.l == nil || e.answered {
		return
	}
	e.answered = true
	prompt = max(prompt, 0)
	uncached = min(max(uncached, 0), prompt)
	blocks := newFullBlocks(int64(prompt), int64(uncached), e.l.blockSize.Load())
	if blocks > 0 {
		e.l.expect.push(expectation{
			dispatched: e.dispatched,
			until:      e.dispatched,
			answered:   e.l.now().UnixNano(),
			uncached:   int64(uncached),
			blocks:     blocks,
		})
	}
}

// defaultBlockSize is vLLM's block size on CUDA when --block-size is not
// given; used until the pod's vllm:cache_config_info (or the router's flag)
// says otherwise.
const defaultBlockSize = 16

// newFullBlocks is the number of full KV blocks a request with prompt
// tokens, of which uncached are expected to be computed, will add to the
// pod's prefix cache: vLLM hashes and announces (BlockStored) full blocks
// only, so a request that merely extends a partial block publishes nothing
// and must not be awaited. The cached tokens are a prefix, so the new full
// blocks are those of the whole prompt minus those of the cached prefix.
func newFullBlocks(prompt, uncached, blockSize int64) int64 {
	if blockSize <= 0 {
		blockSize = defaultBlockSize
	}
	cached := prompt - uncached
	return prompt/blockSize - cached/blockSize
}

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

// expectInbox is a lock-free stack: producers push, the plane takes
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
// by the plane (guarded by Plane.mu).
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
// forget drops the expectations of requests dispatched by restartedAt:
// their pod's process ended, and its unpublished events with it.
func (a *awaitLedger) forget(restartedAt int64) {
	a.pending = slices.DeleteFunc(a.pending, func(e expectation) bool { return e.dispatched <= restartedAt })
}

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
