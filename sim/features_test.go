package sim

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/sim/publish/publishtest"
)

// recordingSink collects an engine's batches in place of a publisher.
type recordingSink struct {
	mu       sync.Mutex
	batches  []events.Batch
	restarts int
}

func (r *recordingSink) Submit(b events.Batch, _ events.Encoding) error {
	r.mu.Lock()
	r.batches = append(r.batches, b)
	r.mu.Unlock()
	return nil
}

func (r *recordingSink) Restart() {
	r.mu.Lock()
	r.restarts++
	r.mu.Unlock()
}

// take returns the batches so far and forgets them.
func (r *recordingSink) take() []events.Batch {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.batches
	r.batches = nil
	return out
}

// startRecordingEngine runs an engine configured with setup whose batches go
// to the returned sink.
func startRecordingEngine(t *testing.T, prof Profile, setup engineSetup) (*engineHarness, *recordingSink) {
	t.Helper()
	h, err := kvindex.NewHasher(kvindex.AlgoSHA256, "0", prof.BlockSize)
	if err != nil {
		t.Fatal(err)
	}
	sink := &recordingSink{}
	e := newEngine(prof, 0, h, 1000, outputTokens(BytesTokenizer()), sink, newFaultBox(Faults{}), 1)
	e.configure(setup)
	harness := &engineHarness{t: t, e: e, hasher: h}
	harness.start()
	return harness, sink
}

// sync waits until every step so far has been published.
func (h *engineHarness) sync() {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := h.e.control(ctx, msgSync); err != nil {
		h.t.Fatal(err)
	}
}

// wireEvents round-trips batches through the wire encoding, as a subscriber
// would see them, and returns their events in order.
func wireEvents(t *testing.T, bs []events.Batch, enc events.Encoding) []events.Event {
	t.Helper()
	var out []events.Event
	for i := range bs {
		payload, err := events.Encode(&bs[i], enc)
		if err != nil {
			t.Fatal(err)
		}
		b, err := events.Decode(payload)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b.Events...)
	}
	return out
}

// hashesOf lists the hashes of the events of kind k, medium m and group g
// (g < 0: any group).
func hashesOf(evs []events.Event, k events.Kind, medium string, g int) []uint64 {
	var out []uint64
	for _, ev := range evs {
		if ev.Kind == k && ev.Medium == medium && (g < 0 || ev.GroupIdx == g) {
			out = append(out, ev.BlockHashes...)
		}
	}
	return out
}

func wires(keys []kvindex.Key, idx ...int) []uint64 {
	out := make([]uint64, len(idx))
	for i, j := range idx {
		out[i] = uint64(keys[j])
	}
	return out
}

// TestKVSpecEventsOnTheWire publishes through real ZMQ and checks that each
// KV-cache spec reports its kind and group indices, decodable by
// kvindex/events, in both encodings.
func TestKVSpecEventsOnTheWire(t *testing.T) {
	tests := []struct {
		spec string
		enc  events.Encoding
	}{
		{KVSpecFullAttention, events.EncodingMap},
		{KVSpecMLA, events.EncodingMap},
		{KVSpecSinkFullAttention, events.EncodingMap},
		{KVSpecHybrid, events.EncodingMap},
		{KVSpecHybrid, events.EncodingArray},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s/%v", tc.spec, tc.enc), func(t *testing.T) {
			f := startTestFleet(t, Config{KVSpec: tc.spec, SlidingWindow: 64, EventEncoding: tc.enc})
			pod := f.Pods[0]
			sub := publishtest.Subscribe(t, pod.EventsAddr(0))
			warmUp(t, sub, pod)
			prompt := tokenRange(0, 40)
			if code, _, out := post(t, pod.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1}); code != 200 {
				t.Fatalf("%d %s", code, out)
			}
			b, err := events.Decode(sub.MustRecv().Payload)
			if err != nil {
				t.Fatal(err)
			}
			h, _ := kvindex.NewHasher(kvindex.AlgoSHA256, "0", 16)
			keys, _ := h.Keys(nil, prompt, kvindex.RequestExtras{})
			want := wires(keys, 0, 1)
			var stored []events.Event
			for _, ev := range b.Events {
				if ev.Kind == events.KindBlockStored {
					stored = append(stored, ev)
				}
			}
			groups := 1
			if tc.spec == KVSpecHybrid {
				groups = 2
			}
			if len(stored) != groups {
				t.Fatalf("%d BlockStored events, want one per group (%d): %+v", len(stored), groups, b.Events)
			}
			for g, ev := range stored {
				if !ev.HasGroupIdx || ev.GroupIdx != g || !slices.Equal(ev.BlockHashes, want) || ev.Medium != events.MediumGPU {
					t.Fatalf("group %d event %+v, want group_idx %d and hashes %v", g, ev, g, want)
				}
			}
			wantKind := tc.spec
			if tc.spec == KVSpecHybrid {
				wantKind = events.SpecFullAttention
				sw := stored[1]
				if sw.SpecKind != "sliding_window" || !sw.HasSlidingWindow || sw.SlidingWindow != 64 {
					t.Fatalf("sliding-window group event %+v", sw)
				}
				if sw.IsFullPrefix() {
					t.Fatal("kvindex/events counts the sliding-window group as full prefix")
				}
			}
			if ev := stored[0]; ev.SpecKind != wantKind || ev.HasSlidingWindow || !ev.IsFullPrefix() {
				t.Fatalf("group 0 event kind %q (window %v), want %q", ev.SpecKind, ev.HasSlidingWindow, wantKind)
			}
		})
	}
	if CheckConfig(Config{KVSpec: "mamba"}) == nil {
		t.Fatal("unknown KV spec accepted")
	}
}

