package tokenize

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// chatTurns builds a multi-turn conversation from the corpus paragraphs;
// final is the text of the last user turn, which differs per call so every
// measured encode sees genuinely new text.
func chatTurns(tb testing.TB, turns int, final string) ChatRequest {
	tb.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "testdata", "tokenizers", "corpus.json"))
	if err != nil {
		tb.Fatal(err)
	}
	var corpus []string
	if err := json.Unmarshal(raw, &corpus); err != nil {
		tb.Fatal(err)
	}
	var paras []string
	for _, s := range corpus {
		if len(s) > 400 && len(s) < 4000 && !strings.Contains(s, "<|") && !strings.Contains(s, "<｜") {
			paras = append(paras, s)
		}
	}
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []msg{{"system", "You are a careful assistant. " + paras[0]}}
	for i := 1; i < turns; i++ {
		msgs = append(msgs, msg{"user", paras[(2*i)%len(paras)]}, msg{"assistant", paras[(2*i+1)%len(paras)]})
	}
	msgs = append(msgs, msg{"user", final})
	m, _ := json.Marshal(msgs)
	return ChatRequest{Messages: m, AddGenerationPrompt: true}
}

// BenchmarkChatTurn re-tokenizes turn 20 of a long chat, cold (no segment
// cache) and warm (the cache holds the earlier turns, as it does in a
// serving router), in one run: "speedup" is end to end (render + encode),
// "encode-speedup" the tokenization of the rendered prompt alone, which is
// what the segment cache serves. Both phases see the same 64 new final
// questions; the BPE word cache is warm in both, as in a running process.
func BenchmarkChatTurn(b *testing.B) {
	dir := fetchedModel(b, "qwen3")
	cold := NewRegistry(Options{CacheMaxBytes: -1})
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
	question := func(i int) string {
		return fmt.Sprintf("Question %d: given everything above, what would you change first, and why? Answer briefly.", i)
	}
	// Earlier turns were tokenized when they were the latest turn.
	for i := 1; i <= turns; i++ {
		if _, _, err := mw.EncodeChat(chatTurns(b, i, question(-i))); err != nil {
			b.Fatal(err)
		}
	}
	warm.cache.c.Wait()
	reqs := make([]ChatRequest, 64)
	prompts := make([]string, len(reqs))
	for i := range reqs {
		reqs[i] = chatTurns(b, turns, question(i))
		if prompts[i], err = mc.RenderChat(reqs[i]); err != nil {
			b.Fatal(err)
		}
	}
	// Warm the word cache for the cold side too, so "cold" means only
	// "this conversation was never seen".
	_, ids, err := mc.EncodeChat(reqs[0])
	if err != nil {
		b.Fatal(err)
	}
	// Each side runs as its own phase after a GC, so one side's garbage
	// and cache misses are not billed to the other.
	phase := func(m *Model, chat bool) time.Duration {
		runtime.GC()
		start := time.Now()
		for i := 0; i < b.N; i++ {
			var err error
			if chat {
				_, _, err = m.EncodeChat(reqs[i%len(reqs)])
			} else {
				_, err = m.Encode(prompts[i%len(prompts)], false)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(start)
	}
	b.ResetTimer()
	coldChat, warmChat := phase(mc, true), phase(mw, true)
	coldEnc, warmEnc := phase(mc, false), phase(mw, false)
	n := float64(b.N)
	b.ReportMetric(float64(coldChat.Microseconds())/n, "cold-µs/op")
	b.ReportMetric(float64(warmChat.Microseconds())/n, "warm-µs/op")
	b.ReportMetric(float64(coldChat)/float64(warmChat), "speedup")
	b.ReportMetric(float64(coldEnc)/float64(warmEnc), "encode-speedup")
	b.ReportMetric(float64(len(prompts[0])), "prompt-bytes")
	b.ReportMetric(float64(len(ids)), "prompt-tokens")
}
