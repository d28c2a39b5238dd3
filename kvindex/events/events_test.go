package events

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

type goldenEvents struct {
	Vectors []goldenVector `json:"vectors"`
}

type goldenVector struct {
	ID        string   `json:"id"`
	Encoding  string   `json:"event_encoding"`
	Topic     string   `json:"topic"`
	Seq       uint64   `json:"seq"`
	FramesHex []string `json:"frames_hex"`
	Decoded   any      `json:"decoded"`
}

func loadGoldenEvents(t testing.TB) []goldenVector {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "testdata", "vllm", "kv_events.json"))
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var g goldenEvents
	if err := dec.Decode(&g); err != nil {
		t.Fatal(err)
	}
	if len(g.Vectors) == 0 {
		t.Fatal("no golden vectors")
	}
	return g.Vectors
}

func (v goldenVector) frames(t testing.TB) [][]byte {
	t.Helper()
	out := make([][]byte, len(v.FramesHex))
	for i, h := range v.FramesHex {
		b, err := hex.DecodeString(h)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = b
	}
	return out
}

// normalize maps a generically decoded msgpack or JSON value onto one shape:
// integers as decimal strings, floats as float64, bytes as {"bytes_hex"}.
func normalize(v any) any {
	switch x := v.(type) {
	case json.Number:
		s := x.String()
		if strings.ContainsAny(s, ".eE") {
			f, _ := x.Float64()
			return f
		}
		return s
	case int8, int16, int32, int64, int, uint8, uint16, uint32, uint64, uint:
		return fmt.Sprintf("%d", x)
	case float32:
		return float64(x)
	case []byte:
		return map[string]any{"bytes_hex": hex.EncodeToString(x)}
	case []any:
		out := make([]any, len(x))
		for i := range x {
			out[i] = normalize(x[i])
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = normalize(e)
		}
		return out
	}
	return v
}

func genericDecode(t *testing.T, payload []byte) any {
	t.Helper()
	d := msgpack.NewDecoder(bytes.NewReader(payload))
	v, err := d.DecodeInterface()
	if err != nil {
		t.Fatal(err)
	}
	return normalize(v)
}

func TestGoldenFramesMatchDecodedJSON(t *testing.T) {
	for _, v := range loadGoldenEvents(t) {
		t.Run(v.ID, func(t *testing.T) {
			fr := v.frames(t)
			if len(fr) != 3 {
				t.Fatalf("%d frames", len(fr))
			}
			if string(fr[0]) != v.Topic {
				t.Errorf("topic %q, want %q", fr[0], v.Topic)
			}
			seq, err := ParseSeq(fr[1])
			if err != nil || seq != v.Seq {
				t.Errorf("seq %d (%v), want %d", seq, err, v.Seq)
			}
			if got, want := genericDecode(t, fr[2]), normalize(v.Decoded); !reflect.DeepEqual(got, want) {
				t.Errorf("generic decode differs\n got %v\nwant %v", got, want)
			}
		})
	}
}

func TestGoldenDecodeEncodeRoundTrip(t *testing.T) {
	for _, v := range loadGoldenEvents(t) {
		t.Run(v.ID, func(t *testing.T) {
			payload := v.frames(t)[2]
			b, err := Decode(payload)
			if err != nil {
				t.Fatal(err)
			}
			enc, err := ParseEncoding(v.Encoding)
			if err != nil {
				t.Fatal(err)
			}
			out, err := Encode(&b, enc)
			if err != nil {
				t.Fatal(err)
			}
			want := normalize(v.Decoded)
			if strings.Contains(v.ID, "bytes_hashes") {
				// Raw-bytes hashes come back as their uint64 wire value.
				want = reduceBytesHashes(want)
			}
			if got := genericDecode(t, out); !reflect.DeepEqual(got, want) {
				t.Errorf("re-encoded batch differs\n got %v\nwant %v", got, want)
			}
			again, err := Decode(out)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(again, b) {
				t.Errorf("decode(encode(b)) != b\n got %+v\nwant %+v", again, b)
			}
		})
	}
}

func reduceBytesHashes(v any) any {
	batch := v.([]any)
	for _, e := range batch[1].([]any) {
		m := e.(map[string]any)
		hs := m["block_hashes"].([]any)
		for i, h := range hs {
			raw, _ := hex.DecodeString(h.(map[string]any)["bytes_hex"].(string))
			hs[i] = fmt.Sprintf("%d", WireFromBytes(raw))
		}
	}
	return v
}

