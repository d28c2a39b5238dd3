// Package bpe owns the pure-Go encoder for HuggingFace tokenizer.json files
// of the BPE family (GPT-2 byte-level, Llama-3, Qwen, DeepSeek,
// SentencePiece-converted BPE). It reproduces HF tokenizers' pipeline —
// added-token split, normalizer, pre-tokenizers, BPE merges,
// post-processor — exactly, and refuses any component type it does not
// implement with a load error naming it.
package bpe

import (
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"unicode/utf8"
)

// SegmentCache stores the ids of text segments between added tokens. The
// tokenize package provides a shared ristretto-backed one; nil disables it.
type SegmentCache interface {
	Get(segment string, first bool) ([]uint32, bool)
	Set(segment string, first bool, ids []uint32)
}

// Tokenizer encodes and decodes with one tokenizer.json. It is safe for
// concurrent use once loaded (SetCache and SetSpecialTokens are setup calls).
type Tokenizer struct {
	added      []*addedToken
	rawMatch   *matcher // normalized=false tokens, matched on raw text
	normMatch  *matcher // normalized=true tokens, matched after normalization
	norm       normalizer
	pre        preTokenizer
	words      *wordSplitter // pre as one fused pass; nil: the general path
	model      *model
	post       postProcessor
	dec        decoder
	idToToken  map[uint32]string
	special    map[uint32]bool
	tokenToID  map[string]uint32
	cache      SegmentCache
	vocabSize  int
	hasPrefixM bool // Metaspace "first" makes segment 0 encode differently
}

// Load reads a tokenizer.json file.
func Load(path string) (*Tokenizer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", path, err)
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", path, err)
	}
	return t, nil
}

// Parse builds a tokenizer from tokenizer.json bytes.
func Parse(data []byte) (*Tokenizer, error) {
	f, err := decodeFile(data)
	if err != nil {
		return nil, fmt.Errorf("parse tokenizer.json: %w", err)
	}
	return build(f)
}

// build makes a tokenizer of a decoded file.
func build(f fileJSON) (*Tokenizer, error) {
	t := &Tokenizer{special: map[uint32]bool{}}
	var err error
	if t.model, err = newModel(f.Model); err != nil {
		return nil, err
	}
	if t.norm, err = parseNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	if t.pre, err = parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if t.post, err = parsePostProcessor(f.PostProcessor); err != nil {
		return nil, err
	}
	if t.dec, err = parseDecoder(f.Decoder); err != nil {
		return nil, err
	}
	t.hasPrefixM = usesFirstScheme(t.pre)
	t.words = newWordSplitter(t.pre)
	t.tokenToID = maps.Clone(t.model.vocab) // a copy of the tables: no rehashing
	t.idToToken = make(map[uint32]string, len(t.model.vocab)+len(f.AddedTokens))
	for tok, id := range t.model.vocab {
		t.idToToken[id] = tok
	}
	var rawPats, normPats []string
	var rawToks, normToks []*addedToken
	for i, a := range f.AddedTokens {
		if a.Content == "" {
			return nil, fmt.Errorf("added_tokens[%d]: empty content", i)
		}
		at := &addedToken{id: a.ID, content: a.Content, singleWord: a.SingleWord, lstrip: a.LStrip,
			rstrip: a.RStrip, normalized: a.Normalized, special: a.Special}
		t.added = append(t.added, at)
		t.tokenToID[a.Content] = a.ID
		t.idToToken[a.ID] = a.Content
		if a.Special {
			t.special[a.ID] = true
		}
		if a.Normalized {
			// HF matches normalized tokens against normalized text, so the
			// pattern is normalized too.
			p := a.Content
			if t.norm != nil {
				if p, err = t.norm.normalize(p); err != nil {
					return nil, fmt.Errorf("added_tokens[%d]: %w", i, err)
				}
			}
			normPats = append(normPats, p)
			normToks = append(normToks, at)
		} else {
			rawPats = append(rawPats, a.Content)
			rawToks = append(rawToks, at)
		}
	}
	t.rawMatch = newMatcher(rawPats, rawToks)
	t.normMatch = newMatcher(normPats, normToks)
	if err := t.post.resolve(t.tokenToID); err != nil {
		return nil, err
	}
	for id := range t.idToToken {
		t.vocabSize = max(t.vocabSize, int(id)+1)
	}
	return t, nil
}

func usesFirstScheme(p preTokenizer) bool {
	switch p := p.(type) {
	case *metaspace:
		return p.scheme == "first"
	case sequencePre:
		return slices.ContainsFunc(p, usesFirstScheme)
	}
	return false
}

// SetCache installs a segment cache (nil removes it). Call before use.
func (t *Tokenizer) SetCache(c SegmentCache) { t.cache = c }

