package bpe

import (
	"container/heap"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// refModel is the merge path as it was before tuning, a plain
// transcription of HF's BPE::merge_word and Word::merge_all (string
// concatenation, fmt for byte fallback, container/heap, a stale check that
// always looks the pair up again). The tuned path must agree with it on
// every word.
type refModel struct {
	vocab        map[string]uint32
	merges       map[[2]uint32]mergeRule
	unk          *uint32
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
	prefix       *string
	suffix       *string
}

func newRefModel(tb testing.TB, raw json.RawMessage) *refModel {
	tb.Helper()
	js, err := referenceModel(raw)
	if err != nil {
		tb.Fatal(err)
	}
	r := &refModel{vocab: js.Vocab, fuseUnk: js.FuseUnk, byteFallback: js.ByteFallback,
		ignoreMerges: js.IgnoreMerges, prefix: js.ContinuingSubwordPrefix, suffix: js.EndOfWordSuffix}
	if js.UnkToken != nil {
		id := r.vocab[*js.UnkToken]
		r.unk = &id
	}
	r.merges = map[[2]uint32]mergeRule{}
	for i, p := range js.Merges {
		right := p[1]
		if r.prefix != nil {
			right = strings.TrimPrefix(right, *r.prefix)
		}
		r.merges[[2]uint32{r.vocab[p[0]], r.vocab[p[1]]}] = mergeRule{rank: uint32(i), newID: r.vocab[p[0]+right]}
	}
	return r
}

// byteFallbackNames[b] is the name of b's byte-fallback token, <0xXX>,
// formatted once: the reference looks the names up, it need not format
// them per byte.
var byteFallbackNames = func() (names [256]string) {
	for b := range names {
		names[b] = fmt.Sprintf("<0x%02X>", b)
	}
	return names
}()

func (m *refModel) tokenize(w string) []uint32 {
	if m.ignoreMerges {
		if id, ok := m.vocab[w]; ok {
			return []uint32{id}
		}
	}
	var syms []refSymbol
	add := func(id uint32) {
		syms = append(syms, refSymbol{id: id, prev: len(syms) - 1, next: len(syms) + 1})
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
			var ids []uint32
			for j := 0; j < len(s); j++ {
				id, found := m.vocab[byteFallbackNames[s[j]]]
				if !found {
					ok = false
					break
				}
				ids = append(ids, id)
			}
			if ok {
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
		return nil
	}
	syms[len(syms)-1].next = -1
	var q refQueue
	for i := 0; i+1 < len(syms); i++ {
		if r, ok := m.merges[[2]uint32{syms[i].id, syms[i+1].id}]; ok {
			q = append(q, refItem{pos: i, rank: r.rank, newID: r.newID})
		}
	}
	heap.Init(&q)
	for q.Len() > 0 {
		top := heap.Pop(&q).(refItem)
		cur := &syms[top.pos]
		if cur.dead || cur.next < 0 {
			continue
		}
		nextPos := cur.next
		right := syms[nextPos]
		if r, ok := m.merges[[2]uint32{cur.id, right.id}]; !ok || r.newID != top.newID {
			continue
		}
		cur.id = top.newID
		cur.next = right.next
		syms[nextPos].dead = true
		if right.next >= 0 {
			syms[right.next].prev = top.pos
		}
		if cur.prev >= 0 {
			if r, ok := m.merges[[2]uint32{syms[cur.prev].id, cur.id}]; ok {
				heap.Push(&q, refItem{pos: cur.prev, rank: r.rank, newID: r.newID})
			}
		}
		if cur.next >= 0 {
			if r, ok := m.merges[[2]uint32{cur.id, syms[cur.next].id}]; ok {
				heap.Push(&q, refItem{pos: top.pos, rank: r.rank, newID: r.newID})
			}
		}
	}
	var out []uint32
	for i := 0; i >= 0; i = syms[i].next {
		out = append(out, syms[i].id)
	}
	return out
}

type refSymbol struct {
	id         uint32
	prev, next int
	dead       bool
}

type refItem struct {
	pos         int
	rank, newID uint32
}

type refQueue []refItem

func (q refQueue) Len() int { return len(q) }
func (q refQueue) Less(i, j int) bool {
	if q[i].rank != q[j].rank {
		return q[i].rank < q[j].rank
	}
	return q[i].pos < q[j].pos
}
func (q refQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *refQueue) Push(x any)   { *q = append(*q, x.(refItem)) }
func (q *refQueue) Pop() any {
	old := *q
	it := old[len(old)-1]
	*q = old[:len(old)-1]
	return it
}

// randomModelJSON builds the "model" object of a random BPE over a few
// units, with random prefix, suffix, unk, fuse_unk, byte fallback and
// ignore_merges, and merges built by joining tokens already made. Some
// merged tokens share another token's id, which lets a stale queue entry
// pass HF's newID check (see TestMergeStaleEntrySameID). byteLevel makes the
// units byte-level characters and usually puts all 256 of them in the
// vocab, which with no prefix or suffix gives the raw-byte path. pool lists
// the tokens words are made of.
func randomModelJSON(rng *rand.Rand, byteLevel bool) (raw json.RawMessage, pool []string) {
	units := []string{"a", "b", "c", "é", "中", "𝄞"}
	if byteLevel {
		units = nil
		for _, b := range []byte("ab \xc3\xa9\xff\n") {
			units = append(units, string(byteToRune[b]))
		}
	}
	vocab := map[string]int{}
	addTok := func(s string) {
		if _, ok := vocab[s]; !ok {
			vocab[s] = len(vocab)
		}
	}
	js := map[string]any{"type": "BPE"}
	// An empty prefix or suffix must act as an absent one (Qwen's files
	// have both empty).
	var prefix, suffix string
	switch rng.IntN(4) {
	case 0:
		js["continuing_subword_prefix"] = ""
	case 1:
		prefix = "##"
		js["continuing_subword_prefix"] = prefix
	}
	switch rng.IntN(4) {
	case 0:
		js["end_of_word_suffix"] = ""
	case 1:
		suffix = "</w>"
		js["end_of_word_suffix"] = suffix
	}
	if byteLevel {
		for b := range 256 {
			if rng.IntN(4) != 0 || rng.IntN(64) != 0 {
				addTok(string(byteToRune[b]))
			}
		}
	}
	for _, u := range units {
		for _, s := range []string{u, prefix + u, u + suffix, prefix + u + suffix} {
			if rng.IntN(5) != 0 {
				addTok(s)
				pool = append(pool, s)
			}
		}
	}
	if rng.IntN(2) == 0 {
		js["byte_fallback"] = true
		for b := range 256 {
			if rng.IntN(8) != 0 {
				addTok(fmt.Sprintf("<0x%02X>", b))
			}
		}
	}
	if rng.IntN(3) != 0 {
		addTok("<unk>")
		js["unk_token"] = "<unk>"
		js["fuse_unk"] = rng.IntN(2) == 0
	}
	js["ignore_merges"] = rng.IntN(4) == 0
	var merges [][2]string
	for range rng.IntN(60) {
		if len(pool) == 0 {
			break
		}
		a, b := pool[rng.IntN(len(pool))], pool[rng.IntN(len(pool))]
		if len(merges) > 0 && rng.IntN(10) == 0 {
			a, b = merges[rng.IntN(len(merges))][0], merges[rng.IntN(len(merges))][1] // maybe a duplicate pair
		}
		n := a + strings.TrimPrefix(b, prefix)
		if _, ok := vocab[n]; !ok {
			if len(n) > 24 {
				continue
			}
			addTok(n)
			if rng.IntN(4) == 0 {
				// Another token's id: then two pairs can yield one id.
				vocab[n] = vocab[pool[rng.IntN(len(pool))]]
			}
			pool = append(pool, n)
		}
		merges = append(merges, [2]string{a, b})
	}
	js["vocab"] = vocab
	js["merges"] = merges
	raw, err := json.Marshal(js)
	if err != nil {
		panic(err)
	}
	return raw, pool
}

// randomWord joins tokens of the model (whole words in the vocab are what
// ignore_merges acts on), stray runes and now and then an invalid byte.
func randomWord(rng *rand.Rand, pool []string) string {
	extra := []string{"z", "ж", "\xff", "\xc3", "<", "#"}
	var sb strings.Builder
	for range rng.IntN(8) {
		if rng.IntN(8) == 0 || len(pool) == 0 {
			sb.WriteString(extra[rng.IntN(len(extra))])
		} else {
			sb.WriteString(pool[rng.IntN(len(pool))])
		}
	}
	return sb.String()
}

// rawWord returns the raw bytes of a randomWord made of byte-level
// characters, or raw bytes of no token when it is not one.
func rawWord(rng *rand.Rand, pool []string) string {
	var b []byte
	for _, r := range randomWord(rng, pool) {
		if c, ok := runeToByte[r]; ok {
			b = append(b, c)
		} else {
			b = append(b, byte(r))
		}
	}
	return string(b)
}

// checkWord compares both ways into the merge path with the reference: w
// as a model word, and w as a raw word of the byte-level path (m's cache
// must be noCache).
func checkWord(t *testing.T, m *model, ref *refModel, w string, raw json.RawMessage) {
	t.Helper()
	if got, want := m.tokenizeUncached(nil, w), ref.tokenize(w); !slices.Equal(got, want) {
		t.Fatalf("word %q: got %v, reference %v\nmodel %s", w, got, want, raw)
	}
	if got, want := m.tokenizeByteLevel(nil, w), ref.tokenize(byteLevelString(w)); !slices.Equal(got, want) {
		t.Fatalf("raw word %q: got %v, reference %v\nmodel %s", w, got, want, raw)
	}
}

func TestMergeMatchesReference(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	nc := noCache()
	for i := range 400 {
		byteLevel := i%2 == 1
		raw, pool := randomModelJSON(rng, byteLevel)
		m, err := parseModel(raw)
		if err != nil {
			t.Fatalf("model %d: %v\n%s", i, err, raw)
		}
		m.words = nc
		ref := newRefModel(t, raw)
		for range 200 {
			checkWord(t, m, ref, randomWord(rng, pool), raw)
			checkWord(t, m, ref, rawWord(rng, pool), raw)
		}
	}
}

// TestMergeStaleEntrySameID: a queue entry whose pair has changed is still
// merged, at its own rank, when the pair now there yields the same id. With
// "abc" sharing the id of "ab", HF merges b+c, then (at the rank of a+b)
// a+bc, before bc+d can; skipping the stale entry would give [a bcd].
func TestMergeStaleEntrySameID(t *testing.T) {
	raw := json.RawMessage(`{"type":"BPE",
		"vocab":{"a":0,"b":1,"c":2,"d":3,"ab":4,"bc":5,"abc":4,"bcd":6},
		"merges":[["b","c"],["a","b"],["bc","d"],["a","bc"]]}`)
	m, err := parseModel(raw)
	if err != nil {
		t.Fatal(err)
	}
	m.words = noCache()
	if got, want := m.tokenizeUncached(nil, "abcd"), []uint32{4, 3}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	checkWord(t, m, newRefModel(t, raw), "abcd", raw)
}

// FuzzMerge compares the merge path with the reference on random models.
func FuzzMerge(f *testing.F) {
	f.Add(uint8(0), "abcé中𝄞")
	f.Add(uint8(1), "ab \xc3\xa9\xff\n")
	type pair struct {
		m   *model
		ref *refModel
		raw json.RawMessage
	}
	var models []pair
	rng := rand.New(rand.NewPCG(3, 4))
	nc := noCache()
	for i := range 32 {
		raw, _ := randomModelJSON(rng, i%2 == 1)
		m, err := parseModel(raw)
		if err != nil {
			f.Fatal(err)
		}
		m.words = nc
		models = append(models, pair{m, newRefModel(f, raw), raw})
	}
	f.Fuzz(func(t *testing.T, which uint8, w string) {
		p := models[int(which)%len(models)]
		checkWord(t, p.m, p.ref, w, p.raw)
	})
}

// noCache returns a word cache that never hits and stores nothing, so
// every word takes the merge path.
func noCache() *wordCache {
	c := newWordCache()
	c.limit = 0
	return c
}

func loadModel(tb testing.TB, name string) *model {
	tb.Helper()
	tk, err := Load(modelPath(tb, name))
	if err != nil {
		tb.Fatal(err)
	}
	return tk.model
}

// corpusWords splits the parity corpus into GPT-2 words (raw bytes), close
// enough to what the fused splitter hands the model.
func corpusWords(tb testing.TB) []string {
	var words []string
	fs := fastPatterns[gpt2Pattern]
	for _, s := range loadCorpus(tb) {
		for _, se := range fs.find(s) {
			words = append(words, s[se[0]:se[1]])
		}
	}
	return words
}

// BenchmarkMerge runs only the model's cache-miss path over every corpus
// word; MB/s counts the words' raw bytes.
func BenchmarkMerge(b *testing.B) {
	words := corpusWords(b)
	n := totalBytes(words)
	for _, name := range []string{"qwen3", "llama3_1", "deepseek_v3"} {
		b.Run(name, func(b *testing.B) {
			m := loadModel(b, name)
			m.words = noCache()
			b.SetBytes(n)
			b.ReportAllocs()
			var dst []uint32
			for b.Loop() {
				for _, w := range words {
					dst = m.tokenizeByteLevel(dst[:0], w)
				}
			}
		})
	}
}

// BenchmarkMergeString is BenchmarkMerge through the general path, which
// models without the raw-byte shortcut (Metaspace, WordPiece-style prefixes)
// take: the words are handed over already byte-level mapped.
func BenchmarkMergeString(b *testing.B) {
	var words []string
	var n int64
	for _, w := range corpusWords(b) {
		words = append(words, byteLevelString(w))
		n += int64(len(w))
	}
	for _, name := range []string{"qwen3", "llama3_1", "deepseek_v3"} {
		b.Run(name, func(b *testing.B) {
			m := loadModel(b, name)
			b.SetBytes(n)
			b.ReportAllocs()
			var dst []uint32
			for b.Loop() {
				for _, w := range words {
					dst = m.tokenizeUncached(dst[:0], w)
				}
			}
		})
	}
}
