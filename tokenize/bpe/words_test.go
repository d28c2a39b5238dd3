package bpe

import (
	"slices"
	"strings"
	"testing"

	"github.com/dlclark/regexp2"
)

// generalPath is a copy of tk that pre-tokenizes piece by piece, with a word
// cache of its own (the fused path keys words by raw bytes, the general
// path by their byte-level form).
func generalPath(tk *Tokenizer) *Tokenizer {
	g := withOwnWordCache(tk)
	g.words = nil
	return g
}

func fusedModels(tb testing.TB) map[string][2]*Tokenizer {
	tb.Helper()
	out := map[string][2]*Tokenizer{}
	for _, name := range []string{"qwen3", "llama3_1", "deepseek_v3"} {
		tk := parityModel(tb, name)
		if tk.words == nil {
			tb.Fatalf("%s: pre-tokenizer chain not fused", name)
		}
		out[name] = [2]*Tokenizer{tk, generalPath(tk)}
	}
	return out
}

// TestWordSplitterMatchesPieces encodes the parity corpus through the fused
// word splitter and through the general piece-by-piece path: the same ids.
func TestWordSplitterMatchesPieces(t *testing.T) {
	t.Parallel()
	corpus := loadCorpus(t)
	for name, pair := range fusedModels(t) {
		for i, s := range corpus {
			fused, err := pair[0].Encode(s, false)
			if err != nil {
				t.Fatal(err)
			}
			general, err := pair[1].Encode(s, false)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(fused, general) {
				t.Fatalf("%s corpus[%d]: fused %v, general %v", name, i, fused, general)
			}
		}
	}
}

func TestWordSplitterChains(t *testing.T) {
	digits := splitPre{fast: &fastSplit{kind: kindDigits3}, behavior: behIsolated}
	for _, tc := range []struct {
		name  string
		pre   preTokenizer
		fused bool
	}{
		{"byte-level alone", byteLevelPre{}, true},
		{"byte-level with its regex", byteLevelPre{re: regexp2.MustCompile(gpt2Pattern, regexp2.None)}, true},
		{"split then byte-level", sequencePre{digits, byteLevelPre{}}, true},
		{"prefix space", byteLevelPre{addPrefixSpace: true}, false},
		{"merged split", sequencePre{splitPre{fast: digits.fast, behavior: behMergedWithNext}, byteLevelPre{}}, false},
		{"inverted split", sequencePre{splitPre{fast: digits.fast, behavior: behIsolated, invert: true}, byteLevelPre{}}, false},
		{"regexp2 split", sequencePre{splitPre{behavior: behIsolated}, byteLevelPre{}}, false},
		{"byte-level not last", sequencePre{byteLevelPre{}, digits}, false},
		{"metaspace", &metaspace{replacement: "▁", scheme: "always"}, false},
		{"empty sequence", sequencePre{}, false},
	} {
		if got := newWordSplitter(tc.pre) != nil; got != tc.fused {
			t.Errorf("%s: fused %v, want %v", tc.name, got, tc.fused)
		}
	}
}

// FuzzWordSplitter compares the fused and general paths of the real
// tokenizers on arbitrary text.
func FuzzWordSplitter(f *testing.F) {
	for _, s := range []string{"Hello, world! It's 12345 o'clock.\n\n  \tdone  ", "中文字符123４５６ⅫⅫ and ＡＢＣ", " \r\n \r\n x", "don'T I'LL", "\xff\xfe"} {
		f.Add(s)
	}
	models := fusedModels(f)
	f.Fuzz(func(t *testing.T, s string) {
		s = strings.ToValidUTF8(s, "\uFFFD")
		for name, pair := range models {
			fused, err1 := pair[0].Encode(s, false)
			general, err2 := pair[1].Encode(s, false)
			if err1 != nil || err2 != nil {
				t.Fatalf("%s: %v / %v", name, err1, err2)
			}
			if !slices.Equal(fused, general) {
				t.Fatalf("%s on %q: fused %v, general %v", name, s, fused, general)
			}
		}
	})
}
