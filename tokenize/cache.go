package tokenize

import (
	"encoding/binary"

	"github.com/dgraph-io/ristretto/v2"

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
	c, err := ristretto.NewCache(&ristretto.Config[string, []uint32]{
		NumCounters: max(maxBytes/100, 1000), // ~10 counters per expected entry
		MaxCost:     maxBytes,
		BufferItems: 64,
	})
	if err != nil {
		// Only reachable with a zero NumCounters or MaxCost, which the
		// arithmetic above rules out.
		panic(err)
	}
	return &segmentCache{c: c, metrics: m}
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

// key prefixes the segment with the tokenizer id and whether the segment
// starts the text (Metaspace prepend_scheme "first" encodes it differently).
func (m *modelCache) key(seg string, first bool) string {
	b := make([]byte, 9, 9+len(seg))
	binary.LittleEndian.PutUint64(b, m.id)
	if first {
		b[8] = 1
	}
	return string(append(b, seg...))
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
	m.s.c.Set(m.key(seg, first), ids, int64(4*len(ids)+len(seg)+64))
}
