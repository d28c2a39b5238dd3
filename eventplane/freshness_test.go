package eventplane

import (
	"cmp"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/manualclock"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/targetid"
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
	// lose is what kvindex reports when n batches are missing for good.
	lose := func(n uint64) func(*kvindex.SubscriberStatus) {
		return func(s *kvindex.SubscriberStatus) { s.Gaps++; s.Unrecovered += n }
	}
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
			// kvindex counts a gap it cannot replay as unrecovered batches.
			name: "sequence gap without replay socket: stale for the bound",
			steps: cat(
				[]step{{event: true, want: VerdictFresh}},
				[]step{{event: true, status: lose(3), want: VerdictStale}},
				repeat(9, step{event: true, want: VerdictStale}),
				[]step{{event: true, want: VerdictFresh}},
			),
			wantDetail: "last event",
		},
		{
			name:   "sequence gap repaired by replay: the replaying flag speaks",
			replay: true,
			steps: []step{
				{event: true, want: VerdictFresh},
				{event: true, status: func(s *kvindex.SubscriberStatus) { s.Gaps++; s.Replaying = true }, want: VerdictReplaying},
				{event: true, status: func(s *kvindex.SubscriberStatus) { s.Replaying = false; s.Replayed += 3 }, want: VerdictFresh},
			},
		},
		{
			name:   "replay could not bring the batches back: stale despite the replay socket",
			replay: true,
			steps: cat(
				[]step{{event: true, want: VerdictFresh}},
				[]step{{event: true, status: lose(500), want: VerdictStale}},
				repeat(4, step{routes: 5, uncached: 64, event: true, want: VerdictStale}),
			),
			wantDetail: "500 event batch(es) lost for good",
		},
		{
			name:   "unrecovered loss heals once the window passes with events flowing",
			replay: true,
			steps: cat(
				[]step{{routes: 5, uncached: 64, event: true, status: lose(2), want: VerdictStale}},
				repeat(9, step{routes: 5, uncached: 64, event: true, want: VerdictStale}),
				repeat(5, step{routes: 5, uncached: 64, event: true, want: VerdictFresh}),
			),
			wantDetail: "last event",
		},
		{
			name:   "a new loss inside the window extends it",
			replay: true,
			steps: cat(
				[]step{{event: true, status: lose(1), want: VerdictStale}},
				repeat(5, step{event: true, want: VerdictStale}),
				[]step{{event: true, status: lose(1), want: VerdictStale}},
				repeat(9, step{event: true, want: VerdictStale}),
				[]step{{event: true, want: VerdictFresh}},
			),
		},
		{
			name: "loss, then idle: fresh after the window (no routes, nothing awaited)",
			steps: cat(
				[]step{{event: true, status: lose(4), want: VerdictStale}},
				repeat(9, step{want: VerdictStale}),
				repeat(5, quiet),
			),
		},
		{
			name:   "a restarted subscriber counts from zero: its first loss is new",
			replay: true,
			steps: cat(
				[]step{{event: true, status: lose(7), want: VerdictStale}},
				repeat(9, step{event: true, want: VerdictStale}),
				[]step{
					{event: true, want: VerdictFresh},
					{event: true, status: func(s *kvindex.SubscriberStatus) { s.Unrecovered = 0 }, want: VerdictFresh},
					{event: true, status: lose(1), want: VerdictStale},
				},
			),
			wantDetail: "1 event batch(es) lost",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := Source{Events: "tcp://127.0.0.1:5557"}
			if tt.replay {
				src.Replay = "tcp://127.0.0.1:5558"
			}
			env := newTestPlane(t, Config{StaleAfter: 10 * time.Second, MinUncachedTokens: 16, MaxQueueDepth: 100})
			id := podID(0)
			if !tt.noStatus {
				env.events.set(id, func(*kvindex.SubscriberStatus) {})
			}
			env.p.SetTarget(id, src)
			env.p.evaluate()
			var got Freshness
			for i, s := range tt.steps {
				env.clock.Advance(time.Second)
				for range s.routes {
					e := env.p.Dispatch(id)
					e.FirstByte(s.uncached+100, s.uncached)
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
				env.p.evaluate()
				got = env.p.Freshness(id)
				if got.Verdict != s.want || env.p.Verdict(id) != s.want {
					t.Fatalf("step %d: verdict %s (%s), want %s", i, got.Verdict, got.Detail, s.want)
				}
				if got.Verdict.Trusted() != (s.want == VerdictFresh) {
					t.Fatalf("step %d: Trusted() disagrees with verdict", i)
				}
			}
			if tt.wantDetail != "" && !strings.Contains(got.Detail, tt.wantDetail) {
				t.Fatalf("detail %q, want containing %q", got.Detail, tt.wantDetail)
			}
			env.verdictMetric(t, id, got.Verdict)
		})
	}
}