// SetSpecialTokens replaces the post-processor with transformers'
// add_bos_token / add_eos_token behaviour: bos? $A eos?. Empty names mean
// the token is not added.
func (t *Tokenizer) SetSpecialTokens(bos, eos string) error {
	var tp templateProcessing
	for _, name := range []string{bos, "$A", eos} {
		switch name {
		case "":
		case "$A":
			tp.single = append(tp.single, templatePiece{seq: true})
		default:
			id, ok := t.tokenToID[name]
			if !ok {
				return fmt.Errorf("special token %q is not in the vocabulary", name)
			}
			tp.single = append(tp.single, templatePiece{ids: []uint32{id}})
		}
	}
	t.post = &tp
	return nil
}

// EncodeSpecialIDs returns [id of tok] when want is true and tok is known,
// else nil; it resolves transformers' BOS/EOS for other backends.
func (t *Tokenizer) EncodeSpecialIDs(tok string, want bool) ([]uint32, bool) {
	if !want || tok == "" {
		return nil, !want
	}
	id, ok := t.tokenToID[tok]
	if !ok {
		return nil, false
	}
	return []uint32{id}, true
}

// TokenID returns the id of a token string (vocabulary or added token).
func (t *Tokenizer) TokenID(tok string) (uint32, bool) {
	id, ok := t.tokenToID[tok]
	return id, ok
}

// VocabSize is one more than the largest id.
func (t *Tokenizer) VocabSize() int { return t.vocabSize }

// Encode tokenizes text. Invalid UTF-8 is replaced by U+FFFD first (HF only
// takes valid strings).
func (t *Tokenizer) Encode(text string, addSpecialTokens bool) ([]uint32, error) {
	st := t.NewStream(text, addSpecialTokens)
	for !st.Done() {
		if err := st.Step(); err != nil {
			return nil, err
		}
	}
	return st.IDs(), nil
}

// Stream encodes a text a segment at a time — the spans between added
// tokens, which encode independently of one another — so a caller that
// needs the ids of only a prefix (the router, once no pod can match further)
// can stop early and finish later. After every Step, IDs is a prefix of what
// Encode returns; once Done, it is all of it.
type Stream struct {
	t    *Tokenizer
	text string
	segs []segment
	next int
	ids  []uint32
	// suffix is what the post-processor appends after the sequence; whole
	// means the post-processor is not of the prefix-sequence-suffix form, so
	// the stream encodes everything in its first step and applies it.
	suffix   []uint32
	whole    bool
	done     bool
	consumed int
	ahead    *prefetch
}

// prefetch is the later half of a stream's segments, encoded by another
// goroutine (see Prefetch).
type prefetch struct {
	from int // first segment it covers; it runs to the end unless stopped
	n    int // segments it encoded
	ids  []uint32
	err  error
	stop atomic.Bool
	done chan struct{}
}

// Prefetch encodes the later half of the segments not yet encoded in
// another goroutine, so that a caller who will read the whole text (the
// router, when a pod holds the prompt's start) gets it in about half the
// time on an otherwise idle core; Step takes those ids when it gets there.
// Nothing is wasted when the caller stops early: it finishes later through
// the same Steps. A text of fewer than minSegs segments left is not split.
func (st *Stream) Prefetch(minSegs int) {
	rest := len(st.segs) - st.next
	if st.ahead != nil || st.whole || rest < max(minSegs, 2) || len(st.text) >= math.MaxInt32 {
		return
	}
	p := &prefetch{from: st.next + rest/2, done: make(chan struct{})}
	st.ahead = p
	go func() {
		defer close(p.done)
		for _, sg := range st.segs[p.from:] {
			if p.stop.Load() {
				return
			}
			if sg.tok != nil {
				p.ids = append(p.ids, sg.tok.id)
			} else if p.ids, p.err = st.t.encodeSegment(p.ids, st.text[sg.start:sg.end], sg.start == 0); p.err != nil {
				return
			}
			p.n++
		}
	}()
}

// StopPrefetch asks the goroutine Prefetch started to stop after the
// segment it is encoding: the caller has read enough for now and would
// rather have the core. Later Steps encode what it left.
func (st *Stream) StopPrefetch() {
	if st.ahead != nil {
		st.ahead.stop.Store(true)
	}
}

// NewStream starts encoding text (see Encode).
func (t *Tokenizer) NewStream(text string, addSpecialTokens bool) *Stream {
	if !utf8.ValidString(text) {
		text = strings.ToValidUTF8(text, "\uFFFD")
	}
	st := &Stream{t: t, text: text, ids: make([]uint32, 0, len(text)/3+4)}
	st.segs = t.rawMatch.find(text, nil)
	if addSpecialTokens && t.post != nil {
		pre, suf, ok := t.post.affixes()
		st.ids, st.suffix, st.whole = append(st.ids, pre...), suf, !ok
	}
	return st
}

