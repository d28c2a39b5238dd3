package sim

import (
	"context"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex"
)

// testProfile is small and has round numbers so expected step times are
// easy to state.
func testProfile() Profile {
	return Profile{
		Name: "test", Model: "sim-test", MaxModelLen: 4096, BlockSize: 16, NumGPUBlocks: 64,
		MaxNumBatchedTokens: 256, MaxNumSeqs: 8,
		StepFixed: time.Millisecond, PrefillPerToken: 10 * time.Microsecond, DecodePerSeq: 20 * time.Microsecond,
	}
}

type engineHarness struct {
	t      *testing.T
	e      *engine
	hasher *kvindex.Hasher
}

// startEngine runs an engine without HTTP or ZMQ, fast (scale 1000).
func startEngine(t *testing.T, prof Profile, faults Faults) *engineHarness {
	t.Helper()
	h := newEngineHarness(t, prof, faults)
	h.start()
	return h
}

// newEngineHarness builds an engine that does not run until start: requests
// submitted before then arrive together.
func newEngineHarness(t *testing.T, prof Profile, faults Faults) *engineHarness {
	t.Helper()
	h, err := kvindex.NewHasher(kvindex.AlgoSHA256, "0", prof.BlockSize)
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(prof, 0, h, 1000, outputTokens(BytesTokenizer()), nil, newFaultBox(faults), 1)
	return &engineHarness{t: t, e: e, hasher: h}
}

func (h *engineHarness) start() {
	ctx, cancel := context.WithCancel(context.Background())
	go h.e.run(ctx)
	h.t.Cleanup(func() {
		cancel()
		<-h.e.done
	})
}

func (h *engineHarness) submit(ids []uint32, maxTokens int, extras kvindex.RequestExtras) *seq {
	h.t.Helper()
	hashes, err := h.hasher.Digests(nil, ids, extras)
	if err != nil {
		h.t.Fatal(err)
	}
	s := &seq{id: "t", tokens: append([]uint32(nil), ids...), promptLen: len(ids), maxTokens: maxTokens,
		extras: extras, hashes: hashes, out: &output{notify: make(chan struct{}, 1)}}
	if err := h.e.submit(context.Background(), engineMsg{kind: msgAdd, s: s}); err != nil {
		h.t.Fatal(err)
	}
	return s
}

func (h *engineHarness) wait(s *seq) Snapshot {
	h.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		if snap := s.out.snapshot(); snap.Done {
			return snap
		}
		select {
		case <-s.out.notify:
		case <-deadline:
			h.t.Fatalf("request did not finish: %+v", s.out.snapshot())
		}
	}
}

func (h *engineHarness) run(ids []uint32, maxTokens int) Snapshot {
	h.t.Helper()
	return h.wait(h.submit(ids, maxTokens, kvindex.RequestExtras{}))
}

func tokenRange(start, n int) []uint32 {
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = uint32(start + i)
	}
	return ids
}

func TestEngineRepeatedPromptHitsFromBlockZero(t *testing.T) {
	tests := []struct {
		name       string
		first      []uint32
		second     []uint32
		wantCached int
	}{
		{"same prompt, whole blocks: last block recomputed", tokenRange(0, 64), tokenRange(0, 64), 48},
		{"same prompt, partial tail", tokenRange(0, 70), tokenRange(0, 70), 64},
		{"shared prefix then divergence", tokenRange(0, 64), append(tokenRange(0, 40), tokenRange(1000, 40)...), 32},
		{"different block 0: no hit even if later blocks match", tokenRange(0, 64), append(tokenRange(500, 16), tokenRange(16, 48)...), 0},
		{"shorter than a block", tokenRange(0, 10), tokenRange(0, 10), 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := startEngine(t, testProfile(), Faults{})
			if s := h.run(tc.first, 1); s.Err != nil || s.CachedTokens != 0 {
				t.Fatalf("first request: %+v", s)
			}
			s := h.run(tc.second, 1)
			if s.Err != nil || s.CachedTokens != tc.wantCached {
				t.Fatalf("second request cached %d tokens (err %v), want %d", s.CachedTokens, s.Err, tc.wantCached)
			}
			st := &h.e.stats
			if got := st.hits.Load(); got != int64(tc.wantCached) {
				t.Fatalf("prefix_cache_hits %d, want %d", got, tc.wantCached)
			}
			if got := st.queries.Load(); got != int64(len(tc.first)+len(tc.second)) {
				t.Fatalf("prefix_cache_queries %d, want %d", got, len(tc.first)+len(tc.second))
			}
		})
	}
}

func TestEngineTTFTFollowsProfile(t *testing.T) {
	prof := testProfile()
	// One request alone: TTFT is the sum of its prefill steps. With a 256
	// token budget a 600-token prompt takes three chunks (256, 256, 88).
	tests := []struct {
		name   string
		warm   []uint32 // run first, to fill the cache
		prompt []uint32
		want   time.Duration
	}{
		{"100 uncached", nil, tokenRange(0, 100), prof.StepTime(100, 0)},
		{"200 uncached", nil, tokenRange(0, 200), prof.StepTime(200, 0)},
		{"600 uncached, chunked", nil, tokenRange(0, 600), prof.StepTime(256, 0)*2 + prof.StepTime(88, 0)},
		{"200 with 192 cached", tokenRange(0, 200), tokenRange(0, 200), prof.StepTime(8, 0)},
		{"192 exact blocks, 176 cached", tokenRange(0, 192), tokenRange(0, 192), prof.StepTime(16, 0)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := startEngine(t, prof, Faults{})
			if tc.warm != nil {
				h.run(tc.warm, 1)
			}
			s := h.run(tc.prompt, 1)
			if s.Err != nil {
				t.Fatal(s.Err)
			}
			if s.TTFT != tc.want {
				t.Fatalf("TTFT %v, want %v", s.TTFT, tc.want)
			}
		})
	}
}

