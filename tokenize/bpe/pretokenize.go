package bpe

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/dlclark/regexp2"
)

// piece is one split of the text on its way to the model. first marks the
// split that starts at offset 0 of the original text (Metaspace
// prepend_scheme "first" prepends only there).
type piece struct {
	s     string
	first bool
}

// preTokenizer refines splits. Like HF's PreTokenizedString.split, every
// pre-tokenizer maps each split to sub-splits and empty splits vanish.
type preTokenizer interface {
	split(in []piece) ([]piece, error)
}

func parsePreTokenizer(raw json.RawMessage) (preTokenizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	typ, err := componentType(raw)
	if err != nil {
		return nil, fmt.Errorf("pre_tokenizer: %w", err)
	}
	switch typ {
	case "Sequence":
		var s struct {
			PreTokenizers []json.RawMessage `json:"pretokenizers"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("pre_tokenizer Sequence: %w", err)
		}
		var seq sequencePre
		for i, p := range s.PreTokenizers {
			pp, err := parsePreTokenizer(p)
			if err != nil {
				return nil, fmt.Errorf("pre_tokenizer Sequence[%d]: %w", i, err)
			}
			if pp != nil {
				seq = append(seq, pp)
			}
		}
		return seq, nil
	case "Split":
		var s struct {
			Pattern  patternJS `json:"pattern"`
			Behavior string    `json:"behavior"`
			Invert   bool      `json:"invert"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("pre_tokenizer Split: %w", err)
		}
		re, err := compilePattern(s.Pattern)
		if err != nil {
			return nil, fmt.Errorf("pre_tokenizer Split: %w", err)
		}
		b, err := parseBehavior(s.Behavior)
		if err != nil {
			return nil, fmt.Errorf("pre_tokenizer Split: %w", err)
		}
		sp := splitPre{re: re, behavior: b, invert: s.Invert}
		if s.Pattern.Regex != nil {
			if f, ok := fastPatterns[*s.Pattern.Regex]; ok {
				sp.fast = &f
			}
		}
		return sp, nil
	case "ByteLevel":
		var s struct {
			AddPrefixSpace bool  `json:"add_prefix_space"`
			UseRegex       *bool `json:"use_regex"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("pre_tokenizer ByteLevel: %w", err)
		}
		bl := byteLevelPre{addPrefixSpace: s.AddPrefixSpace}
		if s.UseRegex == nil || *s.UseRegex {
			bl.re = regexp2.MustCompile(gpt2Pattern, regexp2.None)
			bl.re.MatchTimeout = regexTimeout
		}
		return bl, nil
	case "Metaspace":
		var s struct {
			Replacement    string `json:"replacement"`
			PrependScheme  string `json:"prepend_scheme"`
			AddPrefixSpace *bool  `json:"add_prefix_space"`
			Split          *bool  `json:"split"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("pre_tokenizer Metaspace: %w", err)
		}
		m, err := newMetaspace(s.Replacement, s.PrependScheme, s.AddPrefixSpace)
		if err != nil {
			return nil, fmt.Errorf("pre_tokenizer Metaspace: %w", err)
		}
		m.splitWords = s.Split == nil || *s.Split
		return m, nil
	}
	return nil, fmt.Errorf("unsupported pre_tokenizer type %q", typ)
}

// gpt2Pattern is the regex HF's ByteLevel pre-tokenizer uses with
// use_regex=true.
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

type sequencePre []preTokenizer

func (q sequencePre) split(in []piece) ([]piece, error) {
	var err error
	for _, p := range q {
		if in, err = p.split(in); err != nil {
			return nil, err
		}
	}
	return in, nil
}

type behavior int

const (
	behRemoved behavior = iota
	behIsolated
	behMergedWithPrevious
	behMergedWithNext
	behContiguous
)

func parseBehavior(s string) (behavior, error) {
	switch s {
	case "Removed":
		return behRemoved, nil
	case "Isolated":
		return behIsolated, nil
	case "MergedWithPrevious":
		return behMergedWithPrevious, nil
	case "MergedWithNext":
		return behMergedWithNext, nil
	case "Contiguous":
		return behContiguous, nil
	}
	return 0, fmt.Errorf("unsupported split behavior %q", s)
}

type splitPre struct {
	re       *regexp2.Regexp
	fast     *fastSplit // same matches as re, faster; nil when unknown
	behavior behavior
	invert   bool
}

type span struct {
	start, end int
	match      bool
}

func (sp splitPre) split(in []piece) ([]piece, error) {
	out := make([]piece, 0, len(in)*4)
	for _, p := range in {
		var ms [][2]int
		if sp.fast != nil {
			ms = sp.fast.find(p.s)
		} else {
			var err error
			if ms, err = findAll(sp.re, p.s); err != nil {
				return nil, err
			}
		}
		out = appendSplits(out, p, splitSpans(ms, len(p.s), sp.invert), sp.behavior)
	}
	return out, nil
}

