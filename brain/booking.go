package brain

import (
	"time"

	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/speculative"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// Dispatch is how one attempt of a decision is dispatched: what the
// request is and what of its prompt the chosen pod computes.
type Dispatch struct {
	// RequestID names the request's predictions (speculative policy); a
	// retry keeps its first attempt's.
	RequestID string
	// Tail is the decision's prompt tail, when it looks the decision's
	// candidates up: it holds the flight until the first byte and
	// corrects it to the whole prompt. nil: no tail.
	Tail *Tail
	// LoadsPrompt: the pod loads the prompt's blocks from another pod (a
	// split request's decode stage) instead of computing them: no
	// uncached tokens are booked and no KV events are expected.
	LoadsPrompt bool
	// LengthOnly: the decision knows the prompt's length alone (a split
	// request's decode pod, chosen on load): its first byte settles
	// nothing of the cache, and the approximate table does not learn it.
	LengthOnly bool
	// Forwarded: the request is no prompt the pod caches (embeddings and
	// the like): no KV events are expected and nothing is predicted.
	Forwarded bool
	// Peers is told of the attempt's work and predictions (nil: no peer
	// replicas).
	Peers Peers
}

// Peers is what a booking tells the router's peer replicas
// (router/peers.go): its target's in-flight work whenever it changes, the
// placements it predicted and their withdrawal.
type Peers interface {
	// Changed says the router's own work on target id changed.
	Changed(id targetid.ID)
	// Share publishes a prediction and returns its number (0: not sent).
	Share(p Prediction) uint64
	// Withdraw withdraws the shared prediction numbered n.
	Withdraw(n uint64)
}

// Prediction is what a dispatch predicted the target will store: its
// blocks' keys in their namespace, until Deadline. A replica shares it
// with its peers.
type Prediction struct {
	Target    targetid.ID
	Namespace speculative.Namespace
	Keys      []kvindex.Key
	Deadline  time.Time
}

// Booking is one attempt's bookkeeping, from its dispatch to its end: the
// target's load ledger (the health flight), the event plane's
// expectation, the predicted placements and the follower (speculative
// policy), the approximate policy's table and the peer replicas' view. The
// API's attempts and the virtual router's requests book through it alike.
// Its methods are for the attempt's goroutine (or the one it hands the
// attempt to), not concurrent.
type Booking struct {
	d      *Decision
	tail   *Tail
	peers  Peers
	target targetid.ID
	// lengthOnly: see Dispatch.
	lengthOnly bool
	flight     *health.Flight
	expect     eventplane.Expectation
	placement  *speculative.Placement
	follower   *speculative.Follower
	prediction Prediction
	// shared is the prediction's number at the peers (0: not shared).
	shared               uint64
	predicted, confirmed int
	answered, withdrawn  bool
	ended                bool
}

// Dispatch books an attempt on d's chosen target: its load ledger counts
// the request from now on, the plane expects its blocks' events, and the
// blocks the target does not hold yet are predicted there.
func (d *Decision) Dispatch(o Dispatch) *Booking {
	c := d.target()
	b := &Booking{d: d, tail: o.Tail, peers: o.Peers, target: c.Target.ID, lengthOnly: o.LengthOnly}
	v := d.view(o.Tail, d.chosen)
	b.predicted, b.confirmed = v.Predicted, v.Confirmed
	uncached := v.Prompt.Count - v.Predicted
	if o.LoadsPrompt {
		uncached = 0
	}
	b.flight = c.Target.Dispatch(v.Prompt.Count, uncached)
	if !o.LoadsPrompt && !o.LengthOnly && !o.Forwarded {
		// Its first byte measures the pod's pace (flow control's clock).
		b.flight.Ahead(d.by.ch.queuedTokens(c.Load))
	}
	b.changed() // the peer replicas' view of the pod's queue
	if !o.Forwarded && !o.LoadsPrompt {
		// Only a prompt the pod prefills into its cache is expected to be
		// announced by KV events.
		b.expect = d.by.plane.Dispatch(c.Target.ID)
	}
	o.Tail.hold(b.flight, d.chosen)
	if d.predicting && !o.Forwarded {
		pr := d.by.place(d, c, o.RequestID, d.model)
		b.placement, b.follower = pr.placement, pr.follower
		if pr.placement != nil && len(pr.keys) > 0 {
			b.prediction = Prediction{Target: c.Target.ID, Namespace: pr.ns, Keys: pr.keys, Deadline: pr.placement.Deadline()}
			if b.peers != nil {
				b.shared = b.peers.Share(b.prediction)
			}
		}
	}
	if ap := d.by.ch.approx; ap != nil && len(d.approxChunks) > 0 && !o.LengthOnly {
		ap.record(c.Target.ID, d.approxChunks)
	}
	return b
}

func (b *Booking) changed() {
	if b.peers != nil {
		b.peers.Changed(b.target)
	}
}

// Predicted is the prompt tokens the router expects the target to serve
// from its cache: as of the dispatch, then as of the first byte once the
// whole prompt is known.
func (b *Booking) Predicted() int { return b.predicted }

// Confirmed is the run of prompt blocks the index said the target holds
// at the dispatch.
func (b *Booking) Confirmed() int { return b.confirmed }

// Follower is the request as a follower of predicted blocks, for the
// outcome (nil when predictions did not count in its choice).
func (b *Booking) Follower() *speculative.Follower { return b.follower }

// Prediction is what the dispatch predicted, for the peer replicas; false
// when it predicted nothing.
func (b *Booking) Prediction() (Prediction, bool) {
	return b.prediction, len(b.prediction.Keys) > 0
}

// FirstByte settles what the attempt's first byte (a prefill stage's
// whole answer) says: the flight leaves the pod's queue, the predictions'
// deadlines run from now, the plane awaits the blocks the pod computed.
// It returns the prompt as known now; once only.
func (b *Booking) FirstByte() View {
	d := b.d
	if b.answered {
		return d.view(b.tail, d.chosen)
	}
	b.answered = true
	var v View
	if b.lengthOnly {
		// A split request's decode pod: the prefill stage settled what
		// the prompt found in the cache, or found it cannot.
		b.flight.FirstByte()
		v = d.view(nil, d.chosen)
	} else {
		v = b.atFirstByte()
	}
	b.placement.Settle()
	b.changed()
	d.by.capacityFreed()
	b.expect.FirstByte(b.flight.Tokens())
	if v.Final {
		b.predicted = v.Predicted
	}
	return v
}

// atFirstByte takes the flight back from the tail and settles what it
// expects of the pod, as the prompt is known now, which it returns.
func (b *Booking) atFirstByte() View {
	d, f := b.d, b.flight
	b.tail.release()
	v := d.view(b.tail, d.chosen)
	switch {
	case v.Final:
		// The flight stands corrected (or never needed it): the pod is
		// expected to announce the blocks it really had to compute.
		f.Revise(v.Prompt.Count, v.Prompt.Count-v.Predicted)
		d.by.ch.observeUncached(v.Prompt.Count - v.Predicted)
	case d.settled:
		// The run read so far is only a lower bound of what the pod
		// holds: until the tail knows the whole run nothing is expected
		// (a pod that held the whole prompt rightly announces nothing,
		// and awaiting its events would judge it stale), and the mean
		// uncached size is not fed a guess.
		f.Revise(v.Prompt.Count, 0)
	default:
		d.by.ch.observeUncached(v.Prompt.Count - v.Predicted)
	}
	f.FirstByte()
	return v
}

// Withdraw ends the attempt's predictions, here and at the peer replicas
// it shared them with: the pod rejected the request before computing
// anything. (A client that cancels keeps them: the pod may have stored
// blocks already.)
func (b *Booking) Withdraw() {
	b.withdrawn = true
	b.placement.Withdraw()
	if b.shared != 0 {
		b.peers.Withdraw(b.shared)
		b.shared = 0
	}
}

// End ends the attempt, once, with what it says of its target (the
// circuit breaker's outcome): the tail lets go of the flight and the
// flight ends. Ended before a first byte, its predictions settle now
// unless withdrawn: the pod may have computed some blocks, and their
// events are due.
func (b *Booking) End(outcome health.Outcome) {
	if b.ended {
		return
	}
	b.ended = true
	b.tail.release()
	if !b.answered && !b.withdrawn {
		b.placement.Settle()
	}
	b.flight.Finish(outcome)
	b.changed()
	b.d.by.capacityFreed()
}

// Outcome is what the speculative store learns from an answered request
// booked so: its arm, the prompt, the cached tokens predicted and
// reported (reportedKnown: the pod said), its TTFT and the follower it was
// routed as.
func (b *Booking) Outcome(prompt, predicted, reported int, reportedKnown bool, ttft time.Duration) speculative.Outcome {
	d := b.d
	return speculative.Outcome{Model: d.model, Arm: d.arm, Group: d.group, PromptTokens: prompt,
		PredictedCached: predicted, ReportedCached: reported, CachedReported: reportedKnown,
		TTFT: ttft, Follower: b.follower}
}
