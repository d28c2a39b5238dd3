package sim

import (
	"slices"
	"testing"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
)

func digestOf(t *testing.T, b byte) kvindex.Digest {
	t.Helper()
	raw := make([]byte, 32)
	raw[31] = b
	d, err := kvindex.DigestFromBytes(raw)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func removedHashes(evs []events.Event) []uint64 {
	var out []uint64
	for _, e := range evs {
		if e.Kind == events.KindBlockRemoved {
			out = append(out, e.BlockHashes...)
		}
	}
	return out
}

func TestBlockPoolEvictionOrder(t *testing.T) {
	tests := []struct {
		name      string
		freeOrder func(a, b []int32) [][]int32 // blocks of request a then b, in the order freed
		allocate  int
		want      []uint64 // BlockRemoved hashes, in order
	}{
		{
			name: "request tail evicted before its head",
			freeOrder: func(a, _ []int32) [][]int32 {
				r := slices.Clone(a)
				slices.Reverse(r)
				return [][]int32{r}
			},
			allocate: 2,
			want:     []uint64{3, 2},
		},
		{
			name: "least recently freed request first",
			freeOrder: func(a, b []int32) [][]int32 {
				ra, rb := slices.Clone(a), slices.Clone(b)
				slices.Reverse(ra)
				slices.Reverse(rb)
				return [][]int32{rb, ra}
			},
			allocate: 4,
			want:     []uint64{6, 5, 4, 3},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newBlockPool(6)
			a := p.allocate(nil, 3)
			b := p.allocate(nil, 3)
			for i, id := range a {
				p.cache(id, digestOf(t, byte(1+i)))
			}
			for i, id := range b {
				p.cache(id, digestOf(t, byte(4+i)))
			}
			if p.numFree != 0 || p.usage() != 1 {
				t.Fatalf("free %d usage %v, want 0 and 1", p.numFree, p.usage())
			}
			for _, ids := range tc.freeOrder(a, b) {
				p.free(ids)
			}
			p.takeEvents()
			p.allocate(nil, tc.allocate)
			if got := removedHashes(p.takeEvents()); !slices.Equal(got, tc.want) {
				t.Fatalf("evicted %v, want %v", got, tc.want)
			}
		})
	}
}

func TestBlockPoolRefcounts(t *testing.T) {
	p := newBlockPool(4)
	ids := p.allocate(nil, 2)
	h0, h1 := digestOf(t, 10), digestOf(t, 11)
	p.cache(ids[0], h0)
	p.cache(ids[1], h1)

	// A second request hits both blocks: two references each.
	hits := p.lookup(nil, []kvindex.Digest{h0, h1}, 8)
	if !slices.Equal(hits, ids) {
		t.Fatalf("lookup %v, want %v", hits, ids)
	}
	if n := p.evictable(hits); n != 0 {
		t.Fatalf("evictable %d, want 0 while referenced", n)
	}
	p.touch(hits)
	p.free([]int32{ids[1], ids[0]})
	if p.numFree != 2 {
		t.Fatalf("after first free: %d free, want 2 (blocks still referenced)", p.numFree)
	}
	// Allocating everything free must not evict referenced blocks.
	p.allocate(nil, 2)
	if ev := removedHashes(p.takeEvents()); len(ev) != 0 {
		t.Fatalf("evicted referenced blocks: %v", ev)
	}
	p.free(hits)
	if p.numFree != 2 || p.evictable(hits) != 2 {
		t.Fatalf("after last free: %d free, evictable %d", p.numFree, p.evictable(hits))
	}
	// Freed but cached: still a hit, touching takes it out of the free queue.
	if got := p.lookup(nil, []kvindex.Digest{h0, h1}, 8); len(got) != 2 {
		t.Fatalf("freed blocks no longer hit: %v", got)
	}
	p.touch(hits[:1])
	if p.numFree != 1 {
		t.Fatalf("touch left %d free, want 1", p.numFree)
	}
}

