package bpe

import (
	"container/heap"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// model is HF's BPE model: vocabulary, ranked merges, byte fallback and
// the unknown token.
type model struct {
	vocab        map[string]uint32
	merges       map[[2]uint32]mergeRule
	unk          *uint32
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
	prefix       *string // continuing_subword_prefix
	suffix       *string // end_of_word_suffix

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

type modelJS struct {
	Type                    string            `json:"type"`
	Vocab                   map[string]uint32 `json:"vocab"`
	Merges                  json.RawMessage   `json:"merges"`
	UnkToken                *string           `json:"unk_token"`
	FuseUnk                 bool              `json:"fuse_unk"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	Dropout                 *float64          `json:"dropout"`
}

func parseModel(raw json.RawMessage) (*model, error) {
	if isNull(raw) {
		return nil, fmt.Errorf("model: missing")
	}
	var js modelJS
	if err := json.Unmarshal(raw, &js); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if js.Type == "" && js.Merges != nil {
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
		prefix:       js.ContinuingSubwordPrefix,
		suffix:       js.EndOfWordSuffix,
		words:        newWordCache(),
	}
	if m.vocab == nil {
		m.vocab = map[string]uint32{}
	}
	if js.UnkToken != nil {
		id, ok := m.vocab[*js.UnkToken]
		if !ok {
			return nil, fmt.Errorf("model BPE: unk_token %q not in vocab", *js.UnkToken)
		}
		m.unk = &id
	}
	pairs, err := parseMerges(js.Merges)
	if err != nil {
		return nil, fmt.Errorf("model BPE: %w", err)
	}
	m.merges = make(map[[2]uint32]mergeRule, len(pairs))
	var pfx string
	if m.prefix != nil {
		pfx = *m.prefix
	}
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
		right := p[1]
		if pfx != "" && strings.HasPrefix(right, pfx) {
			right = right[len(pfx):]
		}
		n, ok := m.vocab[p[0]+right]
		if !ok {
			return nil, fmt.Errorf("model BPE: merge %d: result %q not in vocab", i, p[0]+right)
		}
		m.merges[[2]uint32{a, b}] = mergeRule{rank: uint32(i), newID: n}
	}
	return m, nil
}

// parseMerges accepts both forms: ["a b", ...] and [["a", "b"], ...].
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("merges: %w", err)
	}
	out := make([][2]string, len(items))
	for i, it := range items {
		if len(it) > 0 && it[0] == '"' {
			var s string
			if err := json.Unmarshal(it, &s); err != nil {
				return nil, fmt.Errorf("merges[%d]: %w", i, err)
			}
			parts := strings.Split(s, " ")
			if len(parts) != 2 {
				return nil, fmt.Errorf("merges[%d] %q: want two space-separated tokens", i, s)
			}
			out[i] = [2]string{parts[0], parts[1]}
			continue
		}
		var pair []string
		if err := json.Unmarshal(it, &pair); err != nil || len(pair) != 2 {
			return nil, fmt.Errorf("merges[%d]: want a pair of strings", i)
		}
		out[i] = [2]string{pair[0], pair[1]}
	}
	return out, nil
}

type symbol struct {
	id         uint32
	prev, next int
	dead       bool
}

type mergeItem struct {
	pos   int
	rank  uint32
	newID uint32
}

type mergeQueue []mergeItem

func (q mergeQueue) Len() int { return len(q) }
func (q mergeQueue) Less(i, j int) bool {
	if q[i].rank != q[j].rank {
		return q[i].rank < q[j].rank
	}
	return q[i].pos < q[j].pos
}
func (q mergeQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *mergeQueue) Push(x any)   { *q = append(*q, x.(mergeItem)) }
func (q *mergeQueue) Pop() any {
	old := *q
	it := old[len(old)-1]
	*q = old[:len(old)-1]
	return it
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
	dst = m.tokenizeUncached(dst, byteLevelString(raw))
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

// merge splits a word into symbols and applies the merges.
func (m *model) merge(dst []uint32, w string) []uint32 {
	syms := make([]symbol, 0, len(w))
	add := func(id uint32) {
		syms = append(syms, symbol{id: id, prev: len(syms) - 1, next: len(syms) + 1})
	}
	var unkPending bool
	for i := 0; i < len(w); {
		_, size := utf8.DecodeRuneInString(w[i:])
		end := i + size
		s := w[i:end]
		if i > 0 && m.prefix != nil {
			s = *m.prefix + s
		}
		if end == len(w) && m.suffix != nil {
			s += *m.suffix
		}
		i = end
		if id, ok := m.vocab[s]; ok {
			if unkPending {
				add(*m.unk)
				unkPending = false
			}
			add(id)
			continue
		}
		if m.byteFallback {
			ok := true
			ids := make([]uint32, 0, len(s))
			for j := 0; j < len(s); j++ {
				id, found := m.vocab[fmt.Sprintf("<0x%02X>", s[j])]
				if !found {
					ok = false
					break
				}
				ids = append(ids, id)
			}
			if ok {
				// Like HF, a pending unk stays pending across byte-fallback
				// chars: it is emitted before the next vocab hit or at the end.
				for _, id := range ids {
					add(id)
				}
				continue
			}
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
	syms[len(syms)-1].next = -1
	m.mergeAll(syms)
	for i := 0; i >= 0 && i < len(syms); i = syms[i].next {
		dst = append(dst, syms[i].id)
	}
	return dst
}

func (m *model) mergeAll(syms []symbol) {
	q := make(mergeQueue, 0, len(syms))
	for i := 0; i+1 < len(syms); i++ {
		if r, ok := m.merges[[2]uint32{syms[i].id, syms[i+1].id}]; ok {
			q = append(q, mergeItem{pos: i, rank: r.rank, newID: r.newID})
		}
	}
	heap.Init(&q)
	for q.Len() > 0 {
		top := heap.Pop(&q).(mergeItem)
		cur := &syms[top.pos]
		if cur.dead || cur.next < 0 {
			continue
		}
		nextPos := cur.next
		right := syms[nextPos]
		r, ok := m.merges[[2]uint32{cur.id, right.id}]
		if !ok || r.newID != top.newID {
			continue // stale queue entry
		}
		cur.id = top.newID
		cur.next = right.next
		syms[nextPos].dead = true
		if right.next >= 0 {
			syms[right.next].prev = top.pos
		}
		if cur.prev >= 0 {
			if r, ok := m.merges[[2]uint32{syms[cur.prev].id, cur.id}]; ok {
				heap.Push(&q, mergeItem{pos: cur.prev, rank: r.rank, newID: r.newID})
			}
		}
		if cur.next >= 0 {
			if r, ok := m.merges[[2]uint32{cur.id, syms[cur.next].id}]; ok {
				heap.Push(&q, mergeItem{pos: top.pos, rank: r.rank, newID: r.newID})
			}
		}
	}
}
