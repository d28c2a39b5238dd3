package events

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// maxNesting bounds recursion into extra-key values so a hostile payload
// cannot blow the stack.
const maxNesting = 8

var decoderPool = sync.Pool{New: func() any { return msgpack.NewDecoder(nil) }}

// Limits bound what one batch may carry; a zero field is no bound. A batch
// beyond one is refused whole with a *LimitError, found while decoding, so
// that what a message declares costs nothing beyond the bytes it holds.
type Limits struct {
	// MaxEvents bounds a batch's events (known or not).
	MaxEvents int
	// MaxBlocksPerEvent bounds one event's block_hashes.
	MaxBlocksPerEvent int
	// MaxTokensPerEvent bounds one event's token_ids while they are read;
	// after the event, token_ids beyond block_hashes × block_size are
	// refused whatever the limits (vLLM sends the stored blocks' tokens).
	MaxTokensPerEvent int
}

// Limit names, the reason a *LimitError gives.
const (
	LimitEvents = "events"
	LimitBlocks = "blocks"
	LimitTokens = "tokens"
)

// LimitError is a batch refused for exceeding a Limits bound (or token_ids
// beyond its blocks).
type LimitError struct {
	What  string // LimitEvents, LimitBlocks or LimitTokens
	Event int    // the event's index in the batch
	Got   int    // what was declared
	Max   int
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("event %d: %d %s exceed the bound of %d", e.Event, e.Got, e.What, e.Max)
}

// minEventBytes is what an event takes on the wire at the least; it
// bounds the events slice allocated before they are read.
const minEventBytes = 16

// Decode parses one EventBatch payload. Events may be maps keyed by field
// name (first key "type") or positional arrays whose first item is the type
// tag; both may appear in one batch. Unknown keys and trailing positional
// fields are ignored, missing optional fields are tolerated, and hashes may be
// unsigned, signed or raw bytes. Any structural problem is an error: the
// caller counts it and skips the batch.
func Decode(payload []byte) (b Batch, err error) { return DecodeLimited(payload, Limits{}) }

// DecodeLimited is Decode with lim's bounds: a batch beyond one is refused
// with a *LimitError.
func DecodeLimited(payload []byte, lim Limits) (b Batch, err error) {
	r := bytes.NewReader(payload)
	md := decoderPool.Get().(*msgpack.Decoder)
	md.Reset(r)
	defer decoderPool.Put(md)
	d := &decoder{Decoder: md, r: r, payload: payload, lim: lim}

	n, err := d.DecodeArrayLen()
	if err != nil {
		return b, fmt.Errorf("batch: %w", err)
	}
	if n < 2 {
		return b, fmt.Errorf("batch array of %d items (want 2 or 3)", n)
	}
	if b.TS, err = decodeFloat(d); err != nil {
		return b, fmt.Errorf("batch timestamp: %w", err)
	}
	ne, err := d.DecodeArrayLen()
	if err != nil {
		return b, fmt.Errorf("batch events: %w", err)
	}
	if ne < 0 {
		return b, errors.New("batch events is nil")
	}
	if lim.MaxEvents > 0 && ne > lim.MaxEvents {
		return b, &LimitError{What: LimitEvents, Event: 0, Got: ne, Max: lim.MaxEvents}
	}
	// An event is a few hundred bytes in memory and a few dozen on the
	// wire: allocate for what the bytes can hold, not what is declared.
	b.Events = make([]Event, 0, min(ne, r.Len()/minEventBytes, 1024))
	for i := 0; i < ne; i++ {
		d.event = i
		ev, err := decodeEvent(d)
		if le := (*LimitError)(nil); errors.As(err, &le) {
			return b, le
		}
		if err != nil {
			return b, fmt.Errorf("event %d: %w", i, err)
		}
		if ev.Kind == KindUnknown {
			b.Unknown++
			continue
		}
		// A well-formed event whose fields make no sense is dropped on its
		// own: the rest of the batch (often the step's GPU events next to
		// an offloading connector's) still counts.
		if err := checkEvent(&ev); err != nil {
			b.Invalid++
			if b.FirstInvalid == nil {
				b.FirstInvalid = fmt.Errorf("event %d: %w", i, err)
			}
			continue
		}
		// token_ids are the stored blocks' tokens: more says the event is
		// not what it claims, and would cost memory it did not declare.
		if ev.Kind == KindBlockStored && ev.BlockSize > 0 && len(ev.TokenIDs) > len(ev.BlockHashes)*ev.BlockSize {
			return b, &LimitError{What: LimitTokens, Event: i, Got: len(ev.TokenIDs), Max: len(ev.BlockHashes) * ev.BlockSize}
		}
		b.Events = append(b.Events, ev)
	}
	if n >= 3 {
		if isNil(d) {
			_ = d.DecodeNil()
		} else {
			rank, err := decodeInt(d)
			if err != nil {
				return b, fmt.Errorf("batch data_parallel_rank: %w", err)
			}
			if rank < 0 || rank > math.MaxInt32 {
				return b, fmt.Errorf("data_parallel_rank %d out of range", rank)
			}
			b.DPRank, b.HasDPRank = int(rank), true
		}
	}
	for i := 3; i < n; i++ {
		if err := skipValue(d, 0); err != nil {
			return b, fmt.Errorf("batch trailing item: %w", err)
		}
	}
	if r.Len() != 0 {
		return b, fmt.Errorf("%d trailing bytes after batch", r.Len())
	}
	return b, nil
}

