package kvindex

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// storedEvent builds the BlockStored event a vLLM pod publishes for blocks
// [from, to) of tokens, with hashes computed by h.
func storedEvent(t testing.TB, h *Hasher, tokens []uint32, extras RequestExtras, from, to int) events.Event {
	t.Helper()
	digests, err := h.Digests(nil, tokens[:to*h.BlockSize()], extras)
	if err != nil {
		t.Fatal(err)
	}
	bs := h.BlockSize()
	ev := events.Event{Kind: events.KindBlockStored, BlockSize: bs, Medium: events.MediumGPU, LoRAName: extras.LoRAName,
		TokenIDs: tokens[from*bs : to*bs], HasExtraKeys: true, HasGroupIdx: true, SpecKind: events.SpecFullAttention}
	if from > 0 {
		ev.ParentHash, ev.HasParentHash = digests[from-1].Wire(), true
	}
	var scratch []any
	for i := from; i < to; i++ {
		ev.BlockHashes = append(ev.BlockHashes, digests[i].Wire())
		x := extras.AppendBlockExtra(scratch[:0], i, i*bs, (i+1)*bs)
		if x != nil {
			x = append([]any(nil), x...)
		}
		ev.ExtraKeys = append(ev.ExtraKeys, x)
	}
	return ev
}

func seqTokens(n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32((i*40503+17)%152064) + 1
	}
	return out
}

func newTestIngestor(t *testing.T, mode KeyMode, h *Hasher, log *bytes.Buffer) (*Index, *Ingestor, *Metrics, *prometheus.Registry) {
	t.Helper()
	ix := NewIndex(IndexConfig{})
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	cfg := IngestConfig{Mode: mode, Hasher: h, Metrics: m}
	if log != nil {
		cfg.Logger = slog.New(slog.NewTextHandler(log, nil))
	}
	if mode == ModeTokenDerived {
		tk, err := NewTokenKeyer(h.BlockSize())
		if err != nil {
			t.Fatal(err)
		}
		cfg.TokenKeyer = tk
	}
	in, err := NewIngestor(ix, cfg, Observer{})
	if err != nil {
		t.Fatal(err)
	}
	return ix, in, m, reg
}

func TestIngestExactModeMatchesRequestKeys(t *testing.T) {
	h, _ := NewHasher(AlgoSHA256, "0", 16)
	ix, in, m, _ := newTestIngestor(t, ModeExact, h, nil)
	tokens := seqTokens(16 * 10)
	extras := RequestExtras{LoRAName: "sql-lora", CacheSalt: "tenant"}
	// Two events, the second chained on the first, as vLLM emits them.
	b := events.Batch{Events: []events.Event{storedEvent(t, h, tokens, extras, 0, 4), storedEvent(t, h, tokens, extras, 4, 10)}}
	in.Apply(tid(1), &b)
	keys, _ := h.Keys(nil, tokens, extras)
	got := ix.Lookup(nil, keys)
	if len(got) != 1 || got[0].Blocks != 10 {
		t.Fatalf("lookup %+v", got)
	}
	checks, mismatches := in.HashHealth(tid(1))
	if checks != 10 || mismatches != 0 {
		t.Fatalf("checks %d mismatches %d", checks, mismatches)
	}
	if v := testutil.ToFloat64(m.hashChecks.WithLabelValues(tid(1).String())); v != 10 {
		t.Fatalf("hash_checks metric %v", v)
	}
	if v := testutil.ToFloat64(m.placements.WithLabelValues(tid(1).String(), "GPU")); v != 10 {
		t.Fatalf("placements gauge %v", v)
	}
	in.Reset(tid(1))
	if v := testutil.ToFloat64(m.placements.WithLabelValues(tid(1).String(), "GPU")); v != 0 {
		t.Fatalf("placements gauge after reset %v", v)
	}
}