// TestHybridSlidingWindowEvictsSooner follows vLLM's hybrid allocator: the
// sliding-window group frees the blocks that leave the window while the
// request still runs, so a later request evicts them first, and a hit needs
// the window's blocks in both groups.
func TestHybridSlidingWindowEvictsSooner(t *testing.T) {
	prof := testProfile()
	prof.NumGPUBlocks = 16
	// 32-token window: a hit needs cdiv(31, 16) = 2 cached blocks before it.
	h, sink := startRecordingEngine(t, prof, engineSetup{kvSpec: KVSpecHybrid, window: 32})
	a := tokenRange(0, 160) // 10 blocks
	keys, err := h.hasher.Keys(nil, a, kvindex.RequestExtras{})
	if err != nil {
		t.Fatal(err)
	}
	// A decodes twice after its prefill: before the first decode, blocks
	// 0..7 (tokens < 160 − 32 + 1) leave the window and are freed in group
	// 1, last first; group 0 keeps all of them until A finishes.
	h.run(a, 3)
	// B, 10 fresh blocks: both groups take their 5 never-used blocks, then
	// evict from the head of the free queue.
	h.run(tokenRange(10000, 160), 1)
	h.sync()
	evs := wireEvents(t, sink.take(), events.EncodingMap)
	if got, want := hashesOf(evs, events.KindBlockRemoved, events.MediumGPU, 0), wires(keys, 9, 8, 7, 6); !slices.Equal(got, want) {
		t.Fatalf("group 0 evicted %v, want A's tail first %v", got, want)
	}
	if got, want := hashesOf(evs, events.KindBlockRemoved, events.MediumGPU, 1), wires(keys, 7, 6, 5, 4, 3); !slices.Equal(got, want) {
		t.Fatalf("group 1 evicted %v, want the blocks that left the window first %v", got, want)
	}
	// A again: group 0 holds A0..A5; group 1 lost A3..A7. Scanning down
	// from block 5 for 2 consecutive blocks cached in group 1 finds A1, A2,
	// so the hit is 3 blocks, 48 tokens.
	if s := h.run(a, 1); s.CachedTokens != 48 {
		t.Fatalf("hybrid hit %d tokens, want 48 (full attention alone would give 96)", s.CachedTokens)
	}
}

