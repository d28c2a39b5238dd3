package kvindex

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// TestStreamRateLimits: beyond the per-minute limits a sequence reset (a
// lower sequence number) and a gap are refused, not applied, and counted;
// within them they are a restart and a replayed gap as before.
func TestStreamRateLimits(t *testing.T) {
	var mu sync.Mutex
	var applied []uint64
	var restarts atomic.Int64
	now := time.Unix(1000, 0)
	s := NewSequencer(SequencerConfig{
		Target: targetid.ID{Endpoint: "http://p"}, Logger: quietLogger(), Now: func() time.Time { return now },
		Handle:    func(seq uint64, _ *events.Batch, _ bool) { mu.Lock(); applied = append(applied, seq); mu.Unlock() },
		Restarted: func() { restarts.Add(1) },
		Limits:    StreamLimits{ResetsPerMinute: 1, GapsPerMinute: 1},
	})
	var st stream
	feed := func(seq uint64) { s.handle(context.Background(), &st, Message{Seq: seq, Payload: emptyBatch(t)}) }
	last := func() uint64 { mu.Lock(); defer mu.Unlock(); return applied[len(applied)-1] }
	for _, seq := range []uint64{0, 1, 2} {
		feed(seq)
	}
	feed(0) // a reset within the limit: a restart
	if restarts.Load() != 1 || last() != 0 {
		t.Fatalf("first reset: %d restarts, last applied %d", restarts.Load(), last())
	}
	feed(1)
	feed(0) // a second reset within the minute: refused
	if restarts.Load() != 1 || last() != 1 || s.Status().Refused.N[RefusedResetRate] != 1 {
		t.Fatalf("second reset: %d restarts, last applied %d, refused %v", restarts.Load(), last(), s.Status().Refused.N)
	}
	feed(5) // a gap within the limit: counted, unrecovered (no replay socket), applied
	feed(9) // a second gap: refused
	if last() != 5 || s.Status().Gaps != 1 || s.Status().Refused.N[RefusedGapRate] != 1 {
		t.Fatalf("gaps: last applied %d, status %+v", last(), s.Status())
	}
	now = now.Add(time.Minute)
	feed(9)
	if last() != 9 || s.Status().Gaps != 2 {
		t.Fatalf("a minute later the gap is taken: last applied %d, status %+v", last(), s.Status())
	}
}

// TestDecodeAllocatesForBytesNotDeclarations: a batch declaring 16 million
// events in 1 MiB costs about what its bytes hold, not what it declares.
func TestDecodeAllocatesForBytesNotDeclarations(t *testing.T) {
	payload := append([]byte{0x92, 0x01, 0xdd, 0x01, 0x00, 0x00, 0x00}, bytes.Repeat([]byte{0xc0}, 1<<20)...)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if _, err := events.Decode(payload); err == nil {
		t.Fatal("decoded a batch of nils")
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 8<<20 {
		t.Fatalf("decoding %d bytes allocated %d MiB", len(payload), grew>>20)
	}
}

func emptyBatch(t *testing.T) []byte {
	b, err := events.Encode(&events.Batch{TS: 1}, events.EncodingMap)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestSequencerReplayFunc: the transport's replay is a function. A first
// batch at 3 replays 0..2 through it, a gap replays the missing batch, a
// replay that fails counts what it did not bring back as unrecovered and
// the stream goes on, and a payload past the stream's bounds is refused
// as a live one would be.
func TestSequencerReplayFunc(t *testing.T) {
	const held = 8 // the pod's buffer holds 0..7; 8 only arrives live
	buffered := map[uint64][]byte{}
	for seq := range uint64(held + 1) {
		buffered[seq] = emptyBatch(t)
	}
	buffered[6] = mustEncodeEvents(t, 3)
	var asked []uint64
	fail := false
	replay := func(_ context.Context, start uint64, fn func(uint64, []byte) bool) error {
		asked = append(asked, start)
		if fail {
			return errors.New("replay socket unreachable")
		}
		for seq := start; seq < held; seq++ {
			if !fn(seq, buffered[seq]) {
				return nil
			}
		}
		return nil
	}
	type got struct {
		seq      uint64
		replayed bool
	}
	var applied []got
	s := NewSequencer(SequencerConfig{
		Target: targetid.ID{Endpoint: "http://p"}, Logger: quietLogger(), Replay: replay,
		Handle: func(seq uint64, _ *events.Batch, replayed bool) { applied = append(applied, got{seq, replayed}) },
		Limits: StreamLimits{Decode: events.Limits{MaxEvents: 2}},
	})
	var st stream
	feed := func(seq uint64) { s.handle(context.Background(), &st, Message{Seq: seq, Payload: buffered[seq]}) }
	feed(3) // first join: 0..2 replayed
	feed(5) // gap: 4 replayed
	fail = true
	feed(8) // gap whose replay fails: 6 and 7 unrecovered
	want := []got{{0, true}, {1, true}, {2, true}, {3, false}, {4, true}, {5, false}, {8, false}}
	if !slices.Equal(applied, want) {
		t.Fatalf("applied %v, want %v", applied, want)
	}
	if !slices.Equal(asked, []uint64{0, 4, 6}) {
		t.Fatalf("replays asked from %v", asked)
	}
	if st := s.Status(); st.Unrecovered != 2 || st.Replayed != 4 || st.Replays != 3 || st.Gaps != 2 {
		t.Fatalf("status %+v", st)
	}

	// A replayed payload past the bounds is refused, not applied.
	applied = nil
	fail = false
	st = stream{}
	s.handle(context.Background(), &st, Message{Seq: 7, Payload: buffered[7]})
	if s.Status().Refused.N[RefusedEvents] != 1 {
		t.Fatalf("the replayed batch of 3 events was not refused: %v", s.Status().Refused.N)
	}
	for _, a := range applied {
		if a.seq == 6 {
			t.Fatal("the batch past the bounds was applied")
		}
	}
}

// mustEncodeEvents is a batch of n AllBlocksCleared events.
func mustEncodeEvents(t *testing.T, n int) []byte {
	t.Helper()
	b := events.Batch{TS: 1}
	for range n {
		b.Events = append(b.Events, events.Event{Kind: events.KindAllBlocksCleared})
	}
	p, err := events.Encode(&b, events.EncodingMap)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
