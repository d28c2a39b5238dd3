package bpe

import (
	"fmt"
	"math"
	"slices"
	"testing"
)

// TestWordCacheHash: words of every length the short hash reads
// differently (0–3, 4–7, 8–16 bytes) and long ones spread over the table
// about as random values would, and a cached word reads back its ids.
func TestWordCacheHash(t *testing.T) {
	c := newWordCache()
	distinct := make(map[string]bool)
	for i := range 20000 {
		w := fmt.Sprintf("%016x%08x", uint64(i)*2654435761, i)[:1+i%20]
		if i%3 == 0 {
			w = " " + w
		}
		distinct[w] = true
	}
	buckets := make(map[uint64]bool)
	for w := range distinct {
		buckets[c.hash(w)&c.mask] = true
	}
	// k random values in m slots fill m(1-(1-1/m)^k) distinct ones.
	m, k := float64(c.mask+1), float64(len(distinct))
	if want := m * (1 - math.Pow(1-1/m, k)); float64(len(buckets)) < 0.97*want {
		t.Fatalf("%d words fell in %d slots, random values would fill %.0f", len(distinct), len(buckets), want)
	}
	for n := range 24 {
		w := string(make([]byte, n))
		ids := []uint32{uint32(n), 7, 8, 9, 10}[:1+n%5]
		c.put(w, ids)
		if got, ok := c.get(w); !ok || !slices.Equal(got, ids) {
			t.Fatalf("word of %d bytes: got %v %v, want %v", n, got, ok, ids)
		}
	}
}