func TestBlockPoolLookupConsecutiveFromZero(t *testing.T) {
	p := newBlockPool(8)
	ids := p.allocate(nil, 3)
	hs := []kvindex.Digest{digestOf(t, 1), digestOf(t, 2), digestOf(t, 3)}
	for i, id := range ids {
		p.cache(id, hs[i])
	}
	tests := []struct {
		name    string
		query   []kvindex.Digest
		max     int
		wantLen int
	}{
		{"full run", hs, 8, 3},
		{"capped", hs, 2, 2},
		{"miss at block 0 stops everything", []kvindex.Digest{digestOf(t, 9), hs[1], hs[2]}, 8, 0},
		{"gap stops the run", []kvindex.Digest{hs[0], digestOf(t, 9), hs[2]}, 8, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := p.lookup(nil, tc.query, tc.max); len(got) != tc.wantLen {
				t.Fatalf("hit %d blocks, want %d", len(got), tc.wantLen)
			}
		})
	}
}

func TestBlockPoolDuplicateHash(t *testing.T) {
	p := newBlockPool(2)
	ids := p.allocate(nil, 2)
	h := digestOf(t, 7)
	p.cache(ids[0], h)
	p.cache(ids[1], h) // two requests filled the same block concurrently
	p.free([]int32{ids[0], ids[1]})
	p.allocate(nil, 1)
	if got := removedHashes(p.takeEvents()); !slices.Equal(got, []uint64{7}) {
		t.Fatalf("first eviction %v, want [7]", got)
	}
	if len(p.lookup(nil, []kvindex.Digest{h}, 1)) != 1 {
		t.Fatal("the other copy must still hit")
	}
	p.allocate(nil, 1)
	if got := removedHashes(p.takeEvents()); !slices.Equal(got, []uint64{7}) {
		t.Fatalf("second eviction %v, want [7]", got)
	}
	if len(p.lookup(nil, []kvindex.Digest{h}, 1)) != 0 {
		t.Fatal("hash still cached after both copies were evicted")
	}
}

func TestBlockPoolReset(t *testing.T) {
	p := newBlockPool(2)
	ids := p.allocate(nil, 1)
	p.cache(ids[0], digestOf(t, 1))
	if p.reset() {
		t.Fatal("reset succeeded with a block in use")
	}
	p.free(ids)
	if !p.reset() {
		t.Fatal("reset failed with every block free")
	}
	evs := p.takeEvents()
	if len(evs) != 1 || evs[0].Kind != events.KindAllBlocksCleared {
		t.Fatalf("events %+v, want one AllBlocksCleared", evs)
	}
	if len(p.lookup(nil, []kvindex.Digest{digestOf(t, 1)}, 1)) != 0 {
		t.Fatal("cache not cleared")
	}
}

// digestWithPrefix is a digest whose wire form (last 8 bytes) is wire and
// whose first byte is head: equal wire forms, different hashes.
func digestWithPrefix(t *testing.T, head, wire byte) kvindex.Digest {
	t.Helper()
	raw := make([]byte, 32)
	raw[0], raw[31] = head, wire
	d, err := kvindex.DigestFromBytes(raw)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestBlockPoolLookupFromAMemo(t *testing.T) {
	hashes := []kvindex.Digest{digestOf(t, 1), digestOf(t, 2), digestOf(t, 3)}
	// A hash sharing the third's wire form is another block.
	twin := digestWithPrefix(t, 9, 3)
	fill := func() (*blockPool, []int32) {
		p := newBlockPool(8)
		ids := p.allocate(nil, 3)
		for i, id := range ids {
			p.cache(id, hashes[i])
		}
		return p, ids
	}
	for _, tc := range []struct {
		name   string
		change func(p *blockPool, ids []int32)
		memo   func(ids []int32) []int32
		want   int
	}{
		{name: "no memo", memo: func([]int32) []int32 { return nil }, want: 3},
		{name: "memo still valid", memo: func(ids []int32) []int32 { return ids[:2] }, want: 3},
		{name: "memo block evicted", change: func(p *blockPool, ids []int32) {
			p.free(ids[1:2])
			for p.numFree > 0 {
				p.allocate(nil, 1) // reallocating the free block evicts its hash
			}
		}, memo: func(ids []int32) []int32 { return ids }, want: 1},
		{name: "a twin wire form is no hit", change: func(p *blockPool, ids []int32) {
			p.evict(ids[2])
			p.blocks[ids[2]].hashed = false
			id := p.allocate(nil, 1)
			p.cache(id[0], twin)
		}, memo: func(ids []int32) []int32 { return ids[:2] }, want: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, ids := fill()
			at := p.losses
			if tc.change != nil {
				tc.change(p, ids)
			}
			got := p.lookupFrom(nil, hashes, 3, tc.memo(ids), at)
			fresh := p.lookup(nil, hashes, 3)
			if len(got) != tc.want || !slices.Equal(got, fresh) {
				t.Errorf("lookupFrom %v, lookup %v; want %d blocks, the same", got, fresh, tc.want)
			}
		})
	}
}

