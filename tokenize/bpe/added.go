package bpe

import (
	"unicode"
	"unicode/utf8"
)

// addedToken is an entry of tokenizer.json's added_tokens.
type addedToken struct {
	id         uint32
	content    string
	singleWord bool
	lstrip     bool
	rstrip     bool
	normalized bool
	special    bool
}

// matcher finds added tokens leftmost-longest (HF uses Aho-Corasick with
// MatchKind::LeftmostLongest). A byte trie is enough: added tokens are few
// and a first-byte filter skips almost every position.
type matcher struct {
	root     *trieNode
	firstSet [256]bool
	tokens   []*addedToken
}

type trieNode struct {
	next map[byte]*trieNode
	tok  int // index into tokens, -1 if no token ends here
}

func newMatcher(pats []string, toks []*addedToken) *matcher {
	m := &matcher{root: &trieNode{tok: -1}, tokens: toks}
	for i, p := range pats {
		if p == "" {
			continue
		}
		n := m.root
		for j := 0; j < len(p); j++ {
			if n.next == nil {
				n.next = map[byte]*trieNode{}
			}
			c, ok := n.next[p[j]]
			if !ok {
				c = &trieNode{tok: -1}
				n.next[p[j]] = c
			}
			n = c
		}
		if n.tok < 0 {
			n.tok = i
		}
		m.firstSet[p[0]] = true
	}
	return m
}

func (m *matcher) empty() bool { return m.root.next == nil }

// longestAt returns the longest token starting at s[i:], or -1.
func (m *matcher) longestAt(s string, i int) (tok, end int) {
	tok, end = -1, i
	n := m.root
	for j := i; j < len(s); j++ {
		n = n.next[s[j]]
		if n == nil {
			break
		}
		if n.tok >= 0 {
			tok, end = n.tok, j+1
		}
		if n.next == nil {
			break
		}
	}
	return tok, end
}

// segment is a span of text that is either an added token (tok != nil) or
// text to encode.
type segment struct {
	start, end int
	tok        *addedToken
}

// find splits s around added-token matches like HF's
// AddedVocabulary::find_matches, including single_word, lstrip and rstrip.
func (m *matcher) find(s string, dst []segment) []segment {
	if m.empty() || s == "" {
		return append(dst, segment{0, len(s), nil})
	}
	startOffset := 0
	for i := 0; i < len(s); {
		if !m.firstSet[s[i]] {
			i++
			continue
		}
		ti, stop := m.longestAt(s, i)
		if ti < 0 {
			i++
			continue
		}
		t := m.tokens[ti]
		start := i
		// A rejected candidate is skipped whole, as Aho-Corasick's
		// non-overlapping iterator does.
		i = stop
		if t.singleWord {
			startSpace := start == 0 || !endsWithWord(s[:start])
			stopSpace := stop == len(s) || !startsWithWord(s[stop:])
			if !startSpace || !stopSpace {
				continue
			}
		}
		if t.lstrip {
			start = max(spaceLeftmostAtEnd(s[:start]), startOffset)
		}
		if t.rstrip {
			stop += spaceRightmostAtStart(s[stop:])
			i = stop
		}
		if startOffset < start {
			dst = append(dst, segment{startOffset, start, nil})
		}
		dst = append(dst, segment{start, stop, t})
		startOffset = stop
	}
	if startOffset != len(s) {
		dst = append(dst, segment{startOffset, len(s), nil})
	}
	return dst
}

func isWordChar(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsNumber(r) || r == '_'
}

func endsWithWord(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return s != "" && isWordChar(r)
}

func startsWithWord(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return s != "" && isWordChar(r)
}

// spaceLeftmostAtEnd is the offset where s's trailing whitespace starts.
func spaceLeftmostAtEnd(s string) int {
	i := len(s)
	for i > 0 {
		r, size := utf8.DecodeLastRuneInString(s[:i])
		if !unicode.IsSpace(r) {
			break
		}
		i -= size
	}
	return i
}

// spaceRightmostAtStart is the length of s's leading whitespace.
func spaceRightmostAtStart(s string) int {
	i := 0
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		if !unicode.IsSpace(r) {
			break
		}
		i += size
	}
	return i
}
