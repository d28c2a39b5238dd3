package tokenize

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"

	"github.com/dgraph-io/ristretto/v2"
	"github.com/zeebo/xxh3"

	"github.com/prefixrouter/prefixrouter/tokenize/chat"
)

// valueCache holds decoded chat messages (and tool definitions) by the hash
// of their raw JSON. Turn N of a conversation re-sends turns 1..N-1 byte for
// byte, and decoding them again was ~40% of rendering a long chat. Sharing
// a decoded value between requests is safe because template values are
// immutable: chat templates run sandboxed with immutable lists and dicts
// (list.append and friends raise, namespace() and dict() copy), so one
// render cannot change what another sees.
//
// The cache only decodes: the template still sees every message of every
// request, so the render stays exact whatever the template reads.
type valueCache struct {
	c       *ristretto.Cache[string, chat.Value]
	seed    uint64
	metrics *metrics
}

// Elements shorter than this are decoded directly: a hash and a lookup cost
// about as much as decoding them.
const minCachedElem = 32

func newValueCache(maxBytes int64, m *metrics) *valueCache {
	// A per-process seed: clients choose message bytes, and a known seed
	// would let one craft a collision with another client's message.
	return &valueCache{c: newHashKeyedCache[chat.Value](maxBytes), seed: rand.Uint64(), metrics: m}
}

func (v *valueCache) close() {
	if v != nil {
		v.c.Close()
	}
}

// putKey appends an element's key to dst: the seeded 128-bit XXH3 of its
// raw bytes. The decoded value is a function of those bytes alone
// (FromJSONElem), so nothing else belongs in the key.
func (v *valueCache) putKey(dst []byte, raw []byte) []byte {
	h := xxh3.Hash128Seed(raw, v.seed)
	dst = binary.LittleEndian.AppendUint64(dst, h.Lo)
	return binary.LittleEndian.AppendUint64(dst, h.Hi)
}

// decode turns a request's raw JSON field into a template value: None when
// empty, else the value and error chat.FromJSON gives, with the elements of
// an array served from the cache when seen before. A nil cache decodes
// everything.
func (v *valueCache) decode(raw []byte) (chat.Value, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return nil, nil
	}
	if v == nil {
		return chat.FromJSON(raw)
	}
	elems, ok := chat.ArrayElems(raw)
	if !ok || len(elems) == 0 {
		return chat.FromJSON(raw)
	}
	// All the keys in one allocation rather than one each: ristretto
	// hashes a key and keeps only the hash.
	kb := make([]byte, 0, 16*len(elems))
	for _, e := range elems {
		if len(e) >= minCachedElem {
			kb = v.putKey(kb, e)
		}
	}
	keys := string(kb)
	// The counters are added to once per request, not per element.
	var hits, misses int
	defer func() {
		if hits > 0 {
			v.metrics.msgHits.Add(float64(hits))
		}
		if misses > 0 {
			v.metrics.msgMisses.Add(float64(misses))
		}
	}()
	l := &chat.List{Items: make([]chat.Value, len(elems))}
	for i, e := range elems {
		if len(e) < minCachedElem {
			x, err := chat.FromJSONElem(e)
			if err != nil {
				// Report the error FromJSON gives for the whole array
				// (its offsets), exactly as without the cache.
				return chat.FromJSON(raw)
			}
			l.Items[i] = x
			continue
		}
		k := keys[:16]
		keys = keys[16:]
		if x, ok := v.c.Get(k); ok {
			hits++
			l.Items[i] = x
			continue
		}
		misses++
		x, err := chat.FromJSONElem(e)
		if err != nil {
			return chat.FromJSON(raw)
		}
		l.Items[i] = x
		// Cost: the decoded strings are about the raw size; the rest is
		// dict and interface overhead.
		v.c.Set(k, x, int64(len(e))+128)
	}
	return l, nil
}
