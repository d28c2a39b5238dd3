package bpe

import (
	"hash/maphash"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
)

// wordCache caches merged words like HF's BPE cache: bounded, and once full
// it stops taking new entries instead of evicting. It is a fixed
// open-addressing table whose slots are only ever filled, never changed, so a
// lookup is a hash and a few atomic loads: no lock shared between the
// router's request goroutines, no allocation.
type wordCache struct {
	seed  maphash.Seed
	mix   [2]uint64 // per-process secrets of the short-word hash
	slots []atomic.Pointer[wordEntry]
	mask  uint64
	size  atomic.Int64
	limit int64
}

type wordEntry struct {
	word string
	ids  []uint32
	// small holds the ids of a word of few tokens (most words are one), so
	// a hit reads them from the entry's own cache line.
	small [4]uint32
}

const (
	wordCacheCap    = 16384
	wordCacheMaxLen = 256
	// wordProbe bounds a lookup; a word whose probe window is full is not
	// cached, which at the table's load (≤ 1/2) is rare.
	wordProbe = 8
)

func newWordCache() *wordCache {
	slots := 2 * wordCacheCap
	return &wordCache{seed: maphash.MakeSeed(), mix: [2]uint64{rand.Uint64() | 1, rand.Uint64() | 1},
		slots: make([]atomic.Pointer[wordEntry], slots), mask: uint64(slots - 1), limit: wordCacheCap}
}

// hash is maphash's for long words; a word of up to 16 bytes (nearly all
// of them) is read as two overlapping 64-bit loads and mixed by one wide
// multiply, which costs a fraction of maphash's call. The secrets are
// random per process, so a client cannot aim words at one probe window.
func (c *wordCache) hash(w string) uint64 {
	n := len(w)
	var a, b uint64
	switch {
	case n > 16:
		return maphash.String(c.seed, w)
	case n >= 8:
		a, b = le64(w, 0), le64(w, n-8)
	case n >= 4:
		a, b = uint64(le32(w, 0)), uint64(le32(w, n-4))
	case n > 0:
		a = uint64(w[0])<<16 | uint64(w[n>>1])<<8 | uint64(w[n-1])
	}
	hi, lo := bits.Mul64(a^c.mix[0], b^c.mix[1]^uint64(n))
	return hi ^ lo
}

func le64(s string, i int) uint64 {
	s = s[i : i+8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

func le32(s string, i int) uint32 {
	s = s[i : i+4]
	return uint32(s[0]) | uint32(s[1])<<8 | uint32(s[2])<<16 | uint32(s[3])<<24
}

func (c *wordCache) get(w string) ([]uint32, bool) {
	h := c.hash(w)
	for k := range uint64(wordProbe) {
		e := c.slots[(h+k)&c.mask].Load()
		if e == nil {
			return nil, false
		}
		if e.word == w {
			return e.ids, true
		}
	}
	return nil, false
}

func (c *wordCache) put(w string, ids []uint32) {
	if len(w) >= wordCacheMaxLen || c.size.Load() >= c.limit {
		return
	}
	e := &wordEntry{word: strings.Clone(w)}
	if len(ids) <= len(e.small) {
		e.ids = e.small[:copy(e.small[:], ids)]
	} else {
		e.ids = slices.Clone(ids)
	}
	h := c.hash(w)
	for k := range uint64(wordProbe) {
		slot := &c.slots[(h+k)&c.mask]
		if slot.CompareAndSwap(nil, e) {
			c.size.Add(1)
			return
		}
		if slot.Load().word == w {
			return // another goroutine cached it first
		}
	}
}