func TestIngestExactModeDetectsWrongSeed(t *testing.T) {
	pod, _ := NewHasher(AlgoSHA256, "42", 16)   // what the pods run
	router, _ := NewHasher(AlgoSHA256, "0", 16) // what the router was told
	var log bytes.Buffer
	_, in, m, _ := newTestIngestor(t, ModeExact, router, &log)
	tokens := seqTokens(64)
	b := events.Batch{Events: []events.Event{storedEvent(t, pod, tokens, RequestExtras{}, 0, 4)}}
	in.Apply(tid(1), &b)
	if _, mm := in.HashHealth(tid(1)); mm != 1 {
		t.Fatalf("mismatches %d", mm)
	}
	if v := testutil.ToFloat64(m.hashMismatches.WithLabelValues(tid(1).String(), "hash")); v != 1 {
		t.Fatalf("metric %v", v)
	}
	// The event plane makes it loud from KeyHealth; the detail is kept.
	if kh := in.KeyHealth(tid(1)); kh.MismatchReason != MismatchHash || !strings.Contains(kh.MismatchDetail, "the pod published") || kh.PassedSinceMismatch != 0 {
		t.Fatalf("key health %+v", kh)
	}
}

// TestIngestChecksCountEveryVerification: every mismatch is a failed check,
// so the debug view never shows more mismatches than checks, in either
// mode, whatever the reason.
func TestIngestChecksCountEveryVerification(t *testing.T) {
	pod32, _ := NewHasher(AlgoSHA256, "0", 32)
	pod42, _ := NewHasher(AlgoSHA256, "42", 16)
	router, _ := NewHasher(AlgoSHA256, "0", 16)
	tokens := seqTokens(128)
	for _, tc := range []struct {
		name   string
		mode   KeyMode
		ev     events.Event
		reason string
	}{
		{"exact, other block size", ModeExact, storedEvent(t, pod32, tokens, RequestExtras{}, 0, 2), MismatchBlockSize},
		{"exact, other seed", ModeExact, storedEvent(t, pod42, tokens, RequestExtras{}, 0, 2), MismatchHash},
		{"token-derived, other block size", ModeTokenDerived, storedEvent(t, pod32, tokens, RequestExtras{}, 0, 2), MismatchBlockSize},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, in, m, _ := newTestIngestor(t, tc.mode, router, nil)
			for range 11 {
				in.Apply(tid(1), &events.Batch{Events: []events.Event{tc.ev}})
			}
			checks, mismatches := in.HashHealth(tid(1))
			if mismatches != 11 || checks < mismatches {
				t.Fatalf("%d checks, %d mismatches: want 11 mismatches, each a check", checks, mismatches)
			}
			if v := testutil.ToFloat64(m.hashChecks.WithLabelValues(tid(1).String())); v != float64(checks) {
				t.Fatalf("hash_checks metric %v, debug view %d", v, checks)
			}
			if kh := in.KeyHealth(tid(1)); kh.MismatchReason != tc.reason {
				t.Fatalf("reason %q, want %q", kh.MismatchReason, tc.reason)
			}
		})
	}
}

