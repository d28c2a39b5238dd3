package bpe

import (
	"fmt"
	"math/bits"
	"strings"
	"unicode/utf8"
)

// model is HF's BPE model: vocabulary, ranked merges, byte fallback and
// the unknown token.
type model struct {
	vocab        map[string]uint32
	merges       mergeTable
	unk          *uint32
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
	// continuing_subword_prefix and end_of_word_suffix; an absent one
	// acts as "" does.
	prefix, suffix string

	// runeIDs[r] is the token of the bare char r, for the runes that cover
	// byte-level alphabets and most Latin, Greek and Cyrillic text: a table
	// read instead of hashing a string per char.
	runeIDs []optID
	// byteFallbackIDs holds the <0xXX> tokens, so that byte fallback is a
	// table read instead of a formatted string and a map lookup per byte.
	byteFallbackIDs [256]optID
	// byteLevelIDs, when not nil, holds the token of each raw byte's
	// byte-level character: with no prefix or suffix and all 256 characters
	// in the vocab, a byte-level word's symbols follow from its raw bytes
	// alone, without building the mapped string or looking its runes up.
	byteLevelIDs *[256]uint32

	// words caches merged words. Its key is the word as the tokenizer hands
	// it over: the pre-tokenized string, or the raw bytes before the
	// byte-level mapping on the fused path (see wordSplitter); a tokenizer
	// uses one form for all its words, so the two never mix.
	words *wordCache
}

type mergeRule struct {
	rank  uint32
	newID uint32
}

type optID struct {
	id uint32
	ok bool
}

func newModel(js *modelJS) (*model, error) {
	if js == nil {
		return nil, fmt.Errorf("model: missing")
	}
	if js.Type == "" && js.HasMerges {
		js.Type = "BPE" // very old files omit the type
	}
	if js.Type != "BPE" {
		return nil, fmt.Errorf("unsupported model type %q", js.Type)
	}
	if js.Dropout != nil && *js.Dropout > 0 && *js.Dropout < 1 {
		// Dropout makes encodings random; a router cannot match that.
		return nil, fmt.Errorf("model BPE: dropout %v is not supported", *js.Dropout)
	}
	m := &model{
		vocab:        js.Vocab,
		fuseUnk:      js.FuseUnk,
		byteFallback: js.ByteFallback,
		ignoreMerges: js.IgnoreMerges,
		words:        newWordCache(),
	}
	if m.vocab == nil {
		m.vocab = map[string]uint32{}
	}
	if js.ContinuingSubwordPrefix != nil {
		m.prefix = *js.ContinuingSubwordPrefix
	}
	if js.EndOfWordSuffix != nil {
		m.suffix = *js.EndOfWordSuffix
	}
	if js.UnkToken != nil {
		id, ok := m.vocab[*js.UnkToken]
		if !ok {
			return nil, fmt.Errorf("model BPE: unk_token %q not in vocab", *js.UnkToken)
		}
		m.unk = &id
	}
	pairs := js.Merges
	m.merges = newMergeTable(len(pairs))
	for i, p := range pairs {
		a, ok := m.vocab[p[0]]
		if !ok {
			return nil, fmt.Errorf("model BPE: merge %d: token %q not in vocab", i, p[0])
		}
		b, ok := m.vocab[p[1]]
		if !ok {
			return nil, fmt.Errorf("model BPE: merge %d: token %q not in vocab", i, p[1])
		}
		// The right side loses the continuing-subword prefix when merged.
		right := strings.TrimPrefix(p[1], m.prefix)
		n, ok := m.vocab[p[0]+right]
		if !ok {
			return nil, fmt.Errorf("model BPE: merge %d: result %q not in vocab", i, p[0]+right)
		}
		m.merges.put(a, b, mergeRule{rank: uint32(i), newID: n})
	}
	m.runeIDs = make([]optID, runeTableSize)
	for r := range m.runeIDs {
		id, ok := m.vocab[string(rune(r))]
		m.runeIDs[r] = optID{id, ok}
	}
	if m.byteFallback {
		for b := range m.byteFallbackIDs {
			id, ok := m.vocab[fmt.Sprintf("<0x%02X>", b)]
			m.byteFallbackIDs[b] = optID{id, ok}
		}
	}
	if m.prefix == "" && m.suffix == "" {
		var ids [256]uint32
		all := true
		for b, r := range byteToRune {
			id, ok := m.vocab[string(r)]
			ids[b] = id
			all = all && ok
		}
		if all {
			m.byteLevelIDs = &ids
		}
	}
	return m, nil
}

