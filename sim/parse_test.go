package sim

import (
	"bytes"
	"encoding/json"
	"math"
	"slices"
	"testing"
)

func TestParsePrompts(t *testing.T) {
	tests := []struct {
		in      string
		want    []promptInput
		wantErr bool
	}{
		{`"hi"`, []promptInput{{text: "hi", isText: true}}, false},
		{`["a","b"]`, []promptInput{{text: "a", isText: true}, {text: "b", isText: true}}, false},
		{` [ 1 , 2,3 ] `, []promptInput{{ids: []uint32{1, 2, 3}}}, false},
		{`[[1],[4294967295]]`, []promptInput{{ids: []uint32{1}}, {ids: []uint32{math.MaxUint32}}}, false},
		{`[0]`, []promptInput{{ids: []uint32{0}}}, false},
		{`[4294967296]`, nil, true},
		{`[-1]`, nil, true},
		{`[1.0]`, nil, true},
		{`[1e3]`, nil, true},
		{`[01]`, nil, true},
		{`[1,]`, nil, true},
		{`[1 2]`, nil, true},
		{`[1]]`, nil, true},
		{`[1`, nil, true},
		{`[]`, nil, true},
		{`[[]]`, nil, true},
		{`["a",1]`, nil, true},
		{`[true]`, nil, true},
		{`{}`, nil, true},
		{`12`, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parsePrompts(json.RawMessage(tc.in))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, wantErr %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			for i := range got {
				if got[i].isText != tc.want[i].isText || got[i].text != tc.want[i].text || !slices.Equal(got[i].ids, tc.want[i].ids) {
					t.Fatalf("got %+v, want %+v", got, tc.want)
				}
			}
		})
	}
}

// FuzzParseIDs checks the hand-written token-list scanner against
// encoding/json: whatever it accepts, encoding/json reads as the same list
// of integers.
func FuzzParseIDs(f *testing.F) {
	for _, s := range []string{`[1,2,3]`, ` [ 0 ] `, `[4294967295]`, `[4294967296]`, `[-0]`, `[1.5]`, `[1,]`, `[]`, `[01]`, `[1e2]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		ids, err := parseIDs(raw)
		if err != nil {
			return
		}
		var ref []int64
		dec := json.NewDecoder(bytes.NewReader(raw))
		if err := dec.Decode(&ref); err != nil || dec.More() {
			t.Fatalf("accepted %q, which encoding/json rejects (%v)", raw, err)
		}
		if len(ref) != len(ids) {
			t.Fatalf("%q: %v vs %v", raw, ids, ref)
		}
		for i := range ids {
			if int64(ids[i]) != ref[i] {
				t.Fatalf("%q: %v vs %v", raw, ids, ref)
			}
		}
	})
}
