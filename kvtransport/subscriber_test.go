package kvtransport

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/poll"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/sim/publish"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// goldenPayloads returns the msgpack payloads of testdata/vllm/kv_events.json
// by vector id.
func goldenPayloads(t *testing.T) map[string][]byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "testdata", "vllm", "kv_events.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Vectors []struct {
			ID        string   `json:"id"`
			FramesHex []string `json:"frames_hex"`
		} `json:"vectors"`
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, v := range g.Vectors {
		b, err := hex.DecodeString(v.FramesHex[2])
		if err != nil {
			t.Fatal(err)
		}
		out[v.ID] = b
	}
	return out
}

// loadBaseTokens reads the prompt testdata/vllm/block_hashes.json hashes.
func loadBaseTokens(t *testing.T) (g struct {
	BaseTokens []uint32 `json:"base_tokens"`
}) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "testdata", "vllm", "block_hashes.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	return g
}

// waitFor waits for cond (internal/poll).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, what, cond)
}

// rebind starts a publisher on an address just released by another one;
// libzmq frees ports asynchronously, so it retries briefly.
func rebind(t *testing.T, cfg publish.Config) *publish.Publisher {
	t.Helper()
	var err error
	for i := 0; i < 100; i++ {
		var p *publish.Publisher
		if p, err = publish.New(cfg); err == nil {
			return p
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("rebind %s: %v", cfg.Bind, err)
	return nil
}

func emptyBatch(t *testing.T) []byte {
	b, err := events.Encode(&events.Batch{TS: 1}, events.EncodingMap)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSubscriberGoldenGapAndRestart drives a real ZMQ PUB and ROUTER with the
// golden payloads: a late join (first batch only reachable through replay), a
// forced gap, and a pod restart, then checks the index.
func TestSubscriberGoldenGapAndRestart(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		name := "current-replay"
		if legacy {
			name = "legacy-replay"
		}
		t.Run(name, func(t *testing.T) { runGoldenScenario(t, legacy) })
	}
}

func runGoldenScenario(t *testing.T, legacy bool) {
	payloads := goldenPayloads(t)
	g := loadBaseTokens(t)
	pub, err := publish.New(publish.Config{Bind: "tcp://127.0.0.1:*", ReplayBind: "tcp://127.0.0.1:*",
		Topic: "kv@10.0.0.7@my-model", LegacyReplay: legacy})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	h, _ := kvindex.NewHasher(kvindex.AlgoSHA256CBOR, "0", 16)
	ix := kvindex.NewIndex(kvindex.IndexConfig{})
	in, _ := kvindex.NewIngestor(ix, kvindex.IngestConfig{Mode: kvindex.ModeExact, Hasher: h}, kvindex.Observer{})
	id := targetid.ID{Endpoint: "http://10.0.0.7:8000"}
	var mu sync.Mutex
	var seen []uint64
	sub, err := NewSubscriber(SubscriberConfig{
		Target: id, Endpoint: pub.Endpoint(), Replay: pub.ReplayEndpoint(), Topic: "kv@",
		Handle: func(seq uint64, b *events.Batch, replayed bool) {
			in.Apply(id, b)
			mu.Lock()
			seen = append(seen, seq)
			mu.Unlock()
		},
		Restarted: func() { in.Reset(id) },
	})
	if err != nil {
		t.Fatal(err)
	}

	// seq 0 is published before anyone listens: only replay can bring it.
	if _, err := pub.PublishRaw(payloads["stored_2blocks_map"], true); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	// Filler batches until the subscription is live (ZMQ's slow joiner).
	waitFor(t, "first live batch", func() bool {
		if sub.Status().HaveSeq {
			return true
		}
		_, _ = pub.PublishRaw(emptyBatch(t), true)
		time.Sleep(20 * time.Millisecond)
		return false
	})
	baseKeys, _ := h.Keys(nil, g.BaseTokens[:32], kvindex.RequestExtras{})
	waitFor(t, "replayed seq 0 in the index", func() bool {
		m := ix.Lookup(nil, baseKeys)
		return len(m) == 1 && m[0].Blocks == 2
	})

	// Forced gap: block 1 stored again (refcount 2) in a batch that never
	// reaches the subscriber live, followed by a live batch.
	gapSeq, _ := pub.PublishRaw(payloads["stored_minimal_dp3_array"], false)
	live, _ := pub.PublishRaw(emptyBatch(t), true)
	waitFor(t, "gap replayed", func() bool { return sub.Status().LastSeq == live })
	st := sub.Status()
	if st.Gaps < 1 || st.Replayed < 2 {
		t.Fatalf("status after gap %+v", st)
	}
	mu.Lock()
	gotGap := false
	for _, s := range seen {
		gotGap = gotGap || s == gapSeq
	}
	mu.Unlock()
	if !gotGap {
		t.Fatalf("gap batch %d never handled", gapSeq)
	}
	// One removal of block 1 leaves the second reference.
	if _, err := pub.PublishRaw(mustEncode(t, events.Batch{TS: 2, Events: []events.Event{{Kind: events.KindBlockRemoved,
		BlockHashes: []uint64{uint64(baseKeys[1])}, Medium: events.MediumGPU}}}), true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "removal applied", func() bool { return sub.Status().LastSeq == live+1 })
	if m := ix.Lookup(nil, baseKeys); len(m) != 1 || m[0].Blocks != 2 {
		t.Fatalf("after one removal of a doubly stored block: %+v", m)
	}

	// Restart: the sequence starts over; the old process's blocks are gone.
	pub.Restart()
	if _, err := pub.PublishRaw(payloads["stored_lora_salt_map"], true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "restart detected", func() bool { return sub.Status().Restarts == 1 && sub.Status().LastSeq == 0 })
	if m := ix.Lookup(nil, baseKeys); len(m) != 0 {
		t.Fatalf("placements of the old process survived the restart: %+v", m)
	}
	loraKeys, _ := h.Keys(nil, g.BaseTokens[:16], kvindex.RequestExtras{LoRAName: "sql-lora", CacheSalt: "salt-1"})
	if m := ix.Lookup(nil, loraKeys); len(m) != 1 || m[0].Blocks != 1 {
		t.Fatalf("new process's block missing: %+v", m)
	}
	if checks, mm := in.HashHealth(id); mm != 0 || checks == 0 {
		t.Fatalf("golden events failed verification: checks %d mismatches %d", checks, mm)
	}
	if st := sub.Status(); !st.Connected || st.DecodeErrors != 0 {
		t.Fatalf("final status %+v", st)
	}
}

func mustEncode(t *testing.T, b events.Batch) []byte {
	t.Helper()
	p, err := events.Encode(&b, events.EncodingMap)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSubscriberCountsUndecodablePayloads(t *testing.T) {
	pub, err := publish.New(publish.Config{Bind: "tcp://127.0.0.1:*", Topic: "kv"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	handled := make(chan uint64, 100)
	sub, _ := NewSubscriber(SubscriberConfig{Endpoint: pub.Endpoint(), Handle: func(seq uint64, _ *events.Batch, _ bool) { handled <- seq }})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = sub.Run(ctx) }()
	waitFor(t, "subscription live", func() bool {
		_, _ = pub.PublishRaw(emptyBatch(t), true)
		time.Sleep(20 * time.Millisecond)
		return sub.Status().HaveSeq
	})
	bad, _ := pub.PublishRaw([]byte{0x93, 0xc1}, true)
	good, _ := pub.PublishRaw(emptyBatch(t), true)
	waitFor(t, "good batch after bad", func() bool { return sub.Status().LastSeq == good })
	st := sub.Status()
	if st.DecodeErrors != 1 || st.Gaps != 0 {
		t.Fatalf("status %+v (bad seq %d)", st, bad)
	}
}

func TestReplayRangeTimesOutOnSilentPeer(t *testing.T) {
	// Nothing listens at this address: the request is queued by ZMQ and the
	// exchange must end by timeout, not hang.
	err := ReplayRange(context.Background(), "tcp://127.0.0.1:1", 0, 200*time.Millisecond, func(uint64, []byte) bool { return true })
	if err == nil {
		t.Fatal("replay against a silent peer succeeded")
	}
}

func TestParseReplayReply(t *testing.T) {
	seq := events.SeqFrame(5)
	end := events.SeqFrame(events.EndOfReplay)
	cases := []struct {
		name   string
		frames [][]byte
		seq    uint64
		ok     bool
	}{
		{"current", [][]byte{{}, []byte("topic"), seq, []byte("p")}, 5, true},
		{"current empty topic", [][]byte{{}, {}, seq, []byte("p")}, 5, true},
		{"current end", [][]byte{{}, {}, end, {}}, events.EndOfReplay, true},
		{"legacy", [][]byte{{}, seq, []byte("p")}, 5, true},
		{"legacy end", [][]byte{{}, end, {}}, events.EndOfReplay, true},
		{"short", [][]byte{{}}, 0, false},
		{"bad seq", [][]byte{{}, []byte("t"), []byte{1}, []byte("p")}, 0, false},
	}
	for _, c := range cases {
		got, _, err := parseReplayReply(c.frames)
		if (err == nil) != c.ok || (c.ok && got != c.seq) {
			t.Errorf("%s: seq %d err %v", c.name, got, err)
		}
	}
}

// TestSubscriberReconnectsAfterPodRestart closes the publisher and binds a
// new one on the same port, as a restarted vLLM process would: the
// subscriber must reconnect on its own, count it, and treat the sequence
// reset as a restart.
func TestSubscriberReconnectsAfterPodRestart(t *testing.T) {
	first, err := publish.New(publish.Config{Bind: "tcp://127.0.0.1:*"})
	if err != nil {
		t.Fatal(err)
	}
	endpoint := first.Endpoint()
	restarted := make(chan struct{}, 1)
	sub, _ := NewSubscriber(SubscriberConfig{Endpoint: endpoint, ReconnectMin: 20 * time.Millisecond, ReconnectMax: 100 * time.Millisecond,
		Handle:    func(uint64, *events.Batch, bool) {},
		Restarted: func() { restarted <- struct{}{} },
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = sub.Run(ctx) }()
	waitFor(t, "first process's batches", func() bool {
		_, _ = first.PublishRaw(emptyBatch(t), true)
		time.Sleep(20 * time.Millisecond)
		return sub.Status().LastSeq >= 3
	})
	first.Close()
	waitFor(t, "disconnect noticed", func() bool { return !sub.Status().Connected })
	second := rebind(t, publish.Config{Bind: endpoint})
	defer second.Close()
	waitFor(t, "reconnect and restart detection", func() bool {
		_, _ = second.PublishRaw(emptyBatch(t), true)
		time.Sleep(20 * time.Millisecond)
		select {
		case <-restarted:
			return true
		default:
			return false
		}
	})
	if st := sub.Status(); st.Reconnects < 1 || st.Restarts != 1 || !st.Connected {
		t.Fatalf("status %+v", st)
	}
}

// TestSubscriberBlipIsAGapNotARestart: the connection drops while the pod
// keeps running and publishing. On reconnect the missed batches are replayed
// and the index keeps what the pod still holds.
func TestSubscriberBlipIsAGapNotARestart(t *testing.T) {
	first, err := publish.New(publish.Config{Bind: "tcp://127.0.0.1:*", ReplayBind: "tcp://127.0.0.1:*"})
	if err != nil {
		t.Fatal(err)
	}
	endpoint, replayEndpoint := first.Endpoint(), first.ReplayEndpoint()
	ix := kvindex.NewIndex(kvindex.IndexConfig{})
	in, _ := kvindex.NewIngestor(ix, kvindex.IngestConfig{Mode: kvindex.ModeExact}, kvindex.Observer{})
	id := targetid.ID{Endpoint: "pod"}
	sub, _ := NewSubscriber(SubscriberConfig{Target: id, Endpoint: endpoint, Replay: replayEndpoint,
		ReconnectMin: 20 * time.Millisecond, ReconnectMax: 100 * time.Millisecond,
		Handle:    func(_ uint64, b *events.Batch, _ bool) { in.Apply(id, b) },
		Restarted: func() { in.Reset(id) },
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = sub.Run(ctx) }()
	store := func(p *publish.Publisher, h uint64, send bool) {
		t.Helper()
		b := events.Batch{TS: 1, Events: []events.Event{{Kind: events.KindBlockStored, BlockHashes: []uint64{h}, Medium: events.MediumGPU}}}
		payload, _ := events.Encode(&b, events.EncodingMap)
		if _, err := p.PublishRaw(payload, send); err != nil {
			t.Fatal(err)
		}
	}
	store(first, 42, true)
	waitFor(t, "block 42 indexed", func() bool { return ix.Has(id, 42) })
	// The same process keeps its sockets; model the blip by swapping in a
	// publisher that shares the sequence: close and rebind, then publish
	// the batches the pod sent while the link was down.
	next := first.NextSeq()
	first.Close()
	waitFor(t, "disconnect noticed", func() bool { return !sub.Status().Connected })
	second := rebind(t, publish.Config{Bind: endpoint, ReplayBind: replayEndpoint})
	defer second.Close()
	for second.NextSeq() < next { // same process: the sequence carries on
		_, _ = second.PublishRaw(emptyBatch(t), false)
	}
	store(second, 43, false) // published while disconnected
	waitFor(t, "missed batch replayed after reconnect", func() bool { return ix.Has(id, 43) })
	if !ix.Has(id, 42) {
		t.Fatal("a network blip wiped the index")
	}
	if st := sub.Status(); st.Restarts != 0 || st.Reconnects < 1 {
		t.Fatalf("status %+v", st)
	}
}

// TestSubscriberResync: outside evidence of a restart (health sees a new
// process start time) clears the placements and rebuilds from replay.
func TestSubscriberResync(t *testing.T) {
	pub, err := publish.New(publish.Config{Bind: "tcp://127.0.0.1:*", ReplayBind: "tcp://127.0.0.1:*"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	restarted := make(chan struct{}, 4)
	handled := make(chan uint64, 100)
	sub, _ := NewSubscriber(SubscriberConfig{Endpoint: pub.Endpoint(), Replay: pub.ReplayEndpoint(),
		Handle:    func(seq uint64, _ *events.Batch, _ bool) { handled <- seq },
		Restarted: func() { restarted <- struct{}{} },
	})
	// Buffered before the subscriber starts: had it connected and caught up
	// first, no live batch would come to make it look again.
	for i := 0; i < 3; i++ {
		_, _ = pub.PublishRaw(emptyBatch(t), false)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = sub.Run(ctx) }()
	// No live traffic at all: connecting alone must bring the buffer.
	waitFor(t, "idle pod's buffer replayed on connect", func() bool { return sub.Status().Replayed == 3 })
	sub.Resync()
	waitFor(t, "resync replays from 0", func() bool { return sub.Status().Replayed == 6 })
	select {
	case <-restarted:
	default:
		t.Fatal("Restarted not called on resync")
	}
}

// TestSubscriberStopsWhilePodLeaves stops subscribers as their pods go
// away, round after round, as a fleet's churn does. Every new subscriber
// must still connect: a monitor event sent while a subscriber stops must
// not wedge ZeroMQ's I/O thread, which every socket of the process shares.
func TestSubscriberStopsWhilePodLeaves(t *testing.T) {
	for round := range 12 {
		pub, err := publish.New(publish.Config{Bind: "tcp://127.0.0.1:*"})
		if err != nil {
			t.Fatal(err)
		}
		sub, err := NewSubscriber(SubscriberConfig{Endpoint: pub.Endpoint(), Handle: func(uint64, *events.Batch, bool) {}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = sub.Run(ctx); close(done) }()
		waitFor(t, fmt.Sprintf("round %d connected", round), func() bool { return sub.Status().Connected })
		cancel()
		pub.Close()
		<-done
	}
}

// TestSubscriberFirstSequenceOneIsAStart: vLLM numbers a process's batches
// from 0; publishers seen in the field start at 1. Their first batch, live
// or waiting in the replay buffer at connect, and their first batch after a
// restart, are a start: no gap, nothing lost for good (which would make the
// target stale for --events-stale-after).
func TestSubscriberFirstSequenceOneIsAStart(t *testing.T) {
	for _, tc := range []struct {
		name     string
		buffered bool // the batches wait in the replay buffer before the subscriber joins
	}{
		{name: "first batch live"},
		{name: "first batch in the replay buffer", buffered: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pub, err := publish.New(publish.Config{Bind: "tcp://127.0.0.1:*", ReplayBind: "tcp://127.0.0.1:*", FirstSeq: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			if tc.buffered {
				for range 3 {
					_, _ = pub.PublishRaw(emptyBatch(t), false)
				}
			}
			restarted := make(chan struct{}, 1)
			sub, _ := NewSubscriber(SubscriberConfig{Endpoint: pub.Endpoint(), Replay: pub.ReplayEndpoint(),
				Handle:    func(uint64, *events.Batch, bool) {},
				Restarted: func() { restarted <- struct{}{} },
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() { _ = sub.Run(ctx) }()
			waitFor(t, "batches 1 to 3 applied", func() bool {
				if !tc.buffered && sub.Status().Connected && pub.NextSeq() < 4 {
					_, _ = pub.PublishRaw(emptyBatch(t), true)
				}
				time.Sleep(10 * time.Millisecond)
				st := sub.Status()
				return st.HaveSeq && st.LastSeq == 3
			})
			if st := sub.Status(); st.Unrecovered != 0 || st.Gaps != 0 {
				t.Fatalf("a stream starting at 1: %d batches lost for good, %d gaps (want none): %+v", st.Unrecovered, st.Gaps, st)
			}

			// A live batch ends the window in which replayed batches'
			// live copies are dropped; then a new process numbers from 1
			// again: a restart, still no loss.
			waitFor(t, "a live batch", func() bool {
				if pub.NextSeq() < 5 {
					_, _ = pub.PublishRaw(emptyBatch(t), true)
				}
				time.Sleep(10 * time.Millisecond)
				return sub.Status().LastSeq == 4
			})
			pub.Restart()
			waitFor(t, "the new process's first batch", func() bool {
				_, _ = pub.PublishRaw(emptyBatch(t), true)
				time.Sleep(10 * time.Millisecond)
				select {
				case <-restarted:
					return true
				default:
					return false
				}
			})
			waitFor(t, "the new process's batches applied", func() bool { return sub.Status().LastSeq >= 1 && sub.Status().LastSeq < 3 })
			if st := sub.Status(); st.Unrecovered != 0 || st.Restarts != 1 {
				t.Fatalf("after the restart: %d lost for good, %d restarts (want 0 and 1): %+v", st.Unrecovered, st.Restarts, st)
			}
		})
	}
}
