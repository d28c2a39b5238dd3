package chat

import (
	"slices"
	"testing"
)

// TestPySpaceIsPythons compares isPySpace with the characters for which
// Python 3.11's str.isspace() is true:
// [c for c in map(chr, range(0x110000)) if c.isspace()].
func TestPySpaceIsPythons(t *testing.T) {
	python := []rune{0x9, 0xa, 0xb, 0xc, 0xd, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x85, 0xa0, 0x1680,
		0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a,
		0x2028, 0x2029, 0x202f, 0x205f, 0x3000}
	var got []rune
	for r := rune(0); r <= 0x10ffff; r++ {
		if isPySpace(r) {
			got = append(got, r)
		}
	}
	if !slices.Equal(got, python) {
		t.Fatalf("isPySpace is true for %U,\nPython's str.isspace() for %U", got, python)
	}
}

// Expected values are Python 3.11's.
func TestPyStrAlgorithms(t *testing.T) {
	split := []struct {
		s        string
		maxsplit int64
		split    []string
		rsplit   []string
	}{
		{"", -1, nil, nil},
		{" \x1c ", -1, nil, nil},
		{" \x1c ", 0, nil, nil},
		{"  a  b  c  ", -1, []string{"a", "b", "c"}, []string{"a", "b", "c"}},
		{"  a  b  c  ", 0, []string{"a  b  c  "}, []string{"  a  b  c"}},
		{"  a  b  c  ", 1, []string{"a", "b  c  "}, []string{"  a  b", "c"}},
		{"a\u3000b\x1fc", 5, []string{"a", "b", "c"}, []string{"a", "b", "c"}},
	}
	for _, tt := range split {
		if got := pySplitSpace(tt.s, tt.maxsplit); !slices.Equal(got, tt.split) {
			t.Errorf("%q.split(None, %d) = %q, want %q", tt.s, tt.maxsplit, got, tt.split)
		}
		if got := pyRSplitSpace(tt.s, tt.maxsplit); !slices.Equal(got, tt.rsplit) {
			t.Errorf("%q.rsplit(None, %d) = %q, want %q", tt.s, tt.maxsplit, got, tt.rsplit)
		}
	}
	lines := []struct {
		s           string
		lines, ends []string
	}{
		{"", nil, nil},
		{"\n", []string{""}, []string{"\n"}},
		{"a\r\nb\rc\n\nd", []string{"a", "b", "c", "", "d"}, []string{"a\r\n", "b\r", "c\n", "\n", "d"}},
		{"a\x1cb\x1dc\x1ed\x1fe\u0085f\u2028g\u2029h\vi\fj", []string{"a", "b", "c", "d\x1fe", "f", "g", "h", "i", "j"},
			[]string{"a\x1c", "b\x1d", "c\x1e", "d\x1fe\u0085", "f\u2028", "g\u2029", "h\v", "i\f", "j"}},
	}
	for _, tt := range lines {
		if got := pySplitLines(tt.s, false); !slices.Equal(got, tt.lines) {
			t.Errorf("%q.splitlines() = %q, want %q", tt.s, got, tt.lines)
		}
		if got := pySplitLines(tt.s, true); !slices.Equal(got, tt.ends) {
			t.Errorf("%q.splitlines(True) = %q, want %q", tt.s, got, tt.ends)
		}
	}
	for _, tt := range []struct {
		s     string
		width int
		want  string
	}{{"ab", 5, "  ab "}, {"ab", 6, "  ab  "}, {"abc", 6, " abc  "}, {"abc", 7, "  abc  "}, {"é", 4, " é  "}, {"abc", 2, "abc"}} {
		if got := pyCenter(tt.s, tt.width); got != tt.want {
			t.Errorf("%q.center(%d) = %q, want %q", tt.s, tt.width, got, tt.want)
		}
	}
	for _, tt := range []struct{ s, want string }{{"中a bC", "中A Bc"}, {"ǆa", "ǅa"}, {"x1y", "X1Y"}, {"ªb", "ªb"}} {
		if got := pyTitle(tt.s); got != tt.want {
			t.Errorf("%q.title() = %q, want %q", tt.s, got, tt.want)
		}
	}
}
