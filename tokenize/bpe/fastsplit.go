package bpe

import (
	"unicode"
	"unicode/utf8"
)

// fastSplit is a hand-written matcher for the pre-tokenizer regexes almost
// every BPE model ships (GPT-2's, and the cl100k family of Llama-3 and
// Qwen). It returns exactly the matches regexp2 finds for them — the
// FuzzFastSplit target checks that on arbitrary text — at a fraction of the
// cost: regexp2 was ~90% of encode time on long English text.
type fastSplit struct {
	kind      fastKind
	maxDigits int // cl100k: \p{N}{1,3} (3) or \p{N} (1)
}

type fastKind int

const (
	kindCL100k   fastKind = iota // Llama-3, Qwen
	kindGPT2                     // ByteLevel use_regex
	kindDigits3                  // \p{N}{1,3} alone (DeepSeek-V3 step 1)
	kindCJK                      // DeepSeek-V3 step 2
	kindDeepSeek                 // DeepSeek-V3 step 3
)

// Patterns with a fast matcher, by exact source.
var fastPatterns = map[string]fastSplit{
	gpt2Pattern:    {kind: kindGPT2},
	`\p{N}{1,3}`:   {kind: kindDigits3},
	"[一-龥぀-ゟ゠-ヿ]+": {kind: kindCJK},
	"[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+": {kind: kindDeepSeek},
	`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`:                                   {maxDigits: 3},
	`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`:                                        {maxDigits: 1},
}

// The character classes as regexp2 defines them: \p{..} from Go's unicode
// tables, \s as unicode.IsSpace.
func isL(r rune) bool  { return unicode.IsLetter(r) }
func isN(r rune) bool  { return unicode.IsNumber(r) }
func isWS(r rune) bool { return unicode.IsSpace(r) }

// isOther is [^\s\p{L}\p{N}].
func isOther(r rune) bool { return !isWS(r) && !isL(r) && !isN(r) }

