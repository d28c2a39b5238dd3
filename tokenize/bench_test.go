package tokenize

import (
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// chatMsg is one chat message as the benchmarks send it.
type chatMsg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chatHistory builds the messages before the final user turn of a
// multi-turn conversation from the corpus paragraphs: a system prompt, then
// turns-1 user/assistant pairs.
func chatHistory(tb testing.TB, turns int) []chatMsg {
	tb.Helper()
	corpus := readCorpus(tb)
	var paras []string
	for _, s := range corpus {
		if len(s) > 400 && len(s) < 4000 && !strings.Contains(s, "<|") && !strings.Contains(s, "<｜") {
			paras = append(paras, s)
		}
	}
	msgs := []chatMsg{{"system", "You are a careful assistant. " + paras[0]}}
	for i := 1; i < turns; i++ {
		msgs = append(msgs, chatMsg{"user", paras[(2*i)%len(paras)]}, chatMsg{"assistant", paras[(2*i+1)%len(paras)]})
	}
	return msgs
}

// withFinal is the chat request of history followed by a final user turn.
func withFinal(history []chatMsg, final string) ChatRequest {
	m, _ := json.Marshal(append(slices.Clip(history), chatMsg{"user", final}))
	return ChatRequest{Messages: m, AddGenerationPrompt: true}
}

// chatTurns builds a multi-turn conversation whose last user turn is final.
func chatTurns(tb testing.TB, turns int, final string) ChatRequest {
	tb.Helper()
	return withFinal(chatHistory(tb, turns), final)
}

// BenchmarkChatTurn re-tokenizes turn 20 of a long chat, cold and warm, in
// one run. Warm is a serving router that tokenized the earlier turns when
// they were the latest: its segment cache holds their ids and its message
// cache their decoded messages. Cold is a router that never saw this
// conversation: no segment cache, no message cache. Warm on both sides, as
// in any running process: the compiled template and the BPE word cache.
//
// Every measured request ends in a question neither side has seen before
// (a fresh one per request, so the warm side never gets the final turn from
// its caches), and both sides get the same requests. The phases alternate
// in rounds, so a change in machine load hits both sides alike, and each
// phase starts after a GC, so one side's garbage is not billed to the
// other.
//
// "speedup" is end to end (render + encode, wall time); "encode-speedup"
// is the encode of the rendered prompt alone, which is what the segment
// cache serves; "cpu-speedup" is the end-to-end ratio of the benchmark
// thread's CPU time, which time other processes take from the machine
// does not distort (it leaves out GC work done on other threads, which is
// mostly the cold side's).
func BenchmarkChatTurn(b *testing.B) {
	dir := fetchedModel(b, "qwen3")
	cold := NewRegistry(Options{CacheMaxBytes: -1, MessageCacheMaxBytes: -1})
	defer cold.Close()
	warm := NewRegistry(Options{})
	defer warm.Close()
	mc, err := cold.Add("qwen3", dir, ModeLocal)
	if err != nil {
		b.Fatal(err)
	}
	mw, err := warm.Add("qwen3", dir, ModeLocal)
	if err != nil {
		b.Fatal(err)
	}
	const turns = 20
	history := chatHistory(b, turns)
	question := func(i int) string {
		return fmt.Sprintf("Question %d: given everything above, what would you change first, and why? Answer briefly.", i)
	}
	// Earlier turns were tokenized when they were the latest turn.
	for i := 1; i <= turns; i++ {
		if _, _, err := mw.EncodeChat(withFinal(history[:2*i-1], question(-i))); err != nil {
			b.Fatal(err)
		}
	}
	warm.cache.c.Wait()
	warm.values.c.Wait()
	// Warm the word cache for the cold side too, so "cold" means only
	// "this conversation was never seen".
	_, ids, err := mc.EncodeChat(withFinal(history, question(-1)))
	if err != nil {
		b.Fatal(err)
	}
	runtime.LockOSThread() // threadCPU measures this goroutine's thread
	defer runtime.UnlockOSThread()
	type total struct{ wall, cpu time.Duration }
	var coldChat, warmChat, coldEnc, warmEnc total
	phase := func(t *total, n int, run func(i int) error) {
		runtime.GC()
		w, c := time.Now(), threadCPU()
		for i := 0; i < n; i++ {
			if err := run(i); err != nil {
				b.Fatal(err)
			}
		}
		t.cpu += threadCPU() - c
		t.wall += time.Since(w)
	}
	const round = 250
	reqs := make([]ChatRequest, 0, round)
	prompts := make([]string, 0, round)
	next := 0
	b.ResetTimer()
	for done := 0; done < b.N; {
		b.StopTimer()
		n := min(round, b.N-done)
		reqs, prompts = reqs[:0], prompts[:0]
		for range n {
			req := withFinal(history, question(next))
			next++
			p, err := mc.RenderChat(req)
			if err != nil {
				b.Fatal(err)
			}
			reqs, prompts = append(reqs, req), append(prompts, p)
		}
		b.StartTimer()
		chat := func(m *Model) func(int) error {
			return func(i int) error { _, _, err := m.EncodeChat(reqs[i]); return err }
		}
		enc := func(m *Model) func(int) error {
			return func(i int) error { _, err := m.Encode(prompts[i], false); return err }
		}
		// The cold side goes first in every phase, so the warm side's
		// caches never see a question before it is measured.
		phase(&coldChat, n, chat(mc))
		phase(&warmChat, n, chat(mw))
		phase(&coldEnc, n, enc(mc))
		phase(&warmEnc, n, enc(mw))
		done += n
	}
	n := float64(b.N)
	b.ReportMetric(float64(coldChat.wall.Microseconds())/n, "cold-µs/op")
	b.ReportMetric(float64(warmChat.wall.Microseconds())/n, "warm-µs/op")
	b.ReportMetric(float64(coldChat.wall)/float64(warmChat.wall), "speedup")
	b.ReportMetric(float64(coldEnc.wall)/float64(warmEnc.wall), "encode-speedup")
	if warmChat.cpu > 0 {
		b.ReportMetric(float64(coldChat.cpu)/float64(warmChat.cpu), "cpu-speedup")
	}
	b.ReportMetric(float64(len(prompts[0])), "prompt-bytes")
	b.ReportMetric(float64(len(ids)), "prompt-tokens")
}

// BenchmarkRenderChat renders turn 20 of the BenchmarkChatTurn chat (no
// encoding): "fresh" decodes every message, "cached" takes the decoded
// messages from the message cache. The 64 final questions repeat, so the
// cached case also finds the last message cached after the first 64 renders:
// this isolates the render; BenchmarkChatTurn is the end-to-end figure.
func BenchmarkRenderChat(b *testing.B) {
	dir := fetchedModel(b, "qwen3")
	history := chatHistory(b, 20)
	reqs := make([]ChatRequest, 64)
	for i := range reqs {
		reqs[i] = withFinal(history, fmt.Sprintf("Question %d: what would you change first?", i))
	}
	for _, tc := range []struct {
		name  string
		bytes int64
	}{{"fresh", -1}, {"cached", 0}} {
		r := NewRegistry(Options{CacheMaxBytes: -1, MessageCacheMaxBytes: tc.bytes})
		defer r.Close()
		m, err := r.Add("qwen3", dir, ModeLocal)
		if err != nil {
			b.Fatal(err)
		}
		for _, req := range reqs {
			if _, err := m.RenderChat(req); err != nil {
				b.Fatal(err)
			}
		}
		if r.values != nil {
			r.values.c.Wait()
		}
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if _, err := m.RenderChat(reqs[i%len(reqs)]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
