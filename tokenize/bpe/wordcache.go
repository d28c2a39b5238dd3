package bpe

import (
	"hash/maphash"
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
	return &wordCache{seed: maphash.MakeSeed(), slots: make([]atomic.Pointer[wordEntry], slots),
		mask: uint64(slots - 1), limit: wordCacheCap}
}

func (c *wordCache) get(w string) ([]uint32, bool) {
	h := maphash.String(c.seed, w)
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
	h := maphash.String(c.seed, w)
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
