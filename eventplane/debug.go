package eventplane

import (
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// StreamView is a target's KV-event freshness verdict and its evidence, as
// the router's GET /debug/targets shows it (each target's "event_stream").
type StreamView struct {
	Verdict Verdict `json:"verdict"`
	Detail  string  `json:"detail,omitempty"`
	// Source is "subscriber" (the endpoint's events= socket), "bus"
	// (--events-listen) or empty (none); Bus and Topic name the bus and
	// the topic once a batch arrived on one.
	Source string `json:"source,omitempty"`
	Bus    string `json:"bus,omitempty"`
	Topic  string `json:"topic,omitempty"`
	// JudgedAt is when the verdict was made: Detail's durations and
	// LastEventAgeS are as of then.
	JudgedAt           time.Time `json:"judged_at,omitzero"`
	Connected          bool      `json:"connected"`
	Replaying          bool      `json:"replaying"`
	LastEvent          time.Time `json:"last_event,omitzero"`
	LastEventAgeS      *float64  `json:"last_event_age_s,omitempty"`
	LastSeq            uint64    `json:"last_seq"`
	HaveSeq            bool      `json:"have_seq"`
	Gaps               uint64    `json:"gaps"`
	Unrecovered        uint64    `json:"unrecovered_batches"`
	UnrecoveredAt      time.Time `json:"unrecovered_at,omitzero"`
	Restarts           uint64    `json:"restarts"`
	QueueDepth         int       `json:"queue_depth"`
	RoutedInWindow     uint64    `json:"routed_in_window"`
	AwaitingSince      time.Time `json:"awaiting_event_since,omitzero"`
	UncachedSinceEvent int64     `json:"uncached_tokens_since_event"`
	ExpectedBlocks     int64     `json:"expected_blocks_since_event"`
}

// KeysView is the block-key configuration (GET /debug/targets
// "block_keys").
type KeysView struct {
	Configured bool   `json:"configured"`
	Mode       string `json:"mode,omitempty"`
	BlockSize  int    `json:"block_size,omitempty"`
	Algo       string `json:"algo,omitempty"`
}

// IndexView is one target's share of the confirmed index (GET
// /debug/targets "index").
type IndexView struct {
	Target          string `json:"target"`
	Placements      int    `json:"placements"`
	GPU             int    `json:"gpu"`
	CPU             int    `json:"cpu"`
	Storage         int    `json:"storage"`
	Evicted         uint64 `json:"evicted"`
	UnknownRemovals uint64 `json:"unknown_removals"`
	HashChecks      uint64 `json:"hash_checks"`
	HashMismatches  uint64 `json:"hash_mismatches"`
}

// StreamView returns id's stream view as of its last judgement; a target
// the plane does not know has no subscriber.
func (p *Plane) StreamView(id targetid.ID) StreamView {
	f := p.Freshness(id)
	v := StreamView{
		Verdict: f.Verdict, Detail: f.Detail, Source: f.Source, Bus: f.Bus, Topic: f.Topic, Connected: f.Connected,
		Replaying: f.Replaying, LastEvent: f.LastEvent, LastSeq: f.LastSeq,
		HaveSeq: f.HaveSeq, Gaps: f.Gaps, Restarts: f.Restarts,
		Unrecovered: f.Unrecovered, UnrecoveredAt: f.UnrecoveredAt,
		ExpectedBlocks: f.ExpectedBlocksSinceEvent,
		QueueDepth:     f.QueueDepth, RoutedInWindow: f.RoutedInWindow,
		AwaitingSince: f.AwaitingSince, UncachedSinceEvent: f.UncachedSinceEvent,
	}
	v.JudgedAt = f.Judged
	if !f.LastEvent.IsZero() && !f.Judged.IsZero() {
		age := f.Judged.Sub(f.LastEvent).Seconds()
		v.LastEventAgeS = &age
	}
	return v
}

// KeysView describes the block-key configuration.
func (p *Plane) KeysView() KeysView {
	ks := p.Keys()
	if ks == nil {
		return KeysView{}
	}
	return KeysView{Configured: true, Mode: ks.Mode.String(), BlockSize: ks.BlockSize, Algo: ks.Algo}
}

// IndexView describes every target's share of the index, with the
// ingestor's hash checks. It locks the index briefly; it is for the admin
// API, not the request path.
func (p *Plane) IndexView() []IndexView {
	p.mu.Lock()
	in := p.ingestor
	p.mu.Unlock()
	var out []IndexView
	for _, s := range p.index.Stats() {
		iv := IndexView{
			Target: s.Target.String(), Placements: s.Placements,
			GPU: s.ByTier[kvindex.TierGPU], CPU: s.ByTier[kvindex.TierCPU], Storage: s.ByTier[kvindex.TierStorage],
			Evicted: s.Evicted, UnknownRemovals: s.UnknownRemovals,
		}
		if in != nil {
			iv.HashChecks, iv.HashMismatches = in.HashHealth(s.Target)
		}
		out = append(out, iv)
	}
	return out
}
