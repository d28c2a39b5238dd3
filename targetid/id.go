package targetid

import "strconv"

// ID names one target: a pod endpoint and one of its data-parallel ranks.
// It is the unit the placement index, the event subscribers, health and the
// router agree on, and the comparable key of their per-target maps.
type ID struct {
	// Endpoint is the pod's base URL as configured (for example
	// http://10.0.0.7:8000); it is a label, never parsed here.
	Endpoint string
	// Rank is the data-parallel rank (0 when the pod is not data parallel).
	Rank int
}

// String renders the target as "endpoint#rank", rank 0 included: the
// target label of every per-target metric and log line, so that series of
// different packages join on it.
func (id ID) String() string { return id.Endpoint + "#" + strconv.Itoa(id.Rank) }
