package kvindex

import (
	"bytes"
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/sim/publish"
	"github.com/prefixrouter/prefixrouter/sim/publish/publishtest"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// storedPayload is a BlockStored batch of blocks blocks of 4 tokens.
func storedPayload(t *testing.T, first uint64, blocks int) []byte {
	t.Helper()
	ev := events.Event{Kind: events.KindBlockStored, BlockSize: 4, Medium: events.MediumGPU}
	for i := range blocks {
		ev.BlockHashes = append(ev.BlockHashes, first+uint64(i))
		ev.TokenIDs = append(ev.TokenIDs, 1, 2, 3, uint32(i))
	}
	b, err := events.Encode(&events.Batch{TS: 1, Events: []events.Event{ev}}, events.EncodingMap)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestOversizedMessagesDropped: with a 64 KiB bound, a message of about
// 1 MiB is dropped by libzmq on the bus and on a pod's own subscription
// (the peer's connection with it, which reconnects and counts), and the
// batches after it are applied.
func TestOversizedMessagesDropped(t *testing.T) {
	const maxBytes = 64 << 10
	big := storedPayload(t, 1<<40, 40000) // ~1 MiB
	if len(big) < 8*maxBytes {
		t.Fatalf("big payload of %d bytes", len(big))
	}
	type applied struct {
		mu   sync.Mutex
		seqs map[uint64]int // seq → blocks
	}
	record := func(a *applied) func(seq uint64, b *events.Batch, _ bool) {
		return func(seq uint64, b *events.Batch, _ bool) {
			a.mu.Lock()
			defer a.mu.Unlock()
			for _, ev := range b.Events {
				a.seqs[seq] += len(ev.BlockHashes)
			}
		}
	}
	check := func(t *testing.T, a *applied, pub *publish.Publisher, reconnects func() float64) {
		t.Helper()
		var bigSeqs []uint64
		for range 8 {
			seq, err := pub.PublishRaw(big, true)
			if err != nil {
				t.Fatal(err)
			}
			bigSeqs = append(bigSeqs, seq)
		}
		waitFor(t, "the peer dropped and reconnected", func() bool { return reconnects() > 0 })
		waitFor(t, "a small batch after the big ones applied", func() bool {
			seq, err := pub.PublishRaw(storedPayload(t, 1, 2), true)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond)
			a.mu.Lock()
			defer a.mu.Unlock()
			return a.seqs[seq] == 2
		})
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, s := range bigSeqs {
			if a.seqs[s] != 0 {
				t.Fatalf("an oversized batch (seq %d) was applied", s)
			}
		}
	}

	t.Run("bus", func(t *testing.T) {
		listen := publishtest.FreeAddr(t, 1)
		reg := prometheus.NewRegistry()
		m := NewMetrics(reg)
		a := &applied{seqs: map[uint64]int{}}
		id := targetid.ID{Endpoint: "http://127.0.0.1:8000"}
		// The reconnected publisher is a new connection: it takes the
		// topic over once the old one was silent for OwnerIdle.
		bus, err := NewBus(BusConfig{Listen: listen, Logger: quietLogger(), Metrics: m, MaxMessageBytes: maxBytes, OwnerIdle: 200 * time.Millisecond,
			Route: func(int, string) (BusRoute, error) {
				return BusRoute{Target: id, Sources: []string{"127.0.0.1"}, Handle: record(a)}, nil
			}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer func() { cancel(); bus.Wait() }()
		if err := bus.Start(ctx); err != nil {
			t.Fatal(err)
		}
		pub, err := publish.New(publish.Config{Connect: listen, Topic: "kv@127.0.0.1:8000@m", Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		waitFor(t, "the pod's stream", func() bool {
			if _, err := pub.PublishRaw(emptyBatch(t), true); err != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond)
			_, _, ok := bus.Status(id)
			return ok
		})
		first := testutil.ToFloat64(m.busConnections)
		check(t, a, pub, func() float64 { return testutil.ToFloat64(m.busConnections) - first })
	})

	t.Run("subscriber", func(t *testing.T) {
		pub, err := publish.New(publish.Config{Bind: "tcp://127.0.0.1:*", Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		a := &applied{seqs: map[uint64]int{}}
		sub, err := NewSubscriber(SubscriberConfig{Endpoint: pub.Endpoint(), Handle: record(a), MaxMessageBytes: maxBytes, Logger: quietLogger(),
			ReconnectMin: 10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = sub.Run(ctx) }()
		defer func() { cancel(); <-done }()
		waitFor(t, "connected", func() bool { return sub.Status().Connected })
		check(t, a, pub, func() float64 { return float64(sub.Status().Reconnects) })
	})
}

// TestStreamRateLimits: beyond the per-minute limits a sequence reset (a
// lower sequence number) and a gap are refused, not applied, and counted;
// within them they are a restart and a replayed gap as before.
func TestStreamRateLimits(t *testing.T) {
	var mu sync.Mutex
	var applied []uint64
	var restarts atomic.Int64
	now := time.Unix(1000, 0)
	s := newSequencer(sequencerConfig{
		Target: targetid.ID{Endpoint: "http://p"}, Logger: quietLogger(), Now: func() time.Time { return now },
		Handle:    func(seq uint64, _ *events.Batch, _ bool) { mu.Lock(); applied = append(applied, seq); mu.Unlock() },
		Restarted: func() { restarts.Add(1) },
		Limits:    StreamLimits{ResetsPerMinute: 1, GapsPerMinute: 1},
	})
	var st stream
	feed := func(seq uint64) { s.handle(context.Background(), &st, rawMessage{seq: seq, payload: emptyPayload(t)}) }
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

func emptyPayload(t *testing.T) []byte { return emptyBatch(t) }

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

// TestBusQueueBounded: a stream whose queue is full refuses the batch
// rather than stall the socket's other topics.
func TestBusQueueBounded(t *testing.T) {
	seq := newSequencer(sequencerConfig{Target: targetid.ID{Endpoint: "http://p"}, QueueSize: 1, Logger: quietLogger(), Handle: func(uint64, *events.Batch, bool) {}})
	st := &busStream{seq: seq, route: BusRoute{Target: seq.cfg.Target, Sources: []string{"127.0.0.1"}}, owner: "c1", ctx: context.Background()}
	b := &Bus{log: quietLogger(), streams: map[busKey]*busStream{{topic: "t"}: st}, byTarget: map[targetid.ID]*busStream{st.route.Target: st},
		resolver: newSourceResolver(nil), refusals: map[targetid.ID]*busRefusals{}, cfg: BusConfig{OwnerIdle: time.Hour}}
	from := peerOf(map[string]string{"Peer-Address": "127.0.0.1", "User-Id": "c1"})
	frames := [][]byte{[]byte("t"), events.SeqFrame(0), emptyBatch(t)}
	for range 3 {
		if !b.dispatch(context.Background(), 0, frames, from) {
			t.Fatal("dispatch stopped")
		}
	}
	if n := seq.Status().Refused.N[RefusedQueueFull]; n != 2 {
		t.Fatalf("queue of 1, 3 batches: %d refused as queue_full", n)
	}
}