func TestDecodeGoldenFields(t *testing.T) {
	byID := map[string]goldenVector{}
	for _, v := range loadGoldenEvents(t) {
		byID[v.ID] = v
	}
	for _, enc := range []string{"map", "array"} {
		b, err := Decode(byID["stored_2blocks_"+enc].frames(t)[2])
		if err != nil {
			t.Fatal(err)
		}
		ev := b.Events[0]
		if ev.Kind != KindBlockStored || len(ev.BlockHashes) != 2 || ev.BlockHashes[0] != 4816174735284439193 ||
			ev.BlockHashes[1] != 11281961293233673850 || ev.HasParentHash || len(ev.TokenIDs) != 32 ||
			ev.BlockSize != 16 || ev.Medium != MediumGPU || !ev.IsFullPrefix() || !b.HasDPRank || b.DPRank != 0 {
			t.Errorf("%s: unexpected %+v", enc, ev)
		}
		b, err = Decode(byID["stored_minimal_dp3_"+enc].frames(t)[2])
		if err != nil {
			t.Fatal(err)
		}
		ev = b.Events[0]
		if b.DPRank != 3 || !ev.HasParentHash || ev.ParentHash != 4816174735284439193 || ev.HasExtraKeys || ev.HasGroupIdx {
			t.Errorf("%s minimal: unexpected %+v", enc, b)
		}
		b, err = Decode(byID["stored_lora_salt_"+enc].frames(t)[2])
		if err != nil {
			t.Fatal(err)
		}
		ev = b.Events[0]
		if ev.LoRAName != "sql-lora" || ev.LoRAID != 1 || !reflect.DeepEqual(ev.ExtraKeys, [][]any{{"sql-lora", "salt-1"}}) {
			t.Errorf("%s lora: unexpected %+v", enc, ev)
		}
		b, err = Decode(byID["removed_and_cleared_"+enc].frames(t)[2])
		if err != nil {
			t.Fatal(err)
		}
		if len(b.Events) != 2 || b.Events[0].Kind != KindBlockRemoved || b.Events[1].Kind != KindAllBlocksCleared {
			t.Errorf("%s removed: unexpected %+v", enc, b)
		}
	}
}

