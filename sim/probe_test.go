package sim

import (
	"context"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex"
)

// probeNow asks an engine that is not running (the test owns its
// goroutine) for its state.
func probeNow(t *testing.T, h *engineHarness, ids []uint32) RankState {
	t.Helper()
	hashes, err := h.hasher.Digests(nil, ids, kvindex.RequestExtras{})
	if err != nil {
		t.Fatal(err)
	}
	m := probeMsg{hashes: hashes, promptLen: len(ids), reply: make(chan RankState, 1)}
	h.e.answer(m)
	return <-m.reply
}

func addNow(t *testing.T, h *engineHarness, ids []uint32, maxTokens int) *seq {
	t.Helper()
	hashes, err := h.hasher.Digests(nil, ids, kvindex.RequestExtras{})
	if err != nil {
		t.Fatal(err)
	}
	s := &seq{id: "t", tokens: append([]uint32(nil), ids...), promptLen: len(ids), maxTokens: maxTokens,
		hashes: hashes, hasher: h.hasher, out: &output{notify: make(chan struct{}, 1)}}
	h.e.handle(engineMsg{kind: msgAdd, s: s})
	return s
}

func TestProbeReportsCacheAndQueue(t *testing.T) {
	prof := testProfile()
	prefix := tokenRange(1000, 64) // four blocks
	with := func(tail ...uint32) []uint32 { return append(append([]uint32(nil), prefix...), tail...) }

	h := newEngineHarness(t, prof, Faults{})
	if st := probeNow(t, h, with(1, 2, 3)); st != (RankState{}) {
		t.Fatalf("empty engine: %+v", st)
	}
	// One request runs the prefix through a step: its blocks are cached.
	addNow(t, h, with(7), 4)
	h.e.step()
	h.e.finishStep()
	tests := []struct {
		name   string
		ids    []uint32
		cached int
	}{
		{"same prefix, longer", with(1, 2, 3), 64},
		{"the prefix alone: the last token is always computed", prefix, 48},
		{"other tokens", tokenRange(5000, 80), 0},
		{"prefix cut inside block 2", prefix[:40], 32},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := probeNow(t, h, tc.ids)
			if st.CachedTokens != tc.cached {
				t.Fatalf("cached %d, want %d", st.CachedTokens, tc.cached)
			}
			if st.Running != 1 || st.Waiting != 0 || st.QueuedPrefillTokens != 0 || st.KVUsage <= 0 {
				t.Fatalf("load %+v", st)
			}
		})
	}
	// Two more wait: their uncached tokens are the queue, net of the hit
	// each had when it arrived.
	addNow(t, h, with(8, 9), 4)           // 66 tokens, 64 cached
	addNow(t, h, tokenRange(9000, 50), 4) // 50 tokens, none cached
	st := probeNow(t, h, prefix)
	if st.Waiting != 2 || st.QueuedPrefillTokens != 2+50 {
		t.Fatalf("queue %+v, want 2 waiting with 52 tokens to prefill", st)
	}
}

func TestProbeOverTheFleet(t *testing.T) {
	f := startTestFleet(t, Config{DP: 2})
	pod := f.Pods[0]
	prompt := "a shared system prompt of some length, long enough to fill a few blocks of sixteen tokens"
	ids, err := pod.Encode(prompt)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != len(prompt)+1 { // the bytes model adds BOS
		t.Fatalf("%d ids for %d bytes", len(ids), len(prompt))
	}
	code, _, body := post(t, pod.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 2}, "X-data-parallel-rank", "1")
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := pod.Probe(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	want := (len(ids) - 1) / 16 * 16
	if len(st) != 2 || st[0].CachedTokens != 0 || st[1].CachedTokens != want {
		t.Fatalf("ranks %+v, want rank 1 holding %d tokens", st, want)
	}
	if got := cachedTokens(t, body); got != 0 {
		t.Fatalf("first request cached %d", got)
	}
}

func TestStreamIntervalCoalescesLaterTokens(t *testing.T) {
	prof := testProfile()
	for _, tc := range []struct {
		name               string
		every              time.Duration
		minPokes, maxPokes int
	}{
		{"every step", 0, 40, 40},
		{"one wake-up per 10 ms of ~1 ms steps", 10 * time.Millisecond, 3, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newEngineHarness(t, prof, Faults{})
			h.e.streamEvery = tc.every
			s := addNow(t, h, tokenRange(1, 20), 40)
			pokes, first := 0, -1
			for step := 0; !s.out.snapshot().Done; step++ {
				h.e.vnow += h.e.step()
				h.e.finishStep()
				select {
				case <-s.out.notify:
					pokes++
					if first < 0 {
						first = step
					}
				default:
				}
			}
			// The first token wakes the writer in the step that made it.
			if first != 0 || pokes > tc.maxPokes || pokes < tc.minPokes {
				t.Fatalf("first wake-up at step %d, %d wake-ups (want %d..%d)", first, pokes, tc.minPokes, tc.maxPokes)
			}
		})
	}
}