// tokenize appends the ids of one pre-tokenized word, following HF's
// BPE::tokenize / merge_word / Word::merge_all.
func (m *model) tokenize(dst []uint32, w string) []uint32 {
	if w == "" {
		return dst
	}
	if ids, ok := m.words.get(w); ok {
		return append(dst, ids...)
	}
	start := len(dst)
	dst = m.tokenizeUncached(dst, w)
	m.words.put(w, dst[start:])
	return dst
}

// tokenizeByteLevel appends the ids of one raw word that the byte-level
// mapping turns into the model's word; the cache is keyed by the raw bytes,
// so the mapped form is built only on a miss.
func (m *model) tokenizeByteLevel(dst []uint32, raw string) []uint32 {
	if ids, ok := m.words.get(raw); ok {
		return append(dst, ids...)
	}
	start := len(dst)
	if m.byteLevelIDs != nil {
		dst = m.mergeByteLevel(dst, raw)
	} else {
		dst = m.tokenizeUncached(dst, byteLevelString(raw))
	}
	m.words.put(raw, dst[start:])
	return dst
}

func (m *model) tokenizeUncached(dst []uint32, w string) []uint32 {
	if m.ignoreMerges {
		if id, ok := m.vocab[w]; ok {
			return append(dst, id)
		}
	}
	return m.merge(dst, w)
}

// Words up to these sizes merge in buffers on the stack; longer ones
// allocate.
const (
	stackSyms  = 32
	stackBytes = 128
)

// runeTableSize bounds runeIDs: the runes of one- and two-byte UTF-8.
const runeTableSize = 0x800

// mergeByteLevel is tokenizeUncached(dst, byteLevelString(raw)) for a model
// with byteLevelIDs: every rune of the mapped word is in the vocab, so its
// symbols are one per raw byte and neither byte fallback nor unk can occur.
func (m *model) mergeByteLevel(dst []uint32, raw string) []uint32 {
	if m.ignoreMerges {
		var buf [stackBytes]byte
		mapped := buf[:0]
		for i := 0; i < len(raw); i++ {
			mapped = utf8.AppendRune(mapped, byteToRune[raw[i]])
		}
		if id, ok := m.vocab[string(mapped)]; ok {
			return append(dst, id)
		}
	}
	if len(raw) == 0 {
		return dst
	}
	var symBuf [stackSyms]symbol
	syms := symBuf[:0]
	for i := 0; i < len(raw); i++ {
		syms = append(syms, symbol{id: m.byteLevelIDs[raw[i]], prev: int32(i) - 1, next: int32(i) + 1})
	}
	return m.mergeAll(dst, syms)
}

