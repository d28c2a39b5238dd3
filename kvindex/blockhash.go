package kvindex

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"

	"github.com/zeebo/xxh3"
)

// HashAlgo is one of vLLM's --prefix-caching-hash-algo values.
type HashAlgo uint8

// The four algorithms vLLM offers. The zero value is invalid on purpose so a
// forgotten configuration fails loudly instead of hashing with a default.
const (
	AlgoSHA256     HashAlgo = iota + 1 // SHA-256 of a pickle protocol-5 dump (vLLM's default)
	AlgoSHA256CBOR                     // SHA-256 of canonical CBOR
	AlgoXXHash                         // XXH3-128 of the pickle dump
	AlgoXXHashCBOR                     // XXH3-128 of canonical CBOR
)

var algoNames = map[HashAlgo]string{
	AlgoSHA256:     "sha256",
	AlgoSHA256CBOR: "sha256_cbor",
	AlgoXXHash:     "xxhash",
	AlgoXXHashCBOR: "xxhash_cbor",
}

// HashAlgoNames lists the accepted algorithm names, vLLM's spelling.
func HashAlgoNames() []string { return []string{"sha256", "sha256_cbor", "xxhash", "xxhash_cbor"} }

// ParseHashAlgo accepts vLLM's spelling of an algorithm name.
func ParseHashAlgo(name string) (HashAlgo, error) {
	for a, n := range algoNames {
		if n == name {
			return a, nil
		}
	}
	return 0, fmt.Errorf("unknown hash algorithm %q (want one of %s)", name, strings.Join(HashAlgoNames(), ", "))
}

func (a HashAlgo) String() string {
	if n, ok := algoNames[a]; ok {
		return n
	}
	return fmt.Sprintf("HashAlgo(%d)", uint8(a))
}

func (a HashAlgo) usesCBOR() bool { return a == AlgoSHA256CBOR || a == AlgoXXHashCBOR }

// DigestSize is the length in bytes of the algorithm's full digest.
func (a HashAlgo) DigestSize() int {
	if a == AlgoXXHash || a == AlgoXXHashCBOR {
		return 16
	}
	return 32
}

// Digest is a full block digest (32 bytes for SHA-256, 16 for XXH3-128). It is
// a value type so chaining a prompt's blocks does not allocate per block.
type Digest struct {
	b [32]byte
	n uint8
}

// DigestFromBytes copies a raw digest (16 or 32 bytes).
func DigestFromBytes(b []byte) (Digest, error) {
	var d Digest
	if len(b) != 16 && len(b) != 32 {
		return d, fmt.Errorf("digest of %d bytes (want 16 or 32)", len(b))
	}
	d.n = uint8(copy(d.b[:], b))
	return d, nil
}

// Bytes returns the digest bytes.
func (d *Digest) Bytes() []byte { return d.b[:d.n] }

// Hex returns the digest in lower-case hex.
func (d Digest) Hex() string { return hex.EncodeToString(d.b[:d.n]) }

// Wire is the value vLLM publishes in KV events (and the index key in exact
// mode): the digest's last 8 bytes read as a big-endian unsigned integer.
func (d Digest) Wire() uint64 {
	if d.n < 8 {
		return 0
	}
	return binary.BigEndian.Uint64(d.b[d.n-8 : d.n])
}

// IsZero reports whether the digest is unset.
func (d Digest) IsZero() bool { return d.n == 0 }

// Hasher computes vLLM block digests for one (algorithm, seed, block size).
// It is immutable and safe for concurrent use.
type Hasher struct {
	algo      HashAlgo
	blockSize int
	root      Digest
}

// MaxBlockSize bounds the tokens per block. vLLM's pickle framing splits frames
// above 64 KiB; blocks this size stay far below that limit.
const MaxBlockSize = 4096

// NewHasher prepares a hasher. seed is the PYTHONHASHSEED string exactly as the
// pods see it: vLLM hashes the string, not a number, so "0" and "00" differ.
func NewHasher(algo HashAlgo, seed string, blockSize int) (*Hasher, error) {
	if _, ok := algoNames[algo]; !ok {
		return nil, fmt.Errorf("unknown hash algorithm %d", algo)
	}
	if blockSize <= 0 || blockSize > MaxBlockSize {
		return nil, fmt.Errorf("block size %d out of range 1..%d", blockSize, MaxBlockSize)
	}
	h := &Hasher{algo: algo, blockSize: blockSize}
	buf := getBuf()
	defer putBuf(buf)
	if algo.usesCBOR() {
		*buf = appendCBORString((*buf)[:0], seed)
	} else {
		*buf = appendPickleRoot((*buf)[:0], seed)
	}
	h.root = h.digest(*buf)
	return h, nil
}

