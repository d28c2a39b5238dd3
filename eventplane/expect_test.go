package eventplane

import (
	"sync"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// TestNewFullBlocks: only full blocks are hashed and announced, so the
// blocks a request adds are those of the prompt minus those of its cached
// prefix.
func TestNewFullBlocks(t *testing.T) {
	tests := []struct {
		name                        string
		prompt, uncached, blockSize int64
		want                        int64
	}{
		{name: "cold prompt", prompt: 1000, uncached: 1000, blockSize: 16, want: 62},
		{name: "fully cached", prompt: 1000, uncached: 0, blockSize: 16, want: 0},
		{name: "tail inside the partial block", prompt: 1000, uncached: 8, blockSize: 16, want: 0},
		{name: "tail completes a block", prompt: 1000, uncached: 9, blockSize: 16, want: 1},
		{name: "shorter than a block", prompt: 15, uncached: 15, blockSize: 16, want: 0},
		{name: "exactly one block", prompt: 16, uncached: 16, blockSize: 16, want: 1},
		{name: "cached prefix not block aligned", prompt: 40, uncached: 30, blockSize: 16, want: 2},
		{name: "large blocks", prompt: 1000, uncached: 40, blockSize: 64, want: 0},
		{name: "unknown block size: vLLM's default", prompt: 32, uncached: 32, blockSize: 0, want: 2},
		{name: "negative block size: default", prompt: 32, uncached: 32, blockSize: -8, want: 2},
		{name: "empty prompt", prompt: 0, uncached: 0, blockSize: 16, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := newFullBlocks(tt.prompt, tt.uncached, tt.blockSize); got != tt.want {
				t.Fatalf("newFullBlocks(%d, %d, %d) = %d, want %d", tt.prompt, tt.uncached, tt.blockSize, got, tt.want)
			}
		})
	}
}

// TestAwaitLedger: settling drops what an event satisfies; compaction
// bounds the ledger without ever declaring a request satisfied early.
func TestAwaitLedger(t *testing.T) {
	e := func(d int64) expectation {
		return expectation{dispatched: d, until: d, answered: d + 1, uncached: 10, blocks: 1}
	}
	tests := []struct {
		name      string
		pending   []int64 // dispatch times
		compact   bool
		lastEvent int64
		wantSince int64
		wantN     int64 // blocks left
	}{
		{name: "nothing awaited", lastEvent: 5},
		{name: "no event yet", pending: []int64{3, 1, 2}, wantSince: 1, wantN: 3},
		{name: "event at a dispatch satisfies it", pending: []int64{1, 2, 3}, lastEvent: 2, wantSince: 3, wantN: 1},
		{name: "event after all", pending: []int64{1, 2, 3}, lastEvent: 9},
		{name: "event before all", pending: []int64{4, 5}, lastEvent: 3, wantSince: 4, wantN: 2},
		{name: "merged run straddling the event keeps its later part", pending: []int64{1, 4}, compact: true, lastEvent: 2, wantSince: 3, wantN: 2},
		{name: "merged run wholly before the event", pending: []int64{1, 2, 7, 8}, compact: true, lastEvent: 2, wantSince: 7, wantN: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var a awaitLedger
			for _, d := range tt.pending {
				a.pending = append(a.pending, e(d))
			}
			if tt.compact {
				a.compact()
				if len(a.pending) != (len(tt.pending)+1)/2 {
					t.Fatalf("compact left %d entries of %d", len(a.pending), len(tt.pending))
				}
			}
			a.settle(tt.lastEvent)
			s := a.summary(100)
			if s.since != tt.wantSince || s.blocks != tt.wantN || s.uncached != 10*tt.wantN {
				t.Fatalf("summary %+v, want since %d, %d blocks", s, tt.wantSince, tt.wantN)
			}
		})
	}

	// The ledger stays bounded under a broken pipe, and the clock keeps its
	// earliest dispatch.
	var a awaitLedger
	for i := range int64(3 * maxPending) {
		a.absorb([]expectation{e(1000 + i)})
	}
	if len(a.pending) > maxPending {
		t.Fatalf("ledger holds %d entries, bound %d", len(a.pending), maxPending)
	}
	if s := a.summary(1 << 40); s.since != 1000 || s.blocks != 3*maxPending {
		t.Fatalf("after compaction: %+v", s)
	}
	a.settle(1000 + 3*maxPending)
	if len(a.pending) != 0 {
		t.Fatalf("%d entries left after an event later than every dispatch", len(a.pending))
	}
}

