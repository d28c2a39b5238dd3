package bpe

import (
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// regexTimeout bounds one regex search. HuggingFace patterns are linear in
// practice; the bound turns a pathological pattern in a user's
// tokenizer.json into an error instead of a hung request.
const regexTimeout = 30 * time.Second

// compilePattern compiles a tokenizer.json {"String"|"Regex"} pattern. The
// default (non-RE2) regexp2 mode matches Oniguruma's Unicode classes and
// supports the lookahead HF patterns use.
func compilePattern(p patternJS) (*regexp2.Regexp, error) {
	var src string
	switch {
	case p.Regex != nil:
		src = *p.Regex
	case p.String != nil:
		src = regexp2.Escape(*p.String)
	default:
		return nil, fmt.Errorf("pattern has neither String nor Regex")
	}
	re, err := regexp2.Compile(src, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("compile pattern %q: %w", src, err)
	}
	re.MatchTimeout = regexTimeout
	return re, nil
}

// findAll returns the byte offsets [start, end) of the successive
// non-overlapping matches of re in s, like Oniguruma's find_iter.
func findAll(re *regexp2.Regexp, s string) ([][2]int, error) {
	if s == "" {
		return nil, nil
	}
	runes := []rune(s)
	// byteAt[i] is the byte offset of rune i; s is valid UTF-8, so this is
	// exact.
	var byteAt []int
	ascii := len(runes) == len(s)
	if !ascii {
		byteAt = make([]int, len(runes)+1)
		off := 0
		for i, r := range runes {
			byteAt[i] = off
			off += utf8.RuneLen(r)
		}
		byteAt[len(runes)] = off
	}
	conv := func(i int) int {
		if ascii {
			return i
		}
		return byteAt[i]
	}
	var out [][2]int
	m, err := re.FindRunesMatch(runes)
	for err == nil && m != nil {
		out = append(out, [2]int{conv(m.Index), conv(m.Index + m.Length)})
		m, err = re.FindNextMatch(m)
	}
	if err != nil {
		return nil, fmt.Errorf("regex %q: %w", re.String(), err)
	}
	return out, nil
}