// decoder wraps the msgpack decoder with the payload it reads, so that
// declared string and binary lengths can be checked against the bytes that
// remain before the library allocates for them (it trusts a declared length,
// and a hostile 4 GiB header must not cost 4 GiB).
type decoder struct {
	*msgpack.Decoder
	r       *bytes.Reader
	payload []byte
	lim     Limits
	event   int // the event being read, for a LimitError
}

// blob reads a str or bin value after checking that its declared length fits.
func (d *decoder) blob() ([]byte, error) {
	pos := len(d.payload) - d.r.Len()
	if pos >= len(d.payload) {
		return nil, errors.New("unexpected end of payload")
	}
	c, rest := d.payload[pos], d.payload[pos+1:]
	var n, hdr int
	switch {
	case msgpcode.IsFixedString(c):
		n = int(c & msgpcode.FixedStrMask)
	case c == msgpcode.Str8 || c == msgpcode.Bin8:
		hdr = 1
	case c == msgpcode.Str16 || c == msgpcode.Bin16:
		hdr = 2
	case c == msgpcode.Str32 || c == msgpcode.Bin32:
		hdr = 4
	default:
		return nil, fmt.Errorf("want string or bytes, got msgpack code %#x", c)
	}
	if len(rest) < hdr {
		return nil, errors.New("truncated length")
	}
	for i := 0; i < hdr; i++ {
		n = n<<8 | int(rest[i])
	}
	if n > len(rest)-hdr {
		return nil, fmt.Errorf("declared length %d exceeds the %d bytes left", n, len(rest)-hdr)
	}
	return d.DecodeBytes()
}

// extFits checks an ext value's declared length against the bytes left.
func (d *decoder) extFits(c byte) error {
	pos := len(d.payload) - d.r.Len()
	hdr := map[byte]int{msgpcode.Ext8: 1, msgpcode.Ext16: 2, msgpcode.Ext32: 4}[c]
	rest := d.payload[pos+1:]
	if len(rest) < hdr {
		return errors.New("truncated length")
	}
	n := 0
	for i := 0; i < hdr; i++ {
		n = n<<8 | int(rest[i])
	}
	if n+1 > len(rest)-hdr { // +1: the ext type byte
		return fmt.Errorf("declared ext length %d exceeds the %d bytes left", n, len(rest)-hdr)
	}
	return nil
}

// str reads a string with the same length check.
func (d *decoder) str() (string, error) {
	b, err := d.blob()
	return string(b), err
}

func isNil(d *decoder) bool {
	c, err := d.PeekCode()
	return err == nil && c == msgpcode.Nil
}