// TestExpectInboxBounded: with nobody draining (a plane that is not Run), first bytes do not accumulate without bound.
func TestExpectInboxBounded(t *testing.T) {
	var b expectInbox
	for i := range maxInbox + 100 {
		ok := b.push(expectation{dispatched: int64(i)})
		if ok != (i < maxInbox) {
			t.Fatalf("push %d: accepted %v", i, ok)
		}
	}
	if got := len(b.drain()); got != maxInbox {
		t.Fatalf("drained %d, want %d", got, maxInbox)
	}
	if !b.push(expectation{}) || len(b.drain()) != 1 {
		t.Fatal("inbox not usable after a drain")
	}
}

// TestAwaitConcurrent: first bytes from many goroutines while the plane
// evaluates (run with -race); one event later than every dispatch settles
// all of them.
func TestAwaitConcurrent(t *testing.T) {
	env := newTestPlane(t, Config{})
	id := podID(0)
	env.events.set(id, func(*kvindex.SubscriberStatus) {})
	env.p.SetTarget(id, Source{Events: "tcp://127.0.0.1:5557"})
	env.p.evaluate()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 300 {
				e := env.p.Dispatch(id)
				e.FirstByte(1000, 1000)
			}
		})
	}
	wg.Go(func() {
		for range 50 {
			env.p.evaluate()
		}
	})
	wg.Wait()
	env.p.evaluate()
	if got := env.p.Freshness(id); got.ExpectedBlocksSinceEvent != 1200*62 || got.UncachedSinceEvent != 1200*1000 {
		t.Fatalf("awaiting %d blocks, %d tokens; want %d, %d", got.ExpectedBlocksSinceEvent, got.UncachedSinceEvent, 1200*62, 1200*1000)
	}
	env.clock.Advance(time.Millisecond)
	env.events.set(id, func(st *kvindex.SubscriberStatus) { st.LastEvent = env.clock.Now() })
	env.p.evaluate()
	if got := env.p.Freshness(id); !got.AwaitingSince.IsZero() || got.ExpectedBlocksSinceEvent != 0 {
		t.Fatalf("after the event: awaiting since %v, %d blocks", got.AwaitingSince, got.ExpectedBlocksSinceEvent)
	}
}

// TestExpectationZeroAndRepeat: an expectation for a target the plane does
// not know is a no-op, and a second first byte adds nothing.
func TestExpectationZeroAndRepeat(t *testing.T) {
	env := newTestPlane(t, Config{})
	id := podID(0)
	env.events.set(id, func(*kvindex.SubscriberStatus) {})
	env.p.SetTarget(id, Source{Events: "tcp://127.0.0.1:5557"})
	unknown := env.p.Dispatch(podID(1))
	unknown.FirstByte(1000, 1000)
	e := env.p.Dispatch(id)
	e.FirstByte(1000, 1000)
	e.FirstByte(1000, 1000)
	env.p.evaluate()
	if got := env.p.Freshness(id); got.ExpectedBlocksSinceEvent != 62 || got.RoutedInWindow != 1 {
		t.Fatalf("awaiting %d blocks over %d routes; want 62 over 1", got.ExpectedBlocksSinceEvent, got.RoutedInWindow)
	}
	if got := env.p.Freshness(podID(1)); got.Verdict != VerdictDisconnected || got.RoutedInWindow != 0 {
		t.Fatalf("unknown target: %+v", got)
	}
}

// BenchmarkRequestPath is what the event plane adds to one routed request:
// the verdict of four candidates, the dispatch and the first byte (whose
// expectation an evaluation drains every thousand requests, as the
// plane's ticker would).
func BenchmarkRequestPath(b *testing.B) {
	env := newTestPlane(b, Config{})
	ids := []targetid.ID{podID(0), podID(1), podID(2), podID(3)}
	for _, id := range ids {
		env.events.set(id, func(*kvindex.SubscriberStatus) {})
		env.p.SetTarget(id, Source{Events: "tcp://127.0.0.1:5557"})
	}
	env.p.evaluate()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		for _, id := range ids {
			_ = env.p.Verdict(id).ConfirmedWeight()
		}
		e := env.p.Dispatch(ids[i%4])
		e.FirstByte(4096, 1024)
		if i%1000 == 999 {
			b.StopTimer()
			env.p.evaluate()
			b.StartTimer()
		}
	}
}
