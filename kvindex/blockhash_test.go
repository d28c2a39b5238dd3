package kvindex

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/prefixrouter/prefixrouter/kvindex/events"
)

type goldenHashes struct {
	BaseTokens       []uint32                     `json:"base_tokens"`
	NoneHash         map[string]map[string]string `json:"none_hash"`
	NoneHashInputHex map[string]map[string]string `json:"none_hash_input_hex"`
	Cases            []goldenCase                 `json:"cases"`
}

type goldenCase struct {
	ID            string        `json:"id"`
	Algo          string        `json:"algo"`
	Seed          string        `json:"pythonhashseed"`
	BlockSize     int           `json:"block_size"`
	NumTokens     int           `json:"num_tokens"`
	Tokens        []uint32      `json:"tokens"`
	LoRAName      *string       `json:"lora_name"`
	CacheSalt     *string       `json:"cache_salt"`
	NoneHashHex   string        `json:"none_hash_hex"`
	NumFullBlocks int           `json:"num_full_blocks"`
	Blocks        []goldenBlock `json:"blocks"`
}

type goldenBlock struct {
	Index        int             `json:"index"`
	Start        int             `json:"start"`
	End          int             `json:"end"`
	ExtraKeys    json.RawMessage `json:"extra_keys"`
	ParentHex    string          `json:"parent_hash_hex"`
	HashHex      string          `json:"hash_hex"`
	HashU64      string          `json:"hash_u64"`
	HashInputHex string          `json:"hash_input_hex"`
}

func loadGoldenHashes(t testing.TB) goldenHashes {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "testdata", "vllm", "block_hashes.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g goldenHashes
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	return g
}

// jsonExtraKeys turns the golden JSON form of an extra-key tuple into the
// values the serializers take (numbers as int64, arrays as tuples).
func jsonExtraKeys(t *testing.T, raw json.RawMessage) []any {
	t.Helper()
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	var conv func(any) any
	conv = func(x any) any {
		switch y := x.(type) {
		case float64:
			return int64(y)
		case []any:
			out := make([]any, len(y))
			for i := range y {
				out[i] = conv(y[i])
			}
			return out
		}
		return x
	}
	if v == nil {
		return nil
	}
	return conv(v).([]any)
}

func TestGoldenRoots(t *testing.T) {
	g := loadGoldenHashes(t)
	for algoName, bySeed := range g.NoneHash {
		algo, err := ParseHashAlgo(algoName)
		if err != nil {
			t.Fatal(err)
		}
		for seed, want := range bySeed {
			h, err := NewHasher(algo, seed, 16)
			if err != nil {
				t.Fatal(err)
			}
			if got := h.Root().Hex(); got != want {
				t.Errorf("%s seed %q root = %s, want %s", algoName, seed, got, want)
			}
		}
	}
}

func TestGoldenBlockHashes(t *testing.T) {
	g := loadGoldenHashes(t)
	if len(g.Cases) == 0 {
		t.Fatal("no golden cases")
	}
	for _, c := range g.Cases {
		t.Run(c.ID, func(t *testing.T) {
			algo, err := ParseHashAlgo(c.Algo)
			if err != nil {
				t.Fatal(err)
			}
			h, err := NewHasher(algo, c.Seed, c.BlockSize)
			if err != nil {
				t.Fatal(err)
			}
			if h.Root().Hex() != c.NoneHashHex {
				t.Fatalf("root %s, want %s", h.Root().Hex(), c.NoneHashHex)
			}
			tokens := c.Tokens
			if tokens == nil {
				tokens = g.BaseTokens[:c.NumTokens]
			}
			// Block by block with the golden extra keys: pins the serializer.
			parent := h.Root()
			for _, b := range c.Blocks {
				extra := jsonExtraKeys(t, b.ExtraKeys)
				if b.HashInputHex != "" {
					ser, err := h.Serialize(nil, parent, tokens[b.Start:b.End], extra)
					if err != nil {
						t.Fatal(err)
					}
					if got := hex.EncodeToString(ser); got != b.HashInputHex {
						t.Fatalf("block %d serialized\n got %s\nwant %s", b.Index, got, b.HashInputHex)
					}
				}
				d, err := h.HashBlock(parent, tokens[b.Start:b.End], extra)
				if err != nil {
					t.Fatal(err)
				}
				if d.Hex() != b.HashHex {
					t.Fatalf("block %d digest %s, want %s", b.Index, d.Hex(), b.HashHex)
				}
				if strconv.FormatUint(d.Wire(), 10) != b.HashU64 {
					t.Fatalf("block %d wire %d, want %s", b.Index, d.Wire(), b.HashU64)
				}
				parent = d
			}
			// Whole prompt through the request-level API (extra keys built
			// from the LoRA name and salt, not from the golden tuples).
			extras := RequestExtras{}
			if c.LoRAName != nil {
				extras.LoRAName = *c.LoRAName
			}
			if c.CacheSalt != nil {
				extras.CacheSalt = *c.CacheSalt
			}
			if c.ID == "sha256_cbor/seed=0/bs=16/mm-illustration" {
				extras.MM = []MMItem{{Identifier: "mmhash-A", Offset: 4, Length: 20}}
			}
			keys, err := h.Keys(nil, tokens, extras)
			if err != nil {
				t.Fatal(err)
			}
			if len(keys) != c.NumFullBlocks || len(keys) != len(c.Blocks) {
				t.Fatalf("%d keys, want %d", len(keys), c.NumFullBlocks)
			}
			for i, k := range keys {
				if strconv.FormatUint(uint64(k), 10) != c.Blocks[i].HashU64 {
					t.Errorf("key %d = %d, want %s", i, k, c.Blocks[i].HashU64)
				}
			}
		})
	}
}