func mustEncodeGeneric(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeTolerance(t *testing.T) {
	cases := []struct {
		name    string
		payload any
		check   func(t *testing.T, b Batch)
	}{
		{"unknown keys ignored", []any{1.0, []any{map[string]any{"type": "BlockRemoved", "block_hashes": []any{uint64(7)}, "future_field": []any{1, 2}}}}, func(t *testing.T, b Batch) {
			if len(b.Events) != 1 || b.Events[0].BlockHashes[0] != 7 || b.HasDPRank {
				t.Errorf("%+v", b)
			}
		}},
		{"negative int64 hash", []any{1.0, []any{[]any{"BlockRemoved", []any{int64(-1)}, "GPU"}}, 0}, func(t *testing.T, b Batch) {
			if b.Events[0].BlockHashes[0] != ^uint64(0) {
				t.Errorf("%+v", b)
			}
		}},
		{"unknown event type skipped", []any{1.0, []any{map[string]any{"type": "BlockMoved"}, []any{"AllBlocksCleared"}}}, func(t *testing.T, b Batch) {
			if len(b.Events) != 1 || b.Unknown != 1 {
				t.Errorf("%+v", b)
			}
		}},
		{"integer timestamp", []any{5, []any{}}, func(t *testing.T, b Batch) {
			if b.TS != 5 {
				t.Errorf("%+v", b)
			}
		}},
		// vLLM sends nil for a chain's first block; the legacy array form
		// seen in the field sends 0: the block still starts a chain.
		{"legacy array: parent 0 is no parent", []any{1.0, []any{[]any{"BlockStored", []any{uint64(7)}, 0, []any{1, 2}, 2, nil, "GPU"}}}, func(t *testing.T, b Batch) {
			if ev := b.Events[0]; ev.HasParentHash || ev.BlockHashes[0] != 7 {
				t.Errorf("%+v: want a root block", ev)
			}
		}},
		{"map: parent 0 is no parent", []any{1.0, []any{map[string]any{"type": "BlockStored", "block_hashes": []any{uint64(7)}, "parent_block_hash": 0,
			"token_ids": []any{1, 2}, "block_size": 2, "lora_id": nil, "medium": "GPU"}}}, func(t *testing.T, b Batch) {
			if ev := b.Events[0]; ev.HasParentHash {
				t.Errorf("%+v: want a root block", ev)
			}
		}},
		{"legacy array: a parent is a parent", []any{1.0, []any{[]any{"BlockStored", []any{uint64(7)}, uint64(6), []any{1, 2}, 2, nil, "GPU"}}}, func(t *testing.T, b Batch) {
			if ev := b.Events[0]; !ev.HasParentHash || ev.ParentHash != 6 {
				t.Errorf("%+v: want parent 6", ev)
			}
		}},
		{"trailing array fields ignored", []any{1.0, []any{[]any{"BlockRemoved", []any{1}, "CPU", 0, "extra"}}}, func(t *testing.T, b Batch) {
			if b.Events[0].Medium != MediumCPU {
				t.Errorf("%+v", b)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := Decode(mustEncodeGeneric(t, c.payload))
			if err != nil {
				t.Fatal(err)
			}
			c.check(t, b)
		})
	}
}

func TestDecodeSkipsInvalidEventsKeepsBatch(t *testing.T) {
	gpu := map[string]any{"type": "BlockStored", "block_hashes": []any{1, 2}, "parent_block_hash": nil, "token_ids": []any{1, 2, 3, 4},
		"block_size": 2, "lora_id": nil, "medium": "GPU", "lora_name": nil}
	// vLLM's offloading connector: no token_ids, block_size 0, same batch.
	offload := map[string]any{"type": "BlockStored", "block_hashes": []any{1, 2}, "parent_block_hash": nil, "token_ids": []any{},
		"block_size": 0, "lora_id": nil, "medium": "CPU", "lora_name": nil}
	invalid := []any{
		map[string]any{"type": "BlockStored", "block_hashes": []any{1, 2}, "block_size": 16, "extra_keys": []any{nil}},
		map[string]any{"type": "BlockStored", "token_ids": []any{1}, "block_size": 16},
		map[string]any{"type": "BlockStored", "block_hashes": []any{1}, "token_ids": []any{1}, "block_size": 0},
		[]any{"BlockRemoved", []any{}, "GPU"},
	}
	b, err := Decode(mustEncodeGeneric(t, []any{1.0, append([]any{gpu, offload}, invalid...), 0}))
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Events) != 2 || b.Events[1].Medium != MediumCPU || b.Events[1].BlockSize != 0 || b.Invalid != len(invalid) || b.FirstInvalid == nil {
		t.Fatalf("%+v", b)
	}
}

func TestDecodeRejects(t *testing.T) {
	cases := map[string]any{
		"not an array":       map[string]any{"a": 1},
		"short batch":        []any{1.0},
		"event without type": []any{1.0, []any{map[string]any{"block_hashes": []any{1}}}},
		"string token":       []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{"x"}, 16, nil, "GPU", nil}}},
		"negative token":     []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{-3}, 16, nil, "GPU", nil}}},
		"hash is a map":      []any{1.0, []any{[]any{"BlockRemoved", []any{map[string]any{}}, "GPU"}}},
		"negative rank":      []any{1.0, []any{}, -1},
	}
	for name, p := range cases {
		t.Run(name, func(t *testing.T) {
			if b, err := Decode(mustEncodeGeneric(t, p)); err == nil {
				t.Errorf("accepted: %+v", b)
			}
		})
	}
	for _, raw := range [][]byte{nil, {0x93}, {0x92, 0xcb}, {0xdd, 0xff, 0xff, 0xff, 0xff}} {
		if _, err := Decode(raw); err == nil {
			t.Errorf("accepted % x", raw)
		}
	}
}

