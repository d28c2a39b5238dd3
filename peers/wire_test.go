package peers

import (
	"bytes"
	"errors"
	"flag"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/targetid"
)

var update = flag.Bool("update", false, "rewrite the golden wire bytes under testdata/")

var (
	podA   = targetid.ID{Endpoint: "http://10.0.0.7:8000", Rank: 1}
	sentAt = time.Unix(1764614400, 123456789)
)

// goldenMessages are one message of each kind, as testdata/wire-v1-*.msgpack
// pins them.
var goldenMessages = []struct {
	name string
	msg  Message
}{
	{"prediction", Message{Origin: "router-0", Sent: sentAt, Seq: 7, Kind: KindPrediction, Prediction: Prediction{
		Placement: 42, Target: podA, Deadline: sentAt.Add(2 * time.Second), Model: "llama", LoRA: "sql-adapter",
		BlockSize: 16, Keys: []kvindex.Key{1, 0xdeadbeef, 1 << 63}}}},
	{"withdrawal", Message{Origin: "router-0", Sent: sentAt, Seq: 8, Kind: KindWithdrawal, Withdrawal: 42}},
	{"flights", Message{Origin: "router-0", Sent: sentAt, Seq: 9, Kind: KindFlights, Flights: []TargetFlights{
		{Target: podA, InFlight: 3, Prefilling: 1, QueuedUncachedTokens: 2000},
		{Target: targetid.ID{Endpoint: "http://10.0.0.8:8000"}, InFlight: 1}}}},
	{"bye", Message{Origin: "router-0", Sent: sentAt, Seq: 10, Kind: KindBye}},
	{"flights-update", Message{Origin: "router-0", Sent: sentAt, Seq: 11, Kind: KindFlightsUpdate, Flights: []TargetFlights{
		{Target: podA, InFlight: 3, QueuedUncachedTokens: 0},
		{Target: targetid.ID{Endpoint: "http://10.0.0.8:8000"}}}}},
}