func decodeEvent(d *decoder) (Event, error) {
	c, err := d.PeekCode()
	if err != nil {
		return Event{}, err
	}
	if msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32 {
		return decodeMapEvent(d)
	}
	return decodeArrayEvent(d)
}

func decodeMapEvent(d *decoder) (Event, error) {
	var ev Event
	n, err := d.DecodeMapLen()
	if err != nil {
		return ev, err
	}
	if n < 0 {
		return ev, errors.New("event is nil")
	}
	haveType := false
	for i := 0; i < n; i++ {
		key, err := d.str()
		if err != nil {
			return ev, fmt.Errorf("field name: %w", err)
		}
		if key == "type" {
			tag, err := d.str()
			if err != nil {
				return ev, fmt.Errorf("type: %w", err)
			}
			ev.Kind = kindFromTag(tag)
			haveType = true
			continue
		}
		if err := decodeField(d, &ev, key); err != nil {
			return ev, fmt.Errorf("%s: %w", key, err)
		}
	}
	if !haveType {
		return ev, errors.New(`event map without "type"`)
	}
	return ev, nil
}

// Positional field order of the array encoding, after the type tag.
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
	removedFields = []string{"block_hashes", "medium", "group_idx"}
)

func decodeArrayEvent(d *decoder) (Event, error) {
	var ev Event
	n, err := d.DecodeArrayLen()
	if err != nil {
		return ev, err
	}
	if n < 1 {
		return ev, errors.New("empty event array")
	}
	tag, err := d.str()
	if err != nil {
		return ev, fmt.Errorf("type tag: %w", err)
	}
	ev.Kind = kindFromTag(tag)
	var fields []string
	switch ev.Kind {
	case KindBlockStored:
		fields = storedFields
	case KindBlockRemoved:
		fields = removedFields
	}
	for i := 1; i < n; i++ {
		if i-1 < len(fields) {
			if err := decodeField(d, &ev, fields[i-1]); err != nil {
				return ev, fmt.Errorf("%s: %w", fields[i-1], err)
			}
			continue
		}
		if err := skipValue(d, 0); err != nil {
			return ev, err
		}
	}
	return ev, nil
}

// checkEvent enforces what vLLM's structs guarantee. An offloading
// connector's BlockStored carries no token_ids and block_size 0 (the blocks
// were already announced on the GPU); that is valid.
func checkEvent(ev *Event) error {
	switch ev.Kind {
	case KindBlockStored:
		if len(ev.BlockHashes) == 0 {
			return errors.New("BlockStored without block_hashes")
		}
		if len(ev.TokenIDs) > 0 && ev.BlockSize <= 0 {
			return fmt.Errorf("BlockStored with %d token_ids and block_size %d", len(ev.TokenIDs), ev.BlockSize)
		}
		if ev.HasExtraKeys && len(ev.ExtraKeys) != len(ev.BlockHashes) {
			return fmt.Errorf("BlockStored with %d extra_keys for %d blocks", len(ev.ExtraKeys), len(ev.BlockHashes))
		}
	case KindBlockRemoved:
		if len(ev.BlockHashes) == 0 {
			return errors.New("BlockRemoved without block_hashes")
		}
	}
	return nil
}