// NewHasherWithRoot prepares a hasher whose block-0 parent is a given digest
// rather than the hash of a seed string. vLLM does this when PYTHONHASHSEED
// is unset: the root is 32 random bytes per process. Only a simulator (or a
// test) knows such a root; a router facing such pods uses token-derived keys.
func NewHasherWithRoot(algo HashAlgo, root []byte, blockSize int) (*Hasher, error) {
	h, err := NewHasher(algo, "", blockSize)
	if err != nil {
		return nil, err
	}
	if len(root) == 0 || len(root) > 32 {
		return nil, fmt.Errorf("root of %d bytes (want 1..32)", len(root))
	}
	h.root = Digest{n: uint8(len(root))}
	copy(h.root.b[:], root)
	return h, nil
}

// Algo returns the configured algorithm.
func (h *Hasher) Algo() HashAlgo { return h.algo }

// BlockSize returns tokens per block.
func (h *Hasher) BlockSize() int { return h.blockSize }

// Root is the parent digest of block 0: H(serialize(seed string)).
func (h *Hasher) Root() Digest { return h.root }

func (h *Hasher) digest(b []byte) Digest {
	var d Digest
	switch h.algo {
	case AlgoSHA256, AlgoSHA256CBOR:
		d.b = sha256.Sum256(b)
		d.n = 32
	default:
		s := xxh3.Hash128(b).Bytes() // canonical big-endian, as Python's xxh3_128_digest
		copy(d.b[:], s[:])
		d.n = 16
	}
	return d
}

// Serialize returns the exact bytes vLLM hashes for one block:
// serialize((parent, tuple(tokens), extra or None)).
func (h *Hasher) Serialize(dst []byte, parent Digest, tokens []uint32, extra []any) ([]byte, error) {
	if h.algo.usesCBOR() {
		return appendCBORBlock(dst, parent.Bytes(), tokens, extra)
	}
	return appendPickleBlock(dst, parent.Bytes(), tokens, extra)
}

// HashBlock computes one block digest chained on parent. extra nil means
// Python None.
func (h *Hasher) HashBlock(parent Digest, tokens []uint32, extra []any) (Digest, error) {
	buf := getBuf()
	defer putBuf(buf)
	b, err := h.Serialize((*buf)[:0], parent, tokens, extra)
	*buf = b
	if err != nil {
		return Digest{}, err
	}
	return h.digest(b), nil
}

// Digests chains every full block of tokens from the root, appending to dst.
// Trailing tokens that do not fill a block are ignored, as in vLLM.
func (h *Hasher) Digests(dst []Digest, tokens []uint32, extras RequestExtras) ([]Digest, error) {
	_, err := h.chain(0, h.root, tokens, extras, &dst, nil)
	return dst, err
}

// Keys implements Keyer: the wire values of every full block.
func (h *Hasher) Keys(dst []Key, tokens []uint32, extras RequestExtras) ([]Key, error) {
	_, err := h.chain(0, h.root, tokens, extras, nil, &dst)
	return dst, err
}

// Extend implements Keyer.
func (h *Hasher) Extend(c *KeyChain, tokens []uint32, extras RequestExtras) error {
	parent := c.parent
	if len(c.Keys) == 0 {
		parent = h.root
	}
	parent, err := h.chain(len(c.Keys), parent, tokens, extras, nil, &c.Keys)
	c.parent = parent
	return err
}

// chain hashes every full block of tokens from block first (chained on
// parent), appending digests or wire keys, and returns the last digest. It
// runs for every request, so it avoids a callback per block and builds
// extra keys only when the request has any.
func (h *Hasher) chain(first int, parent Digest, tokens []uint32, extras RequestExtras, digests *[]Digest, keys *[]Key) (Digest, error) {
	n := len(tokens) / h.blockSize
	buf := getBuf()
	defer putBuf(buf)
	hasExtras := extras.LoRAName != "" || extras.CacheSalt != "" || len(extras.MM) > 0
	var extraBuf [4]any
	for i := first; i < n; i++ {
		start := i * h.blockSize
		var extra []any
		if hasExtras {
			extra = extras.AppendBlockExtra(extraBuf[:0], i, start, start+h.blockSize)
		}
		b, err := h.Serialize((*buf)[:0], parent, tokens[start:start+h.blockSize], extra)
		*buf = b
		if err != nil {
			return parent, fmt.Errorf("block %d: %w", i, err)
		}
		parent = h.digest(b)
		if keys != nil {
			*keys = append(*keys, Key(parent.Wire()))
		} else {
			*digests = append(*digests, parent)
		}
	}
	return parent, nil
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

func getBuf() *[]byte  { return bufPool.Get().(*[]byte) }
func putBuf(b *[]byte) { bufPool.Put(b) }
