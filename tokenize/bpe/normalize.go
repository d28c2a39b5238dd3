package bpe

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites one piece of text (the text between added tokens).
type normalizer interface {
	normalize(s string) (string, error)
}

func parseNormalizer(raw json.RawMessage) (normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	typ, err := componentType(raw)
	if err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	switch typ {
	case "NFC":
		return unicodeNorm{norm.NFC}, nil
	case "NFD":
		return unicodeNorm{norm.NFD}, nil
	case "NFKC":
		return unicodeNorm{norm.NFKC}, nil
	case "NFKD":
		return unicodeNorm{norm.NFKD}, nil
	case "Lowercase":
		return lowercase{}, nil
	case "StripAccents":
		return stripAccents{}, nil
	case "Strip":
		var s struct {
			Left  bool `json:"strip_left"`
			Right bool `json:"strip_right"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("normalizer Strip: %w", err)
		}
		return strip{left: s.Left, right: s.Right}, nil
	case "Prepend":
		var p struct {
			Prepend string `json:"prepend"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("normalizer Prepend: %w", err)
		}
		return prepend{p.Prepend}, nil
	case "Replace":
		var r struct {
			Pattern patternJS `json:"pattern"`
			Content string    `json:"content"`
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			return nil, fmt.Errorf("normalizer Replace: %w", err)
		}
		re, err := compilePattern(r.Pattern)
		if err != nil {
			return nil, fmt.Errorf("normalizer Replace: %w", err)
		}
		return replace{re: re, content: r.Content}, nil
	case "Sequence":
		var s struct {
			Normalizers []json.RawMessage `json:"normalizers"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("normalizer Sequence: %w", err)
		}
		var seq sequenceNorm
		for i, n := range s.Normalizers {
			nn, err := parseNormalizer(n)
			if err != nil {
				return nil, fmt.Errorf("normalizer Sequence[%d]: %w", i, err)
			}
			if nn != nil {
				seq = append(seq, nn)
			}
		}
		if len(seq) == 0 {
			return nil, nil
		}
		return seq, nil
	}
	return nil, fmt.Errorf("unsupported normalizer type %q", typ)
}

type unicodeNorm struct{ f norm.Form }

func (u unicodeNorm) normalize(s string) (string, error) {
	// ASCII is its own form under all four; most prompts are, and this
	// test reads eight bytes at a time.
	if isASCII(s) || u.f.IsNormalString(s) {
		return s, nil
	}
	out := u.f.String(s)
	// x/text/unicode/norm follows the Stream-Safe Text Format and inserts
	// U+034F after 30 non-starters; HF (unicode-normalization) does not.
	// Those rare inputs take the exact, slower path.
	if strings.Count(out, "\u034F") > strings.Count(s, "\u034F") {
		return exactNormalize(u.f, s), nil
	}
	return out, nil
}

// exactNormalize implements UAX #15 directly — full decomposition,
// canonical ordering of whole non-starter runs, canonical composition —
// using x/text only per rune and per pair, where no stream-safe limit
// applies.
func exactNormalize(f norm.Form, s string) string {
	decomp, compose := norm.NFD, false
	switch f {
	case norm.NFC:
		compose = true
	case norm.NFKC:
		decomp, compose = norm.NFKD, true
	case norm.NFKD:
		decomp = norm.NFKD
	}
	var rs []rune
	for _, r := range s {
		rs = append(rs, []rune(decomp.String(string(r)))...)
	}
	ccc := func(r rune) uint8 { return norm.NFD.PropertiesString(string(r)).CCC() }
	// Canonical ordering: stable sort of every run of non-starters.
	for i := 0; i < len(rs); {
		if ccc(rs[i]) == 0 {
			i++
			continue
		}
		j := i
		for j < len(rs) && ccc(rs[j]) != 0 {
			j++
		}
		run := rs[i:j]
		slices.SortStableFunc(run, func(a, b rune) int { return int(ccc(a)) - int(ccc(b)) })
		i = j
	}
	if !compose {
		return string(rs)
	}
	// Canonical composition: a character joins the last starter when no
	// character between them blocks it.
	out := make([]rune, 0, len(rs))
	starter := -1
	var lastCCC uint8
	for _, r := range rs {
		c := ccc(r)
		if starter >= 0 && (lastCCC < c || (lastCCC == 0 && len(out)-1 == starter)) {
			if p := []rune(norm.NFC.String(string([]rune{out[starter], r}))); len(p) == 1 {
				out[starter] = p[0]
				continue
			}
		}
		if c == 0 {
			starter = len(out)
			lastCCC = 0
		} else {
			lastCCC = c
		}
		out = append(out, r)
	}
	return string(out)
}

// lowercase follows Rust's str::to_lowercase, which uses full case mappings
// (İ → i̇) and the final-sigma rule; Go's simple mappings differ there.
type lowercase struct{}

func (lowercase) normalize(s string) (string, error) {
	if !strings.ContainsFunc(s, func(r rune) bool { return r == 'İ' || r == 'Σ' }) {
		return strings.ToLower(s), nil
	}
	rs := []rune(s)
	var b strings.Builder
	for i, r := range rs {
		switch r {
		case 'İ':
			b.WriteString("i\u0307")
		case 'Σ':
			if finalSigma(rs, i) {
				b.WriteRune('ς')
			} else {
				b.WriteRune('σ')
			}
		default:
			b.WriteRune(unicode.ToLower(r))
		}
	}
	return b.String(), nil
}

// finalSigma is Unicode's Final_Sigma condition: preceded by a cased letter
// (skipping case-ignorable) and not followed by one.
func finalSigma(rs []rune, i int) bool {
	before := false
	for j := i - 1; j >= 0; j-- {
		if caseIgnorable(rs[j]) {
			continue
		}
		before = isCased(rs[j])
		break
	}
	if !before {
		return false
	}
	for j := i + 1; j < len(rs); j++ {
		if caseIgnorable(rs[j]) {
			continue
		}
		return !isCased(rs[j])
	}
	return true
}

func isCased(r rune) bool {
	return unicode.IsUpper(r) || unicode.IsLower(r) || unicode.IsTitle(r)
}

func caseIgnorable(r rune) bool {
	return unicode.In(r, unicode.Mn, unicode.Me, unicode.Cf, unicode.Lm, unicode.Sk) ||
		r == '\'' || r == '.' || r == ':' || r == '·' || r == '\u2019'
}

type stripAccents struct{}

func (stripAccents) normalize(s string) (string, error) {
	return strings.Map(func(r rune) rune {
		if unicode.Is(unicode.Mn, r) {
			return -1
		}
		return r
	}, s), nil
}

type strip struct{ left, right bool }

func (st strip) normalize(s string) (string, error) {
	if st.left {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
	}
	if st.right {
		s = strings.TrimRightFunc(s, unicode.IsSpace)
	}
	return s, nil
}

type prepend struct{ p string }

func (p prepend) normalize(s string) (string, error) {
	if s == "" {
		return s, nil
	}
	return p.p + s, nil
}

type replace struct {
	re      *regexp2.Regexp
	content string
}

func (r replace) normalize(s string) (string, error) {
	ms, err := findAll(r.re, s)
	if err != nil || len(ms) == 0 {
		return s, err
	}
	var b strings.Builder
	last := 0
	for _, m := range ms {
		b.WriteString(s[last:m[0]])
		b.WriteString(r.content)
		last = m[1]
	}
	b.WriteString(s[last:])
	return b.String(), nil
}

type sequenceNorm []normalizer

func (q sequenceNorm) normalize(s string) (string, error) {
	for _, n := range q {
		var err error
		if s, err = n.normalize(s); err != nil {
			return "", err
		}
	}
	return s, nil
}

// isASCII reports whether s has no byte above 0x7F.
func isASCII(s string) bool {
	i := 0
	for ; i+8 <= len(s); i += 8 {
		w := s[i : i+8]
		if (w[0]|w[1]|w[2]|w[3]|w[4]|w[5]|w[6]|w[7])&0x80 != 0 {
			return false
		}
	}
	for ; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}