// TestIngestLegacyRootParentZero: a publisher of the legacy array form
// that sends a chain's first block with parent 0 is indexed in
// token-derived mode: the block starts a chain, it is not an orphan.
func TestIngestLegacyRootParentZero(t *testing.T) {
	h, _ := NewHasher(AlgoSHA256, "0", 4)
	ix, in, _, _ := newTestIngestor(t, ModeTokenDerived, h, nil)
	tokens := seqTokens(8)
	toks := make([]any, len(tokens))
	for i, v := range tokens {
		toks[i] = v
	}
	payload, err := msgpack.Marshal([]any{1.0, []any{
		[]any{"BlockStored", []any{uint64(101), uint64(102)}, 0, toks, 4, nil, "GPU"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := events.Decode(payload)
	if err != nil {
		t.Fatal(err)
	}
	in.Apply(tid(1), &b)
	tk, _ := NewTokenKeyer(4)
	keys, _ := tk.Keys(nil, tokens, RequestExtras{})
	if got := ix.Lookup(nil, keys); len(got) != 1 || got[0].Blocks != 2 {
		t.Fatalf("lookup %+v: want both blocks of the chain indexed", got)
	}
	if kh := in.KeyHealth(tid(1)); kh.Unchained != 0 || kh.RecentChained != 2 {
		t.Fatalf("key health %+v", kh)
	}
}

// TestIngestRecentUnchained: KeyHealth's window follows the latest stored
// blocks, so a stream that starts with orphans (a late join) and then
// chains is told apart from one whose blocks never chain.
func TestIngestRecentUnchained(t *testing.T) {
	h, _ := NewHasher(AlgoSHA256, "0", 4)
	_, in, _, _ := newTestIngestor(t, ModeTokenDerived, h, nil)
	tokens := seqTokens(4 * 400)
	orphan := func(i int) events.Event {
		ev := storedEvent(t, h, tokens, RequestExtras{}, i, i+1)
		ev.ParentHash, ev.HasParentHash = 1<<40+uint64(i), true // never seen
		return ev
	}
	for i := range 100 {
		in.Apply(tid(1), &events.Batch{Events: []events.Event{orphan(i)}})
	}
	if kh := in.KeyHealth(tid(1)); kh.RecentChained != 0 || kh.RecentUnchained < unchainedWindow || kh.Unchained != 100 {
		t.Fatalf("orphans only: %+v", kh)
	}
	// Chains from the root now arrive: the window turns over.
	for i := range 200 {
		in.Apply(tid(1), &events.Batch{Events: []events.Event{storedEvent(t, h, tokens, RequestExtras{}, 0, 1+i%4)}})
	}
	kh := in.KeyHealth(tid(1))
	if kh.RecentUnchained*8 > kh.RecentChained || kh.RecentChained+kh.RecentUnchained >= 2*unchainedWindow || kh.Unchained != 100 {
		t.Fatalf("after chained blocks: %+v", kh)
	}
}

func TestIngestExactModeDetectsBlockSize(t *testing.T) {
	pod, _ := NewHasher(AlgoSHA256, "0", 32)
	router, _ := NewHasher(AlgoSHA256, "0", 16)
	_, in, m, _ := newTestIngestor(t, ModeExact, router, nil)
	b := events.Batch{Events: []events.Event{storedEvent(t, pod, seqTokens(64), RequestExtras{}, 0, 2)}}
	in.Apply(tid(1), &b)
	if v := testutil.ToFloat64(m.hashMismatches.WithLabelValues(tid(1).String(), "block_size")); v != 1 {
		t.Fatalf("metric %v", v)
	}
}

func TestIngestTokenDerivedMode(t *testing.T) {
	// The pods' seed is unknown (random): their hashes mean nothing to the
	// router, yet the token-derived keys must match request-side keys.
	pod, _ := NewHasher(AlgoSHA256, "random-per-process", 16)
	routerSide, _ := NewHasher(AlgoSHA256, "0", 16) // only its block size matters
	ix, in, m, _ := newTestIngestor(t, ModeTokenDerived, routerSide, nil)
	tk, _ := NewTokenKeyer(16)
	tokens := seqTokens(16 * 6)
	extras := RequestExtras{LoRAName: "adapter-1", CacheSalt: "s"}
	first, second := storedEvent(t, pod, tokens, extras, 0, 3), storedEvent(t, pod, tokens, extras, 3, 6)

	// The second event arrives first: its parent is unknown.
	in.Apply(tid(1), &events.Batch{Events: []events.Event{second}})
	if v := testutil.ToFloat64(m.unchained.WithLabelValues(tid(1).String())); v != 3 {
		t.Fatalf("unchained %v", v)
	}
	// Replay delivers the chain in order.
	in.Apply(tid(1), &events.Batch{Events: []events.Event{first, second}})
	keys, _ := tk.Keys(nil, tokens, extras)
	got := ix.Lookup(nil, keys)
	if len(got) != 1 || got[0].Blocks != 6 {
		t.Fatalf("lookup %+v", got)
	}
	// Removal carries only engine hashes; the engine map resolves them.
	rm := events.Event{Kind: events.KindBlockRemoved, BlockHashes: second.BlockHashes[1:], Medium: events.MediumGPU}
	in.Apply(tid(1), &events.Batch{Events: []events.Event{rm}})
	got = ix.Lookup(nil, keys)
	if len(got) != 1 || got[0].Blocks != 4 {
		t.Fatalf("after removal %+v", got)
	}
	// A different salt gives different keys.
	other, _ := tk.Keys(nil, tokens, RequestExtras{LoRAName: "adapter-1", CacheSalt: "t"})
	if m := ix.Lookup(nil, other); len(m) != 0 {
		t.Fatalf("salted keys collided: %+v", m)
	}
}

func TestIngestHybridGroupsAndClear(t *testing.T) {
	h, _ := NewHasher(AlgoSHA256CBOR, "0", 16)
	ix, in, _, _ := newTestIngestor(t, ModeExact, h, nil)
	tokens := seqTokens(64)
	full := storedEvent(t, h, tokens, RequestExtras{}, 0, 4)
	full.GroupIdx = 1
	swa := full
	swa.GroupIdx, swa.SpecKind = 0, "sliding_window"
	in.Apply(tid(1), &events.Batch{Events: []events.Event{swa, full}})
	keys, _ := h.Keys(nil, tokens, RequestExtras{})
	if got := ix.Lookup(nil, keys); len(got) != 1 || got[0].Blocks != 4 {
		t.Fatalf("lookup %+v", got)
	}
	// The sliding-window group evicting the same hashes must not remove
	// the full-attention placement.
	in.Apply(tid(1), &events.Batch{Events: []events.Event{{Kind: events.KindBlockRemoved, BlockHashes: full.BlockHashes, HasGroupIdx: true, GroupIdx: 0}}})
	if got := ix.Lookup(nil, keys); len(got) != 1 || got[0].Blocks != 4 {
		t.Fatalf("after other-group removal %+v", got)
	}
	in.Apply(tid(1), &events.Batch{Events: []events.Event{{Kind: events.KindBlockRemoved, BlockHashes: full.BlockHashes[2:], HasGroupIdx: true, GroupIdx: 1}}})
	if got := ix.Lookup(nil, keys); len(got) != 1 || got[0].Blocks != 2 {
		t.Fatalf("after full-attention removal %+v", got)
	}
	in.Apply(tid(1), &events.Batch{Events: []events.Event{{Kind: events.KindAllBlocksCleared}}})
	if got := ix.Lookup(nil, keys); len(got) != 0 {
		t.Fatalf("after clear %+v", got)
	}
}

func TestIngestObserverAndTiers(t *testing.T) {
	h, _ := NewHasher(AlgoSHA256, "0", 16)
	ix := NewIndex(IndexConfig{})
	var stored, removed []Key
	cleared := 0
	in, err := NewIngestor(ix, IngestConfig{Mode: ModeExact, Hasher: h}, Observer{
		Stored:  func(_ targetid.ID, tier Tier, k []Key) { stored = append(stored, k...) },
		Removed: func(_ targetid.ID, tier Tier, k []Key) { removed = append(removed, k...) },
		Cleared: func(targetid.ID) { cleared++ },
	})
	if err != nil {
		t.Fatal(err)
	}
	tokens := seqTokens(32)
	ev := storedEvent(t, h, tokens, RequestExtras{}, 0, 2)
	ev.Medium = events.MediumCPU
	in.Apply(tid(1), &events.Batch{Events: []events.Event{ev, {Kind: events.KindBlockRemoved, BlockHashes: ev.BlockHashes[1:], Medium: events.MediumCPU}, {Kind: events.KindAllBlocksCleared}}})
	if len(stored) != 2 || len(removed) != 1 || cleared != 1 {
		t.Fatalf("observer saw stored %v removed %v cleared %d", stored, removed, cleared)
	}
	if ix.Stats()[0].Placements != 0 {
		t.Fatal("not cleared")
	}
}

func BenchmarkIngestApply(b *testing.B) {
	// One batch = 4 BlockStored events of 16 blocks plus matching evictions
	// once warm: the steady state of a busy pod. Exact mode with the default
	// verification sampling.
	h, _ := NewHasher(AlgoSHA256, "0", 16)
	ix := NewIndex(IndexConfig{})
	in, _ := NewIngestor(ix, IngestConfig{Mode: ModeExact, Hasher: h, Metrics: NewMetrics(nil)}, Observer{})
	const perEvent, perBatch = 16, 4
	mk := func(i int, kind events.Kind) events.Event {
		hs := make([]uint64, perEvent)
		for j := range hs {
			hs[j] = uint64(i*perEvent + j + 1)
		}
		return events.Event{Kind: kind, BlockHashes: hs, BlockSize: 16, Medium: events.MediumGPU}
	}
	batches := make([]events.Batch, 4096)
	for i := range batches {
		for e := 0; e < perBatch; e++ {
			n := i*perBatch + e
			batches[i].Events = append(batches[i].Events, mk(n, events.KindBlockStored))
			if n >= 2048 {
				batches[i].Events = append(batches[i].Events, mk(n-2048, events.KindBlockRemoved))
			}
		}
	}
	id := tid(1)
	blockEvents := 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		bt := &batches[i%len(batches)]
		if i%len(batches) == 0 && i > 0 {
			b.StopTimer()
			ix.Clear(id)
			b.StartTimer()
		}
		in.Apply(id, bt)
		for _, e := range bt.Events {
			blockEvents += len(e.BlockHashes)
		}
	}
	b.ReportMetric(float64(blockEvents)/b.Elapsed().Seconds()/1e6, "M-block-events/s")
}

func TestIngestGroupSelection(t *testing.T) {
	stored := func(h uint64, group int, kind string) events.Event {
		return events.Event{Kind: events.KindBlockStored, BlockHashes: []uint64{h}, BlockSize: 16, Medium: events.MediumGPU,
			GroupIdx: group, HasGroupIdx: true, SpecKind: kind}
	}
	removed := func(h uint64, group int) events.Event {
		return events.Event{Kind: events.KindBlockRemoved, BlockHashes: []uint64{h}, Medium: events.MediumGPU, GroupIdx: group, HasGroupIdx: true}
	}
	cases := []struct {
		name    string
		batch   []events.Event
		indexed bool
	}{
		{"full attention", []events.Event{stored(7, 0, "full_attention")}, true},
		{"MLA (DeepSeek) is a full-prefix group", []events.Event{stored(7, 0, "mla_attention")}, true},
		{"attention sinks keep the full prefix", []events.Event{stored(7, 0, "sink_full_attention")}, true},
		{"sliding window is not indexed", []events.Event{stored(7, 0, "sliding_window")}, false},
		{"mamba is not indexed", []events.Event{stored(7, 1, "mamba")}, false},
		{"two full-attention groups: one pinned, removals from both balance",
			[]events.Event{stored(7, 0, "full_attention"), stored(7, 2, "full_attention"), removed(7, 0), removed(7, 2)}, false},
		{"two full-attention groups: removal from the other group leaves it",
			[]events.Event{stored(7, 0, "full_attention"), stored(7, 2, "full_attention"), removed(7, 2)}, true},
		{"full attention in group 1 of a hybrid model",
			[]events.Event{stored(7, 0, "sliding_window"), stored(7, 1, "full_attention"), removed(7, 0)}, true},
		{"group_idx without spec kind: only group 0",
			[]events.Event{stored(7, 0, ""), stored(7, 1, ""), removed(7, 0), removed(7, 1)}, false},
		{"no group fields at all (older vLLM)",
			[]events.Event{{Kind: events.KindBlockStored, BlockHashes: []uint64{7}, BlockSize: 16}}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ix := NewIndex(IndexConfig{})
			in, _ := NewIngestor(ix, IngestConfig{Mode: ModeExact}, Observer{})
			in.Apply(tid(1), &events.Batch{Events: c.batch})
			if got := ix.Has(tid(1), 7); got != c.indexed {
				t.Fatalf("indexed = %v, want %v", got, c.indexed)
			}
		})
	}
}

// TestIngestOffloadedCopies: vLLM's offloading connector announces CPU
// copies of GPU blocks with no token_ids and block_size 0, in the same batch
// as the GPU events. Neither mode may raise a configuration alarm, and the
// CPU tier must be indexed.
func TestIngestOffloadedCopies(t *testing.T) {
	h, _ := NewHasher(AlgoSHA256, "0", 16)
	tokens := seqTokens(32)
	for _, mode := range []KeyMode{ModeExact, ModeTokenDerived} {
		t.Run(mode.String(), func(t *testing.T) {
			ix, in, m, _ := newTestIngestor(t, mode, h, nil)
			gpu := storedEvent(t, h, tokens, RequestExtras{}, 0, 2)
			cpu := events.Event{Kind: events.KindBlockStored, BlockHashes: gpu.BlockHashes, Medium: events.MediumCPU}
			in.Apply(tid(1), &events.Batch{Events: []events.Event{gpu, cpu}})
			st, _ := ix.StatsFor(tid(1))
			if _, mm := in.HashHealth(tid(1)); mm != 0 || st.ByTier[TierCPU] != 2 || st.ByTier[TierGPU] != 2 {
				t.Fatalf("mismatches %d, placements %v", mm, st.ByTier)
			}
			// The GPU copy is evicted; the CPU copy still serves the prefix.
			in.Apply(tid(1), &events.Batch{Events: []events.Event{{Kind: events.KindBlockRemoved, BlockHashes: gpu.BlockHashes, Medium: events.MediumGPU}}})
			var keyer Keyer = h
			if mode == ModeTokenDerived {
				keyer, _ = NewTokenKeyer(16)
			}
			keys, _ := keyer.Keys(nil, tokens, RequestExtras{})
			got := ix.Lookup(nil, keys)
			if len(got) != 1 || got[0].Blocks != 2 || got[0].Weighted != 2*DefaultTierWeights[TierCPU] {
				t.Fatalf("lookup %+v", got)
			}
			if v := testutil.ToFloat64(m.hashMismatches.WithLabelValues(tid(1).String(), "block_size")); v != 0 {
				t.Fatalf("block_size alarm %v", v)
			}
		})
	}
}

func TestIngestRankMismatchIsLoud(t *testing.T) {
	var log bytes.Buffer
	_, in, m, _ := newTestIngestor(t, ModeExact, nil, &log)
	in.Apply(targetid.ID{Endpoint: "pod", Rank: 1}, &events.Batch{HasDPRank: true, DPRank: 0})
	if v := testutil.ToFloat64(m.rankMismatches.WithLabelValues("pod#1")); v != 1 || !strings.Contains(log.String(), "wrong data-parallel rank") {
		t.Fatalf("metric %v log %q", v, log.String())
	}
}

// engineEntries counts the engine hashes the ingestor remembers for id.
func engineEntries(in *Ingestor, id targetid.ID) int {
	st := in.state(id)
	st.mu.Lock()
	defer st.mu.Unlock()
	n := st.engine.young.Len()
	if st.engine.old == nil {
		return n
	}
	for h := range st.engine.old.All() {
		if _, dup := st.engine.young.Get(h); !dup {
			n++
		}
	}
	return n
}

func TestIngestEngineMapFollowsTheCache(t *testing.T) {
	h, _ := NewHasher(AlgoSHA256, "0", 16)
	tokens := seqTokens(16 * 4)
	gpu := storedEvent(t, h, tokens, RequestExtras{}, 0, 4)
	removed := func(medium string, hashes ...uint64) events.Event {
		return events.Event{Kind: events.KindBlockRemoved, BlockHashes: hashes, Medium: medium}
	}
	cpu := events.Event{Kind: events.KindBlockStored, BlockHashes: gpu.BlockHashes[:2], Medium: events.MediumCPU}
	orphan := storedEvent(t, h, seqTokens(16*8), RequestExtras{}, 6, 8) // parent never seen: unchained
	b := gpu.BlockHashes
	tests := []struct {
		name    string
		batches [][]events.Event
		// entries is what the map holds after the batches, blocks what
		// the index still finds of the prompt.
		entries, blocks int
	}{
		{"stored", [][]events.Event{{gpu}}, 4, 4},
		{"every block removed", [][]events.Event{{gpu}, {removed(events.MediumGPU, b...)}}, 0, 0},
		{"tail removed", [][]events.Event{{gpu}, {removed(events.MediumGPU, b[2:]...)}}, 2, 2},
		// A duplicate copy keeps its hash until its own removal.
		{"one of two copies removed", [][]events.Event{{gpu, gpu}, {removed(events.MediumGPU, b...)}}, 4, 4},
		{"both copies removed", [][]events.Event{{gpu, gpu}, {removed(events.MediumGPU, b...)}, {removed(events.MediumGPU, b...)}}, 0, 0},
		// The CPU tier still holds the first two blocks after the GPU
		// drops them; its own removal must still resolve.
		{"offloaded copy outlives the GPU one", [][]events.Event{{gpu, cpu}, {removed(events.MediumGPU, b...)}}, 2, 2},
		{"offloaded copy removed", [][]events.Event{{gpu, cpu}, {removed(events.MediumGPU, b...)}, {removed(events.MediumCPU, b[:2]...)}}, 0, 0},
		// A block whose parent is unknown has no key: nothing to keep.
		{"unchained stored", [][]events.Event{{orphan}}, 0, 0},
		{"unchained removed", [][]events.Event{{orphan}, {removed(events.MediumGPU, orphan.BlockHashes...)}}, 0, 0},
		{"restored after removal", [][]events.Event{{gpu}, {removed(events.MediumGPU, b...)}, {gpu}}, 4, 4},
	}
	tk, _ := NewTokenKeyer(16)
	keys, _ := tk.Keys(nil, tokens, RequestExtras{})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ix, in, _, _ := newTestIngestor(t, ModeTokenDerived, h, nil)
			for _, evs := range tc.batches {
				in.Apply(tid(1), &events.Batch{Events: evs})
			}
			if n := engineEntries(in, tid(1)); n != tc.entries {
				t.Errorf("engine map holds %d hashes, want %d", n, tc.entries)
			}
			blocks := 0
			if got := ix.Lookup(nil, keys); len(got) == 1 {
				blocks = got[0].Blocks
			}
			if blocks != tc.blocks {
				t.Errorf("index finds %d blocks, want %d", blocks, tc.blocks)
			}
			if st, _ := ix.StatsFor(tid(1)); st.UnknownRemovals != 0 {
				t.Errorf("%d removals of unknown placements", st.UnknownRemovals)
			}
		})
	}
}

// TestIngestEngineMapStaysFlat churns a pod's cache far past its size, as a
// long run does: the map holds what the pod holds, not what it stored.
func TestIngestEngineMapStaysFlat(t *testing.T) {
	h, _ := NewHasher(AlgoSHA256, "0", 16)
	_, in, _, _ := newTestIngestor(t, ModeTokenDerived, h, nil)
	const held = 8 // prompts the pod holds at once
	var live [][]uint64
	for i := range 200 {
		tokens := seqTokens(16 * 5)
		tokens[0] = uint32(i + 1) // a prompt of its own
		ev := storedEvent(t, h, tokens, RequestExtras{}, 0, 5)
		batch := []events.Event{ev}
		if len(live) == held {
			batch = append(batch, events.Event{Kind: events.KindBlockRemoved, BlockHashes: live[0], Medium: events.MediumGPU})
			live = live[1:]
		}
		live = append(live, ev.BlockHashes)
		in.Apply(tid(1), &events.Batch{Events: batch})
	}
	if n := engineEntries(in, tid(1)); n != held*5 {
		t.Fatalf("engine map holds %d hashes after 200 prompts, want the %d the pod holds", n, held*5)
	}
}
