package kvindex

// Key identifies one block in the index. In vLLM-exact mode it is the block
// hash exactly as published in KV events (the digest's last 8 bytes); in
// token-derived mode it is the router's own chained hash of the block's tokens.
type Key uint64

// Keyer turns a prompt's token ids into block keys, full blocks only. The two
// implementations are Hasher (vLLM-exact) and TokenKeyer (seed unknown).
type Keyer interface {
	Keys(dst []Key, tokens []uint32, extras RequestExtras) ([]Key, error)
	// Extend appends to c the keys of the full blocks of tokens it does not
	// hold yet: tokens is the prompt so far, of which c holds the first
	// len(c.Keys) blocks. A prompt keyed piece by piece gets the keys Keys
	// gives for the whole.
	Extend(c *KeyChain, tokens []uint32, extras RequestExtras) error
	BlockSize() int
}

// KeyChain is a prompt's block keys computed so far, for a caller that
// learns the prompt's tokens a piece at a time (the router stops
// tokenizing once no target can match further).
type KeyChain struct {
	Keys   []Key
	parent Digest // the Hasher's last digest: a wire key is only its tail
}

// MMItem is one multimodal input placed in the prompt: its content
// identifier and the token span it occupies.
type MMItem struct {
	Identifier string
	Offset     int // first token of the item in the prompt
	Length     int // tokens it occupies
}

// RequestExtras are the request properties vLLM folds into block hashes as
// extra keys, in vLLM's order: LoRA adapter name (every block), multimodal
// items overlapping the block, cache_salt (block 0 only).
type RequestExtras struct {
	LoRAName  string
	MM        []MMItem
	CacheSalt string
}

// AppendBlockExtra appends the extra-key tuple of block i covering tokens
// [start, end) and returns it, or nil when the tuple is empty (Python None).
// A multimodal item contributes (identifier, item offset - block start), the
// form current vLLM builds.
func (r RequestExtras) AppendBlockExtra(dst []any, i, start, end int) []any {
	if r.LoRAName != "" {
		dst = append(dst, r.LoRAName)
	}
	for _, m := range r.MM {
		if m.Offset < end && m.Offset+m.Length > start {
			dst = append(dst, []any{m.Identifier, int64(m.Offset - start)})
		}
	}
	if i == 0 && r.CacheSalt != "" {
		dst = append(dst, r.CacheSalt)
	}
	if len(dst) == 0 {
		return nil
	}
	return dst
}
