package chat

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Python's notions of white space, line breaks and cased characters, and
// the str algorithms built on them. Every method, filter and lexer rule
// that Python defines by str.isspace() (or re's \s, the same set) uses
// isPySpace, so a character is white space everywhere or nowhere.

// isPySpace is Python's str.isspace() for one character: Go's
// unicode.IsSpace plus the information separators U+001C..U+001F, which
// Python counts (bidirectional class B or S) and Go does not.
func isPySpace(r rune) bool {
	if r < utf8.RuneSelf {
		return asciiSpace[r]
	}
	return unicode.IsSpace(r)
}

var asciiSpace = [utf8.RuneSelf]bool{'\t': true, '\n': true, '\v': true, '\f': true, '\r': true,
	0x1c: true, 0x1d: true, 0x1e: true, 0x1f: true, ' ': true}

// isPyLineBreak is a line boundary of Python's str.splitlines ("\r\n"
// counts as one, see pySplitLines).
func isPyLineBreak(r rune) bool {
	switch r {
	case '\n', '\r', '\v', '\f', 0x1c, 0x1d, 0x1e, 0x85, 0x2028, 0x2029:
		return true
	}
	return false
}

// isPyCased is Python's "cased" character (Lu, Ll, Lt and the other
// upper- and lowercase letters), which str.title uses for word boundaries.
func isPyCased(r rune) bool {
	return unicode.IsUpper(r) || unicode.IsLower(r) || unicode.IsTitle(r) ||
		unicode.In(r, unicode.Other_Lowercase, unicode.Other_Uppercase)
}

// pyStripSpace is str.strip() / lstrip() / rstrip() without arguments.
func pyStripSpace(s string, left, right bool) string {
	if left {
		s = strings.TrimLeftFunc(s, isPySpace)
	}
	if right {
		s = strings.TrimRightFunc(s, isPySpace)
	}
	return s
}

// pySplitSpace is str.split(None, maxsplit): runs of white space separate
// words; after maxsplit words (maxsplit < 0: no limit) the rest, from its
// first non-space character, is the last item, trailing white space and
// all.
func pySplitSpace(s string, maxsplit int64) []string {
	var out []string
	i := 0
	for maxsplit < 0 || int64(len(out)) < maxsplit {
		i = skipSpace(s, i)
		if i == len(s) {
			return out
		}
		j := skipWord(s, i)
		out = append(out, s[i:j])
		i = j
	}
	if i = skipSpace(s, i); i < len(s) {
		out = append(out, s[i:])
	}
	return out
}

// pyRSplitSpace is str.rsplit(None, maxsplit), pySplitSpace from the end.
func pyRSplitSpace(s string, maxsplit int64) []string {
	var out []string
	j := len(s)
	for maxsplit < 0 || int64(len(out)) < maxsplit {
		j = skipSpaceBack(s, j)
		if j == 0 {
			break
		}
		i := skipWordBack(s, j)
		out = append(out, s[i:j])
		j = i
	}
	if j = skipSpaceBack(s, j); j > 0 { // only when maxsplit ended the loop
		out = append(out, s[:j])
	}
	for a, b := 0, len(out)-1; a < b; a, b = a+1, b-1 {
		out[a], out[b] = out[b], out[a]
	}
	return out
}

func skipSpace(s string, i int) int {
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !isPySpace(r) {
			break
		}
		i += n
	}
	return i
}

func skipWord(s string, i int) int {
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if isPySpace(r) {
			break
		}
		i += n
	}
	return i
}

func skipSpaceBack(s string, j int) int {
	for j > 0 {
		r, n := utf8.DecodeLastRuneInString(s[:j])
		if !isPySpace(r) {
			break
		}
		j -= n
	}
	return j
}

func skipWordBack(s string, j int) int {
	for j > 0 {
		r, n := utf8.DecodeLastRuneInString(s[:j])
		if isPySpace(r) {
			break
		}
		j -= n
	}
	return j
}

// pySplitLines is str.splitlines(keepends).
func pySplitLines(s string, keepends bool) []string {
	var out []string
	for i := 0; i < len(s); {
		start := i
		var r rune
		n := 0
		for i < len(s) {
			r, n = utf8.DecodeRuneInString(s[i:])
			if isPyLineBreak(r) {
				break
			}
			i += n
		}
		eol := i
		if i < len(s) {
			i += n
			if r == '\r' && i < len(s) && s[i] == '\n' {
				i++
			}
			if keepends {
				eol = i
			}
		}
		out = append(out, s[start:eol])
	}
	return out
}

// pyCenter is str.center(width): Python puts the odd space on the left
// when the width is odd as well.
func pyCenter(s string, width int) string {
	marg := width - utf8.RuneCountInString(s)
	if marg <= 0 {
		return s
	}
	left := marg/2 + (marg & width & 1)
	return strings.Repeat(" ", left) + s + strings.Repeat(" ", marg-left)
}

// pyTitle is str.title(): a character after a cased one is lowercased,
// any other is titlecased.
func pyTitle(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	prevCased := false
	for _, r := range s {
		if prevCased {
			b.WriteRune(unicode.ToLower(r))
		} else {
			b.WriteRune(unicode.ToTitle(r))
		}
		prevCased = isPyCased(r)
	}
	return b.String()
}

// jinjaTitle is Jinja's title filter: words start after white space and
// -({[< (unlike str.title, "it's" stays "It's").
func jinjaTitle(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	start := true
	for _, r := range s {
		if isPySpace(r) || strings.ContainsRune("-({[<", r) {
			b.WriteRune(r)
			start = true
			continue
		}
		if start {
			b.WriteRune(unicode.ToUpper(r))
		} else {
			b.WriteRune(unicode.ToLower(r))
		}
		start = false
	}
	return b.String()
}

// jinjaIndent is Jinja's indent filter: str.splitlines boundaries (each
// becomes "\n"), the first line and empty lines left alone unless first
// and blank say otherwise.
func jinjaIndent(s, pad string, first, blank bool) (string, error) {
	lines := pySplitLines(s+"\n", false)
	if len(pad) > 0 && (maxOutput-len(s))/len(pad) < len(lines) {
		return "", errValueTooLarge()
	}
	var b strings.Builder
	if first {
		b.WriteString(pad)
	}
	for i, l := range lines {
		if i > 0 {
			b.WriteByte('\n')
			if blank || l != "" {
				b.WriteString(pad)
			}
		}
		b.WriteString(l)
	}
	return b.String(), nil
}

// joinChecked is strings.Join, refused before it allocates a result past
// the output limit.
func joinChecked(parts []string, sep string) (string, error) {
	total := len(sep) * max(0, len(parts)-1)
	for _, p := range parts {
		if total += len(p); total > maxOutput {
			return "", errValueTooLarge()
		}
	}
	if total > maxOutput {
		return "", errValueTooLarge()
	}
	return strings.Join(parts, sep), nil
}

// replaceChecked is strings.Replace (n < 0: every occurrence), refused
// before it allocates a result past the output limit.
func replaceChecked(s, old, repl string, n int) (string, error) {
	if len(repl) > len(old) {
		count := strings.Count(s, old)
		if n >= 0 && n < count {
			count = n
		}
		if grow := len(repl) - len(old); count > 0 && (maxOutput-len(s))/count < grow {
			return "", errValueTooLarge()
		}
	}
	return strings.Replace(s, old, repl, n), nil
}
