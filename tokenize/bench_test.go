package tokenize

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
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

// BenchmarkChatTurn re-tokenizes turn 20 of a long chat (render + encode),
// cold (no segment cache) and warm (cache holds the earlier turns, as it
// does in a serving router), in one run, and reports the speed-up.
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
	for i := range reqs {
		reqs[i] = chatTurns(b, turns, question(i))
	}
	prompt, ids, err := mc.EncodeChat(reqs[0])
	if err != nil {
		b.Fatal(err)
	}
	var coldDur, warmDur time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		req := reqs[i%len(reqs)]
		t0 := time.Now()
		_, want, err := mc.EncodeChat(req)
		t1 := time.Now()
		_, got, err2 := mw.EncodeChat(req)
		t2 := time.Now()
		if err != nil || err2 != nil || len(got) != len(want) {
			b.Fatalf("cold %v / warm %v: %d vs %d ids", err, err2, len(want), len(got))
		}
		coldDur += t1.Sub(t0)
		warmDur += t2.Sub(t1)
	}
	n := float64(b.N)
	b.ReportMetric(float64(coldDur.Microseconds())/n, "cold-µs/op")
	b.ReportMetric(float64(warmDur.Microseconds())/n, "warm-µs/op")
	b.ReportMetric(float64(coldDur)/float64(warmDur), "speedup")
	b.ReportMetric(float64(len(prompt)), "prompt-bytes")
	b.ReportMetric(float64(len(ids)), "prompt-tokens")
}