// splitSpans covers [0, n) with matched and unmatched spans, like HF's
// Pattern::find_matches (empty matches included, dropped later).
func splitSpans(ms [][2]int, n int, invert bool) []span {
	spans := make([]span, 0, 2*len(ms)+1)
	prev := 0
	for _, m := range ms {
		if prev != m[0] {
			spans = append(spans, span{prev, m[0], invert})
		}
		spans = append(spans, span{m[0], m[1], !invert})
		prev = m[1]
	}
	if prev != n {
		spans = append(spans, span{prev, n, invert})
	}
	return spans
}

// appendSplits applies a split behaviour exactly as HF's
// NormalizedString::split does.
func appendSplits(out []piece, p piece, spans []span, b behavior) []piece {
	var merged []span
	switch b {
	case behIsolated:
		merged = spans
	case behRemoved:
		for _, s := range spans {
			if !s.match {
				merged = append(merged, s)
			}
		}
	case behContiguous:
		prevMatch := false
		for _, s := range spans {
			if s.match == prevMatch && len(merged) > 0 {
				merged[len(merged)-1].end = s.end
			} else {
				merged = append(merged, s)
			}
			prevMatch = s.match
		}
	case behMergedWithPrevious:
		prevMatch := false
		for _, s := range spans {
			if s.match && !prevMatch && len(merged) > 0 {
				merged[len(merged)-1].end = s.end
			} else {
				merged = append(merged, s)
			}
			prevMatch = s.match
		}
	case behMergedWithNext:
		prevMatch := false
		for i := len(spans) - 1; i >= 0; i-- {
			s := spans[i]
			if s.match && !prevMatch && len(merged) > 0 {
				merged[len(merged)-1].start = s.start
			} else {
				merged = append(merged, s)
			}
			prevMatch = s.match
		}
		for i, j := 0, len(merged)-1; i < j; i, j = i+1, j-1 {
			merged[i], merged[j] = merged[j], merged[i]
		}
	}
	for _, s := range merged {
		if s.start == s.end {
			continue
		}
		out = append(out, piece{s: p.s[s.start:s.end], first: p.first && s.start == 0})
	}
	return out
}

// byteLevelPre maps every byte to its printable stand-in (GPT-2's
// bytes_to_unicode), after the optional prefix space and GPT-2 regex split.
type byteLevelPre struct {
	addPrefixSpace bool
	re             *regexp2.Regexp // nil: use_regex false
}

func (bl byteLevelPre) split(in []piece) ([]piece, error) {
	out := make([]piece, 0, len(in))
	for _, p := range in {
		if bl.addPrefixSpace && !strings.HasPrefix(p.s, " ") {
			p.s = " " + p.s
		}
		subs := []piece{p}
		if bl.re != nil {
			ms := fastPatterns[gpt2Pattern].find(p.s)
			subs = appendSplits(nil, p, splitSpans(ms, len(p.s), false), behIsolated)
		}
		for _, s := range subs {
			out = append(out, piece{s: byteLevelString(s.s), first: s.first})
		}
	}
	return out, nil
}

var byteToRune, runeToByte = byteLevelTables()

// byteLevelTables builds GPT-2's reversible byte ↔ printable-rune map.
func byteLevelTables() ([256]rune, map[rune]byte) {
	var b2r [256]rune
	r2b := make(map[rune]byte, 256)
	n := 0
	for b := 0; b < 256; b++ {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		if printable {
			b2r[b] = rune(b)
		} else {
			b2r[b] = rune(256 + n)
			n++
		}
		r2b[b2r[b]] = byte(b)
	}
	return b2r, r2b
}

func byteLevelString(s string) string {
	var b strings.Builder
	b.Grow(len(s) * 2)
	for i := 0; i < len(s); i++ {
		b.WriteRune(byteToRune[s[i]])
	}
	return b.String()
}

type metaspace struct {
	replacement string
	scheme      string // always, first, never
	splitWords  bool
}

func newMetaspace(replacement, scheme string, addPrefixSpace *bool) (*metaspace, error) {
	if replacement == "" {
		replacement = "▁"
	}
	switch scheme {
	case "always", "first", "never":
	case "":
		// Older files carry add_prefix_space instead of prepend_scheme.
		scheme = "always"
		if addPrefixSpace != nil && !*addPrefixSpace {
			scheme = "never"
		}
	default:
		return nil, fmt.Errorf("unsupported prepend_scheme %q", scheme)
	}
	return &metaspace{replacement: replacement, scheme: scheme}, nil
}

func (m *metaspace) split(in []piece) ([]piece, error) {
	out := make([]piece, 0, len(in))
	for _, p := range in {
		s := strings.ReplaceAll(p.s, " ", m.replacement)
		if !strings.HasPrefix(s, m.replacement) && (m.scheme == "always" || (m.scheme == "first" && p.first)) {
			s = m.replacement + s
		}
		if !m.splitWords {
			if s != "" {
				out = append(out, piece{s: s, first: p.first})
			}
			continue
		}
		// MergedWithNext on the replacement: each ▁ starts a new split.
		start := 0
		for i := 1; i < len(s); i++ {
			if strings.HasPrefix(s[i:], m.replacement) {
				out = append(out, piece{s: s[start:i], first: p.first && start == 0})
				start = i
				i += len(m.replacement) - 1
			}
		}
		if start < len(s) {
			out = append(out, piece{s: s[start:], first: p.first && start == 0})
		}
	}
	return out, nil
}
