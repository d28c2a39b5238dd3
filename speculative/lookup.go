package speculative

import (
	"math"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// Extension is a target's predicted run beyond its confirmed run: Blocks
// consecutive blocks after the confirmed ones are pending predictions on
// it. Ref refers to them for follower accounting (Follow).
type Extension struct {
	Blocks int
	// Queued is how many of Blocks belong to requests still waiting at
	// the pod for their first byte (a peer replica's count as waiting:
	// their first byte is not known here): the prefill that computes them
	// is still queued there. The others are computed, their events on
	// the way.
	Queued int
	Ref    Ref
}

// Ref refers to the predictions one lookup counted. It holds the lookup's
// keys slice, which must not change until Follow has been called with it
// (the router's decision keeps its keys unchanged). The zero Ref refers to
// nothing.
type Ref struct {
	t    *targetState
	keys []kvindex.Key
	gen  uint64
	at   int64
}

// Lookup is the request path: for a target, the prompt's block keys read
// so far and the target's confirmed run (blocks 0..confirmed-1 held per
// the index), how many consecutive blocks from block confirmed on are
// pending predictions on the target, whose deadlines have not passed and
// whose requests have not queued at the pod past their first deadline.
// Each counts as referenced by a later lookup (funnel). It takes the
// target's read lock once and allocates nothing; a target without pending
// predictions costs a map read. The router calls it for each candidate of
// a decision made with predictions (the speculative policy's arm); the
// predicted run weighs Trust(target).
func (s *Store) Lookup(id targetid.ID, keys []kvindex.Key, confirmed int) Extension {
	t := s.target(id)
	if t == nil || confirmed < 0 || confirmed >= len(keys) || t.live.Load() == 0 {
		return Extension{}
	}
	t.mu.RLock()
	if t.pending[keys[confirmed]] == nil {
		t.mu.RUnlock()
		return Extension{}
	}
	now := s.clock()
	n, queued := 0, 0
	for _, k := range keys[confirmed:] {
		p := t.pending[k]
		if p == nil || p.deadline < now || p.queued && p.owner.settled == 0 {
			// A prediction whose request has queued at the pod past its
			// TTL stays pending (Placement.Settle) but leads no follower:
			// its blocks are not coming soon, and a follower there would
			// wait behind the whole queue, or hold a second copy of a
			// prefix another pod holds (on the overloaded llm-d ladder,
			// counting them cost 12% of the output throughput).
			break
		}
		if !p.referenced.Load() && p.referenced.CompareAndSwap(false, true) {
			t.referenced.Add(1)
		}
		if p.owner.settled == 0 || p.owner.peer != nil {
			queued++
		}
		n++
	}
	gen := t.gen
	t.mu.RUnlock()
	if n == 0 {
		return Extension{}
	}
	return Extension{Blocks: n, Queued: queued, Ref: Ref{t: t, keys: keys[confirmed : confirmed+n], gen: gen, at: now}}
}

// Trust is the weight in [0, 1] of a target's predicted run: 0 while its
// event stream is not fresh (Deps.Stream), else its block-confirmation
// rate over recent mature cohorts under the prior (priorMean,
// priorStrength). Lock-free. The router calls it for each candidate.
func (s *Store) Trust(id targetid.ID) float64 {
	if !s.stream(id).Fresh {
		return 0
	}
	return s.posterior(id)
}

// posterior is a target's trust before its stream's state.
func (s *Store) posterior(id targetid.ID) float64 {
	if t := s.target(id); t != nil {
		return math.Float64frombits(t.posterior.Load())
	}
	return priorMean
}

// Follower is a request routed on predictions, for false-warm
// accounting: its route is false-warm when a prediction it was routed on
// later expires unconfirmed or is withdrawn.
type Follower struct {
	t  *targetState
	id string // the follower's correlation id: in debug logs, never a label
	// Guarded by t.mu.
	failed bool // false-warm: counted in routes
	// blame is the peer replica's ledger whose prediction failed it, nil
	// for a local prediction: false warmth per origin.
	blame *peerLedger
	// The request's outcome, once recorded.
	ended         bool
	predicted     int
	reported      int
	reportedKnown bool
	tokensCounted bool
}

// Follow records that a request (its correlation id) was routed on the
// predictions ref refers to (the chosen candidate's Extension.Ref, when its
// predicted run counted in the choice: Blocks > 0 and Trust > 0), and
// returns the follower to pass to Record with the request's outcome; nil
// when ref refers to nothing still known (the target was invalidated
// since the lookup). The router calls it at dispatch.
func (s *Store) Follow(ref Ref, requestID string) *Follower {
	t := ref.t
	if t == nil || len(ref.keys) == 0 {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.removed || t.gen != ref.gen {
		return nil
	}
	f := &Follower{t: t, id: requestID}
	found := false
	for _, k := range ref.keys {
		p := t.pending[k]
		if p == nil || p.inserted > ref.at {
			// It ended between the lookup and now: what it was routed on
			// is the one that was pending then.
			p = t.ended[k]
			if p == nil || p.inserted > ref.at || p.endedAt < ref.at {
				continue
			}
		}
		found = true
		if !p.followed {
			p.followed = true
			if l := p.owner.peer; l != nil {
				l.followed++
			} else {
				t.funnel.followed++
			}
		}
		switch p.state {
		case statePending:
			p.followers = append(p.followers, f)
		case stateExpired, stateWithdrawn:
			t.failFollower(f, p.owner.peer)
		}
	}
	if !found {
		return nil
	}
	t.funnel.followerRoutes++
	return f
}

// failFollower makes f's route false-warm, once, blaming the origin of the
// prediction that failed (peer; nil: local); its prefill cost is counted
// when its outcome is known.
func (t *targetState) failFollower(f *Follower, peer *peerLedger) {
	if f.failed {
		return
	}
	f.failed, f.blame = true, peer
	t.funnel.falseWarmRoutes++
	if peer != nil {
		peer.falseWarmRoutes++
	}
	t.countFalseWarmTokens(f)
	t.log.Debug("false-warm route: a prediction it was routed on failed", "target", t.name, "request_id", f.id)
}

// countFalseWarmTokens adds a false-warm route's cost once both its failure
// and its reported cached tokens are known: the tokens the router expected
// cached that the pod computed.
func (t *targetState) countFalseWarmTokens(f *Follower) {
	if !f.failed || !f.ended || !f.reportedKnown || f.tokensCounted {
		return
	}
	f.tokensCounted = true
	cost := uint64(max(0, f.predicted-f.reported))
	t.funnel.falseWarmTokens += cost
	if f.blame != nil {
		f.blame.falseWarmTokens += cost
	}
}

// recordFollower takes a follower's outcome.
func (f *Follower) record(predicted, reported int, reportedKnown bool) {
	t := f.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if f.ended {
		return
	}
	f.ended, f.predicted, f.reported, f.reportedKnown = true, predicted, reported, reportedKnown
	if reportedKnown {
		t.funnel.followerReported++
		t.funnel.followerCachedTokens += uint64(max(0, reported))
	}
	t.countFalseWarmTokens(f)
}

// funnel is a target's prediction funnel and false-warm routes. Guarded by
// the target's lock (referenced lives in targetState, lock-free).
type funnel struct {
	inserted, confirmed, late        uint64 // predictions
	followed                         uint64 // predictions a follower was routed on
	followerRoutes                   uint64
	followerReported                 uint64 // follower routes whose cached tokens were reported
	followerCachedTokens             uint64
	falseWarmRoutes, falseWarmTokens uint64
}
