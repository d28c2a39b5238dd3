package bpe

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
)

const testdataDir = "../../testdata/tokenizers"

// modelPath returns the fetched tokenizer.json of a parity model. Missing
// files fail the test under CI (make testdata must have run) and skip it
// locally.
func modelPath(tb testing.TB, model string) string {
	tb.Helper()
	p := filepath.Join(testdataDir, "models", model, "tokenizer.json")
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("%s missing under CI: run make testdata (scripts/fetch-tokenizers.sh): %v", p, err)
		}
		tb.Skipf("%s missing; run make testdata to fetch it", p)
	}
	return p
}

// parsed holds each parity model parsed once per test binary (model name ->
// func() (*Tokenizer, error)): parsing a tokenizer.json dominates these
// tests' time, about tenfold under -race. Tests that load models run in
// parallel, so two models parse at once on two cores.
var parsed sync.Map

// parityModel returns a parity model with a word cache of its own, so no
// test's merges are answered from another test's warm cache. The rest of a
// Tokenizer is read-only after Parse.
func parityModel(tb testing.TB, name string) *Tokenizer {
	tb.Helper()
	path := modelPath(tb, name)
	load, _ := parsed.LoadOrStore(name, sync.OnceValues(func() (*Tokenizer, error) { return Load(path) }))
	tk, err := load.(func() (*Tokenizer, error))()
	if err != nil {
		tb.Fatal(err)
	}
	return withOwnWordCache(tk)
}

// withOwnWordCache is a copy of tk sharing everything but the model's word
// cache.
func withOwnWordCache(tk *Tokenizer) *Tokenizer {
	c := *tk
	m := *tk.model
	m.words = newWordCache()
	c.model = &m
	return &c
}

func loadCorpus(tb testing.TB) []string {
	tb.Helper()
	raw, err := os.ReadFile(filepath.Join(testdataDir, "corpus.json"))
	if err != nil {
		tb.Fatal(err)
	}
	var corpus []string
	if err := json.Unmarshal(raw, &corpus); err != nil {
		tb.Fatal(err)
	}
	return corpus
}

func loadRef(tb testing.TB, name string) [][]uint32 {
	tb.Helper()
	f, err := os.Open(filepath.Join(testdataDir, "ref", name))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var out [][]uint32
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var ids []uint32
		if err := json.Unmarshal(sc.Bytes(), &ids); err != nil {
			tb.Fatalf("%s line %d: %v", name, len(out)+1, err)
		}
		out = append(out, ids)
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return out
}

// knownDiffs lists corpus lines (0-based) where HF's ids cannot be matched,
// per model; see the comments at each entry. Empty means exact parity.
var knownDiffs = map[string][]int{}

func TestParity(t *testing.T) {
	t.Parallel()
	corpus := loadCorpus(t)
	for _, model := range []string{"qwen3", "llama3_1", "deepseek_v3"} {
		t.Run(model, func(t *testing.T) {
			t.Parallel()
			tk := parityModel(t, model)
			for _, add := range []bool{false, true} {
				name := fmt.Sprintf("%s.add%d.jsonl", model, map[bool]int{false: 0, true: 1}[add])
				ref := loadRef(t, name)
				if len(ref) != len(corpus) {
					t.Fatalf("%s: %d lines, corpus has %d", name, len(ref), len(corpus))
				}
				var diffs []int
				for i, text := range corpus {
					got, err := tk.Encode(text, add)
					if err != nil {
						t.Fatalf("line %d: %v", i, err)
					}
					if !slices.Equal(got, ref[i]) {
						if len(diffs) < 5 {
							t.Logf("%s line %d %q:\n got %v\nwant %v", name, i, truncs(text), trunc(got), trunc(ref[i]))
						}
						diffs = append(diffs, i)
					}
				}
				t.Logf("parity %s: %d/%d lines identical", name, len(corpus)-len(diffs), len(corpus))
				if want := knownDiffs[model]; !slices.Equal(diffs, want) {
					t.Errorf("%s: differing lines %v, want exactly %v", name, head(diffs), want)
				}
			}
		})
	}
}

func truncs(s string) string {
	r := []rune(s)
	if len(r) > 80 {
		return string(r[:80]) + "…"
	}
	return s
}

func trunc(v []uint32) []uint32 {
	if len(v) > 40 {
		return v[:40]
	}
	return v
}

func head(v []int) []int {
	if len(v) > 30 {
		return v[:30]
	}
	return v
}
