package bpe

// wordSplitter runs the pre-tokenizer chain almost every byte-level BPE
// model ships — Split pre-tokenizers with a fast matcher and Isolated
// behaviour, then ByteLevel — as one pass that hands each word straight to
// the model. The general path builds a piece list per split level and a
// byte-level string per word; here a word's ids depend only on its raw
// bytes, so the word cache is keyed by them and the byte-level form is built
// only on a cache miss. It yields exactly the words the general path does
// (TestWordSplitterMatchesPieces).
type wordSplitter struct {
	levels []fastSplit // applied in order, each to every span of the last
}

// newWordSplitter returns the fused form of pre, or nil when pre is
// anything else (those chains take the general path).
func newWordSplitter(pre preTokenizer) *wordSplitter {
	var chain []preTokenizer
	switch p := pre.(type) {
	case sequencePre:
		chain = p
	case byteLevelPre:
		chain = []preTokenizer{p}
	default:
		return nil
	}
	if len(chain) == 0 {
		return nil
	}
	ws := &wordSplitter{}
	for _, p := range chain[:len(chain)-1] {
		sp, ok := p.(splitPre)
		if !ok || sp.fast == nil || sp.behavior != behIsolated || sp.invert {
			return nil
		}
		ws.levels = append(ws.levels, *sp.fast)
	}
	bl, ok := chain[len(chain)-1].(byteLevelPre)
	if !ok || bl.addPrefixSpace {
		return nil
	}
	if bl.re != nil {
		ws.levels = append(ws.levels, fastPatterns[gpt2Pattern])
	}
	return ws
}

// encode appends the ids of s split from the given level on: matches and
// the text between them are both kept (Isolated), empty spans vanish.
func (ws *wordSplitter) encode(dst []uint32, m *model, s string, level int) []uint32 {
	if level == len(ws.levels) {
		return m.tokenizeByteLevel(dst, s)
	}
	f := &ws.levels[level]
	for gap := 0; gap < len(s); {
		start, end := f.next(s, gap)
		if gap < start {
			dst = ws.encode(dst, m, s[gap:start], level+1)
		}
		if start == len(s) {
			break
		}
		dst = ws.encode(dst, m, s[start:end], level+1)
		gap = end
	}
	return dst
}