// TestRoutingWindow: recent routing volume counts dispatches over the window.
func TestRoutingWindow(t *testing.T) {
	env := newTestPlane(t, Config{RoutingWindow: 10 * time.Second})
	id := podID(0)
	env.p.SetTarget(id, Source{})
	env.p.evaluate()
	for range 10 {
		for range 3 {
			env.p.Dispatch(id)
		}
		env.clock.Advance(time.Second)
		env.p.evaluate()
	}
	if got := env.p.Freshness(id).RoutedInWindow; got != 30 {
		t.Fatalf("routed in window %d, want 30", got)
	}
	for range 5 {
		env.clock.Advance(time.Second)
		env.p.evaluate()
	}
	if got := env.p.Freshness(id).RoutedInWindow; got != 15 {
		t.Fatalf("routed in window after 5 quiet seconds %d, want 15", got)
	}
}

// TestEventAwaitClock plays request timelines against a fake clock to pin
// down when a request's KV event is awaited. vLLM publishes a step's events
// before it returns the step's outputs, so the confirming batch normally
// lands before the first byte; any batch received since the request's
// dispatch confirms it. Only requests that fill a new full block publish
// anything. Times are offsets from the start; the subscriber is connected.
func TestEventAwaitClock(t *testing.T) {
	type op struct {
		at   time.Duration
		kind string // dispatch, first, event, check
		req  int    // dispatch, first
		// dispatch: prompt and uncached tokens, told to the plane at the
		// first byte (the request's end tells it nothing)
		prompt, uncached int
		// check: the verdict, and optionally the awaited clock start
		want          Verdict
		awaitingSince time.Duration // -1: nothing awaited; 0: not checked
	}
	const s = time.Second
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	dispatch := func(at time.Duration, req, prompt, uncached int) op {
		return op{at: at, kind: "dispatch", req: req, prompt: prompt, uncached: uncached}
	}
	first := func(at time.Duration, req int) op { return op{at: at, kind: "first", req: req} }
	event := func(at time.Duration) op { return op{at: at, kind: "event"} }
	check := func(at time.Duration, want Verdict) op { return op{at: at, kind: "check", want: want} }
	checkAwait := func(at time.Duration, want Verdict, since time.Duration) op {
		return op{at: at, kind: "check", want: want, awaitingSince: since}
	}
	tests := []struct {
		name      string
		blockSize int // the pod's cache config (16 when 0)
		ops       []op
	}{
		{
			name: "event 5ms before the first byte, then idle: fresh for good",
			ops: []op{
				dispatch(1*s, 1, 1000, 1000), event(1*s + ms(200)), first(1*s+ms(205), 1),
				checkAwait(5*s, VerdictFresh, -1), check(12*s, VerdictFresh), check(31*s, VerdictFresh), check(10*time.Minute, VerdictFresh),
			},
		},
		{
			name: "chunked prefill: blocks announced long before the first byte",
			ops: []op{
				dispatch(1*s, 1, 8000, 8000), event(3 * s), first(8*s, 1),
				check(20*s, VerdictFresh), check(40*s, VerdictFresh),
			},
		},
		{
			name: "event after the first byte still confirms",
			ops: []op{
				dispatch(1*s, 1, 1000, 1000), first(1*s+ms(100), 1), event(1*s + ms(150)),
				check(30*s, VerdictFresh),
			},
		},
		{
			name: "an event received before dispatch confirms nothing",
			ops: []op{
				event(ms(500)), dispatch(1*s, 1, 1000, 1000), first(1*s+ms(200), 1),
				checkAwait(10*s+ms(900), VerdictFresh, 1*s), check(11*s+ms(100), VerdictStale), check(60*s, VerdictStale),
				event(61 * s), check(61*s+ms(1), VerdictFresh),
			},
		},
		{
			name: "an event for an earlier request does not confirm a later one",
			ops: []op{
				dispatch(1*s, 1, 1000, 1000), event(1*s + ms(500)), dispatch(2*s, 2, 1000, 1000),
				first(1*s+ms(600), 1), first(2*s+ms(500), 2),
				checkAwait(11*s+ms(900), VerdictFresh, 2*s), check(12*s+ms(100), VerdictStale),
			},
		},
		{
			name: "the earliest unconfirmed dispatch starts the clock, whatever the order of first bytes",
			ops: []op{
				dispatch(1*s, 1, 1000, 1000), dispatch(2*s, 2, 1000, 1000),
				first(3*s, 2), first(4*s, 1),
				checkAwait(10*s, VerdictFresh, 1*s), check(11*s+ms(100), VerdictStale),
			},
		},
		{
			name: "requests that only extend a partial block publish nothing: never awaited",
			ops: func() []op {
				var ops []op
				for i := range 100 { // 8 uncached tokens after 992 cached: block 62 stays partial
					at := 1*s + time.Duration(i)*ms(100)
					ops = append(ops, dispatch(at, i, 1000, 8), first(at+ms(50), i))
				}
				return append(ops, checkAwait(30*s, VerdictFresh, -1))
			}(),
		},
		{
			name: "nine uncached tokens complete a block: awaited",
			ops: []op{
				dispatch(1*s, 1, 1000, 9), first(1*s+ms(50), 1),
				checkAwait(11*s, VerdictFresh, 1*s), check(11*s+ms(100), VerdictStale),
			},
		},
		{
			name:      "the pod's block size decides: 40 tokens fill no 64-token block",
			blockSize: 64,
			ops: []op{
				dispatch(1*s, 1, 1000, 40), first(1*s+ms(50), 1),
				checkAwait(30*s, VerdictFresh, -1),
			},
		},
		{
			name: "a prefill longer than the bound: its events get a moment after the first byte",
			ops: []op{
				dispatch(1*s, 1, 1000, 1000), first(12*s, 1),
				check(12*s+ms(100), VerdictFresh), event(12*s + ms(150)), check(13*s+ms(500), VerdictFresh),
			},
		},
		{
			name: "a prefill longer than the bound on a broken pipe: stale once the moment passed",
			ops: []op{
				dispatch(1*s, 1, 1000, 1000), first(12*s, 1),
				check(12*s+ms(100), VerdictFresh), check(13*s+ms(100), VerdictStale),
			},
		},
		{
			name: "no first byte, no expectation (failed or cancelled prefill)",
			ops: []op{
				dispatch(1*s, 1, 1000, 1000), check(30*s, VerdictFresh),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newTestPlane(t, Config{StaleAfter: 10 * time.Second, MinUncachedTokens: 1})
			id := podID(0)
			if tt.blockSize != 0 {
				env.p.SetCaches(map[targetid.ID]Cache{id: {Reported: true, BlockSize: tt.blockSize, HashAlgo: "sha256"}})
			}
			env.events.set(id, func(*kvindex.SubscriberStatus) {})
			env.p.SetTarget(id, Source{Events: "tcp://127.0.0.1:5557"})
			env.p.evaluate()
			start := env.clock.Now()
			type request struct {
				exp              Expectation
				prompt, uncached int
			}
			requests := map[int]*request{}
			ops := slices.Clone(tt.ops)
			slices.SortStableFunc(ops, func(a, b op) int { return cmp.Compare(a.at, b.at) })
			for _, o := range ops {
				if d := start.Add(o.at).Sub(env.clock.Now()); d > 0 {
					env.clock.Advance(d)
				}
				switch o.kind {
				case "dispatch":
					requests[o.req] = &request{exp: env.p.Dispatch(id), prompt: o.prompt, uncached: o.uncached}
				case "first":
					q := requests[o.req]
					q.exp.FirstByte(q.prompt, q.uncached)
				case "event":
					env.events.set(id, func(st *kvindex.SubscriberStatus) {
						st.LastEvent = env.clock.Now()
						st.LastSeq++
						st.HaveSeq = true
						st.Batches++
					})
				case "check":
					env.p.evaluate()
					got := env.p.Freshness(id)
					if got.Verdict != o.want {
						t.Fatalf("at %s: verdict %s (%s), want %s", o.at, got.Verdict, got.Detail, o.want)
					}
					switch {
					case o.awaitingSince < 0 && !got.AwaitingSince.IsZero():
						t.Fatalf("at %s: awaiting since %s, want nothing awaited", o.at, got.AwaitingSince.Sub(start))
					case o.awaitingSince > 0 && !got.AwaitingSince.Equal(start.Add(o.awaitingSince)):
						t.Fatalf("at %s: awaiting since %s, want %s", o.at, got.AwaitingSince.Sub(start), o.awaitingSince)
					}
				}
			}
		})
	}
}