// TestCPUOffload checks the CPU tier: GPU evictions are kept there and
// reported as vLLM's offloading connector does, a GPU miss that hits the
// tier loads instead of recomputing, and the tier is a bounded LRU.
func TestCPUOffload(t *testing.T) {
	prof := testProfile()
	prof.NumGPUBlocks = 8
	const load = 200 * time.Microsecond
	a := tokenRange(0, 64)    // 4 blocks
	b := tokenRange(900, 128) // 8 blocks: evicts all of A from the GPU

	t.Run("without a CPU tier", func(t *testing.T) {
		h, _ := startRecordingEngine(t, prof, engineSetup{})
		h.run(a, 1)
		h.run(b, 1)
		if s := h.run(a, 1); s.CachedTokens != 0 || s.TTFT != prof.StepTime(64, 0) {
			t.Fatalf("cached %d, TTFT %v; want 0 and %v", s.CachedTokens, s.TTFT, prof.StepTime(64, 0))
		}
	})

	h, sink := startRecordingEngine(t, prof, engineSetup{cpuBlocks: 4, cpuLoad: load})
	keys, _ := h.hasher.Keys(nil, a, kvindex.RequestExtras{})
	h.run(a, 1)
	h.run(b, 1)
	h.sync()
	batches := sink.take()
	// The batch that removes A's blocks from the GPU stores them on CPU.
	var evictBatch []events.Event
	for _, bt := range batches {
		evs := wireEvents(t, []events.Batch{bt}, events.EncodingMap)
		if len(hashesOf(evs, events.KindBlockRemoved, events.MediumGPU, -1)) > 0 {
			evictBatch = evs
		}
	}
	wantA := wires(keys, 3, 2, 1, 0)
	if got := hashesOf(evictBatch, events.KindBlockRemoved, events.MediumGPU, -1); !slices.Equal(got, wantA) {
		t.Fatalf("GPU removed %v, want %v", got, wantA)
	}
	if got := hashesOf(evictBatch, events.KindBlockStored, events.MediumCPU, -1); !slices.Equal(got, wantA) {
		t.Fatalf("CPU stored %v in the same batch, want %v", got, wantA)
	}
	for _, ev := range evictBatch {
		if ev.Medium != events.MediumCPU || ev.Kind != events.KindBlockStored {
			continue
		}
		if len(ev.TokenIDs) != 0 || ev.BlockSize != 0 || ev.HasParentHash || ev.HasGroupIdx {
			t.Fatalf("CPU BlockStored %+v: want empty token_ids, block_size 0, no parent", ev)
		}
	}

	// A again: no GPU hit, blocks 0..2 load from the CPU tier (the last
	// block is always recomputed); one step of 16 prefill tokens plus three
	// loads.
	s := h.run(a, 1)
	if want := prof.StepTime(16, 0) + 3*load; s.CachedTokens != 48 || s.TTFT != want {
		t.Fatalf("cached %d, TTFT %v; want 48 and %v", s.CachedTokens, s.TTFT, want)
	}
	if got := h.e.stats.cpuHits.Load(); got != 48 {
		t.Fatalf("CPU hit tokens %d, want 48", got)
	}
	h.sync()
	evs := wireEvents(t, sink.take(), events.EncodingMap)
	// The loaded blocks are GPU blocks again.
	if got := hashesOf(evs, events.KindBlockStored, events.MediumGPU, 0); !slices.Equal(got, wires(keys, 0, 1, 2, 3)) {
		t.Fatalf("GPU stored %v after the load, want A's blocks", got)
	}
	// Loading evicted four of B's blocks from the GPU into a full tier: it
	// stayed at 4 blocks by evicting as many, reported with medium CPU.
	stored := hashesOf(evs, events.KindBlockStored, events.MediumCPU, -1)
	removed := hashesOf(evs, events.KindBlockRemoved, events.MediumCPU, -1)
	if len(stored) != 4 || len(removed) != 4 {
		t.Fatalf("CPU stored %d and removed %d blocks, want 4 and 4", len(stored), len(removed))
	}
	if n := h.e.cpu.len(); n != 4 {
		t.Fatalf("CPU tier holds %d blocks, want its capacity 4", n)
	}
	if CheckConfig(Config{CPUOffloadBlocks: -1}) == nil || CheckConfig(Config{CPUOffloadBlocks: 4, KVSpec: KVSpecHybrid}) == nil {
		t.Fatal("bad CPU offload config accepted")
	}
}

// TestRandomHashSeed models PYTHONHASHSEED unset: each rank hashes from its
// own random root, which nobody else can reproduce, and draws a new one when
// it restarts.
func TestRandomHashSeed(t *testing.T) {
	f := startTestFleet(t, Config{RandomHashSeed: true, DP: 2})
	pod := f.Pods[0]
	seeded, _ := kvindex.NewHasher(kvindex.AlgoSHA256, "0", 16)
	root0, root1 := pod.engines[0].hasher.Load().Root(), pod.engines[1].hasher.Load().Root()
	if root0 == root1 || root0 == seeded.Root() {
		t.Fatal("ranks share a root, or the root is the seed-0 one")
	}
	prompt := tokenRange(0, 40)
	storedHashes := func() []uint64 {
		t.Helper()
		code, _, body := post(t, pod.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1}, "X-data-parallel-rank", "0")
		if code != 200 {
			t.Fatalf("%d %s", code, body)
		}
		if c := cachedTokens(t, body); c != 0 {
			t.Fatalf("cached %d tokens, want a miss", c)
		}
		waitPublished(t, pod, 0)
		_, payloads := replay(t, pod.ReplayAddr(0), 0, false)
		var out []uint64
		for _, p := range payloads {
			b, err := events.Decode(p)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, hashesOf(b.Events, events.KindBlockStored, events.MediumGPU, -1)...)
		}
		return out
	}
	own, _ := pod.engines[0].hasher.Load().Keys(nil, prompt, kvindex.RequestExtras{})
	fromSeed, _ := seeded.Keys(nil, prompt, kvindex.RequestExtras{})
	first := storedHashes()
	if !slices.Equal(first, wires(own, 0, 1)) || slices.Equal(first, wires(fromSeed, 0, 1)) {
		t.Fatalf("stored %v: want the rank's own root's %v, not seed 0's %v", first, wires(own, 0, 1), wires(fromSeed, 0, 1))
	}
	if err := pod.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	if pod.engines[0].hasher.Load().Root() == root0 {
		t.Fatal("restart kept the random root")
	}
	after := storedHashes()
	if len(after) != 2 || slices.Equal(after, first) {
		t.Fatalf("after restart stored %v, want new hashes (before %v)", after, first)
	}
	if err := CheckConfig(Config{RandomHashSeed: true, HashSeed: "0"}); err == nil {
		t.Fatal("a seed together with a random seed accepted")
	}
}

// waitPublished waits until every batch rank has produced so far has left
// its publisher.
func waitPublished(t *testing.T, pod *Pod, rank int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := pod.engines[rank].control(ctx, msgSync); err != nil {
		t.Fatal(err)
	}
	for pod.pubs[rank].Pending() > 0 {
		if ctx.Err() != nil {
			t.Fatal("event batches still queued after 5s")
		}
		time.Sleep(time.Millisecond)
	}
}
