package kvindex

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
)

// The serializers below write exactly the bytes Python produces for the
// values vLLM hashes: pickle.dumps(x, protocol=5) and
// cbor2.dumps(x, canonical=True). They are hand-written because the inputs
// are a tiny fixed shape (bytes, tuple of ints, optional tuple of extra keys)
// and a reusable buffer keeps hashing allocation-free; the golden vectors in
// testdata/vllm pin every byte.

// Pickle opcodes used by protocol 5 for these values.
const (
	pkProto           = 0x80
	pkFrame           = 0x95
	pkShortBinBytes   = 'C'
	pkBinBytes        = 'B'
	pkMemoize         = 0x94
	pkMark            = '('
	pkTuple           = 't'
	pkEmptyTuple      = ')'
	pkTuple1          = 0x85
	pkTuple2          = 0x86
	pkTuple3          = 0x87
	pkBinInt1         = 'K'
	pkBinInt2         = 'M'
	pkBinInt          = 'J'
	pkLong1           = 0x8a
	pkShortBinUnicode = 0x8c
	pkBinUnicode      = 'X'
	pkNone            = 'N'
	pkStop            = '.'
)

// pickleHeaderLen is PROTO 5 plus the FRAME opcode and its 8-byte length.
const pickleHeaderLen = 2 + 9

func pickleStart(dst []byte) ([]byte, int) {
	start := len(dst)
	dst = append(dst, pkProto, 5, pkFrame, 0, 0, 0, 0, 0, 0, 0, 0)
	return dst, start
}

// pickleFinish writes STOP and patches the frame length. Python only frames
// payloads of at least 4 bytes; every value hashed here is longer.
func pickleFinish(dst []byte, start int) []byte {
	dst = append(dst, pkStop)
	binary.LittleEndian.PutUint64(dst[start+3:start+11], uint64(len(dst)-start-pickleHeaderLen))
	return dst
}

func appendPickleRoot(dst []byte, seed string) []byte {
	dst, start := pickleStart(dst)
	dst = appendPickleString(dst, seed)
	return pickleFinish(dst, start)
}

func appendPickleBlock(dst []byte, parent []byte, tokens []uint32, extra []any) ([]byte, error) {
	dst, start := pickleStart(dst)
	dst = appendPickleBytes(dst, parent)
	dst = appendPickleTokenTuple(dst, tokens)
	if extra == nil {
		dst = append(dst, pkNone)
	} else {
		var err error
		if dst, err = appendPickleTuple(dst, extra); err != nil {
			return dst, err
		}
	}
	dst = append(dst, pkTuple3, pkMemoize)
	return pickleFinish(dst, start), nil
}

func appendPickleBytes(dst, b []byte) []byte {
	if len(b) < 256 {
		dst = append(dst, pkShortBinBytes, byte(len(b)))
	} else {
		dst = append(dst, pkBinBytes)
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(b)))
	}
	dst = append(dst, b...)
	return append(dst, pkMemoize)
}

func appendPickleString(dst []byte, s string) []byte {
	if len(s) < 256 {
		dst = append(dst, pkShortBinUnicode, byte(len(s)))
	} else {
		dst = append(dst, pkBinUnicode)
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(s)))
	}
	dst = append(dst, s...)
	return append(dst, pkMemoize)
}

func appendPickleInt(dst []byte, v int64) []byte {
	switch {
	case v >= 0 && v < 1<<8:
		return append(dst, pkBinInt1, byte(v))
	case v >= 0 && v < 1<<16:
		return append(dst, pkBinInt2, byte(v), byte(v>>8))
	case v >= math.MinInt32 && v <= math.MaxInt32:
		dst = append(dst, pkBinInt)
		return binary.LittleEndian.AppendUint32(dst, uint32(int32(v)))
	}
	// LONG1: minimal two's-complement little-endian bytes.
	var tmp [9]byte
	n := 0
	for x := v; ; x >>= 8 {
		tmp[n] = byte(x)
		n++
		if (x >= -128 && x < 128) && ((x < 0) == (tmp[n-1]&0x80 != 0)) {
			break
		}
	}
	dst = append(dst, pkLong1, byte(n))
	return append(dst, tmp[:n]...)
}

// tupleOpen/tupleClose follow pickle's save_tuple: small tuples use the
// TUPLEn opcodes, larger ones MARK ... TUPLE; every non-empty tuple is memoized.
func pickleTupleOpen(dst []byte, n int) []byte {
	if n > 3 {
		dst = append(dst, pkMark)
	}
	return dst
}

func pickleTupleClose(dst []byte, n int) []byte {
	switch n {
	case 0:
		return append(dst, pkEmptyTuple)
	case 1:
		dst = append(dst, pkTuple1)
	case 2:
		dst = append(dst, pkTuple2)
	case 3:
		dst = append(dst, pkTuple3)
	default:
		dst = append(dst, pkTuple)
	}
	return append(dst, pkMemoize)
}

