package health

import (
	"fmt"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex"
)

// judgeFreshness updates t.fresh from the subscriber status and the
// router's own accounting. Called with m.mu held.
//
// The rule that tells an idle pod from a broken pipe: a KV event is only
// expected after the pod has computed something, i.e. after a request with
// uncached prompt tokens got its first byte back. FirstByte starts the clock
// (live.awaitingSince); any event received after that stops it. A target is
// stale when the clock has run for longer than EventsStaleAfter and at least
// EventsMinUncachedTokens uncached tokens were answered meanwhile. A pod
// that receives no routes never starts the clock and stays fresh.
func (m *Monitor) judgeFreshness(t *target, now time.Time) {
	l := t.live
	var status kvindex.SubscriberStatus
	ok := false
	if m.events != nil {
		status, ok = m.events(t.ts.ID)
	}

	// Routing volume over the window.
	n := l.dispatched.Load()
	t.routes = append(t.routes, routeSample{at: now, n: n})
	cut := 0
	for cut < len(t.routes)-1 && now.Sub(t.routes[cut+1].at) >= m.cfg.RoutingWindow {
		cut++
	}
	t.routes = t.routes[cut:]
	if len(t.routes) > 4096 { // evaluation far more often than the window needs
		t.routes = append(t.routes[:0:0], t.routes[len(t.routes)-2048:]...)
	}
	routed := n - t.routes[0].n

	// An event after the first unanswered first byte stops the clock.
	aw := l.awaitingSince.Load()
	if aw != 0 && ok && !status.LastEvent.IsZero() && status.LastEvent.UnixNano() >= aw {
		u := l.uncachedSinceEvent.Load()
		if l.awaitingSince.CompareAndSwap(aw, 0) {
			l.uncachedSinceEvent.Add(-u)
		}
		aw = l.awaitingSince.Load()
	}
	uncached := l.uncachedSinceEvent.Load()

	// Sequence continuity: a gap the subscriber could not repair by replay.
	if ok {
		if status.Gaps > t.lastGaps && t.seenStatus {
			t.gapAt = now
		}
		t.lastGaps = status.Gaps
		t.seenStatus = true
	}

	f := Freshness{
		LastEvent:          status.LastEvent,
		LastSeq:            status.LastSeq,
		HaveSeq:            status.HaveSeq,
		Connected:          status.Connected,
		Replaying:          status.Replaying,
		QueueDepth:         status.QueueDepth,
		Gaps:               status.Gaps,
		Restarts:           status.Restarts,
		RoutedInWindow:     routed,
		UncachedSinceEvent: uncached,
	}
	if aw != 0 {
		f.AwaitingSince = time.Unix(0, aw)
	}
	switch {
	case !ok:
		f.Verdict, f.Detail = VerdictDisconnected, "no event subscriber for this target"
	case !status.Connected:
		f.Verdict, f.Detail = VerdictDisconnected, fmt.Sprintf("subscriber not connected to %s", t.ts.Events)
	case status.Replaying:
		f.Verdict, f.Detail = VerdictReplaying, "replay in progress"
	case status.QueueDepth > m.cfg.EventsMaxQueueDepth:
		f.Verdict, f.Detail = VerdictStale, fmt.Sprintf("subscriber backlog of %d batches (limit %d)", status.QueueDepth, m.cfg.EventsMaxQueueDepth)
	case !t.gapAt.IsZero() && t.ts.Replay == "" && now.Sub(t.gapAt) < m.cfg.EventsStaleAfter:
		f.Verdict, f.Detail = VerdictStale, fmt.Sprintf("sequence gap at %s and no replay socket: the index missed events",
			t.gapAt.UTC().Format(time.RFC3339))
	case aw != 0 && now.Sub(time.Unix(0, aw)) > m.cfg.EventsStaleAfter && uncached >= int64(m.cfg.EventsMinUncachedTokens):
		f.Verdict, f.Detail = VerdictStale, fmt.Sprintf("%d uncached prompt tokens answered since %s with no KV event for %s",
			uncached, time.Unix(0, aw).UTC().Format(time.RFC3339), now.Sub(time.Unix(0, aw)).Round(time.Millisecond))
	case status.LastEvent.IsZero() && routed == 0:
		f.Verdict, f.Detail = VerdictFresh, "idle: no routes and no events"
	case status.LastEvent.IsZero():
		f.Verdict, f.Detail = VerdictFresh, "no events yet"
	default:
		f.Verdict, f.Detail = VerdictFresh, fmt.Sprintf("last event %s ago", now.Sub(status.LastEvent).Round(time.Millisecond))
	}
	if f.Verdict != t.fresh.Verdict && t.fresh.Verdict != "" {
		lvl := m.log.Info
		if f.Verdict == VerdictStale || f.Verdict == VerdictDisconnected {
			lvl = m.log.Warn
		}
		lvl("event stream verdict", "target", TargetName(t.ts.ID), "verdict", f.Verdict, "previous", t.fresh.Verdict, "detail", f.Detail)
	}
	t.fresh = f
}
