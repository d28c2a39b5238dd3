package speculative

import (
	"cmp"
	"container/heap"
	"sync/atomic"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// state is where a prediction stands. Every state but pending is terminal.
type state uint8

const (
	statePending state = iota
	stateConfirmed
	// stateExpired: the deadline passed unconfirmed on a fresh stream.
	// A confirmation within the grace window makes it early (p.early),
	// otherwise it is stale.
	stateExpired
	stateInvalidated
	stateWithdrawn
	// stateUnknown: the deadline passed unconfirmed while, or after, the
	// stream was not fresh: the event may have been lost, so it is no
	// expiry.
	stateUnknown
)

// prediction is one (target, key) placement.
type prediction struct {
	key   kvindex.Key
	state state
	early bool // expired, then confirmed within the grace window
	// followed: a follower was routed on it (funnel).
	followed bool
	// queued: its deadline was moved while its request waited at the pod
	// (Placement.Settle), so its latency measures the pod's queue, not
	// the event path, and does not size the TTL.
	queued     bool
	referenced atomic.Bool
	// claims counts the live placements that predicted it: the one that
	// inserted it and those that repeated it while it was pending. It is
	// withdrawn only when every claim is.
	claims int32
	// inserted and deadline (= inserted + TTL) are when it was inserted
	// and until when it counts; routed is its placement's dispatch, from
	// which confirmation latency runs; endedAt is when it ended
	// unconfirmed (its deadline for an expiry).
	inserted, deadline, routed, endedAt int64
	owner                               *Placement
	cohort                              *cohort
	followers                           []*Follower
}

func (p *prediction) tokens() int64 { return int64(p.owner.ns.BlockSize) }

// Namespace is what a prediction's block belongs to: the request's model,
// LoRA adapter and cache_salt, and the block geometry. Block keys already
// fold in what vLLM hashes (adapter, salt, block size), so uniqueness is
// per (target, key); the namespace labels the accounting.
type Namespace struct {
	Model     string
	LoRA      string
	CacheSalt string
	// BlockSize is the tokens in each predicted block (only full blocks
	// are keyed): the weight of a block in token-weighted rates.
	BlockSize int
}

// Dispatch is a routing decision that committed: the target that computes
// the prompt's prefill (the prefill pod of a disaggregated pair), the
// request's correlation id and its namespace.
type Dispatch struct {
	Target    targetid.ID
	RequestID string
	Namespace Namespace
	// Settles says that the caller will call Placement.Settle at the
	// request's first byte or end: until then its predictions do not
	// expire. Without it the placement is settled at once.
	Settles bool
}

// Placement is one request's predictions on its target: the handle Predict
// returns for Withdraw. A nil *Placement is valid and does
// nothing. It is safe for concurrent use.
type Placement struct {
	s      *Store
	t      *targetState
	gen    uint64
	id     string // the request's correlation id: in debug logs, never a label
	ns     Namespace
	routed int64
	// deadline is when its new predictions expire: now + the target's TTL
	// at Predict, or the origin's deadline (PredictFrom).
	deadline int64
	// peer is the origin's ledger on the target for a peer replica's
	// placement (PredictFrom); nil for a local one.
	peer *peerLedger
	// Guarded by t.mu.
	preds     []*prediction // inserted or claimed
	cohort    *cohort       // where the request counts: its first insertion's
	withdrawn bool
	// settled is when the request stopped waiting at the pod (its first
	// byte, or its end); 0 while it waits (Settle).
	settled int64
	// own predictions by outcome, for the request-weighted rate.
	confirmed, expired int
}

// Predict records, when a routing decision commits, the blocks the chosen
// target does not hold yet: keys are the prompt's block keys beyond the
// target's confirmed run, in prompt order. Each new (target, key) is a
// prediction with deadline now + TTL(target); a key already pending on the
// target is not a new prediction (the placement only claims it). The
// router calls it at dispatch, for every attempt and in both holdback
// arms, with the prompt's keys (the router reads the whole prompt before
// dispatch).
func (s *Store) Predict(d Dispatch, keys []kvindex.Key) *Placement {
	t := s.targetOrAdd(d.Target)
	now := s.clock()
	t.mu.Lock()
	defer t.mu.Unlock()
	s.expireLocked(t, now)
	h := &Placement{s: s, t: t, gen: t.gen, id: d.RequestID, ns: d.Namespace, routed: now,
		deadline: now + t.ttl.Load(), preds: make([]*prediction, 0, len(keys))}
	if !d.Settles {
		h.settled = max(now, 1)
	}
	if d.Namespace.Model != "" {
		t.model = d.Namespace.Model
	}
	s.insertLocked(t, h, keys, now)
	return h
}

// Deadline is when the placement's new predictions expire (zero for a nil
// placement): what a replica shares with its peers beside the keys.
func (h *Placement) Deadline() time.Time {
	if h == nil {
		return time.Time{}
	}
	return h.s.epoch.Add(time.Duration(h.deadline))
}

// Withdraw ends the placement's pending predictions at once: the pod
// rejected the request before computing anything (a 4xx or 5xx before the
// first byte), so no event will confirm them. A prediction another live
// placement repeated stays. Followers routed on a withdrawn prediction are
// false-warm. The router calls it from the attempt that got the
// rejection; a client cancel must not withdraw (the pod may have stored
// blocks already).
func (h *Placement) Withdraw() {
	if h == nil {
		return
	}
	t := h.t
	now := h.s.clock()
	t.mu.Lock()
	defer t.mu.Unlock()
	if h.withdrawn {
		return
	}
	h.withdrawn = true
	ended := 0
	for _, p := range h.preds {
		if p.state != statePending {
			continue
		}
		if p.claims--; p.claims > 0 {
			continue
		}
		h.s.endLocked(t, p, stateWithdrawn, now)
		ended++
	}
	t.publishCounts()
	h.s.log.Debug("predictions withdrawn: the pod rejected the request", "target", t.name, "request_id", h.id, "blocks", ended)
}

// Settle says that the placement's request no longer waits at its pod:
// its first byte arrived (the prefill ran), or it ended without one. Until
// then its predictions do not expire: a request queued at a busy pod for
// longer than the TTL has not computed its blocks yet, and the event
// confirming them is not late. Once settled, a prediction whose deadline
// was moved that way lives one TTL more. The router calls it at the first
// byte and when the attempt ends; it is idempotent. A nil placement does
// nothing.
func (h *Placement) Settle() {
	if h == nil {
		return
	}
	now := max(h.s.clock(), 1) // 0 means waiting
	h.t.mu.Lock()
	h.settled = cmp.Or(h.settled, now)
	h.t.mu.Unlock()
}

// requeueLocked moves the deadline of a batch that came due while its
// request still waited at the pod (to now + TTL) and, once the request
// settled, of a batch moved so, to a TTL after the settling. It reports
// whether the batch went back in the queue; otherwise its predictions
// expire, at their deadline as moved. A peer's placement keeps its
// origin's deadline.
func (s *Store) requeueLocked(t *targetState, b *batch, now int64) bool {
	h := b.preds[0].owner
	if h.peer != nil || h.withdrawn || h.gen != t.gen || t.removed {
		return false
	}
	ttl := t.ttl.Load()
	var deadline int64
	switch {
	case h.settled == 0:
		deadline = now + ttl
	case b.requeued && h.settled+ttl > b.deadline:
		deadline = h.settled + ttl
	default:
		return false
	}
	pending := false
	for i := range b.preds {
		if p := &b.preds[i]; p.state == statePending {
			p.deadline, p.queued, pending = deadline, true, true
			p.cohort.lastDeadline = max(p.cohort.lastDeadline, deadline)
		}
	}
	b.deadline, b.requeued = deadline, true
	if !pending || deadline < now {
		return false
	}
	heap.Push(&t.queue, b)
	return true
}

// insertLocked adds h's keys to its target.
func (s *Store) insertLocked(t *targetState, h *Placement, keys []kvindex.Key, now int64) {
	if h.withdrawn || h.gen != t.gen || t.removed {
		return
	}
	deadline := h.deadline
	book := &t.cohorts
	if h.peer != nil {
		book = &h.peer.cohorts
	}
	var c *cohort
	// New predictions are allocated together, from the first new key to
	// the end of keys (claims of pending ones come first in a follower's
	// prompt, new blocks after them); each allocation is one batch of the
	// deadline queue.
	var slab []prediction
	inserted := 0
	for i, k := range keys {
		if p := t.pending[k]; p != nil {
			if p.owner != h {
				p.claims++
				h.preds = append(h.preds, p)
			}
			continue
		}
		if len(slab) == cap(slab) {
			if len(slab) > 0 {
				heap.Push(&t.queue, &batch{deadline: deadline, preds: slab})
			}
			slab = make([]prediction, 0, len(keys)-i)
		}
		if c == nil {
			if c = h.cohort; c == nil || c.mature {
				c = book.current(now)
			}
		}
		slab = append(slab, prediction{key: k, claims: 1, inserted: now, deadline: deadline, routed: h.routed, owner: h, cohort: c})
		p := &slab[len(slab)-1]
		t.pending[k] = p
		h.preds = append(h.preds, p)
		c.add(outcomeInserted, p.tokens())
		inserted++
	}
	if inserted == 0 {
		return
	}
	heap.Push(&t.queue, &batch{deadline: deadline, preds: slab})
	if h.peer != nil {
		h.peer.inserted += uint64(inserted)
		h.peer.live += int64(inserted)
	} else {
		t.funnel.inserted += uint64(inserted)
	}
	c.lastDeadline = max(c.lastDeadline, deadline)
	if h.cohort == nil {
		h.cohort = c
		c.reqs = append(c.reqs, h)
		if h.peer == nil {
			t.rate.requests++
		}
	}
	t.publishCounts()
}

// Confirm is the event path: the target stored keys (a BlockStored in any
// tier) and the router applied the event at at. A pending prediction of
// one of them whose deadline has not passed is confirmed, with its
// route-to-confirmation latency; one that expired within the grace window
// before becomes an early expiry (its latency recorded as late). A
// prediction of the target's previous generation is never confirmed. The
// kvindex.Observer from Observer calls it for every stored batch.
func (s *Store) Confirm(id targetid.ID, keys []kvindex.Key, at time.Time) {
	t := s.target(id)
	if t == nil || t.live.Load() == 0 && t.lateable.Load() == 0 {
		return
	}
	ts := s.since(at)
	t.mu.Lock()
	defer t.mu.Unlock()
	s.expireLocked(t, ts)
	polled := false
	for _, k := range keys {
		p := t.pending[k]
		if p == nil {
			p = t.ended[k]
			if p == nil || p.state != stateExpired || p.early || p.cohort.mature || ts-p.deadline > s.grace() {
				continue
			}
		}
		if !polled {
			s.pollLocked(t, ts)
			polled = true
		}
		if p.state == statePending {
			s.confirmLocked(t, p, ts)
		} else {
			s.lateLocked(t, p, ts)
		}
	}
	t.publishCounts()
}

func (s *Store) confirmLocked(t *targetState, p *prediction, ts int64) {
	delete(t.pending, p.key)
	p.state = stateConfirmed
	p.followers = nil
	p.cohort.add(outcomeConfirmed, p.tokens())
	p.owner.confirmed++
	if l := p.owner.peer; l != nil {
		// Its latency runs from its arrival here, not from the origin's
		// dispatch: it says nothing of the target's event latency.
		l.confirmed++
		l.live--
		return
	}
	t.funnel.confirmed++
	if !p.queued && !t.unfreshSince(p.inserted) {
		lat := time.Duration(ts - p.routed)
		t.lat.add(lat, false)
		t.latHist[0].Observe(lat.Seconds())
	}
}

// lateLocked makes an expiry early: its confirmation came within the
// grace window after the deadline.
func (s *Store) lateLocked(t *targetState, p *prediction, ts int64) {
	p.early = true
	p.cohort.add(outcomeEarly, p.tokens())
	if l := p.owner.peer; l != nil {
		l.late++
		return
	}
	t.funnel.late++
	if !p.queued && !t.unfreshSince(p.inserted) {
		lat := time.Duration(ts - p.routed)
		t.lat.add(lat, true)
		t.latHist[1].Observe(lat.Seconds())
	}
}

// expireLocked ends every prediction whose deadline passed before now, in
// deadline order: expired on a fresh stream, unknown when the stream was
// not fresh at some time since it was inserted. It also forgets ended
// predictions past the grace window.
func (s *Store) expireLocked(t *targetState, now int64) {
	if len(t.queue) > 0 && t.queue[0].deadline < now {
		s.pollLocked(t, now)
		for len(t.queue) > 0 && t.queue[0].deadline < now {
			b := heap.Pop(&t.queue).(*batch)
			if s.requeueLocked(t, b, now) {
				continue
			}
			for i := range b.preds {
				p := &b.preds[i]
				if p.state != statePending {
					continue
				}
				delete(t.pending, p.key)
				st := stateExpired
				if t.unfreshSince(p.inserted) {
					st = stateUnknown
				}
				s.finishLocked(t, p, st, p.deadline)
			}
		}
	}
	grace := s.grace()
	for t.endedHead < len(t.endedFIFO) && now-t.endedFIFO[t.endedHead].endedAt > grace {
		p := t.endedFIFO[t.endedHead]
		t.endedFIFO[t.endedHead] = nil
		t.endedHead++
		if t.ended[p.key] == p {
			delete(t.ended, p.key)
		}
	}
	if t.endedHead > 64 && t.endedHead*2 > len(t.endedFIFO) {
		t.endedFIFO = append(t.endedFIFO[:0], t.endedFIFO[t.endedHead:]...)
		t.endedHead = 0
	}
	t.publishCounts()
}

// endLocked ends a pending prediction before its deadline; its batch
// passes it by when the deadline comes.
func (s *Store) endLocked(t *targetState, p *prediction, st state, at int64) {
	delete(t.pending, p.key)
	s.finishLocked(t, p, st, at)
}

// finishLocked records a prediction's unconfirmed end.
func (s *Store) finishLocked(t *targetState, p *prediction, st state, at int64) {
	p.state, p.endedAt = st, at
	if l := p.owner.peer; l != nil {
		l.live--
	}
	switch st {
	case stateExpired:
		p.cohort.add(outcomeExpired, p.tokens())
		p.owner.expired++
	case stateWithdrawn:
		p.cohort.add(outcomeWithdrawn, p.tokens())
	case stateInvalidated:
		p.cohort.add(outcomeInvalidated, p.tokens())
	case stateUnknown:
		p.cohort.add(outcomeUnknown, p.tokens())
	}
	if st == stateExpired || st == stateWithdrawn {
		t.ended[p.key] = p
		t.endedFIFO = append(t.endedFIFO, p)
		for _, f := range p.followers {
			t.failFollower(f, p.owner.peer)
		}
	}
	p.followers = nil
}

// batch is the predictions one Predict call inserted: they
// share a deadline.
type batch struct {
	deadline int64
	preds    []prediction
	// requeued: its deadline was moved while its request waited.
	requeued bool
}

// deadlineQueue orders a target's batches by deadline: one heap per
// target, drained by Run and on access, instead of a timer per prediction.
// A batch stays until its deadline; predictions that ended before it are
// passed by.
type deadlineQueue []*batch

func (q deadlineQueue) Len() int           { return len(q) }
func (q deadlineQueue) Less(i, j int) bool { return q[i].deadline < q[j].deadline }
func (q deadlineQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *deadlineQueue) Push(x any)        { *q = append(*q, x.(*batch)) }
func (q *deadlineQueue) Pop() any {
	old := *q
	b := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return b
}
