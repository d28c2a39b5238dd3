package bpe

import (
	"slices"
	"strings"
	"testing"

	"github.com/dlclark/regexp2"
)

// FuzzFastSplit checks the hand-written matchers against regexp2 on the
// same patterns: identical matches on any text.
func FuzzFastSplit(f *testing.F) {
	for _, s := range []string{
		"Hello, world! It's 12345 o'clock.\n\n  \tdone  ", "don'T I'LL 're 've x'ſ", " \r\n \r\n x", "a  \u00a0b\u3000\u3000c   ",
		"中文字符123４５６ⅫⅫ", "!!!\r\n\r\n", "   ", "é\u0301", "x'", "'", " 'll", "\t!", "a\r \n b", "1,000.5e-3",
	} {
		f.Add(s)
	}
	type pair struct {
		re   *regexp2.Regexp
		fast fastSplit
	}
	var pairs []pair
	for src, fs := range fastPatterns {
		pairs = append(pairs, pair{regexp2.MustCompile(src, regexp2.None), fs})
	}
	f.Fuzz(func(t *testing.T, s string) {
		s = strings.ToValidUTF8(s, "\uFFFD")
		for _, p := range pairs {
			want, err := findAll(p.re, s)
			if err != nil {
				t.Fatal(err)
			}
			got := p.fast.find(s)
			if len(want) == 0 && len(got) == 0 {
				continue
			}
			if !slices.Equal(got, want) {
				t.Fatalf("pattern %q on %q:\n fast  %v\n regex %v", p.re.String(), s, got, want)
			}
		}
	})
}

// TestFastPathsUsed makes sure the parity models' Split patterns hit a
// fast matcher (a changed pattern string would silently fall back to
// regexp2: correct, but slow).
func TestFastPathsUsed(t *testing.T) {
	t.Parallel()
	for _, model := range []string{"qwen3", "llama3_1", "deepseek_v3"} {
		tk := parityModel(t, model)
		var check func(p preTokenizer)
		check = func(p preTokenizer) {
			switch p := p.(type) {
			case sequencePre:
				for _, q := range p {
					check(q)
				}
			case splitPre:
				if p.fast == nil {
					t.Errorf("%s: Split %q has no fast matcher", model, p.re.String())
				}
			}
		}
		check(tk.pre)
	}
}
