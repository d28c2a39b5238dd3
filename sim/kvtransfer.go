package sim

import (
	"bytes"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"sync"
	"time"
)

// Prefill/decode disaggregation, as a vLLM server started with
// --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
// takes part in it. A request whose kv_transfer_params say do_remote_decode
// is a prefill: the pod answers it as usual and adds the parameters a decode
// pod needs to pull its prompt's blocks (its engine id and block ids). A
// request whose params say do_remote_prefill is a decode: the pod loads the
// prompt's blocks past its own prefix hit from the named engine instead of
// computing them, or recomputes them when that engine is gone.

// kvTransferPerToken is the time to move one token's KV cache between pods:
// an 8B model's ~128 KiB per token (Llama-3-8B: 32 layers × 8 KV heads ×
// 128 dims × 2 (K and V) × 2 bytes) over an RDMA link that sustains
// ~25 GB/s is 131072 B / 25e9 B/s ≈ 5.2 µs. The 32B TP2 profile's 256 KiB
// per token is split over two GPUs' links: the same time.
const kvTransferPerToken = 5243 * time.Nanosecond

// DefaultKVTransferPerBlock is the model time to pull one block of
// blockSize tokens from a remote prefill engine: kvTransferPerToken per
// token, 84 µs for a 16-token block.
func DefaultKVTransferPerBlock(blockSize int) time.Duration {
	return time.Duration(blockSize) * kvTransferPerToken
}

// kvTransferParams is the part of a request's kv_transfer_params the pod
// acts on; vLLM hands the whole dict to the connector, so other members are
// ignored.
type kvTransferParams struct {
	DoRemoteDecode  bool     `json:"do_remote_decode"`
	DoRemotePrefill bool     `json:"do_remote_prefill"`
	RemoteEngineID  *string  `json:"remote_engine_id"`
	RemoteBlockIDs  *[]int64 `json:"remote_block_ids"`
}

// parseKVTransferParams reads a request's kv_transfer_params: absent or
// null is none, anything but an object with well-typed members is a 400.
func parseKVTransferParams(raw json.RawMessage) (*kvTransferParams, error) {
	raw = bytes.TrimSpace(raw)
	if isNull(raw) {
		return nil, nil
	}
	bad := func(what string) error {
		return &apiError{status: 400, typ: "BadRequestError", msg: "kv_transfer_params: " + what, param: "kv_transfer_params"}
	}
	if raw[0] != '{' {
		return nil, bad("must be an object")
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(raw, &members); err != nil {
		return nil, bad("must be an object")
	}
	var kp kvTransferParams
	for _, m := range []struct {
		name, want string
		dst        any
	}{
		{"do_remote_decode", "a boolean", &kp.DoRemoteDecode},
		{"do_remote_prefill", "a boolean", &kp.DoRemotePrefill},
		{"remote_engine_id", "a string", &kp.RemoteEngineID},
		{"remote_block_ids", "a list of integers", &kp.RemoteBlockIDs},
	} {
		v, ok := members[m.name]
		if !ok || isNull(v) {
			continue
		}
		if err := json.Unmarshal(v, m.dst); err != nil || m.name == "remote_block_ids" && hasNullItem(v) {
			return nil, bad(m.name + " must be " + m.want)
		}
	}
	return &kp, nil
}

// hasNullItem reports a JSON list with a null item, which encoding/json
// would read into a slice of integers as 0.
func hasNullItem(list json.RawMessage) bool {
	var items []json.RawMessage
	if json.Unmarshal(list, &items) != nil {
		return false
	}
	for _, it := range items {
		if isNull(it) {
			return true
		}
	}
	return false
}

// kvTransferAnswer is the kv_transfer_params a prefill's response carries:
// what the decode pod's connector needs to read the prompt's blocks.
type kvTransferAnswer struct {
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	RemoteBlockIDs  []int32 `json:"remote_block_ids"`
	RemoteEngineID  string  `json:"remote_engine_id"`
	RemoteHost      string  `json:"remote_host"`
	RemotePort      int     `json:"remote_port"`
	TPSize          int     `json:"tp_size"`
}

// engineRegistry holds the engine ids of every live simulated engine in the
// process, so a decode pod can tell whether the prefill engine it is told
// to read from still holds the blocks. An engine registers when it starts
// and at every restart (with a new id) and leaves when it dies or closes.
type engineRegistry struct {
	mu  sync.Mutex
	ids map[string]struct{}
}

var liveEngines = engineRegistry{ids: map[string]struct{}{}}

func (r *engineRegistry) add(id string) {
	r.mu.Lock()
	r.ids[id] = struct{}{}
	r.mu.Unlock()
}

func (r *engineRegistry) remove(id string) {
	r.mu.Lock()
	delete(r.ids, id)
	r.mu.Unlock()
}

func (r *engineRegistry) live(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.ids[id]
	return ok
}

// newEngineID draws a fresh engine id as vLLM does per process (a random
// uuid), suffixed _dp<rank> when the pod has several data-parallel ranks.
func newEngineID(rank, dp int) string {
	var b [16]byte
	_, _ = crand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	h := hex.EncodeToString(b[:])
	id := h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
	if dp > 1 {
		id += "_dp" + strconv.Itoa(rank)
	}
	return id
}

// remoteBlocks is how many blocks a decode request may load from its
// prefill engine, or why it cannot load any ("" when it can).
func remoteBlocks(kp *kvTransferParams) (int, string) {
	switch {
	case kp == nil || !kp.DoRemotePrefill:
		return 0, ""
	case kp.RemoteEngineID == nil || kp.RemoteBlockIDs == nil:
		return 0, "remote_engine_id or remote_block_ids missing"
	case !liveEngines.live(*kp.RemoteEngineID):
		return 0, "unknown remote engine (restarted or gone)"
	}
	return len(*kp.RemoteBlockIDs), ""
}
