package kvindex

import (
	"bytes"
	"math/rand"
	"testing"

	"github.com/fxamacker/cbor/v2"
)

// canonicalCBOR is fxamacker/cbor in canonical mode: an independent oracle
// for the hand-written encoder (and the alternative it was measured against).
var canonicalCBOR, _ = cbor.CanonicalEncOptions().EncMode()

func randomBlock(r *rand.Rand) ([]byte, []uint32, []any) {
	parent := make([]byte, 32)
	r.Read(parent)
	tokens := make([]uint32, 1+r.Intn(64))
	for i := range tokens {
		switch r.Intn(4) {
		case 0:
			tokens[i] = uint32(r.Intn(30))
		case 1:
			tokens[i] = uint32(r.Intn(70000))
		default:
			tokens[i] = r.Uint32()
		}
	}
	var extra []any
	if r.Intn(2) == 0 {
		extra = append(extra, "lora-"+string(rune('a'+r.Intn(26))))
		if r.Intn(2) == 0 {
			extra = append(extra, []any{"mm-hash", int64(r.Intn(200) - 100)})
		}
		if r.Intn(2) == 0 {
			extra = append(extra, string(bytes.Repeat([]byte("s"), r.Intn(300))))
		}
	}
	return parent, tokens, extra
}

func TestCBORMatchesLibraryCanonicalEncoding(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 2000; i++ {
		parent, tokens, extra := randomBlock(r)
		got, err := appendCBORBlock(nil, parent, tokens, extra)
		if err != nil {
			t.Fatal(err)
		}
		var x any = nil
		if extra != nil {
			x = extra
		}
		want, err := canonicalCBOR.Marshal([]any{parent, tokens, x})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("block %d differs\n got %x\nwant %x", i, got, want)
		}
	}
}

// BenchmarkCBORBlock compares the hand-written block encoder with the
// library on the same 16-token blocks, side by side in one run.
func BenchmarkCBORBlock(b *testing.B) {
	tokens := seqTokens(16)
	parent := make([]byte, 32)
	b.Run("hand-written", func(b *testing.B) {
		buf := make([]byte, 0, 256)
		for i := 0; i < b.N; i++ {
			buf, _ = appendCBORBlock(buf[:0], parent, tokens, nil)
		}
	})
	b.Run("fxamacker", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			_, _ = canonicalCBOR.Marshal([]any{parent, tokens, nil})
		}
	})
}
