package eventplane

import (
	"fmt"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex"
)

// Verdict is the freshness of a target's KV-event stream. Only Fresh means
// the index (and predictions confirmed by it) can be trusted for the target.
type Verdict string

// Verdicts.
const (
	VerdictFresh        Verdict = "fresh"
	VerdictStale        Verdict = "stale"
	VerdictDisconnected Verdict = "disconnected"
	VerdictReplaying    Verdict = "replaying"
)

// Trusted reports whether predictions on the target may count: only a
// fresh stream confirms what was predicted.
func (v Verdict) Trusted() bool { return v == VerdictFresh }

// ConfirmedWeight weights a target's confirmed run by its stream's verdict.
// A fresh or replaying stream (replay only adds what was missed) counts
// fully; a stale one may have missed stores and removals alike, so its run
// counts half; a disconnected one counts nothing: the pod may have
// restarted and lost everything without the router hearing of it.
func (v Verdict) ConfirmedWeight() float64 {
	switch v {
	case VerdictFresh, VerdictReplaying:
		return 1
	case VerdictStale:
		return 0.5
	}
	return 0
}

// Trust is how far routing may lean on a target's event stream.
type Trust struct {
	Verdict Verdict
	// Confirmed weights the target's confirmed run: the verdict's
	// ConfirmedWeight, or 0 while a fault distrusts the cache.
	Confirmed float64
	// Predictions says whether predictions may count (Verdict.Trusted,
	// and no fault distrusts the cache).
	Predictions bool
	// DistrustedBy is the fault that voids the cache, if any.
	DistrustedBy FaultKind
}

// Freshness is the verdict on a target's event stream with its evidence.
type Freshness struct {
	Verdict Verdict
	// Detail explains the verdict in words (debug view only).
	Detail string
	// Judged is when the verdict was made; Detail's durations are as of
	// then.
	Judged time.Time
	// Faults are the stream's wiring faults, most severe first.
	Faults []Fault
	// Source is where the target's events come from: "subscriber" (its
	// own events= socket), "bus" (Config.EventsListen) or "" (none). Bus
	// and Topic name the bus and the topic its batches arrive under, once
	// one did.
	Source     string
	Bus, Topic string
	// LastEvent is when the subscriber last received a batch (zero: never).
	LastEvent  time.Time
	LastSeq    uint64
	HaveSeq    bool
	Connected  bool
	Replaying  bool
	QueueDepth int
	Gaps       uint64
	// Unrecovered is the subscriber's count of batches known missing that
	// replay could not bring back; UnrecoveredAt is when it last grew, set
	// while that is within StaleAfter (the target is stale meanwhile).
	Unrecovered   uint64
	UnrecoveredAt time.Time
	Restarts      uint64
	// RoutedInWindow is the number of requests the router dispatched to the
	// target over the routing window.
	RoutedInWindow uint64
	// AwaitingSince is the earliest dispatch of an answered request that
	// filled at least one new full block and for which no KV event has been
	// received since; zero when nothing is awaited.
	AwaitingSince time.Time
	// UncachedSinceEvent and ExpectedBlocksSinceEvent are the uncached
	// prompt tokens and new full blocks of the requests awaiting an event.
	UncachedSinceEvent       int64
	ExpectedBlocksSinceEvent int64
}

// Trust is what f lets routing lean on.
func (f *Freshness) Trust() Trust {
	t := Trust{Verdict: f.Verdict, Confirmed: f.Verdict.ConfirmedWeight(), Predictions: f.Verdict.Trusted()}
	for _, x := range f.Faults {
		if x.Kind.DistrustsCache() {
			t.Confirmed, t.Predictions, t.DistrustedBy = 0, false, x.Kind
			break
		}
	}
	return t
}

// noSubscriber is the freshness of a target the plane runs no subscriber
// for (unknown to it, removed, or waiting for block keys).
var noSubscriber = Freshness{Verdict: VerdictDisconnected, Detail: "no event subscriber for this target"}

