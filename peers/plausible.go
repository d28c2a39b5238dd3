package peers

import (
	"fmt"
	"time"

	"github.com/prefixrouter/prefixrouter/targetid"
)

// What one replica can plausibly report. A peer holding the key is a
// replica of the same deployment, but a broken one (an overflowed
// counter, a wild clock) must not take a pod out of routing or fill the
// store: a message beyond these bounds is dropped whole, counted by
// reason, and the peer shows the fault "rejected" with the reason for
// rejectHold. The speculative store caps what passes further: a
// prediction's deadline at now + --speculative-max-stale.
const (
	// maxPeerInFlight bounds requests in flight (and prefilling) on one
	// target from one replica: beyond what one pod runs at once by orders
	// of magnitude.
	maxPeerInFlight = 1 << 20
	// maxPeerQueuedTokens bounds uncached prompt tokens queued on one
	// target from one replica: thousands of full-context prompts.
	maxPeerQueuedTokens = 1 << 32
	// maxPeerTargets bounds the targets one replica reports work on, in a
	// message and in what this replica holds of it.
	maxPeerTargets = 4096
	// maxPredictedTokens bounds one prediction's keys times its block
	// size: a prompt longer than any model's context.
	maxPredictedTokens = 1 << 24
	// maxPeerSkew bounds how far a message's sent time may be from this
	// replica's clock (clock skew and queueing together), and
	// maxPredictionAhead how far past it a prediction's deadline may lie.
	maxPeerSkew        = time.Minute
	maxPredictionAhead = 10 * time.Minute
	// rejectHold is how long a peer shows rejected after its last
	// rejected message.
	rejectHold = time.Minute
)

// Reasons a message is rejected: the reason label of
// prefixrouter_peer_messages_rejected_total.
const (
	rejectMalformed    = iota // could not be decoded (a length or value out of the format's bounds included)
	rejectVersion             // a wire version this replica does not read
	rejectClock               // sent time too far from this replica's clock
	rejectInFlight            // requests in flight or prefilling beyond maxPeerInFlight
	rejectQueuedTokens        // queued uncached tokens beyond maxPeerQueuedTokens
	rejectTargets             // more targets than maxPeerTargets
	rejectKeys                // a prediction longer than maxPredictedTokens
	rejectDeadline            // a prediction's deadline implausibly far from its sending
	numRejectReasons
)

var rejectNames = [numRejectReasons]string{"malformed", "version", "clock", "in_flight", "queued_tokens", "targets", "keys", "deadline"}

// implausible returns why msg, arriving at now from an origin whose
// work this replica holds on known's targets, is beyond what a replica
// reports, and the detail for the peer's reason; -1 when it is not.
func implausible(msg *Message, now time.Time, known map[targetid.ID]TargetFlights) (int, string) {
	if d := now.Sub(msg.Sent); d > maxPeerSkew || d < -maxPeerSkew {
		return rejectClock, fmt.Sprintf("sent %s from this replica's clock (at most %s): check the replicas' clocks", d.Round(time.Millisecond), maxPeerSkew)
	}
	switch msg.Kind {
	case KindFlights, KindFlightsUpdate:
		n := len(msg.Flights)
		if msg.Kind == KindFlightsUpdate {
			// What the origin's work would span once applied.
			n = len(known)
			for _, f := range msg.Flights {
				if _, ok := known[f.Target]; !ok && !f.isZero() {
					n++
				}
			}
		}
		if n > maxPeerTargets {
			return rejectTargets, fmt.Sprintf("%s: work on %d targets, at most %d", msg.Kind, n, maxPeerTargets)
		}
		for _, f := range msg.Flights {
			if f.InFlight > maxPeerInFlight || f.Prefilling > maxPeerInFlight {
				return rejectInFlight, fmt.Sprintf("%s: %d requests in flight (%d prefilling) on %s, at most %d", msg.Kind, f.InFlight, f.Prefilling, f.Target, maxPeerInFlight)
			}
			if f.QueuedUncachedTokens > maxPeerQueuedTokens {
				return rejectQueuedTokens, fmt.Sprintf("%s: %d queued uncached tokens on %s, at most %d", msg.Kind, f.QueuedUncachedTokens, f.Target, int64(maxPeerQueuedTokens))
			}
		}
	case KindPrediction:
		p := &msg.Prediction
		if int64(len(p.Keys))*int64(p.BlockSize) > maxPredictedTokens {
			return rejectKeys, fmt.Sprintf("prediction: %d blocks of %d tokens on %s, at most %d tokens", len(p.Keys), p.BlockSize, p.Target, maxPredictedTokens)
		}
		if d := p.Deadline.Sub(msg.Sent); d > maxPredictionAhead || d < -maxPeerSkew {
			return rejectDeadline, fmt.Sprintf("prediction: deadline %s from its sending (from -%s to %s)", d.Round(time.Millisecond), maxPeerSkew, maxPredictionAhead)
		}
	}
	return -1, ""
}
