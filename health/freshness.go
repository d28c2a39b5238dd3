package health

import (
	"fmt"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex"
)

// judgeFreshness updates t.fresh from the subscriber status and the
// router's own accounting. Called with m.mu held.
//
// The rule that tells an idle pod from a broken pipe (expect.go): a KV event
// is only expected after the pod computed at least one new full block for a
// request the router dispatched and got a first byte for. Any event received
// since that request's dispatch confirms it. A target is stale when the
// earliest unconfirmed request was dispatched more than EventsStaleAfter ago
// and the unconfirmed requests carried at least EventsMinUncachedTokens
// uncached tokens. A pod that receives no routes awaits nothing and stays
// fresh, however long it stays quiet.
func (m *Monitor) judgeFreshness(t *rankState, now time.Time) {
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

	// Requests awaiting their events.
	t.await.absorb(l.expect.drain())
	if ok && !status.LastEvent.IsZero() {
		t.await.settle(status.LastEvent.UnixNano())
	}
	aw := t.await.summary(now.UnixNano())

	// Unrecoverable loss: batches the subscriber knows it missed and could
	// not replay. A counter lower than last seen belongs to a new subscriber
	// counting from zero, so all of it is new.
	if ok {
		grew := status.Unrecovered - t.lastUnrecovered
		if status.Unrecovered < t.lastUnrecovered {
			grew = status.Unrecovered
		}
		if grew > 0 {
			if now.Sub(t.unrecoveredAt) >= m.cfg.EventsStaleAfter {
				t.unrecoveredN = 0
			}
			t.unrecoveredN += grew
			t.unrecoveredAt = now
		}
		t.lastUnrecovered = status.Unrecovered
	}
	lossRecent := !t.unrecoveredAt.IsZero() && now.Sub(t.unrecoveredAt) < m.cfg.EventsStaleAfter

	f := Freshness{
		LastEvent:                status.LastEvent,
		LastSeq:                  status.LastSeq,
		HaveSeq:                  status.HaveSeq,
		Connected:                status.Connected,
		Replaying:                status.Replaying,
		QueueDepth:               status.QueueDepth,
		Gaps:                     status.Gaps,
		Unrecovered:              status.Unrecovered,
		Restarts:                 status.Restarts,
		RoutedInWindow:           routed,
		UncachedSinceEvent:       aw.uncached,
		ExpectedBlocksSinceEvent: aw.blocks,
	}
	if aw.since != 0 {
		f.AwaitingSince = time.Unix(0, aw.since)
	}
	if lossRecent {
		f.UnrecoveredAt = t.unrecoveredAt
	}
	switch {
	case !ok:
		f.Verdict, f.Detail = VerdictDisconnected, "no event subscriber for this target"
	case !status.Connected:
		f.Verdict, f.Detail = VerdictDisconnected, fmt.Sprintf("subscriber not connected to %s", t.ts.Events)
	case status.Replaying:
		f.Verdict, f.Detail = VerdictReplaying, "replay in progress"
	case t.cache.PrefixCachingDisabled():
		// Such a pod publishes no KV events and holds nothing a later
		// request could hit: nothing predicted on it will be confirmed.
		f.Verdict, f.Detail = VerdictStale, "prefix caching is disabled on the pod (enable_prefix_caching="+t.cache.PrefixCaching+"): it publishes no KV events"
	case status.QueueDepth > m.cfg.EventsMaxQueueDepth:
		f.Verdict, f.Detail = VerdictStale, fmt.Sprintf("subscriber backlog of %d batches (limit %d)", status.QueueDepth, m.cfg.EventsMaxQueueDepth)
	case lossRecent:
		why := "replay could not bring them back"
		if t.ts.Replay == "" {
			why = "no replay socket to ask"
		}
		f.Verdict, f.Detail = VerdictStale, fmt.Sprintf("%d event batch(es) lost for good, the last at %s (%s): the index may miss stores or hold removed blocks; stale until %s pass without a new loss",
			t.unrecoveredN, t.unrecoveredAt.UTC().Format(time.RFC3339), why, m.cfg.EventsStaleAfter)
	case aw.due != 0 && now.Sub(time.Unix(0, aw.due)) > m.cfg.EventsStaleAfter && aw.uncached >= int64(m.cfg.EventsMinUncachedTokens):
		f.Verdict, f.Detail = VerdictStale, fmt.Sprintf("%d uncached prompt tokens (%d full blocks) answered with no KV event received since their dispatch at %s (%s ago)",
			aw.uncached, aw.blocks, time.Unix(0, aw.due).UTC().Format(time.RFC3339), now.Sub(time.Unix(0, aw.due)).Round(time.Millisecond))
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
		lvl("event stream verdict", "target", t.ts.ID.String(), "verdict", f.Verdict, "previous", t.fresh.Verdict, "detail", f.Detail)
	}
	t.fresh = f
}
