package jsonspan

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestEnd(t *testing.T) {
	tests := []struct {
		in   string
		i    int
		end  int
		isOK bool
	}{
		{in: `"abc"`, end: 5, isOK: true},
		{in: `"a\"b" ,`, end: 6, isOK: true},
		{in: `"a\\" ,`, end: 5, isOK: true},
		{in: `"a\\\"b"`, end: 8, isOK: true},
		{in: `"abc`, end: 4},
		{in: `"a\"`, end: 4},
		{in: `{"a":[1,{"b":"]}"}]} x`, end: 20, isOK: true},
		{in: `[[[]]]`, end: 6, isOK: true},
		{in: `[{]}]`, end: 4, isOK: true}, // counted, not matched
		{in: `[1, 2`, end: 5},
		{in: `{"a":"}`, end: 7},
		{in: `123,`, end: 3, isOK: true},
		{in: `-1.5e3}`, end: 6, isOK: true},
		{in: `true]`, end: 4, isOK: true},
		{in: "null\n", end: 4, isOK: true},
		{in: `42`, end: 2, isOK: true},
		{in: `[1, 2]`, i: 4, end: 5, isOK: true},
		{in: `,`, end: 0},
		{in: `]`, end: 0},
		{in: `:`, end: 0},
		{in: ``, end: 0},
		{in: `x`, i: 1, end: 1},
	}
	for _, tt := range tests {
		end, ok := End([]byte(tt.in), tt.i)
		if end != tt.end || ok != tt.isOK {
			t.Errorf("End(%q, %d) = %d, %v; want %d, %v", tt.in, tt.i, end, ok, tt.end, tt.isOK)
		}
	}
}

func TestSkipWS(t *testing.T) {
	for _, tt := range []struct {
		in      string
		i, want int
	}{
		{"", 0, 0}, {" \t\r\n x", 0, 5}, {"x ", 0, 0}, {"x  ", 1, 3}, {"\v", 0, 0}, {"\u00a0", 0, 0},
	} {
		if got := SkipWS([]byte(tt.in), tt.i); got != tt.want {
			t.Errorf("SkipWS(%q, %d) = %d, want %d", tt.in, tt.i, got, tt.want)
		}
	}
}

// FuzzEnd checks End against encoding/json on valid JSON: the extent of
// a value, alone or as an element of an array, is exactly the value.
func FuzzEnd(f *testing.F) {
	for _, s := range []string{`"a\\\"b"`, `{"a":[1,{"b":"]}"}]}`, `-0.5e+3`, `[]`, `null`, `"\u00e9"`, ` [ 1 , "x" ] `} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if !json.Valid(raw) {
			return
		}
		start := SkipWS(raw, 0)
		want := start + len(bytes.TrimRight(raw[start:], " \t\r\n"))
		if end, ok := End(raw, start); !ok || end != want {
			t.Fatalf("End(%q) = %d, %v; want %d", raw, end, ok, want)
		}
		in := append(append([]byte("["), raw...), ",0]"...)
		if end, ok := End(in, 1+start); !ok || end != 1+want {
			t.Fatalf("End(%q) inside an array = %d, %v; want %d", raw, end, ok, 1+want)
		}
	})
}
