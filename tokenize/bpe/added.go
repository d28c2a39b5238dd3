package bpe

import (
	"strings"
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
	// only is the single first byte of every token when there is one (as
	// with "<|...|>" specials), so scanning can jump with IndexByte.
	only    byte
	hasOnly bool
}

// trieNode children are a small sorted-by-insertion list: fan-out is tiny
// past the first byte, and a slice scan beats a map lookup there.
type trieNode struct {
	keys []byte
	next []*trieNode
	tok  int // index into tokens, -1 if no token ends here
}

func (n *trieNode) child(b byte) *trieNode {
	for i, k := range n.keys {
		if k == b {
			return n.next[i]
		}
	}
	return nil
}

func newMatcher(pats []string, toks []*addedToken) *matcher {
	m := &matcher{root: &trieNode{tok: -1}, tokens: toks}
	for i, p := range pats {
		if p == "" {
			continue
		}
		n := m.root
		for j := 0; j < len(p); j++ {
			c := n.child(p[j])
			if c == nil {
				c = &trieNode{tok: -1}
				n.keys = append(n.keys, p[j])
				n.next = append(n.next, c)
			}
			n = c
		}
		if n.tok < 0 {
			n.tok = i
		}
		m.firstSet[p[0]] = true
	}
	n := 0
	for b, ok := range m.firstSet {
		if ok {
			n++
			m.only = byte(b)
		}
	}
	m.hasOnly = n == 1
	return m
}

func (m *matcher) empty() bool { return len(m.root.keys) == 0 }

// longestAt returns the longest token starting at s[i:], or -1.
func (m *matcher) longestAt(s string, i int) (tok, end int) {
	tok, end = -1, i
	n := m.root
	for j := i; j < len(s); j++ {
		n = n.child(s[j])
		if n == nil {
			break
		}
		if n.tok >= 0 {
			tok, end = n.tok, j+1
		}
		if len(n.keys) == 0 {
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
		if m.hasOnly {
			j := strings.IndexByte(s[i:], m.only)
			if j < 0 {
				break
			}
			i += j
		} else if !m.firstSet[s[i]] {
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
