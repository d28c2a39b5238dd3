package kvindex

import (
	"time"

	"github.com/prefixrouter/prefixrouter/targetid"
)

// SubscriberStatus is a point-in-time view of one target's event stream,
// read by the event plane to judge freshness.
type SubscriberStatus struct {
	Target    targetid.ID
	Connected bool // SUB socket connected and receiving is possible
	// EverConnected is set once the SUB socket first connected.
	EverConnected bool
	// ConnectionChanged is when Connected last changed; before the first
	// connection, when the subscriber started running.
	ConnectionChanged time.Time
	Replaying         bool      // a replay request is in flight
	LastEvent         time.Time // wall time the last batch was received (zero: never)
	LastSeq           uint64    // sequence number of the last applied batch
	HaveSeq           bool      // LastSeq is meaningful
	Batches           uint64
	Events            uint64
	Gaps              uint64 // sequence gaps detected
	Replays           uint64 // replay requests issued
	Replayed          uint64 // batches received through replay
	// Unrecovered counts batches known to be missing that replay could not
	// bring back (no replay socket, buffer too short, replay failed): the
	// index may be missing stores or holding removed blocks.
	Unrecovered uint64
	Restarts    uint64 // sequence went backwards: the pod restarted
	Reconnects  uint64
	// DecodeErrors counts payloads that failed to decode and were skipped.
	DecodeErrors uint64
	// QueueDepth is the number of received batches not yet applied.
	QueueDepth int
	// Refused counts batches (or events) received and not applied, by
	// reason (Refusal).
	Refused RefusalCounts
}