// TestWireGolden: each kind encodes to the bytes pinned under testdata/
// and decodes back to the message.
func TestWireGolden(t *testing.T) {
	for _, g := range goldenMessages {
		t.Run(g.name, func(t *testing.T) {
			b, err := Encode(nil, &g.msg)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", "wire-v1-"+g.name+".msgpack")
			if *update {
				if err := os.WriteFile(path, b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(b, want) {
				t.Fatalf("encoding differs from %s (rewrite with -update if the format changed on purpose, and bump WireVersion if old readers cannot read it):\n got %x\nwant %x", path, b, want)
			}
			got, err := Decode(want)
			if err != nil {
				t.Fatal(err)
			}
			wantMsg := g.msg
			wantMsg.Version = WireVersion
			if !reflect.DeepEqual(got, wantMsg) {
				t.Fatalf("decoded %+v\nwant    %+v", got, wantMsg)
			}
		})
	}
}

// raw encodes v with msgpack as it is, for hand-made messages.
func raw(t *testing.T, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDecodeRules: what a receiver accepts and refuses.
func TestDecodeRules(t *testing.T) {
	ns := sentAt.UnixNano()
	for _, tc := range []struct {
		name    string
		in      any
		wantErr string // "" accepts
		check   func(t *testing.T, m Message)
	}{
		{name: "fields appended by a later build are skipped",
			in: []any{1, "r1", ns, 1, 2, []any{5, "future", []any{1, map[string]any{"x": 1}}}, "trailing"},
			check: func(t *testing.T, m Message) {
				if m.Withdrawal != 5 {
					t.Fatalf("withdrawal %d", m.Withdrawal)
				}
			}},
		{name: "integers in any form", in: []any{int8(1), "r1", uint64(ns), int16(3), uint8(4), []any{}},
			check: func(t *testing.T, m Message) {
				if m.Kind != KindBye || m.Seq != 3 {
					t.Fatalf("%+v", m)
				}
			}},
		{name: "another version", in: []any{2, "r1", ns, 1, 4, []any{}}, wantErr: "unsupported wire version 2"},
		{name: "unknown kind", in: []any{1, "r1", ns, 1, 9, []any{}}, wantErr: "unknown kind 9"},
		{name: "empty origin", in: []any{1, "", ns, 1, 4, []any{}}, wantErr: "empty origin"},
		{name: "short envelope", in: []any{1, "r1", ns}, wantErr: "want at least 6"},
		{name: "not an array", in: map[string]any{"v": 1}, wantErr: "envelope"},
		{name: "negative seq", in: []any{1, "r1", ns, -1, 4, []any{}}, wantErr: "seq"},
		{name: "prediction without keys", in: []any{1, "r1", ns, 1, 1, []any{1, "http://p", 0, ns, "m", "", 16}}, wantErr: "at least 8"},
		{name: "zero block size", in: []any{1, "r1", ns, 1, 1, []any{1, "http://p", 0, ns, "m", "", 0, []any{}}}, wantErr: "block_size"},
		{name: "signed key", in: []any{1, "r1", ns, 1, 1, []any{1, "http://p", 0, ns, "m", "", 16, []any{-5}}}, wantErr: "key"},
		{name: "negative flights", in: []any{1, "r1", ns, 1, 3, []any{[]any{"http://p", 0, -1, 0, 0}}}, wantErr: "in_flight"},
		{name: "nested too deep", in: []any{1, "r1", ns, 1, 4, []any{}, []any{[]any{[]any{[]any{[]any{[]any{[]any{[]any{[]any{[]any{1}}}}}}}}}}}, wantErr: "nested too deep"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Decode(raw(t, tc.in))
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatal(err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
			case tc.check != nil:
				tc.check(t, m)
			}
		})
	}
	if _, err := Decode(raw(t, []any{2, "r1", ns, 1, 4, []any{}})); !errors.Is(err, ErrVersion) {
		t.Fatalf("a version error does not wrap ErrVersion: %v", err)
	}
	b, _ := Encode(nil, &goldenMessages[0].msg)
	for i := range len(b) {
		if _, err := Decode(b[:i]); err == nil {
			t.Fatalf("a message cut at %d of %d bytes decoded", i, len(b))
		}
	}
	if _, err := Decode(append(b, 0xc0)); err == nil {
		t.Fatal("bytes after the message accepted")
	}
}

// FuzzDecode: no input panics the decoder or makes it allocate beyond the
// input's size, and what it accepts encodes back to a message that
// decodes the same.
func FuzzDecode(f *testing.F) {
	for _, g := range goldenMessages {
		b, err := Encode(nil, &g.msg)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x96, 0x01, 0xa1, 'r', 0x00, 0x01, 0x01, 0x98, 0x01, 0xa1, 'e', 0x00, 0x00, 0xa0, 0xa0, 0x10, 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0x96, 0x01, 0xdb, 0xff, 0xff, 0xff, 0xff})
	// Readable, but beyond what a replica reports (plausible.go).
	pod := targetid.ID{Endpoint: "http://pod:8000"}
	for _, m := range []Message{
		{Origin: "r", Sent: sentAt, Seq: 1, Kind: KindFlights, Flights: []TargetFlights{{Target: pod, InFlight: 1, QueuedUncachedTokens: 1 << 60}}},
		{Origin: "r", Sent: sentAt, Seq: 1, Kind: KindFlightsUpdate, Flights: []TargetFlights{{Target: pod, InFlight: 1 << 40}}},
		{Origin: "r", Sent: sentAt, Seq: 1, Kind: KindPrediction, Prediction: Prediction{Placement: 1, Target: pod,
			Deadline: sentAt.Add(24 * time.Hour), Model: "m", BlockSize: 1 << 30, Keys: []kvindex.Key{1, 2}}},
		{Origin: "r", Sent: time.Unix(0, math.MinInt64), Seq: 1, Kind: KindBye},
	} {
		b, err := Encode(nil, &m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			return
		}
		// The bounds judge whatever decodes, at any clock.
		for _, now := range []time.Time{m.Sent, sentAt, time.Unix(0, math.MaxInt64)} {
			if r, detail := implausible(&m, now, nil); r >= numRejectReasons || r >= 0 && detail == "" {
				t.Fatalf("implausible: %d %q", r, detail)
			}
		}
		again, err := Encode(nil, &m)
		if err != nil {
			t.Fatalf("an accepted message does not encode: %v", err)
		}
		m2, err := Decode(again)
		if err != nil {
			t.Fatalf("re-encoded message does not decode: %v", err)
		}
		if !reflect.DeepEqual(m, m2) {
			t.Fatalf("round trip changed the message:\n%+v\n%+v", m, m2)
		}
	})
}
