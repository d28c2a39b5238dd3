package tokenize

import (
	"encoding/binary"

	"github.com/dgraph-io/ristretto/v2"
	"github.com/zeebo/xxh3"

	"github.com/prefixrouter/prefixrouter/tokenize/bpe"
)

// segmentCache holds the ids of text segments between added tokens. A chat
// prompt is mostly segments seen before (system prompt, earlier turns), so
// re-tokenizing turn N only encodes the new text.
type segmentCache struct {
	c       *ristretto.Cache[string, []uint32]
	metrics *metrics
}

// Segments longer than this are not cached: one of them could evict many
// small, hot ones, and its encode time dwarfs the lookup anyway.
const maxCachedSegment = 1 << 20

func newSegmentCache(maxBytes int64, m *metrics) *segmentCache {
	return &segmentCache{c: newHashKeyedCache[[]uint32](maxBytes), metrics: m}
}

// newHashKeyedCache makes a ristretto cache bounded by maxBytes whose keys
// are already 128-bit hashes (16-byte strings), so ristretto's own hashing
// is skipped.
func newHashKeyedCache[V any](maxBytes int64) *ristretto.Cache[string, V] {
	c, err := ristretto.NewCache(&ristretto.Config[string, V]{
		NumCounters: max(maxBytes/100, 1000), // ~10 counters per expected entry
		MaxCost:     maxBytes,
		BufferItems: 64,
		KeyToHash: func(k string) (uint64, uint64) {
			return binary.LittleEndian.Uint64([]byte(k[:8])), binary.LittleEndian.Uint64([]byte(k[8:16]))
		},
	})
	if err != nil {
		// Only reachable with a zero NumCounters or MaxCost, which the
		// arithmetic above rules out.
		panic(err)
	}
	return c
}

func (s *segmentCache) close() { s.c.Close() }

// forModel returns the cache view of one loaded tokenizer, or nil when
// caching is off.
func (s *segmentCache) forModel(id uint64) bpe.SegmentCache {
	if s == nil {
		return nil
	}
	return &modelCache{s: s, id: id}
}

type modelCache struct {
	s  *segmentCache
	id uint64
}

// key is the 128-bit XXH3 of the segment, seeded with the tokenizer id and
// whether the segment starts the text (Metaspace prepend_scheme "first"
// encodes it differently): one fast pass over the text instead of building
// a key string and hashing it twice. Only a 2^-128 collision could hit
// wrongly.
func (m *modelCache) key(seg string, first bool) string {
	seed := m.id << 1
	if first {
		seed |= 1
	}
	h := xxh3.HashString128Seed(seg, seed)
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], h.Lo)
	binary.LittleEndian.PutUint64(b[8:], h.Hi)
	return string(b[:])
}

func (m *modelCache) Get(seg string, first bool) ([]uint32, bool) {
	ids, ok := m.s.c.Get(m.key(seg, first))
	if ok {
		m.s.metrics.cacheHits.Inc()
	} else {
		m.s.metrics.cacheMisses.Inc()
	}
	return ids, ok
}

func (m *modelCache) Set(seg string, first bool, ids []uint32) {
	if len(seg) > maxCachedSegment {
		return
	}
	m.s.c.Set(m.key(seg, first), ids, int64(4*len(ids)+64))
}
