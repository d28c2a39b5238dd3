package events

import (
	"bytes"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Encoding selects how events are laid out inside a batch.
type Encoding uint8

const (
	// EncodingMap writes each event as a map whose first key is "type"
	// (vLLM >= 0.26).
	EncodingMap Encoding = iota
	// EncodingArray writes each event as [tag, fields...] (older vLLM).
	EncodingArray
)

// ParseEncoding accepts "map" or "array".
func ParseEncoding(s string) (Encoding, error) {
	switch s {
	case "map", "":
		return EncodingMap, nil
	case "array", "legacy":
		return EncodingArray, nil
	}
	return 0, fmt.Errorf("unknown event encoding %q (want map or array)", s)
}

// Encode writes a batch exactly as a vLLM publisher does: optional fields that
// hold no value are left out (in array mode only when trailing), hashes are
// unsigned integers.
func Encode(b *Batch, enc Encoding) ([]byte, error) {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	e.UseCompactInts(true)
	n := 2
	if b.HasDPRank {
		n = 3
	}
	if err := e.EncodeArrayLen(n); err != nil {
		return nil, err
	}
	if err := e.EncodeFloat64(b.TS); err != nil {
		return nil, err
	}
	if err := e.EncodeArrayLen(len(b.Events)); err != nil {
		return nil, err
	}
	for i := range b.Events {
		var err error
		if enc == EncodingArray {
			err = encodeArrayEvent(e, &b.Events[i])
		} else {
			err = encodeMapEvent(e, &b.Events[i])
		}
		if err != nil {
			return nil, fmt.Errorf("event %d: %w", i, err)
		}
	}
	if b.HasDPRank {
		if err := e.EncodeInt(int64(b.DPRank)); err != nil {
			return nil, err
		}
	}
	return buf.Bytes(), nil
}

// field is one named event field and the function that writes its value.
type field struct {
	name    string
	present bool
	write   func(*msgpack.Encoder) error
}

func eventFields(ev *Event) []field {
	switch ev.Kind {
	case KindBlockStored:
		return []field{
			{"block_hashes", true, func(e *msgpack.Encoder) error { return encodeHashes(e, ev.BlockHashes) }},
			{"parent_block_hash", true, func(e *msgpack.Encoder) error {
				if !ev.HasParentHash {
					return e.EncodeNil()
				}
				return e.EncodeUint(ev.ParentHash)
			}},
			{"token_ids", true, func(e *msgpack.Encoder) error { return encodeTokens(e, ev.TokenIDs) }},
			{"block_size", true, func(e *msgpack.Encoder) error { return e.EncodeInt(int64(ev.BlockSize)) }},
			{"lora_id", true, func(e *msgpack.Encoder) error {
				if !ev.HasLoRAID {
					return e.EncodeNil()
				}
				return e.EncodeInt(ev.LoRAID)
			}},
			{"medium", true, func(e *msgpack.Encoder) error { return encodeOptString(e, ev.Medium) }},
			{"lora_name", true, func(e *msgpack.Encoder) error { return encodeOptString(e, ev.LoRAName) }},
			{"extra_keys", ev.HasExtraKeys, func(e *msgpack.Encoder) error { return encodeExtraKeys(e, ev.ExtraKeys) }},
			{"group_idx", ev.HasGroupIdx, func(e *msgpack.Encoder) error { return e.EncodeInt(int64(ev.GroupIdx)) }},
			{"kv_cache_spec_kind", ev.SpecKind != "", func(e *msgpack.Encoder) error { return e.EncodeString(ev.SpecKind) }},
			{"kv_cache_spec_sliding_window", ev.HasSlidingWindow, func(e *msgpack.Encoder) error { return e.EncodeInt(ev.SlidingWindow) }},
		}
	case KindBlockRemoved:
		return []field{
			{"block_hashes", true, func(e *msgpack.Encoder) error { return encodeHashes(e, ev.BlockHashes) }},
			{"medium", true, func(e *msgpack.Encoder) error { return encodeOptString(e, ev.Medium) }},
			{"group_idx", ev.HasGroupIdx, func(e *msgpack.Encoder) error { return e.EncodeInt(int64(ev.GroupIdx)) }},
		}
	}
	return nil
}

func encodeMapEvent(e *msgpack.Encoder, ev *Event) error {
	if ev.Kind == KindUnknown {
		return fmt.Errorf("cannot encode event of unknown kind")
	}
	fields := eventFields(ev)
	n := 1
	for _, f := range fields {
		if f.present {
			n++
		}
	}
	if err := e.EncodeMapLen(n); err != nil {
		return err
	}
	if err := e.EncodeString("type"); err != nil {
		return err
	}
	if err := e.EncodeString(ev.Kind.String()); err != nil {
		return err
	}
	for _, f := range fields {
		if !f.present {
			continue
		}
		if err := e.EncodeString(f.name); err != nil {
			return err
		}
		if err := f.write(e); err != nil {
			return err
		}
	}
	return nil
}

func encodeArrayEvent(e *msgpack.Encoder, ev *Event) error {
	if ev.Kind == KindUnknown {
		return fmt.Errorf("cannot encode event of unknown kind")
	}
	fields := eventFields(ev)
	// Only trailing defaulted fields may be left out of a positional array.
	n := len(fields)
	for n > 0 && !fields[n-1].present {
		n--
	}
	if err := e.EncodeArrayLen(n + 1); err != nil {
		return err
	}
	if err := e.EncodeString(ev.Kind.String()); err != nil {
		return err
	}
	for _, f := range fields[:n] {
		if !f.present {
			if err := e.EncodeNil(); err != nil {
				return err
			}
			continue
		}
		if err := f.write(e); err != nil {
			return err
		}
	}
	return nil
}

func encodeHashes(e *msgpack.Encoder, hs []uint64) error {
	if err := e.EncodeArrayLen(len(hs)); err != nil {
		return err
	}
	for _, h := range hs {
		if err := e.EncodeUint(h); err != nil {
			return err
		}
	}
	return nil
}

func encodeTokens(e *msgpack.Encoder, ts []uint32) error {
	if err := e.EncodeArrayLen(len(ts)); err != nil {
		return err
	}
	for _, t := range ts {
		if err := e.EncodeUint(uint64(t)); err != nil {
			return err
		}
	}
	return nil
}

func encodeOptString(e *msgpack.Encoder, s string) error {
	if s == "" {
		return e.EncodeNil()
	}
	return e.EncodeString(s)
}

func encodeExtraKeys(e *msgpack.Encoder, keys [][]any) error {
	if err := e.EncodeArrayLen(len(keys)); err != nil {
		return err
	}
	for _, k := range keys {
		if k == nil {
			if err := e.EncodeNil(); err != nil {
				return err
			}
			continue
		}
		if err := encodeExtraValue(e, k); err != nil {
			return err
		}
	}
	return nil
}

func encodeExtraValue(e *msgpack.Encoder, v any) error {
	switch x := v.(type) {
	case nil:
		return e.EncodeNil()
	case string:
		return e.EncodeString(x)
	case []byte:
		return e.EncodeBytes(x)
	case int:
		return e.EncodeInt(int64(x))
	case int64:
		return e.EncodeInt(x)
	case []any:
		if err := e.EncodeArrayLen(len(x)); err != nil {
			return err
		}
		for _, it := range x {
			if err := encodeExtraValue(e, it); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("extra key of unsupported type %T", v)
}