func FuzzDecode(f *testing.F) {
	for _, v := range loadGoldenEvents(f) {
		f.Add(v.frames(f)[2])
	}
	f.Add([]byte{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90, 0x00})
	// The bounds: token_ids beyond blocks × block size, many blocks, many
	// events declared in few bytes.
	f.Add(mustEncodeGeneric(f, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{1, 2, 3, 4, 5}, 4, nil, "GPU", nil}}}))
	f.Add(mustEncodeGeneric(f, []any{1.0, []any{[]any{"BlockRemoved", []any{1, 2, 3, 4, 5, 6}, "GPU"}}}))
	f.Add(mustEncodeGeneric(f, []any{1.0, []any{[]any{"AllBlocksCleared"}, []any{"AllBlocksCleared"}, []any{"AllBlocksCleared"}, []any{"AllBlocksCleared"}, []any{"AllBlocksCleared"}}}))
	f.Add([]byte{0x92, 0x01, 0xdd, 0x01, 0x00, 0x00, 0x00, 0xc0, 0xc0})
	f.Fuzz(func(t *testing.T, payload []byte) {
		lim := Limits{MaxEvents: 4, MaxBlocksPerEvent: 4, MaxTokensPerEvent: 64}
		if lb, err := DecodeLimited(payload, lim); err == nil {
			if len(lb.Events)+lb.Unknown+lb.Invalid > lim.MaxEvents {
				t.Fatalf("%d events passed a bound of %d", len(lb.Events), lim.MaxEvents)
			}
			for _, ev := range lb.Events {
				if len(ev.BlockHashes) > lim.MaxBlocksPerEvent || len(ev.TokenIDs) > lim.MaxTokensPerEvent ||
					(ev.BlockSize > 0 && len(ev.TokenIDs) > len(ev.BlockHashes)*ev.BlockSize) {
					t.Fatalf("event beyond the bounds passed: %d blocks, %d tokens, block size %d", len(ev.BlockHashes), len(ev.TokenIDs), ev.BlockSize)
				}
			}
		}
		b, err := Decode(payload)
		if err != nil {
			return
		}
		// Whatever decodes must encode and decode to the same batch.
		out, err := Encode(&b, EncodingMap)
		if err != nil {
			t.Fatalf("encode decoded batch: %v", err)
		}
		again, err := Decode(out)
		if err != nil {
			t.Fatalf("decode re-encoded batch: %v", err)
		}
		if len(again.Events) != len(b.Events) {
			t.Fatalf("round trip changed event count %d -> %d", len(b.Events), len(again.Events))
		}
	})
}

func TestDecodeHostileLengths(t *testing.T) {
	nested := append([]byte{0x93, 0x01, 0x91, 0x93, 0xa1, 'X'}, bytes.Repeat([]byte{0x91}, 200000)...)
	cases := map[string][]byte{
		// A hash declared as a 3.4 GB string inside a stored event.
		"huge string": {0x93, 0x01, 0x91, 0x93, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0x91, 0xdb, 0xcf, 0x9c, 0x91, 0x94, 0x00},
		// An unknown map key whose value is an ext declaring 3.4 GB.
		"huge ext": {0x93, 0x01, 0x91, 0x82, 0xa4, 't', 'y', 'p', 'e', 0xb0, 'A', 'l', 'l', 'B', 'l', 'o', 'c', 'k', 's', 'C', 'l', 'e', 'a', 'r', 'e', 'd', 0xa1, 'x', 0xc9, 0xce, 0x00, 0x01, 0x7b, 0x01},
		// An ignored trailing field nested 200,000 arrays deep.
		"deep nesting": nested,
	}
	for name, p := range cases {
		if _, err := Decode(p); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestDecodeLimits: each bound refuses the batch with a *LimitError
// naming it; within the bounds the batch decodes.
func TestDecodeLimits(t *testing.T) {
	stored := func(blocks, tokens, blockSize int) any {
		hs, ts := make([]any, blocks), make([]any, tokens)
		for i := range hs {
			hs[i] = i + 1
		}
		for i := range ts {
			ts[i] = i
		}
		return []any{"BlockStored", hs, nil, ts, blockSize, nil, "GPU", nil}
	}
	lim := Limits{MaxEvents: 2, MaxBlocksPerEvent: 4, MaxTokensPerEvent: 64}
	for _, tt := range []struct {
		name   string
		events []any
		lim    Limits
		what   string
	}{
		{name: "within", events: []any{stored(4, 16, 4), stored(1, 4, 4)}, lim: lim},
		{name: "fewer tokens than blocks hold", events: []any{stored(2, 4, 4)}, lim: lim},
		{name: "too many events", events: []any{stored(1, 4, 4), stored(1, 4, 4), []any{"AllBlocksCleared"}}, lim: lim, what: LimitEvents},
		{name: "too many blocks", events: []any{stored(5, 20, 4)}, lim: lim, what: LimitBlocks},
		{name: "too many tokens while reading", events: []any{stored(4, 65, 16)}, lim: lim, what: LimitTokens},
		{name: "tokens beyond blocks × block size", events: []any{stored(1, 5, 4)}, lim: lim, what: LimitTokens},
		{name: "tokens beyond blocks × block size, no bounds", events: []any{stored(1, 5, 4)}, what: LimitTokens},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, err := DecodeLimited(mustEncodeGeneric(t, []any{1.0, tt.events}), tt.lim)
			var le *LimitError
			switch {
			case tt.what == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.what == "" && len(b.Events) != len(tt.events):
				t.Fatalf("decoded %d of %d events", len(b.Events), len(tt.events))
			case tt.what != "" && (!errors.As(err, &le) || le.What != tt.what):
				t.Fatalf("err %v, want a %s LimitError", err, tt.what)
			}
		})
	}
}
