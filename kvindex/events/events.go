// Package events owns vLLM's KV-cache event wire format: the three-frame ZMQ
// message (topic, big-endian sequence number, msgpack payload), the EventBatch
// payload with events as maps (vLLM >= 0.26) or positional arrays (older
// releases), and the replay socket's framing. It decodes what pods publish and
// encodes the same bytes for the simulator, and it knows nothing about indexes
// or sockets.
package events

import (
	"encoding/binary"
	"fmt"
)

// Kind is the event type.
type Kind uint8

// Event kinds as vLLM names them on the wire.
const (
	KindUnknown Kind = iota
	KindBlockStored
	KindBlockRemoved
	KindAllBlocksCleared
)

var kindNames = [...]string{"Unknown", "BlockStored", "BlockRemoved", "AllBlocksCleared"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

func kindFromTag(tag string) Kind {
	for i, n := range kindNames[1:] {
		if n == tag {
			return Kind(i + 1)
		}
	}
	return KindUnknown
}

// Medium names where a block lives. vLLM's offloading connectors publish the
// tier a block was stored to; plain GPU prefix caching says GPU.
const (
	MediumGPU     = "GPU"
	MediumCPU     = "CPU"
	MediumStorage = "STORAGE"
)

// KV-cache spec kinds whose groups hold the whole prefix, so their blocks
// decide a prefix-cache hit. Other groups of hybrid models (sliding window,
// chunked local attention, Mamba) keep only a suffix and are not indexed.
const (
	SpecFullAttention     = "full_attention"
	SpecMLAAttention      = "mla_attention"
	SpecSinkFullAttention = "sink_full_attention"
)

// Event is one decoded KV-cache event. Fields that the event kind does not
// carry, or that the publisher left out, hold their zero value and the Has*
// flags say which optional fields were present.
type Event struct {
	Kind Kind

	// BlockHashes are the uint64 wire values (a raw-bytes hash is reduced to
	// its last 8 bytes, big-endian).
	BlockHashes []uint64

	// ParentHash is the hash of the block before the first one; without
	// HasParentHash the first block starts a chain (sent as nil, or as 0
	// by some publishers of the legacy array form).
	ParentHash    uint64
	HasParentHash bool

	TokenIDs  []uint32
	BlockSize int

	LoRAID    int64
	HasLoRAID bool
	LoRAName  string
	Medium    string

	// ExtraKeys holds one entry per stored block: the extra-key tuple vLLM
	// hashed (strings, int64s, []byte, nested []any), nil for Python None.
	ExtraKeys    [][]any
	HasExtraKeys bool

	GroupIdx    int
	HasGroupIdx bool

	SpecKind         string
	SlidingWindow    int64
	HasSlidingWindow bool
}

// IsFullPrefix reports whether the event's KV-cache group holds the whole
// prefix (full attention, MLA, full attention with sinks). Publishers that
// predate per-group events only ever had one group, so a missing spec kind
// counts as full prefix.
func (e *Event) IsFullPrefix() bool {
	switch e.SpecKind {
	case "", SpecFullAttention, SpecMLAAttention, SpecSinkFullAttention:
		return true
	}
	return false
}

// Batch is one EventBatch payload: [ts, events, data_parallel_rank?].
type Batch struct {
	TS        float64
	Events    []Event
	DPRank    int
	HasDPRank bool
	// Unknown counts events whose type tag this decoder does not know; they
	// are skipped so that a newer publisher does not break ingestion.
	Unknown int
	// Invalid counts well-formed events whose fields contradict each other
	// (FirstInvalid says how); they are skipped, the rest of the batch kept.
	Invalid      int
	FirstInvalid error
}

// EndOfReplay is the sequence number that closes a replay response.
const EndOfReplay = ^uint64(0)

// ParseSeq reads the 8-byte big-endian sequence frame.
func ParseSeq(frame []byte) (uint64, error) {
	if len(frame) != 8 {
		return 0, fmt.Errorf("sequence frame of %d bytes (want 8)", len(frame))
	}
	return binary.BigEndian.Uint64(frame), nil
}

// SeqFrame encodes a sequence number as its 8-byte big-endian frame.
func SeqFrame(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq)
}
