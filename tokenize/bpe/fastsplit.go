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

// class is a character class of the patterns: f decides any rune, and
// ascii caches f over ASCII, where almost every byte of English text falls,
// so the span loops below test a table instead of calling f.
type class struct {
	ascii [utf8.RuneSelf]bool
	f     func(rune) bool
}

func newClass(f func(rune) bool) *class {
	c := &class{f: f}
	for r := range rune(utf8.RuneSelf) {
		c.ascii[r] = f(r)
	}
	return c
}

// The character classes as regexp2 defines them: \p{..} from Go's unicode
// tables, \s as unicode.IsSpace.
func isL(r rune) bool  { return unicode.IsLetter(r) }
func isN(r rune) bool  { return unicode.IsNumber(r) }
func isWS(r rune) bool { return unicode.IsSpace(r) }

// isOther is [^\s\p{L}\p{N}].
func isOther(r rune) bool { return !isWS(r) && !isL(r) && !isN(r) }

var (
	classL       = newClass(isL)
	classN       = newClass(isN)
	classWS      = newClass(isWS)
	classOther   = newClass(isOther)
	classNewline = newClass(func(r rune) bool { return r == '\r' || r == '\n' })
	classCJK     = newClass(isDeepSeekCJK)
	classASCIIL  = newClass(isASCIILetter)
	classPS      = newClass(isPS)
	classLM      = newClass(isLM)
	gpt2Classes  = [...]*class{classL, classN, classOther}
)

func at(s string, i int) (rune, int) {
	if i >= len(s) {
		return -1, 0
	}
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// spanLetters is spanWhile(s, i, classL, 0)'s end, the span nearly every
// English word is: its loop reads one table per byte, with no limit and no
// class pointer to follow.
func spanLetters(s string, i int) int {
	for i < len(s) {
		b := s[i]
		if b < utf8.RuneSelf {
			if !asciiLetters[b] {
				return i
			}
			i++
			continue
		}
		r, w := utf8.DecodeRuneInString(s[i:])
		if !isL(r) {
			return i
		}
		i += w
	}
	return i
}

var asciiLetters = classL.ascii

// spanWhile consumes runes of class c from i and returns the end offset and
// the number of runes taken (at most limit when limit > 0).
func spanWhile(s string, i int, c *class, limit int) (int, int) {
	n := 0
	for i < len(s) && (limit <= 0 || n < limit) {
		if b := s[i]; b < utf8.RuneSelf {
			if !c.ascii[b] {
				break
			}
			i++
			n++
			continue
		}
		r, w := utf8.DecodeRuneInString(s[i:])
		if !c.f(r) {
			break
		}
		i += w
		n++
	}
	return i, n
}

func (f fastSplit) find(s string) [][2]int {
	out := make([][2]int, 0, len(s)/4+1)
	for i := 0; ; {
		start, end := f.next(s, i)
		if start == len(s) {
			return out
		}
		out = append(out, [2]int{start, end})
		i = end
	}
}

// next returns the first match at or after i, or (len(s), len(s)) when
// there is none. Every match is non-empty.
func (f *fastSplit) next(s string, i int) (start, end int) {
	for i < len(s) {
		if i = f.skip(s, i); i == len(s) {
			break
		}
		if e := f.matchAt(s, i); e > i {
			return i, e
		}
		// No match here: a rune in none of the pattern's classes.
		_, w := at(s, i)
		i += w
	}
	return len(s), len(s)
}

// skip returns the first offset from i where a match can start. The
// patterns that match only digits or only CJK match nothing in most of an
// English text, so their ASCII stretches are passed over a byte at a time.
func (f *fastSplit) skip(s string, i int) int {
	var c *class
	switch f.kind {
	case kindDigits3:
		c = classN
	case kindCJK:
		c = classCJK
	default:
		return i
	}
	for i < len(s) && s[i] < utf8.RuneSelf && !c.ascii[s[i]] {
		i++
	}
	return i
}

func (f fastSplit) matchAt(s string, i int) int {
	if f.kind == kindCL100k && i+1 < len(s) {
		// Most of English text, decided on two ASCII bytes: a word, or a
		// word after one space or punctuation byte (the apostrophe's
		// contractions take the full path below).
		c0, c1 := s[i], s[i+1]
		if c0 < utf8.RuneSelf && c1 < utf8.RuneSelf && c0 != '\'' {
			if asciiLetters[c0] {
				return spanLetters(s, i+1)
			}
			if c0 != '\r' && c0 != '\n' && !classN.ascii[c0] && asciiLetters[c1] {
				return spanLetters(s, i+2)
			}
		}
	}
	r0, w0 := at(s, i)
	r1, w1 := at(s, i+w0)
	switch f.kind {
	case kindGPT2:
		return f.matchGPT2(s, i, r0, w0, r1)
	case kindDigits3:
		e, _ := spanWhile(s, i, classN, 3)
		return e
	case kindCJK:
		e, _ := spanWhile(s, i, classCJK, 0)
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
		e, _ := spanWhile(s, i+w0, classL, 0)
		return e
	}
	if isL(r0) {
		e, _ := spanWhile(s, i, classL, 0)
		return e
	}
	// \p{N}{1,3} or \p{N}
	if isN(r0) {
		e, _ := spanWhile(s, i, classN, f.maxDigits)
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
		e, _ := spanWhile(s, start, classOther, 0)
		e, _ = spanWhile(s, e, classNewline, 0)
		return e
	}
	return wsMatch(s, i, true)
}

// wsMatch covers \s*[\r\n]+ (when withNewline), \s+(?!\S) and \s+ at i.
func wsMatch(s string, i int, withNewline bool) int {
	end, n := spanWhile(s, i, classWS, 0)
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
	for _, c := range gpt2Classes {
		if r0 == ' ' && r1 >= 0 && c.f(r1) {
			e, _ := spanWhile(s, i+w0, c, 0)
			return e
		}
		if c.f(r0) {
			e, _ := spanWhile(s, i, c, 0)
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
		e, _ := spanWhile(s, i+w0, classASCIIL, 0)
		return e
	}
	if r0 != '\r' && r0 != '\n' && !unicode.IsLetter(r0) && !isPS(r0) && r1 >= 0 && isLM(r1) {
		e, _ := spanWhile(s, i+w0, classLM, 0)
		return e
	}
	if isLM(r0) {
		e, _ := spanWhile(s, i, classLM, 0)
		return e
	}
	start := -1
	if r0 == ' ' && r1 >= 0 && isPS(r1) {
		start = i + w0
	} else if isPS(r0) {
		start = i
	}
	if start >= 0 {
		e, _ := spanWhile(s, start, classPS, 0)
		e, _ = spanWhile(s, e, classNewline, 0)
		return e
	}
	return wsMatch(s, i, true)
}