// Step encodes the next text segment and the added tokens before it; the
// last step also appends the post-processor's closing ids.
func (st *Stream) Step() error {
	if len(st.text) >= math.MaxInt32 {
		return fmt.Errorf("text of %d bytes is too long to encode (at most %d)", len(st.text), math.MaxInt32-1)
	}
	for st.next < len(st.segs) {
		if p := st.ahead; p != nil && st.next == p.from {
			<-p.done
			if p.err != nil {
				return p.err
			}
			st.ahead = nil
			st.ids = append(st.ids, p.ids...)
			if p.n > 0 {
				st.next += p.n
				st.consumed = st.segs[st.next-1].end
			}
			if st.next < len(st.segs) {
				return nil
			}
			break
		}
		sg := st.segs[st.next]
		st.next++
		st.consumed = sg.end
		if sg.tok != nil {
			st.ids = append(st.ids, sg.tok.id)
			continue
		}
		var err error
		if st.ids, err = st.t.encodeSegment(st.ids, st.text[sg.start:sg.end], sg.start == 0); err != nil {
			return err
		}
		if !st.whole && st.next < len(st.segs) {
			return nil
		}
	}
	if !st.done {
		st.done = true
		if st.whole {
			st.ids = st.t.post.apply(st.ids)
		} else {
			st.ids = append(st.ids, st.suffix...)
		}
	}
	return nil
}

// Done reports whether the whole text is encoded.
func (st *Stream) Done() bool { return st.done }

// IDs returns the ids encoded so far; the slice is only valid until the
// next Step.
func (st *Stream) IDs() []uint32 { return st.ids }

// Consumed is how many bytes of the text the ids so far cover.
func (st *Stream) Consumed() int { return st.consumed }

// encodeSegment encodes text between raw-matched added tokens. Its result
// depends only on the text and, for Metaspace "first", whether it starts the
// input — which is exactly the cache key.
func (t *Tokenizer) encodeSegment(dst []uint32, seg string, first bool) ([]uint32, error) {
	if seg == "" {
		return dst, nil
	}
	first = first && t.hasPrefixM
	if t.cache != nil {
		if ids, ok := t.cache.Get(seg, first); ok {
			return append(dst, ids...), nil
		}
	}
	start := len(dst)
	dst, err := t.encodeSegmentUncached(dst, seg, first)
	if err != nil {
		return nil, err
	}
	if t.cache != nil {
		t.cache.Set(seg, first, slices.Clone(dst[start:]))
	}
	return dst, nil
}

func (t *Tokenizer) encodeSegmentUncached(dst []uint32, seg string, first bool) ([]uint32, error) {
	s := seg
	if t.norm != nil {
		var err error
		if s, err = t.norm.normalize(s); err != nil {
			return nil, err
		}
	}
	var pieces []piece
	if t.normMatch.empty() {
		pieces = []piece{{s: s, first: first}}
	} else {
		for _, sg := range t.normMatch.find(s, nil) {
			if sg.tok != nil {
				// Flush pieces so far, then the token itself.
				var err error
				if dst, err = t.encodePieces(dst, pieces); err != nil {
					return nil, err
				}
				pieces = pieces[:0]
				dst = append(dst, sg.tok.id)
				continue
			}
			pieces = append(pieces, piece{s: s[sg.start:sg.end], first: first && sg.start == 0})
		}
	}
	return t.encodePieces(dst, pieces)
}

func (t *Tokenizer) encodePieces(dst []uint32, pieces []piece) ([]uint32, error) {
	if len(pieces) == 0 {
		return dst, nil
	}
	if t.words != nil {
		for _, p := range pieces {
			dst = t.words.encode(dst, t.model, p.s, 0)
		}
		return dst, nil
	}
	if t.pre != nil {
		var err error
		if pieces, err = t.pre.split(pieces); err != nil {
			return nil, err
		}
	}
	for _, p := range pieces {
		dst = t.model.tokenize(dst, p.s)
	}
	return dst, nil
}

// Decode turns ids back into text through the tokenizer's decoder. Unknown
// ids are an error; skipSpecialTokens drops special added tokens.
func (t *Tokenizer) Decode(ids []uint32, skipSpecialTokens bool) (string, error) {
	toks := make([]string, 0, len(ids))
	for i, id := range ids {
		tok, ok := t.idToToken[id]
		if !ok {
			return "", fmt.Errorf("token %d (%d) is not in the vocabulary", i, id)
		}
		if skipSpecialTokens && t.special[id] {
			continue
		}
		toks = append(toks, tok)
	}
	if t.dec == nil {
		return strings.Join(toks, " "), nil
	}
	return strings.Join(t.dec.decode(toks), ""), nil
}