// merge splits a word into symbols and applies the merges (HF's
// BPE::merge_word).
func (m *model) merge(dst []uint32, w string) []uint32 {
	var symBuf [stackSyms]symbol
	var keyBuf [stackBytes]byte
	syms := symBuf[:0]
	add := func(id uint32) {
		syms = append(syms, symbol{id: id, prev: int32(len(syms)) - 1, next: int32(len(syms)) + 1})
	}
	var unkPending bool
	for i := 0; i < len(w); {
		r, size := utf8.DecodeRuneInString(w[i:])
		start, end := i, i+size
		i = end
		withPrefix := start > 0 && m.prefix != ""
		withSuffix := end == len(w) && m.suffix != ""
		var s []byte // the token looked up, built only when needed
		var id uint32
		var ok bool
		if !withPrefix && !withSuffix && int(r) < len(m.runeIDs) {
			// r is valid here: an invalid byte decodes to RuneError, which is
			// past the table.
			id, ok = m.runeIDs[r].id, m.runeIDs[r].ok
		} else {
			// Built in keyBuf: a map index by string(bytes) does not
			// allocate, where concatenating the prefix or suffix would.
			s = m.token(keyBuf[:0], w[start:end], withPrefix, withSuffix)
			id, ok = m.vocab[string(s)]
		}
		if ok {
			if unkPending {
				add(*m.unk)
				unkPending = false
			}
			add(id)
			continue
		}
		if s == nil {
			s = m.token(keyBuf[:0], w[start:end], withPrefix, withSuffix)
		}
		if m.byteFallback && m.hasByteFallback(s) {
			// Like HF, a pending unk stays pending across byte-fallback
			// chars: it is emitted before the next vocab hit or at the end.
			for _, b := range s {
				add(m.byteFallbackIDs[b].id)
			}
			continue
		}
		if m.unk != nil {
			if unkPending && !m.fuseUnk {
				add(*m.unk)
			}
			unkPending = true
		}
	}
	if unkPending {
		add(*m.unk)
	}
	if len(syms) == 0 {
		return dst
	}
	return m.mergeAll(dst, syms)
}

// token appends the vocab string of one char of a word to b.
func (m *model) token(b []byte, char string, withPrefix, withSuffix bool) []byte {
	if withPrefix {
		b = append(b, m.prefix...)
	}
	b = append(b, char...)
	if withSuffix {
		b = append(b, m.suffix...)
	}
	return b
}

// hasByteFallback reports whether every byte of s has a <0xXX> token; HF
// falls back per char only when all of its bytes do.
func (m *model) hasByteFallback(s []byte) bool {
	for _, b := range s {
		if !m.byteFallbackIDs[b].ok {
			return false
		}
	}
	return true
}

// symbol is one part of a word being merged, in a list linked by index.
// next is -1 for the last symbol and for one merged into its left
// neighbour: HF skips a queue entry in either case.
type symbol struct {
	id         uint32
	prev, next int32
}

// mergeItem is a queue entry of HF's Word::merge_all.
type mergeItem struct {
	order uint64 // rank<<32 | pos: HF's order, by rank then position
	pair  uint64 // the ids the entry was queued for
	newID uint32
}

func pairKey(a, b uint32) uint64 { return uint64(a)<<32 | uint64(b) }