func TestEngineSlowFault(t *testing.T) {
	prof := testProfile()
	h := startEngine(t, prof, Faults{Slow: 3})
	s := h.run(tokenRange(0, 100), 1)
	if want := 3 * prof.StepTime(100, 0); s.TTFT != want {
		t.Fatalf("TTFT %v, want %v", s.TTFT, want)
	}
}

func TestEngineDecodeAndOutputBlocks(t *testing.T) {
	prof := testProfile()
	h := startEngine(t, prof, Faults{})
	s := h.submit(tokenRange(0, 30), 20, kvindex.RequestExtras{})
	snap := h.wait(s)
	if snap.Generated != 20 || snap.Finish != "length" {
		t.Fatalf("generated %d (%q), want 20 (length)", snap.Generated, snap.Finish)
	}
	// 50 tokens known: 3 full blocks hashed, the same chain kvindex computes.
	want, err := h.hasher.Digests(nil, s.tokens, kvindex.RequestExtras{})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.hashes) != 3 || len(want) != 3 {
		t.Fatalf("hashed %d blocks, kvindex %d; want 3", len(s.hashes), len(want))
	}
	for i := range want {
		if s.hashes[i] != want[i] {
			t.Fatalf("block %d hash differs from kvindex", i)
		}
	}
	// A follow-up turn that extends prompt+output hits the generated blocks:
	// 49 computed tokens (the last generated token has no KV) → 3 blocks.
	s2 := h.run(append(append([]uint32(nil), s.tokens...), tokenRange(900, 10)...), 1)
	if s2.CachedTokens != 48 {
		t.Fatalf("follow-up cached %d, want 48", s2.CachedTokens)
	}
}

func TestEngineWaitsWhenKVFull(t *testing.T) {
	prof := testProfile()
	prof.NumGPUBlocks = 8 // 128 tokens
	prof.MaxNumBatchedTokens = 1024
	h := newEngineHarness(t, prof, Faults{})
	// The first request holds 6 blocks while it decodes; the second needs 4
	// and must wait until the first finishes.
	a := h.submit(tokenRange(0, 80), 10, kvindex.RequestExtras{})
	b := h.submit(tokenRange(1000, 60), 1, kvindex.RequestExtras{})
	h.start()
	sa, sb := h.wait(a), h.wait(b)
	if sa.Err != nil || sb.Err != nil {
		t.Fatal(sa.Err, sb.Err)
	}
	// b's first token came only after a's 10 steps: its TTFT covers them.
	minWait := prof.StepTime(80, 0) + 9*prof.StepTime(0, 1)
	if sb.TTFT < minWait {
		t.Fatalf("second request TTFT %v, want ≥ %v (it should have waited for KV space)", sb.TTFT, minWait)
	}
	if h.e.pool.numFree != prof.NumGPUBlocks {
		t.Fatalf("%d blocks free after both finished, want %d", h.e.pool.numFree, prof.NumGPUBlocks)
	}
}

func TestEngineFailPrefillFreesBlocks(t *testing.T) {
	prof := testProfile()
	h := startEngine(t, prof, Faults{FailPrefill: 1})
	s := h.run(tokenRange(0, 50), 5)
	if s.Err != errPrefillFailed || s.Generated != 0 {
		t.Fatalf("got %+v, want a prefill failure", s)
	}
	ok, err := h.e.control(context.Background(), msgReset)
	if err != nil || !ok {
		t.Fatalf("reset after failure: ok=%v err=%v (blocks leaked?)", ok, err)
	}
}

func TestEngineAbortFreesBlocks(t *testing.T) {
	prof := testProfile()
	h := startEngine(t, prof, Faults{})
	s := h.submit(tokenRange(0, 50), 100000, kvindex.RequestExtras{})
	deadline := time.After(5 * time.Second)
	for s.out.snapshot().Generated == 0 {
		select {
		case <-s.out.notify:
		case <-deadline:
			t.Fatal("no token")
		}
	}
	if err := h.e.submit(context.Background(), engineMsg{kind: msgAbort, s: s}); err != nil {
		t.Fatal(err)
	}
	if snap := h.wait(s); snap.Err != errAborted {
		t.Fatalf("got %+v, want aborted", snap)
	}
	ok, err := h.e.control(context.Background(), msgReset)
	if err != nil || !ok {
		t.Fatalf("reset after abort: ok=%v err=%v (blocks leaked?)", ok, err)
	}
	if h.e.stats.running.Load() != 0 {
		t.Fatal("aborted request still counted as running")
	}
}

func TestEnginePreemptsNewestWhenRunningCannotGrow(t *testing.T) {
	prof := testProfile()
	prof.NumGPUBlocks = 6 // 96 tokens
	prof.MaxNumBatchedTokens = 1024
	h := newEngineHarness(t, prof, Faults{})
	// Two requests of 40 tokens (3 blocks each) fill the cache; decoding
	// past 48 tokens needs a fourth block, so the newest is preempted and
	// recomputed later. Both must still finish.
	a := h.submit(tokenRange(0, 40), 20, kvindex.RequestExtras{})
	b := h.submit(tokenRange(100, 40), 20, kvindex.RequestExtras{})
	h.start()
	sa, sb := h.wait(a), h.wait(b)
	if sa.Err != nil || sb.Err != nil || sa.Generated != 20 || sb.Generated != 20 {
		t.Fatalf("a %+v b %+v", sa, sb)
	}
	if h.e.stats.preemptions.Load() == 0 {
		t.Fatal("no preemption recorded")
	}
}