func decodeField(d *decoder, ev *Event, key string) error {
	var err error
	switch key {
	case "block_hashes":
		ev.BlockHashes, err = decodeHashList(d, d.lim.MaxBlocksPerEvent)
	case "parent_block_hash":
		if isNil(d) {
			return d.DecodeNil()
		}
		// vLLM sends nil for a chain's first block; publishers of the
		// legacy array form seen in the field send 0. No block hashes to
		// 0 but by a 2^-64 chance, so 0 is "no parent" in either form.
		ev.ParentHash, err = decodeHash(d)
		ev.HasParentHash = err == nil && ev.ParentHash != 0
	case "token_ids":
		ev.TokenIDs, err = decodeTokenList(d, d.lim.MaxTokensPerEvent)
	case "block_size":
		var v int64
		if v, err = decodeInt(d); err == nil {
			if v < 0 || v > math.MaxInt32 {
				return fmt.Errorf("%d out of range", v)
			}
			ev.BlockSize = int(v)
		}
	case "lora_id":
		if isNil(d) {
			return d.DecodeNil()
		}
		ev.LoRAID, err = decodeInt(d)
		ev.HasLoRAID = err == nil
	case "medium":
		ev.Medium, err = decodeOptString(d)
	case "lora_name":
		ev.LoRAName, err = decodeOptString(d)
	case "extra_keys":
		if isNil(d) {
			return d.DecodeNil()
		}
		ev.ExtraKeys, err = decodeExtraKeys(d)
		ev.HasExtraKeys = err == nil
	case "group_idx":
		if isNil(d) {
			return d.DecodeNil()
		}
		var v int64
		if v, err = decodeInt(d); err == nil {
			if v < 0 || v > math.MaxInt32 {
				return fmt.Errorf("%d out of range", v)
			}
			ev.GroupIdx, ev.HasGroupIdx = int(v), true
		}
	case "kv_cache_spec_kind":
		ev.SpecKind, err = decodeOptString(d)
	case "kv_cache_spec_sliding_window":
		if isNil(d) {
			return d.DecodeNil()
		}
		ev.SlidingWindow, err = decodeInt(d)
		ev.HasSlidingWindow = err == nil
	default:
		err = skipValue(d, 0)
	}
	return err
}

func decodeOptString(d *decoder) (string, error) {
	if isNil(d) {
		return "", d.DecodeNil()
	}
	return d.str()
}

func decodeFloat(d *decoder) (float64, error) {
	c, err := d.PeekCode()
	if err != nil {
		return 0, err
	}
	if c == msgpcode.Float || c == msgpcode.Double {
		return d.DecodeFloat64()
	}
	v, err := decodeInt(d)
	return float64(v), err
}

// decodeInt accepts any msgpack integer that fits int64.
func decodeInt(d *decoder) (int64, error) {
	c, err := d.PeekCode()
	if err != nil {
		return 0, err
	}
	if c == msgpcode.Uint64 {
		v, err := d.DecodeUint64()
		if err != nil {
			return 0, err
		}
		if v > math.MaxInt64 {
			return 0, fmt.Errorf("integer %d overflows int64", v)
		}
		return int64(v), nil
	}
	if !isIntCode(c) {
		return 0, fmt.Errorf("want integer, got msgpack code %#x", c)
	}
	return d.DecodeInt64()
}

func isIntCode(c byte) bool {
	return msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Uint64) || (c >= msgpcode.Int8 && c <= msgpcode.Int64)
}

// decodeHash accepts an unsigned or signed integer (reinterpreted as its
// uint64 bit pattern) or raw digest bytes (reduced to the last 8 bytes,
// big-endian), the three forms vLLM releases have published.
func decodeHash(d *decoder) (uint64, error) {
	c, err := d.PeekCode()
	if err != nil {
		return 0, err
	}
	switch {
	case msgpcode.IsBin(c) || msgpcode.IsString(c):
		b, err := d.blob()
		if err != nil {
			return 0, err
		}
		if len(b) == 0 {
			return 0, errors.New("empty hash bytes")
		}
		return WireFromBytes(b), nil
	case c == msgpcode.Uint64 || (c >= msgpcode.Uint8 && c <= msgpcode.Uint32) || msgpcode.IsFixedNum(c) && c <= msgpcode.PosFixedNumHigh:
		return d.DecodeUint64()
	case isIntCode(c):
		v, err := d.DecodeInt64()
		return uint64(v), err
	}
	return 0, fmt.Errorf("want hash (integer or bytes), got msgpack code %#x", c)
}

// WireFromBytes reduces a raw digest, as published with
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0, to its uint64 wire value: the last 8
// bytes read big-endian.
func WireFromBytes(b []byte) uint64 {
	if len(b) > 8 {
		b = b[len(b)-8:]
	}
	var v uint64
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v
}

