package kvindex

import (
	"strconv"
	"time"
)

// TargetID names one event source: a pod endpoint and data-parallel rank.
// It is the unit the index, the subscriber and health agree on.
type TargetID struct {
	// Endpoint is the pod's base URL as configured (for example
	// http://10.0.0.7:8000); it is a label, never parsed here.
	Endpoint string
	// Rank is the data-parallel rank (0 when the pod is not data parallel).
	Rank int
}

// SubscriberStatus is a point-in-time view of one target's event stream,
// read by health to judge freshness and by the admin API.
type SubscriberStatus struct {
	Target    TargetID
	Connected bool      // SUB socket connected and receiving is possible
	Replaying bool      // a replay request is in flight
	LastEvent time.Time // wall time the last batch was received (zero: never)
	LastSeq   uint64    // sequence number of the last applied batch
	HaveSeq   bool      // LastSeq is meaningful
	Batches   uint64
	Events    uint64
	Gaps      uint64 // sequence gaps detected
	Replays   uint64 // replay requests issued
	Replayed  uint64 // batches received through replay
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
}

// String renders the target as "endpoint#rank", the form used in metric
// labels and logs.
func (t TargetID) String() string { return t.Endpoint + "#" + strconv.Itoa(t.Rank) }
