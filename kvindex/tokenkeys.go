package kvindex

import (
	"encoding/binary"
	"fmt"

	"github.com/zeebo/xxh3"

	"github.com/prefixrouter/prefixrouter/internal/flatmap"
)

// TokenKeyer derives block keys from token ids alone, for fleets whose
// PYTHONHASHSEED is unknown (vLLM then seeds its hashes with random bytes per
// process, so its hashes cannot be reproduced). Keys chain like vLLM's:
// key(i) = XXH3-64(tokens(i) ‖ extra(i)) seeded with key(i-1), so a key still
// identifies the whole prefix up to and including its block. Events are
// translated into these keys by the Ingestor from their token_ids.
type TokenKeyer struct {
	blockSize int
}

// tokenKeyRoot seeds block 0's chain; any fixed value works, this one spells
// "prefixrt" so it is recognisable in dumps.
const tokenKeyRoot Key = 0x7072656669787274

// NewTokenKeyer makes a keyer for the given block size.
func NewTokenKeyer(blockSize int) (*TokenKeyer, error) {
	if blockSize <= 0 || blockSize > MaxBlockSize {
		return nil, fmt.Errorf("block size %d out of range 1..%d", blockSize, MaxBlockSize)
	}
	return &TokenKeyer{blockSize: blockSize}, nil
}

// BlockSize returns tokens per block.
func (t *TokenKeyer) BlockSize() int { return t.blockSize }

// Root is the parent key of block 0.
func (t *TokenKeyer) Root() Key { return tokenKeyRoot }

// KeyBlock chains one block on parent. extra is the block's extra-key tuple
// (nil for None), serialized canonically so that request-side extras and the
// extra_keys published in events produce the same key.
func (t *TokenKeyer) KeyBlock(parent Key, tokens []uint32, extra []any) (Key, error) {
	buf := getBuf()
	defer putBuf(buf)
	b := (*buf)[:0]
	for _, tok := range tokens {
		b = binary.LittleEndian.AppendUint32(b, tok)
	}
	if extra != nil {
		var err error
		if b, err = appendCBORValue(b, extra); err != nil {
			*buf = b
			return 0, err
		}
	}
	*buf = b
	return Key(xxh3.HashSeed(b, uint64(parent))), nil
}

// Keys implements Keyer.
func (t *TokenKeyer) Keys(dst []Key, tokens []uint32, extras RequestExtras) ([]Key, error) {
	c := KeyChain{Keys: dst[len(dst):]}
	err := t.Extend(&c, tokens, extras)
	return append(dst, c.Keys...), err
}

// Extend implements Keyer: a token-derived key is its own chain state.
func (t *TokenKeyer) Extend(c *KeyChain, tokens []uint32, extras RequestExtras) error {
	parent := tokenKeyRoot
	if len(c.Keys) > 0 {
		parent = c.Keys[len(c.Keys)-1]
	}
	var extraBuf [4]any
	n := len(tokens) / t.blockSize
	for i := len(c.Keys); i < n; i++ {
		start := i * t.blockSize
		k, err := t.KeyBlock(parent, tokens[start:start+t.blockSize], extras.AppendBlockExtra(extraBuf[:0], i, start, start+t.blockSize))
		if err != nil {
			return fmt.Errorf("block %d: %w", i, err)
		}
		c.Keys = append(c.Keys, k)
		parent = k
	}
	return nil
}

// engineKeyMap remembers, for one target, which router key each engine hash
// stands for, so BlockRemoved (which carries only engine hashes) and later
// BlockStored events (whose parent is an engine hash) resolve. Only blocks
// whose key could be derived are kept: a block whose parent was unknown
// resolves to no key whether remembered or not. An entry is forgotten once
// the target holds its block nowhere (Ingestor.forgetRemoved), so the map
// follows the pod's cache rather than every block it ever stored; two
// generations bound it all the same (removals the router missed): when the
// young one fills, the old one is dropped.
// Its ingestState's mu guards it.
type engineKeyMap struct {
	// young and old are flat maps: every event probes them, and they hold
	// up to limit entries, far beyond the CPU caches. old is nil until the
	// first generation fills.
	young, old *flatmap.Map[Key]
	limit      int // entries per generation
}

func newEngineKeyMap(limit int) *engineKeyMap {
	if limit < 2 {
		limit = 2
	}
	return &engineKeyMap{young: &flatmap.Map[Key]{}, limit: limit / 2}
}

func (m *engineKeyMap) get(h uint64) (Key, bool) {
	if k, ok := m.young.Get(h); ok {
		return k, true
	}
	if m.old == nil {
		return 0, false
	}
	if k, ok := m.old.Get(h); ok {
		m.put(h, k) // promote what is still in use
		return k, true
	}
	return 0, false
}

// peek is get without promotion.
func (m *engineKeyMap) peek(h uint64) (Key, bool) {
	if k, ok := m.young.Get(h); ok {
		return k, true
	}
	if m.old == nil {
		return 0, false
	}
	return m.old.Get(h)
}

// forget drops h from both generations.
func (m *engineKeyMap) forget(h uint64) {
	m.young.Delete(h)
	if m.old != nil {
		m.old.Delete(h)
	}
}

func (m *engineKeyMap) put(h uint64, k Key) {
	if m.young.Len() >= m.limit {
		m.old, m.young = m.young, &flatmap.Map[Key]{}
	}
	m.young.Put(h, k)
}

func (m *engineKeyMap) reset() {
	m.young, m.old = &flatmap.Map[Key]{}, nil
}