func appendPickleTokenTuple(dst []byte, tokens []uint32) []byte {
	dst = pickleTupleOpen(dst, len(tokens))
	// Hot path: grow once and emit each int opcode with one 8-byte
	// little-endian store (opcode in the low byte, the value above it),
	// advancing by the opcode's real length; the slack absorbs the overlap.
	n := len(dst)
	dst = slices.Grow(dst, 5*len(tokens)+8)[:n+5*len(tokens)+8]
	for _, t := range tokens {
		v := uint64(t)
		switch {
		case v < 1<<8:
			binary.LittleEndian.PutUint64(dst[n:], v<<8|pkBinInt1)
			n += 2
		case v < 1<<16:
			binary.LittleEndian.PutUint64(dst[n:], v<<8|pkBinInt2)
			n += 3
		case v <= math.MaxInt32:
			binary.LittleEndian.PutUint64(dst[n:], v<<8|pkBinInt)
			n += 5
		default:
			dst = appendPickleInt(dst[:n], int64(t))
			n = len(dst)
			dst = slices.Grow(dst, 5*len(tokens)+8)[:n+5*len(tokens)+8]
		}
	}
	return pickleTupleClose(dst[:n], len(tokens))
}

func appendPickleTuple(dst []byte, items []any) ([]byte, error) {
	dst = pickleTupleOpen(dst, len(items))
	for _, it := range items {
		var err error
		if dst, err = appendPickleValue(dst, it); err != nil {
			return dst, err
		}
	}
	return pickleTupleClose(dst, len(items)), nil
}

func appendPickleValue(dst []byte, v any) ([]byte, error) {
	switch x := v.(type) {
	case nil:
		return append(dst, pkNone), nil
	case string:
		return appendPickleString(dst, x), nil
	case []byte:
		return appendPickleBytes(dst, x), nil
	case int:
		return appendPickleInt(dst, int64(x)), nil
	case int64:
		return appendPickleInt(dst, x), nil
	case []any:
		return appendPickleTuple(dst, x)
	}
	return dst, fmt.Errorf("extra key of unsupported type %T", v)
}

// CBOR (RFC 8949) major types, as cbor2's canonical encoder writes them.
const (
	cborUint   = 0 << 5
	cborNegInt = 1 << 5
	cborBytes  = 2 << 5
	cborText   = 3 << 5
	cborArray  = 4 << 5
	cborNull   = 0xf6
)

func appendCBORHead(dst []byte, major byte, n uint64) []byte {
	switch {
	case n < 24:
		return append(dst, major|byte(n))
	case n < 1<<8:
		return append(dst, major|24, byte(n))
	case n < 1<<16:
		return append(dst, major|25, byte(n>>8), byte(n))
	case n < 1<<32:
		return append(dst, major|26, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	dst = append(dst, major|27)
	return binary.BigEndian.AppendUint64(dst, n)
}

func appendCBORString(dst []byte, s string) []byte {
	dst = appendCBORHead(dst, cborText, uint64(len(s)))
	return append(dst, s...)
}

func appendCBORInt(dst []byte, v int64) []byte {
	if v >= 0 {
		return appendCBORHead(dst, cborUint, uint64(v))
	}
	return appendCBORHead(dst, cborNegInt, uint64(-1-v))
}

func appendCBORBlock(dst []byte, parent []byte, tokens []uint32, extra []any) ([]byte, error) {
	dst = appendCBORHead(dst, cborArray, 3)
	dst = appendCBORHead(dst, cborBytes, uint64(len(parent)))
	dst = append(dst, parent...)
	dst = appendCBORHead(dst, cborArray, uint64(len(tokens)))
	n := len(dst)
	dst = slices.Grow(dst, 5*len(tokens)+8)[:n+5*len(tokens)+8]
	for _, t := range tokens {
		v := uint64(t)
		switch {
		case v < 24:
			dst[n] = byte(v)
			n++
		case v < 1<<8:
			dst[n], dst[n+1] = 24, byte(v)
			n += 2
		case v < 1<<16:
			binary.BigEndian.PutUint32(dst[n:], 25<<24|uint32(v)<<8)
			n += 3
		default:
			binary.BigEndian.PutUint64(dst[n:], 26<<56|v<<24)
			n += 5
		}
	}
	dst = dst[:n]
	if extra == nil {
		return append(dst, cborNull), nil
	}
	return appendCBORValue(dst, extra)
}

func appendCBORValue(dst []byte, v any) ([]byte, error) {
	switch x := v.(type) {
	case nil:
		return append(dst, cborNull), nil
	case string:
		return appendCBORString(dst, x), nil
	case []byte:
		dst = appendCBORHead(dst, cborBytes, uint64(len(x)))
		return append(dst, x...), nil
	case int:
		return appendCBORInt(dst, int64(x)), nil
	case int64:
		return appendCBORInt(dst, x), nil
	case []any:
		dst = appendCBORHead(dst, cborArray, uint64(len(x)))
		for _, it := range x {
			var err error
			if dst, err = appendCBORValue(dst, it); err != nil {
				return dst, err
			}
		}
		return dst, nil
	}
	return dst, fmt.Errorf("extra key of unsupported type %T", v)
}
