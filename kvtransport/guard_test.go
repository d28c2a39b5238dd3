package kvtransport

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixrouter/prefixrouter/kvindex"
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
		m, bm := kvindex.NewMetrics(reg), NewMetrics(reg)
		a := &applied{seqs: map[uint64]int{}}
		id := targetid.ID{Endpoint: "http://127.0.0.1:8000"}
		// The reconnected publisher is a new connection: it takes the
		// topic over once the old one was silent for OwnerIdle.
		bus, err := NewBus(BusConfig{Listen: listen, Logger: quietLogger(), Metrics: m, BusMetrics: bm, MaxMessageBytes: maxBytes, OwnerIdle: 200 * time.Millisecond,
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
		first := testutil.ToFloat64(bm.connections)
		check(t, a, pub, func() float64 { return testutil.ToFloat64(bm.connections) - first })
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

// TestBusQueueBounded: a stream whose queue is full refuses the batch
// rather than stall the socket's other topics.
func TestBusQueueBounded(t *testing.T) {
	id := targetid.ID{Endpoint: "http://p"}
	seq := kvindex.NewSequencer(kvindex.SequencerConfig{Target: id, QueueSize: 1, Logger: quietLogger(), Handle: func(uint64, *events.Batch, bool) {}})
	st := &busStream{seq: seq, route: BusRoute{Target: id, Sources: []string{"127.0.0.1"}}, owner: "c1", ctx: context.Background()}
	b := &Bus{log: quietLogger(), streams: map[busKey]*busStream{{topic: "t"}: st}, byTarget: map[targetid.ID]*busStream{st.route.Target: st},
		resolver: newSourceResolver(nil), refusals: map[targetid.ID]*kvindex.RefusalLog{}, cfg: BusConfig{OwnerIdle: time.Hour}}
	from := peerOf(map[string]string{"Peer-Address": "127.0.0.1", "User-Id": "c1"})
	frames := [][]byte{[]byte("t"), events.SeqFrame(0), emptyBatch(t)}
	for range 3 {
		if !b.dispatch(context.Background(), 0, frames, from) {
			t.Fatal("dispatch stopped")
		}
	}
	if n := seq.Status().Refused.N[kvindex.RefusedQueueFull]; n != 2 {
		t.Fatalf("queue of 1, 3 batches: %d refused as queue_full", n)
	}
}