func at(s string, i int) (rune, int) {
	if i >= len(s) {
		return -1, 0
	}
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// spanWhile consumes runes satisfying f from i and returns the end offset and
// the number of runes taken (at most limit when limit > 0).
func spanWhile(s string, i int, f func(rune) bool, limit int) (int, int) {
	n := 0
	for i < len(s) && (limit <= 0 || n < limit) {
		r, w := at(s, i)
		if !f(r) {
			break
		}
		i += w
		n++
	}
	return i, n
}

func (f fastSplit) find(s string) [][2]int {
	out := make([][2]int, 0, len(s)/4+1)
	for i := 0; i < len(s); {
		e := f.matchAt(s, i)
		if e <= i {
			// Unreachable for these patterns (every rune is a letter, number,
			// space or other), kept so a bad guess cannot loop.
			_, w := at(s, i)
			i += w
			continue
		}
		out = append(out, [2]int{i, e})
		i = e
	}
	return out
}

func (f fastSplit) matchAt(s string, i int) int {
	r0, w0 := at(s, i)
	r1, w1 := at(s, i+w0)
	switch f.kind {
	case kindGPT2:
		return f.matchGPT2(s, i, r0, w0, r1)
	case kindDigits3:
		e, _ := spanWhile(s, i, isN, 3)
		return e
	case kindCJK:
		e, _ := spanWhile(s, i, isDeepSeekCJK, 0)
		return e
	case kindDeepSeek:
		return matchDeepSeek(s, i, r0, w0, r1)
	}
	// (?i:'s|'t|'re|'ve|'m|'ll|'d) — regexp2 compares unicode.ToLower.
	if r0 == '\'' && r1 >= 0 {
		switch unicode.ToLower(r1) {
		case 's', 't', 'm', 'd':
			return i + w0 + w1
		case 'r', 'v', 'l':
			r2, w2 := at(s, i+w0+w1)
			want := 'e'
			if unicode.ToLower(r1) == 'l' {
				want = 'l'
			}
			if r2 >= 0 && unicode.ToLower(r2) == want {
				return i + w0 + w1 + w2
			}
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if r0 != '\r' && r0 != '\n' && !isL(r0) && !isN(r0) && r1 >= 0 && isL(r1) {
		e, _ := spanWhile(s, i+w0, isL, 0)
		return e
	}
	if isL(r0) {
		e, _ := spanWhile(s, i, isL, 0)
		return e
	}
	// \p{N}{1,3} or \p{N}
	if isN(r0) {
		e, _ := spanWhile(s, i, isN, f.maxDigits)
		return e
	}
	// ' ?[^\s\p{L}\p{N}]+[\r\n]*'
	start := -1
	if r0 == ' ' && r1 >= 0 && isOther(r1) {
		start = i + w0
	} else if isOther(r0) {
		start = i
	}
	if start >= 0 {
		e, _ := spanWhile(s, start, isOther, 0)
		e, _ = spanWhile(s, e, func(r rune) bool { return r == '\r' || r == '\n' }, 0)
		return e
	}
	return wsMatch(s, i, true)
}

// wsMatch covers \s*[\r\n]+ (when withNewline), \s+(?!\S) and \s+ at i.
func wsMatch(s string, i int, withNewline bool) int {
	end, n := spanWhile(s, i, isWS, 0)
	if n == 0 {
		return i
	}
	if withNewline {
		// Greedy \s* backs off to the last \r or \n of the run.
		for j := end - 1; j >= i; j-- {
			if s[j] == '\r' || s[j] == '\n' {
				return j + 1
			}
			if s[j] >= utf8.RuneSelf {
				// Skip to the start of this multi-byte rune.
				for j > i && !utf8.RuneStart(s[j]) {
					j--
				}
			}
		}
	}
	if end == len(s) || n == 1 {
		return end // \s+(?!\S) at the end of text, or plain \s+
	}
	_, w := utf8.DecodeLastRuneInString(s[:end])
	return end - w // \s+(?!\S): leave one space for the next word
}

// matchGPT2 is 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+.
func (f fastSplit) matchGPT2(s string, i int, r0 rune, w0 int, r1 rune) int {
	if r0 == '\'' && r1 >= 0 {
		w1 := utf8.RuneLen(r1)
		switch r1 {
		case 's', 't', 'm', 'd':
			return i + w0 + w1
		case 'r', 'v', 'l':
			r2, w2 := at(s, i+w0+w1)
			if (r1 == 'l' && r2 == 'l') || (r1 != 'l' && r2 == 'e') {
				return i + w0 + w1 + w2
			}
		}
	}
	for _, class := range []func(rune) bool{isL, isN, isOther} {
		if r0 == ' ' && r1 >= 0 && class(r1) {
			e, _ := spanWhile(s, i+w0, class, 0)
			return e
		}
		if class(r0) {
			e, _ := spanWhile(s, i, class, 0)
			return e
		}
	}
	return wsMatch(s, i, false)
}

// isDeepSeekCJK is [一-龥぀-ゟ゠-ヿ].
func isDeepSeekCJK(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FA5) || (r >= 0x3040 && r <= 0x309F) || (r >= 0x30A0 && r <= 0x30FF)
}

func isASCIIPunct(r rune) bool {
	return r < 0x80 && r > ' ' && r != 0x7F && !(r >= '0' && r <= '9') && !(r >= 'A' && r <= 'Z') && !(r >= 'a' && r <= 'z')
}

func isASCIILetter(r rune) bool { return (r >= 'A' && r <= 'Z') || (r >= 'a' && r <= 'z') }

func isPS(r rune) bool { return unicode.IsPunct(r) || unicode.IsSymbol(r) }

func isLM(r rune) bool { return unicode.IsLetter(r) || unicode.IsMark(r) }

// matchDeepSeek is DeepSeek-V3's third pattern:
// [ASCII punct][A-Za-z]+ | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ |
// ' ?[\p{P}\p{S}]+[\r\n]*' | \s*[\r\n]+ | \s+(?!\S) | \s+.
// Runes in none of these classes (digits, controls, format characters) do
// not match at all, exactly as with the regex.
func matchDeepSeek(s string, i int, r0 rune, w0 int, r1 rune) int {
	if isASCIIPunct(r0) && r1 >= 0 && isASCIILetter(r1) {
		e, _ := spanWhile(s, i+w0, isASCIILetter, 0)
		return e
	}
	if r0 != '\r' && r0 != '\n' && !unicode.IsLetter(r0) && !isPS(r0) && r1 >= 0 && isLM(r1) {
		e, _ := spanWhile(s, i+w0, isLM, 0)
		return e
	}
	if isLM(r0) {
		e, _ := spanWhile(s, i, isLM, 0)
		return e
	}
	start := -1
	if r0 == ' ' && r1 >= 0 && isPS(r1) {
		start = i + w0
	} else if isPS(r0) {
		start = i
	}
	if start >= 0 {
		e, _ := spanWhile(s, start, isPS, 0)
		e, _ = spanWhile(s, e, func(r rune) bool { return r == '\r' || r == '\n' }, 0)
		return e
	}
	return wsMatch(s, i, true)
}