func TestPickleIntWidths(t *testing.T) {
	cases := []struct {
		v    int64
		want string
	}{
		{0, "4b00"},
		{255, "4bff"},
		{256, "4d0001"},
		{65535, "4dffff"},
		{65536, "4a00000100"},
		{-1, "4affffffff"},
		{-12, "4af4ffffff"},
		{2147483647, "4affffff7f"},
		{2147483648, "8a050000008000"},
		{-2147483649, "8a05ffffff7fff"},
		{1 << 40, "8a06000000000001"},
	}
	for _, c := range cases {
		if got := hex.EncodeToString(appendPickleInt(nil, c.v)); got != c.want {
			t.Errorf("pickle int %d = %s, want %s", c.v, got, c.want)
		}
	}
}

func TestWireFromBytes(t *testing.T) {
	b, _ := hex.DecodeString("9f8e6436fc2fd8468c8ab2583529a3a8969f22b3dbb9061a42d67d6790d70899")
	if got := events.WireFromBytes(b); got != 4816174735284439193 {
		t.Fatalf("wire = %d", got)
	}
}

func TestNewHasherRejects(t *testing.T) {
	if _, err := NewHasher(AlgoSHA256, "0", 0); err == nil {
		t.Error("block size 0 accepted")
	}
	if _, err := NewHasher(HashAlgo(9), "0", 16); err == nil {
		t.Error("unknown algo accepted")
	}
	if _, err := ParseHashAlgo("md5"); err == nil {
		t.Error("md5 accepted")
	}
}

// TestTokenFastPathsMatchGenericEncoders checks the fast-path token
// serializers against the straightforward per-value encoders at every width
// boundary.
func TestTokenFastPathsMatchGenericEncoders(t *testing.T) {
	var vals []uint32
	for v := uint32(0); v < 300; v++ {
		vals = append(vals, v)
	}
	for _, base := range []uint32{1 << 16, 1 << 24, 1 << 31, 1<<32 - 1} {
		for d := uint32(0); d < 3; d++ {
			vals = append(vals, base-d, base+d)
		}
	}
	for _, v := range vals {
		gotP := appendPickleTokenTuple(nil, []uint32{v, v, v, v})
		var wantP []byte
		wantP = pickleTupleOpen(wantP, 4)
		for i := 0; i < 4; i++ {
			wantP = appendPickleInt(wantP, int64(v))
		}
		wantP = pickleTupleClose(wantP, 4)
		if hex.EncodeToString(gotP) != hex.EncodeToString(wantP) {
			t.Fatalf("pickle %d: %x, want %x", v, gotP, wantP)
		}
		gotC, _ := appendCBORBlock(nil, nil, []uint32{v}, nil)
		wantC := appendCBORHead([]byte{0x83, 0x40, 0x81}, cborUint, uint64(v))
		wantC = append(wantC, cborNull)
		if hex.EncodeToString(gotC) != hex.EncodeToString(wantC) {
			t.Fatalf("cbor %d: %x, want %x", v, gotC, wantC)
		}
	}
}

func TestNewHasherWithRoot(t *testing.T) {
	seeded, _ := NewHasher(AlgoSHA256, "0", 16)
	root := seeded.Root()
	same, err := NewHasherWithRoot(AlgoSHA256, root.Bytes(), 16)
	if err != nil {
		t.Fatal(err)
	}
	tokens := make([]uint32, 32)
	a, _ := seeded.Keys(nil, tokens, RequestExtras{})
	b, _ := same.Keys(nil, tokens, RequestExtras{})
	if len(a) != 2 || a[0] != b[0] || a[1] != b[1] {
		t.Fatalf("keys differ: %v %v", a, b)
	}
	random := make([]byte, 32)
	random[0] = 1
	other, _ := NewHasherWithRoot(AlgoSHA256, random, 16)
	c, _ := other.Keys(nil, tokens, RequestExtras{})
	if c[0] == a[0] {
		t.Fatal("a different root gave the same key")
	}
	if _, err := NewHasherWithRoot(AlgoSHA256, nil, 16); err == nil {
		t.Fatal("empty root accepted")
	}
}