// TestBlockPoolCopiesAndWireCollisions checks which block holds a hash as
// copies and hashes sharing a wire form (the last 8 bytes) come and go:
// always the earliest cached one still holding it, as vLLM's dict of
// blocks per hash returns; and nothing is left behind once all are gone.
func TestBlockPoolCopiesAndWireCollisions(t *testing.T) {
	a, b := digestWithPrefix(t, 1, 9), digestWithPrefix(t, 2, 9) // the same wire form
	if a.Wire() != b.Wire() {
		t.Fatal("test digests must share a wire form")
	}
	hashes := []kvindex.Digest{a, a, b, a, b} // block i caches hashes[i]
	tests := []struct {
		name  string
		evict []int32 // blocks evicted, in order
	}{
		{"none", nil},
		{"the first", []int32{0}},
		{"the first two", []int32{0, 1}},
		{"the middle ones", []int32{1, 2}},
		{"the last", []int32{4}},
		{"all, oldest first", []int32{0, 1, 2, 3, 4}},
		{"all, newest first", []int32{4, 3, 2, 1, 0}},
		{"all, mixed", []int32{2, 0, 4, 1, 3}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newBlockPool(len(hashes))
			ids := p.allocate(nil, len(hashes))
			for i, id := range ids {
				p.cache(id, hashes[i])
			}
			gone := map[int32]bool{}
			for _, id := range tc.evict {
				p.blocks[id].ref = 0
				p.evict(id)
				gone[id] = true
			}
			for _, h := range []kvindex.Digest{a, b} {
				want := int32(noBlock)
				for i, x := range hashes {
					if x == h && !gone[int32(i)] {
						want = int32(i)
						break
					}
				}
				if got := p.first(h); got != want {
					t.Errorf("first(%x) = %d, want %d", h.Wire(), got, want)
				}
			}
			if len(tc.evict) == len(hashes) && p.cached.Len() != 0 {
				t.Errorf("left behind: %d cached wire forms", p.cached.Len())
			}
		})
	}
}

// TestBlockPoolMemoKeepsARecachedBlock: a memo block that lost its hash and
// cached the same hash again is still the memo's hit, even though a lookup
// from scratch finds the other block that cached it in between.
func TestBlockPoolMemoKeepsARecachedBlock(t *testing.T) {
	h := []kvindex.Digest{digestOf(t, 1)}
	p := newBlockPool(2)
	a := p.allocate(nil, 1)[0]
	p.cache(a, h[0])
	at := p.losses
	p.evict(a)
	b := p.allocate(nil, 1)[0]
	p.cache(b, h[0])
	p.cache(a, h[0])
	if got := p.lookupFrom(nil, h, 1, []int32{a}, at); !slices.Equal(got, []int32{a}) {
		t.Errorf("lookupFrom the memo = %v, want [%d]", got, a)
	}
	if got := p.lookup(nil, h, 1); !slices.Equal(got, []int32{b}) {
		t.Errorf("lookup = %v, want the first block caching it, [%d]", got, b)
	}
}
