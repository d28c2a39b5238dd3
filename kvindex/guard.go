package kvindex

import (
	"errors"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex/events"
)

// Refusal is why a batch (or one event of it) reached the router and was
// not applied: it came from somewhere a pod's stream does not, or it would
// do more than a pod's stream does. The reasons are few and fixed: they
// label prefixrouter_kv_refused_total.
type Refusal int

// Refusal reasons.
const (
	// RefusedSource: on a bus, the batch came from an address that is
	// neither its topic's host nor its target's endpoint host.
	RefusedSource Refusal = iota
	// RefusedConnection: on a bus, a second connection published under a
	// topic another connection owns, without a restart health saw.
	RefusedConnection
	// RefusedSecondTopic: on a bus, another topic named a target already
	// followed under its first topic.
	RefusedSecondTopic
	// RefusedClearRate, RefusedResetRate, RefusedGapRate: more
	// AllBlocksCleared events, sequence resets (a lower sequence number
	// taken for a restart) or gaps than the stream's limits allow per
	// minute.
	RefusedClearRate
	RefusedResetRate
	RefusedGapRate
	// RefusedQueueFull: the stream's queue was full (the batch is then
	// missing, a gap the next batch replays).
	RefusedQueueFull
	// RefusedEvents, RefusedBlocks, RefusedTokens: the batch exceeds the
	// events per batch, blocks per event or token_ids bounds.
	RefusedEvents
	RefusedBlocks
	RefusedTokens
	numRefusals
)

var refusalNames = [numRefusals]string{"source_address", "other_connection", "second_topic", "clear_rate", "reset_rate", "gap_rate", "queue_full",
	"events_cap", "blocks_cap", "tokens_cap"}

func (r Refusal) String() string {
	if r >= 0 && r < numRefusals {
		return refusalNames[r]
	}
	return "unknown"
}

// Refusals lists every reason.
func Refusals() []Refusal {
	out := make([]Refusal, numRefusals)
	for i := range out {
		out[i] = Refusal(i)
	}
	return out
}

// RefusalCounts counts a stream's refused batches by reason.
type RefusalCounts struct {
	N [numRefusals]uint64
	// Last is when the last refusal happened, Reason its reason, Detail
	// what it was (it may name addresses: admin views and logs only).
	Last   time.Time
	Reason Refusal
	Detail string
}

// Total is the number of refusals of every reason.
func (c RefusalCounts) Total() uint64 {
	var n uint64
	for _, v := range c.N {
		n += v
	}
	return n
}

// Add merges o into c, the later refusal's reason and detail kept.
func (c *RefusalCounts) Add(o RefusalCounts) {
	for i, v := range o.N {
		c.N[i] += v
	}
	if o.Last.After(c.Last) {
		c.Last, c.Reason, c.Detail = o.Last, o.Reason, o.Detail
	}
}

func (c *RefusalCounts) record(r Refusal, detail string, now time.Time) {
	c.N[r]++
	c.Last, c.Reason, c.Detail = now, r, detail
}

// RefusalLog is one stream's (or one bus target's) refusals with when
// each reason was last logged, so that a flood of refusals logs a line
// per reason per RefusalLogEvery while every one is counted.
type RefusalLog struct {
	RefusalCounts
	logged [numRefusals]time.Time
}

// Record counts r and reports whether to log it: the first of its reason,
// or RefusalLogEvery after the last one logged.
func (l *RefusalLog) Record(r Refusal, detail string, now time.Time) bool {
	l.record(r, detail, now)
	if !l.logged[r].IsZero() && now.Sub(l.logged[r]) < RefusalLogEvery {
		return false
	}
	l.logged[r] = now
	return true
}

// StreamLimits bound what one stream's batches may do. A zero field is
// no bound (an in-process stream has none).
type StreamLimits struct {
	Decode events.Limits
	// ClearsPerMinute, ResetsPerMinute and GapsPerMinute bound how many
	// AllBlocksCleared events, sequence resets and gaps a stream may have
	// in any minute; each beyond is refused.
	ClearsPerMinute int
	ResetsPerMinute int
	GapsPerMinute   int
}

// rateWindow allows at most n occurrences in any minute.
type rateWindow struct {
	n     int
	times []time.Time
}

func (w *rateWindow) allow(now time.Time) bool {
	if w.n <= 0 {
		return true
	}
	cut := 0
	for cut < len(w.times) && now.Sub(w.times[cut]) >= time.Minute {
		cut++
	}
	w.times = append(w.times[:0], w.times[cut:]...)
	if len(w.times) >= w.n {
		return false
	}
	w.times = append(w.times, now)
	return true
}

// limitRefusal maps a decode bound to its refusal; ok is false for other
// errors.
func limitRefusal(err error) (Refusal, bool) {
	var le *events.LimitError
	if !errors.As(err, &le) {
		return 0, false
	}
	switch le.What {
	case events.LimitEvents:
		return RefusedEvents, true
	case events.LimitBlocks:
		return RefusedBlocks, true
	}
	return RefusedTokens, true
}

// RefusalLogEvery bounds how often one stream logs refusals of one reason.
const RefusalLogEvery = 10 * time.Second