// judge updates t.fresh from the subscriber status and the router's own
// accounting. Called with p.mu held.
//
// The rule that tells an idle pod from a broken pipe (expect.go): a KV event
// is only expected after the pod computed at least one new full block for a
// request the router dispatched and got a first byte for. Any event received
// since that request's dispatch confirms it. A target is stale when the
// earliest unconfirmed request was dispatched more than StaleAfter ago and
// the unconfirmed requests carried at least MinUncachedTokens uncached
// tokens. A pod that receives no routes awaits nothing and stays fresh,
// however long it stays quiet.
func (p *Plane) judge(t *stream, now time.Time) {
	l := t.live
	status, ok := p.statusOf(t)
	var bus, topic string
	if t.onBus && p.statusFn == nil {
		status, bus, topic, ok = p.busStatus(t)
	}

	// Routing volume over the window.
	n := l.dispatched.Load()
	t.routes = append(t.routes, routeSample{at: now, n: n})
	cut := 0
	for cut < len(t.routes)-1 && now.Sub(t.routes[cut+1].at) >= p.cfg.RoutingWindow {
		cut++
	}
	t.routes = t.routes[cut:]
	if len(t.routes) > 4096 { // evaluation far more often than the window needs
		t.routes = append(t.routes[:0:0], t.routes[len(t.routes)-2048:]...)
	}
	routed := n - t.routes[0].n

	// Requests awaiting their events.
	t.await.absorb(l.expect.drain())
	if at := l.restarted.Swap(0); at != 0 {
		t.await.forget(at)
	}
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
			if now.Sub(t.unrecoveredAt) >= p.cfg.StaleAfter {
				t.unrecoveredN = 0
			}
			t.unrecoveredN += grew
			t.unrecoveredAt = now
		}
		t.lastUnrecovered = status.Unrecovered
	}
	lossRecent := !t.unrecoveredAt.IsZero() && now.Sub(t.unrecoveredAt) < p.cfg.StaleAfter

	f := Freshness{
		Judged:                   now,
		Faults:                   p.judgeFaults(t, status, ok, aw.due, now),
		Bus:                      bus,
		Topic:                    topic,
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
	case t.onBus:
		f.Source = "bus"
	case t.src.Events != "":
		f.Source = "subscriber"
	}
	// A bus-fed target none of whose batches arrived yet is judged like an
	// idle connected one: whether its pod connected to the bus shows only
	// in its batches, so the expectations tell a silent pod from an idle
	// one (and judgeFaults names it).
	waitingOnBus := t.onBus && !ok && p.ingestor != nil
	cache := p.caches[t.id]
	switch {
	case !ok && p.ingestor == nil:
		f.Verdict, f.Detail = noSubscriber.Verdict, "no event subscriber until the fleet's block keys are known (block size, and hash algorithm with --hash-seed)"
	case !ok && !waitingOnBus:
		f.Verdict, f.Detail = noSubscriber.Verdict, noSubscriber.Detail
	case ok && !status.Connected:
		f.Verdict, f.Detail = VerdictDisconnected, fmt.Sprintf("subscriber not connected to %s", t.src.Events)
	case status.Replaying:
		f.Verdict, f.Detail = VerdictReplaying, "replay in progress"
	case cache.PrefixCachingDisabled:
		// Such a pod publishes no KV events and holds nothing a later
		// request could hit: nothing predicted on it will be confirmed.
		f.Verdict, f.Detail = VerdictStale, "prefix caching is disabled on the pod (enable_prefix_caching="+cache.PrefixCaching+"): it publishes no KV events"
	case status.QueueDepth > p.cfg.MaxQueueDepth:
		f.Verdict, f.Detail = VerdictStale, fmt.Sprintf("subscriber backlog of %d batches (limit %d)", status.QueueDepth, p.cfg.MaxQueueDepth)
	case lossRecent:
		why := "replay could not bring them back"
		if t.src.Replay == "" {
			why = "no replay socket to ask"
		}
		f.Verdict, f.Detail = VerdictStale, fmt.Sprintf("%d event batch(es) lost for good, the last at %s (%s): the index may miss stores or hold removed blocks; stale until %s pass without a new loss",
			t.unrecoveredN, t.unrecoveredAt.UTC().Format(time.RFC3339), why, p.cfg.StaleAfter)
	case aw.due != 0 && now.Sub(time.Unix(0, aw.due)) > p.cfg.StaleAfter && aw.uncached >= int64(p.cfg.MinUncachedTokens):
		f.Verdict, f.Detail = VerdictStale, fmt.Sprintf("%d uncached prompt tokens (%d full blocks) answered with no KV event received since their dispatch at %s (%s ago)",
			aw.uncached, aw.blocks, time.Unix(0, aw.due).UTC().Format(time.RFC3339), now.Sub(time.Unix(0, aw.due)).Round(time.Millisecond))
	case waitingOnBus && routed == 0:
		f.Verdict, f.Detail = VerdictFresh, "idle: no routes, and no batch on the bus yet under topic "+t.expectedTopic()
	case waitingOnBus:
		f.Verdict, f.Detail = VerdictFresh, "no batch on the bus yet under topic "+t.expectedTopic()
	case status.LastEvent.IsZero() && routed == 0:
		f.Verdict, f.Detail = VerdictFresh, "idle: no routes and no events"
	case status.LastEvent.IsZero():
		f.Verdict, f.Detail = VerdictFresh, "no events yet"
	default:
		f.Verdict, f.Detail = VerdictFresh, fmt.Sprintf("last event %s ago", now.Sub(status.LastEvent).Round(time.Millisecond))
	}
	if f.Verdict != t.fresh.Verdict && t.fresh.Verdict != "" {
		lvl := p.log.Info
		if f.Verdict == VerdictStale || f.Verdict == VerdictDisconnected {
			lvl = p.log.Warn
		}
		lvl("event stream verdict", "target", t.id.String(), "verdict", f.Verdict, "previous", t.fresh.Verdict, "detail", f.Detail)
	}
	t.fresh = f
}

// statusOf is the subscriber status of t; ok is false when no subscriber
// runs for it. Tests replace it through statusFn.
func (p *Plane) statusOf(t *stream) (kvindex.SubscriberStatus, bool) {
	if p.statusFn != nil {
		return p.statusFn(t.id)
	}
	if t.direct != nil {
		return t.direct.Status(), true
	}
	if t.sub == nil {
		return kvindex.SubscriberStatus{}, false
	}
	return t.sub.sub.Status(), true
}