func decodeHashList(d *decoder, maxN int) ([]uint64, error) {
	n, err := d.DecodeArrayLen()
	if err != nil || n <= 0 {
		return nil, err
	}
	if maxN > 0 && n > maxN {
		return nil, &LimitError{What: LimitBlocks, Event: d.event, Got: n, Max: maxN}
	}
	out := make([]uint64, 0, min(n, d.r.Len(), 4096))
	for i := 0; i < n; i++ {
		h, err := decodeHash(d)
		if err != nil {
			return nil, fmt.Errorf("hash %d: %w", i, err)
		}
		out = append(out, h)
	}
	return out, nil
}

func decodeTokenList(d *decoder, maxN int) ([]uint32, error) {
	n, err := d.DecodeArrayLen()
	if err != nil || n <= 0 {
		return nil, err
	}
	if maxN > 0 && n > maxN {
		return nil, &LimitError{What: LimitTokens, Event: d.event, Got: n, Max: maxN}
	}
	out := make([]uint32, 0, min(n, d.r.Len(), 1<<16))
	for i := 0; i < n; i++ {
		v, err := decodeInt(d)
		if err != nil {
			return nil, fmt.Errorf("token %d: %w", i, err)
		}
		if v < 0 || v > math.MaxUint32 {
			return nil, fmt.Errorf("token %d: id %d out of range", i, v)
		}
		out = append(out, uint32(v))
	}
	return out, nil
}

func decodeExtraKeys(d *decoder) ([][]any, error) {
	n, err := d.DecodeArrayLen()
	if err != nil || n <= 0 {
		return nil, err
	}
	out := make([][]any, 0, min(n, d.r.Len(), 4096))
	for i := 0; i < n; i++ {
		if isNil(d) {
			if err := d.DecodeNil(); err != nil {
				return nil, err
			}
			out = append(out, nil)
			continue
		}
		v, err := decodeExtraValue(d, 0)
		if err != nil {
			return nil, fmt.Errorf("block %d: %w", i, err)
		}
		tuple, ok := v.([]any)
		if !ok {
			return nil, fmt.Errorf("block %d: extra keys are %T, want a tuple", i, v)
		}
		out = append(out, tuple)
	}
	return out, nil
}

// decodeExtraValue reads one extra-key element into the value model the
// block hasher serializes: string, int64, []byte, nil or []any.
func decodeExtraValue(d *decoder, depth int) (any, error) {
	if depth > maxNesting {
		return nil, errors.New("extra keys nested too deep")
	}
	c, err := d.PeekCode()
	if err != nil {
		return nil, err
	}
	switch {
	case c == msgpcode.Nil:
		return nil, d.DecodeNil()
	case msgpcode.IsString(c):
		return d.str()
	case msgpcode.IsBin(c):
		return d.blob()
	case isIntCode(c):
		return decodeInt(d)
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := d.DecodeArrayLen()
		if err != nil {
			return nil, err
		}
		out := make([]any, 0, min(n, d.r.Len(), 64))
		for i := 0; i < n; i++ {
			v, err := decodeExtraValue(d, depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	}
	return nil, fmt.Errorf("extra key of msgpack code %#x", c)
}

// maxSkipNesting bounds how deep an ignored value may nest. The library's
// Skip recurses without limit, so a payload of nested one-element arrays
// could otherwise exhaust the stack.
const maxSkipNesting = 32

// skipValue skips one value of any type, iterating containers itself.
func skipValue(d *decoder, depth int) error {
	if depth > maxSkipNesting {
		return errors.New("ignored value nested too deep")
	}
	c, err := d.PeekCode()
	if err != nil {
		return err
	}
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := d.DecodeArrayLen()
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			if err := skipValue(d, depth+1); err != nil {
				return err
			}
		}
		return nil
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err := d.DecodeMapLen()
		if err != nil {
			return err
		}
		for i := 0; i < 2*n; i++ {
			if err := skipValue(d, depth+1); err != nil {
				return err
			}
		}
		return nil
	case msgpcode.IsString(c) || msgpcode.IsBin(c):
		_, err := d.blob()
		return err
	case c == msgpcode.Ext8 || c == msgpcode.Ext16 || c == msgpcode.Ext32:
		if err := d.extFits(c); err != nil {
			return err
		}
	}
	return d.Skip()
}