// TestFirstByteCountsDecide: what a request expects is decided by the
// token counts the router gives at its first byte, not at its dispatch: a
// request the router found fully cached by then (its flight revised to no
// uncached tokens) awaits no event; with the dispatch's estimate, the same
// silence makes the target stale.
func TestFirstByteCountsDecide(t *testing.T) {
	for _, revised := range []bool{false, true} {
		env := newTestPlane(t, Config{StaleAfter: 10 * time.Second, MinUncachedTokens: 16, MaxQueueDepth: 100})
		id := podID(0)
		env.events.set(id, func(*kvindex.SubscriberStatus) {})
		env.p.SetTarget(id, Source{Events: "tcp://127.0.0.1:5557"})
		env.p.evaluate()
		e := env.p.Dispatch(id)
		if revised {
			e.FirstByte(4100, 0)
		} else {
			e.FirstByte(4000, 3500)
		}
		env.clock.Advance(11 * time.Second)
		env.p.evaluate()
		want := VerdictStale
		if revised {
			want = VerdictFresh
		}
		if v := env.p.Freshness(id); v.Verdict != want {
			t.Fatalf("revised %v: verdict %s (%s), want %s", revised, v.Verdict, v.Detail, want)
		}
	}
}

// TestRestartForgetsAwaitedEvents: a pod process that restarts takes the
// events it had not published yet with it, so the requests dispatched
// before the restart await nothing more: the stream stays fresh where,
// without the restart, the same silence makes it stale. Both ways a
// restart shows (the sequence going backwards, and a scrape's new process
// start time) count.
func TestRestartForgetsAwaitedEvents(t *testing.T) {
	h, err := kvindex.NewHasher(kvindex.AlgoSHA256, "0", 16)
	if err != nil {
		t.Fatal(err)
	}
	tokens := make([]uint32, 64)
	for i := range tokens {
		tokens[i] = uint32(i + 1)
	}
	batch, _ := storedBatch(t, h, tokens)
	for _, tc := range []struct {
		name    string
		restart func(p *Plane, id targetid.ID)
		want    Verdict
	}{
		{"no restart", func(*Plane, targetid.ID) {}, VerdictStale},
		{"sequence backwards", func(p *Plane, id targetid.ID) { p.Deliver(id, 0, &batch) }, VerdictFresh},
		{"process start time", func(p *Plane, id targetid.ID) { p.TargetRestarted(id) }, VerdictFresh},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := manualclock.New()
			p, err := New(Config{StaleAfter: 10 * time.Second, MinUncachedTokens: 1, BlockSize: 16}, Deps{Now: clock.Now,
				Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			id := podID(0)
			p.SetCaches(map[targetid.ID]Cache{id: {Serving: true, Reported: true, BlockSize: 16}})
			p.SetTarget(id, Source{InProcess: true})
			for seq := range uint64(4) {
				p.Deliver(id, seq, &batch)
			}
			clock.Advance(time.Second)
			exp := p.Dispatch(id)
			exp.FirstByte(1000, 1000)
			clock.Advance(time.Second)
			p.Evaluate()
			// The old process dies before publishing the request's blocks.
			tc.restart(p, id)
			clock.Advance(12 * time.Second)
			p.Evaluate()
			if f := p.Freshness(id); f.Verdict != tc.want {
				t.Fatalf("verdict %s (%s), want %s", f.Verdict, f.Detail, tc.want)
			}
		})
	}
}
