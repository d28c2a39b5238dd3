package sim

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestRealTokenizer serves a model with a real tokenizer directory (fetched
// by `make testdata`). Locally it is skipped when the files are absent; under
// CI=true their absence is a failure, so CI cannot pass without running it.
func TestRealTokenizer(t *testing.T) {
	dir := filepath.Join("..", "testdata", "tokenizers", "models", "qwen3")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s missing under CI: run make testdata", dir)
		}
		t.Skip("qwen3 tokenizer not fetched; run make testdata")
	}
	f := startTestFleet(t, Config{Tokenizer: dir, Model: "Qwen/Qwen3-32B"})
	pod := f.Pods[0]
	code, _, raw := post(t, pod.URL()+"/tokenize", map[string]any{"prompt": "Hello world, hello world!"})
	var tok tokenizeResponse
	if code != 200 || json.Unmarshal(raw, &tok) != nil || tok.Count == 0 || tok.Count >= 25 {
		t.Fatalf("tokenize: %d %s", code, raw)
	}
	code, _, raw = post(t, pod.URL()+"/v1/completions", map[string]any{"model": "Qwen/Qwen3-32B", "prompt": "Hello world, hello world!", "max_tokens": 5})
	b := decodeBody(t, raw)
	if code != 200 || b.Usage.PromptTokens != tok.Count || b.Choices[0].Text == "" {
		t.Fatalf("completions: %d %s", code, raw)
	}
	code, _, raw = post(t, pod.URL()+"/detokenize", map[string]any{"tokens": tok.Tokens})
	if code != 200 || string(raw) != `{"prompt":"Hello world, hello world!"}` {
		t.Fatalf("detokenize: %d %s", code, raw)
	}
}
