package kvindex

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/prefixrouter/prefixrouter/targetid"
)

// TestExtendMatchesKeys keys prompts piece by piece, at random cut points,
// with every keyer and with and without extra keys: the keys Keys gives for
// the whole prompt.
func TestExtendMatchesKeys(t *testing.T) {
	var keyers []Keyer
	for _, algo := range []HashAlgo{AlgoSHA256, AlgoSHA256CBOR, AlgoXXHash, AlgoXXHashCBOR} {
		h, err := NewHasher(algo, "42", 16)
		if err != nil {
			t.Fatal(err)
		}
		keyers = append(keyers, h)
	}
	tk, err := NewTokenKeyer(16)
	if err != nil {
		t.Fatal(err)
	}
	keyers = append(keyers, tk)
	rng := rand.New(rand.NewPCG(1, 2))
	tokens := make([]uint32, 700)
	for i := range tokens {
		tokens[i] = rng.Uint32N(150000)
	}
	for _, extras := range []RequestExtras{{}, {LoRAName: "adapter", CacheSalt: "salt"},
		{MM: []MMItem{{Identifier: "img", Offset: 20, Length: 40}}}} {
		for _, k := range keyers {
			want, err := k.Keys(nil, tokens, extras)
			if err != nil {
				t.Fatal(err)
			}
			for trial := range 5 {
				var c KeyChain
				for n := 0; n < len(tokens); {
					n = min(len(tokens), n+1+rng.IntN(90))
					if err := k.Extend(&c, tokens[:n], extras); err != nil {
						t.Fatal(err)
					}
					if len(c.Keys) != n/16 {
						t.Fatalf("%T after %d tokens: %d keys", k, n, len(c.Keys))
					}
				}
				if !slices.Equal(c.Keys, want) {
					t.Fatalf("%T %+v trial %d: piecewise keys differ from Keys", k, extras, trial)
				}
			}
		}
	}
}

// TestReachAgreesWithLookup: over targets in two groups of 64 and all
// three tiers, Extend says "read on" exactly while some target's Lookup run
// covers every key so far, and Holders names exactly those targets.
func TestReachAgreesWithLookup(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	ix := NewIndex(IndexConfig{})
	prompt := keysN(7, 40)
	for i := range 100 {
		n := rng.IntN(len(prompt))
		keys := slices.Clone(prompt[:n])
		if n > 3 && rng.IntN(3) == 0 {
			keys = slices.Delete(keys, n/2, n/2+1) // a hole: the run ends there
		}
		ix.Store(tid(i), Tier(rng.IntN(int(numTiers))), keys)
	}
	longest := func(keys []Key) int {
		best := 0
		for _, m := range ix.Lookup(nil, keys) {
			best = max(best, m.Blocks)
		}
		return best
	}
	covering := func(keys []Key) []targetid.ID {
		var ids []targetid.ID
		for _, m := range ix.Lookup(nil, keys) {
			if m.Blocks == len(keys) {
				ids = append(ids, m.Target)
			}
		}
		return ids
	}
	sorted := func(ids []targetid.ID) []targetid.ID {
		return slices.SortedFunc(slices.Values(ids), func(a, b targetid.ID) int { return strings.Compare(a.String(), b.String()) })
	}
	for trial := range 20 {
		var r Reach
		for n := 0; n < len(prompt); {
			next := min(len(prompt), n+1+rng.IntN(6))
			got := ix.Extend(&r, prompt[n:next])
			want := longest(prompt[:next]) == next
			if got != want {
				t.Fatalf("trial %d after %d keys: Extend %v, Lookup says %v", trial, next, got, want)
			}
			n = next
			if !got {
				break
			}
			if got, want := sorted(ix.Holders(&r, nil)), sorted(covering(prompt[:next])); !slices.Equal(got, want) {
				t.Fatalf("trial %d after %d keys: Holders %v, Lookup says %v", trial, next, got, want)
			}
		}
	}
}
