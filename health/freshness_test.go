package health

import (
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex"
)

// TestEventFreshness plays scenarios second by second against a fake clock
// and a fake subscriber: each step may route requests (answered with a first
// byte) and may deliver an event; the verdict is checked after each step.
func TestEventFreshness(t *testing.T) {
	type step struct {
		routes   int  // requests dispatched and answered this second
		uncached int  // uncached tokens per request
		event    bool // an event batch arrives this second
		status   func(*kvindex.SubscriberStatus)
		want     Verdict
	}
	quiet := step{want: VerdictFresh}
	repeat := func(n int, s step) []step {
		out := make([]step, n)
		for i := range out {
			out[i] = s
		}
		return out
	}
	cat := func(parts ...[]step) []step {
		var out []step
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	tests := []struct {
		name       string
		replay     bool
		noStatus   bool
		steps      []step
		wantDetail string
	}{
		{
			name:       "idle pod: no routes, no events stays fresh",
			steps:      repeat(30, quiet),
			wantDetail: "idle",
		},
		{
			name:  "busy pod with events flowing stays fresh",
			steps: repeat(30, step{routes: 5, uncached: 64, event: true, want: VerdictFresh}),
		},
		{
			name: "events stop while routes continue: stale after the bound",
			steps: cat(
				repeat(5, step{routes: 5, uncached: 64, event: true, want: VerdictFresh}),
				repeat(10, step{routes: 5, uncached: 64, want: VerdictFresh}), // 10s without events: at the bound
				repeat(3, step{routes: 5, uncached: 64, want: VerdictStale}),
				// Stale persists while routes go on without events, even when routing stops.
				repeat(3, step{want: VerdictStale}),
				// The first event heals it.
				[]step{{event: true, want: VerdictFresh}},
			),
			wantDetail: "last event",
		},
		{
			name: "events stop and routes stop too: idle, fresh",
			steps: cat(
				repeat(3, step{routes: 5, uncached: 64, event: true, want: VerdictFresh}),
				repeat(30, quiet),
			),
		},
		{
			name: "fully cached requests expect no events",
			steps: cat(
				repeat(3, step{routes: 5, uncached: 64, event: true, want: VerdictFresh}),
				repeat(30, step{routes: 5, uncached: 0, want: VerdictFresh}),
			),
		},
		{
			name: "a trickle below the token bound is not a broken pipe",
			steps: cat(
				[]step{{routes: 1, uncached: 10, want: VerdictFresh}},
				repeat(20, quiet),
			),
		},
		{
			name: "never any event but routes answered: stale",
			steps: cat(
				repeat(10, step{routes: 2, uncached: 32, want: VerdictFresh}),
				[]step{{routes: 2, uncached: 32, want: VerdictStale}},
			),
			wantDetail: "no KV event",
		},
		{
			name:       "subscriber disconnected",
			steps:      []step{{status: func(s *kvindex.SubscriberStatus) { s.Connected = false }, want: VerdictDisconnected}},
			wantDetail: "not connected",
		},
		{
			name:       "no subscriber at all",
			noStatus:   true,
			steps:      []step{{want: VerdictDisconnected}},
			wantDetail: "no event subscriber",
		},
		{
			name: "replay in progress, then done",
			steps: []step{
				{status: func(s *kvindex.SubscriberStatus) { s.Replaying = true }, want: VerdictReplaying},
				{status: func(s *kvindex.SubscriberStatus) { s.Replaying = false }, event: true, want: VerdictFresh},
			},
		},
		{
			name:       "subscriber backlog",
			steps:      []step{{status: func(s *kvindex.SubscriberStatus) { s.QueueDepth = 5000 }, want: VerdictStale}},
			wantDetail: "backlog",
		},
		{
			name: "sequence gap without replay socket: stale for the bound",
			steps: cat(
				[]step{{event: true, want: VerdictFresh}},
				[]step{{event: true, status: func(s *kvindex.SubscriberStatus) { s.Gaps++ }, want: VerdictStale}},
				repeat(9, step{event: true, want: VerdictStale}),
				[]step{{event: true, want: VerdictFresh}},
			),
		},
		{
			name:   "sequence gap with replay socket: the replaying flag speaks",
			replay: true,
			steps: []step{
				{event: true, want: VerdictFresh},
				{event: true, status: func(s *kvindex.SubscriberStatus) { s.Gaps++ }, want: VerdictFresh},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := newFakePod(t, "m")
			opts := ""
			if tt.replay {
				opts = "replay=tcp://127.0.0.1:5558"
			}
			env := newTestMonitor(t, Config{Endpoints: []string{pod.spec(opts)}, EventsStaleAfter: 10 * time.Second, EventsMinUncachedTokens: 16, EventsMaxQueueDepth: 100}, Deps{})
			id := pod.id(0)
			if !tt.noStatus {
				env.events.set(id, func(*kvindex.SubscriberStatus) {})
			}
			env.tick()
			tg := env.target(t, id)
			for i, s := range tt.steps {
				env.clock.Advance(time.Second)
				for range s.routes {
					f := tg.Dispatch(s.uncached+100, s.uncached)
					f.FirstByte()
					f.Finish(OutcomeSuccess)
				}
				if !tt.noStatus {
					env.events.set(id, func(st *kvindex.SubscriberStatus) {
						if s.status != nil {
							s.status(st)
						}
						if s.event {
							// The batch arrives a little after this second's first bytes.
							st.LastEvent = env.clock.Now().Add(10 * time.Millisecond)
							st.LastSeq++
							st.HaveSeq = true
							st.Batches++
						}
					})
				}
				env.clock.Advance(20 * time.Millisecond)
				env.m.evaluate()
				tg = env.target(t, id)
				if tg.Events.Verdict != s.want {
					t.Fatalf("step %d: verdict %s (%s), want %s", i, tg.Events.Verdict, tg.Events.Detail, s.want)
				}
				if tg.Events.Trusted() != (s.want == VerdictFresh) {
					t.Fatalf("step %d: Trusted() disagrees with verdict", i)
				}
			}
			if tt.wantDetail != "" && !strings.Contains(tg.Events.Detail, tt.wantDetail) {
				t.Fatalf("detail %q, want containing %q", tg.Events.Detail, tt.wantDetail)
			}
			if v, ok := env.gauge(t, "prefixrouter_health_events_verdict", map[string]string{"target": pod.srv.URL, "verdict": string(tg.Events.Verdict)}); !ok || v != 1 {
				t.Fatalf("verdict metric missing for %s", tg.Events.Verdict)
			}
		})
	}
}

// TestRoutingWindow: recent routing volume counts dispatches over the window.
func TestRoutingWindow(t *testing.T) {
	pod := newFakePod(t, "m")
	env := newTestMonitor(t, Config{Endpoints: []string{pod.spec("")}, RoutingWindow: 10 * time.Second}, Deps{})
	env.tick()
	tg := env.target(t, pod.id(0))
	for range 10 {
		for range 3 {
			f := tg.Dispatch(1, 1)
			f.Finish(OutcomeSuccess)
		}
		env.clock.Advance(time.Second)
		env.m.evaluate()
	}
	if got := env.target(t, pod.id(0)).Events.RoutedInWindow; got != 30 {
		t.Fatalf("routed in window %d, want 30", got)
	}
	for range 5 {
		env.clock.Advance(time.Second)
		env.m.evaluate()
	}
	if got := env.target(t, pod.id(0)).Events.RoutedInWindow; got != 15 {
		t.Fatalf("routed in window after 5 quiet seconds %d, want 15", got)
	}
}