// mergeAll applies the ranked merges to syms (linked in order, the last's
// next -1; the word has at least one symbol) as HF's Word::merge_all does,
// and appends the resulting ids.
func (m *model) mergeAll(dst []uint32, syms []symbol) []uint32 {
	// Positions are int32, which keeps symbols and queue entries small;
	// Stream.Step refuses texts of MaxInt32 bytes or more, so no word has
	// that many symbols.
	syms[len(syms)-1].next = -1
	var qBuf [stackSyms]mergeItem
	q := qBuf[:0]
	for i := 0; i+1 < len(syms); i++ {
		if r, ok := m.merges.get(syms[i].id, syms[i+1].id); ok {
			q = append(q, mergeItem{order: uint64(r.rank)<<32 | uint64(i), pair: pairKey(syms[i].id, syms[i+1].id), newID: r.newID})
		}
	}
	for i := len(q)/2 - 1; i >= 0; i-- {
		siftDown(q, i)
	}
	for len(q) > 0 {
		top := q[0]
		last := len(q) - 1
		q[0] = q[last]
		if q = q[:last]; last > 0 {
			siftDown(q, 0)
		}

		pos := int32(top.order)
		cur := &syms[pos]
		if cur.next < 0 {
			continue
		}
		right := syms[cur.next]
		if pairKey(cur.id, right.id) != top.pair {
			// The entry was queued for another pair. HF still merges when the
			// pair now there yields the same token: look it up.
			if r, ok := m.merges.get(cur.id, right.id); !ok || r.newID != top.newID {
				continue
			}
		}
		syms[cur.next].next = -1
		cur.id = top.newID
		cur.next = right.next
		if right.next >= 0 {
			syms[right.next].prev = pos
		}
		if cur.prev >= 0 {
			left := syms[cur.prev].id
			if r, ok := m.merges.get(left, cur.id); ok {
				q = pushItem(q, mergeItem{order: uint64(r.rank)<<32 | uint64(cur.prev), pair: pairKey(left, cur.id), newID: r.newID})
			}
		}
		if cur.next >= 0 {
			nextID := syms[cur.next].id
			if r, ok := m.merges.get(cur.id, nextID); ok {
				q = pushItem(q, mergeItem{order: uint64(r.rank)<<32 | uint64(pos), pair: pairKey(cur.id, nextID), newID: r.newID})
			}
		}
	}
	for i := int32(0); i >= 0; i = syms[i].next {
		dst = append(dst, syms[i].id)
	}
	return dst
}

// The queue is a binary min-heap on order, written out for mergeItem:
// container/heap boxes every pushed and popped item in an interface.

func siftDown(q []mergeItem, i int) {
	it := q[i]
	for {
		c := 2*i + 1
		if c >= len(q) {
			break
		}
		if c+1 < len(q) && q[c+1].order < q[c].order {
			c++
		}
		if it.order <= q[c].order {
			break
		}
		q[i] = q[c]
		i = c
	}
	q[i] = it
}

func pushItem(q []mergeItem, it mergeItem) []mergeItem {
	q = append(q, it)
	i := len(q) - 1
	for i > 0 {
		p := (i - 1) / 2
		if q[p].order <= it.order {
			break
		}
		q[i] = q[p]
		i = p
	}
	q[i] = it
	return q
}

// mergeTable maps a pair of ids to its merge. It is an open-addressing
// table with linear probing over one flat slice: the merge lookups are most
// of the merge path's time, and a probe here touches one cache line where a
// Go map goes through its directory, control word and slot.
type mergeTable struct {
	slots []mergeSlot
	shift uint // 64 - log2(len(slots))
}

type mergeSlot struct {
	pair  uint64
	seq   uint32 // rank+1; 0 marks an empty slot
	newID uint32
}

func newMergeTable(n int) mergeTable {
	// At most 2/3 full, so that a probe that misses stays short.
	size := 1 << max(bits.Len(uint(n+n/2)), 1)
	return mergeTable{slots: make([]mergeSlot, size), shift: uint(64 - bits.Len(uint(size-1)))}
}

func (t *mergeTable) home(pair uint64) uint64 {
	return (pair * 0x9E3779B97F4A7C15) >> t.shift // Fibonacci hashing
}

// put stores r for (a, b); a later merge of the same pair replaces an
// earlier one, as in HF's map.
func (t *mergeTable) put(a, b uint32, r mergeRule) {
	pair := pairKey(a, b)
	mask := uint64(len(t.slots) - 1)
	for i := t.home(pair); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.seq == 0 || s.pair == pair {
			*s = mergeSlot{pair: pair, seq: r.rank + 1, newID: r.newID}
			return
		}
	}
}

func (t *mergeTable) get(a, b uint32) (mergeRule, bool) {
	pair := pairKey(a, b)
	mask := uint64(len(t.slots) - 1)
	for i := t.home(pair); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.pair == pair && s.seq != 0 {
			return mergeRule{rank: s.seq - 1, newID: s.newID}, true
		}
		if s.seq == 0 {
			return mergeRule{}, false
		}
	}
}
