package workload

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// Vocab is how text is measured in tokens.
type Vocab string

// Vocabularies.
const (
	// Bytes makes one token per character: the simulated pods' bytes
	// model (which adds one BOS token to a completions prompt).
	Bytes Vocab = "bytes"
	// Words makes one common English word per token, each with its
	// leading space, as BPE tokenizers mostly encode them: lengths are
	// close to, not exactly, the tokens a real model counts.
	Words Vocab = "words"
)

// ParseVocab reads bytes or words.
func ParseVocab(s string) (Vocab, error) {
	switch v := Vocab(s); v {
	case Bytes, Words:
		return v, nil
	}
	return "", fmt.Errorf("unknown text vocabulary %q (want bytes or words)", s)
}

// kinds keep the texts of different roles apart: the same id in two roles
// gives two texts.
type kind uint64

const (
	kindSystem kind = iota + 1
	kindQuestion
	kindRandom
	kindBurstPrefix
	kindBurstSuffix
	kindTraceBlock
	kindTurn
	kindPairPrefix
	kindPairSuffix
	kindOverload
)

// texter makes deterministic text: the same (seed, kind, id, tokens) gives
// the same string, and a shorter text is a prefix of a longer one with the
// same key, so a trace's partial last block is a prefix of its full block.
type texter struct {
	seed  uint64
	vocab Vocab
}

// commonWords encode as one token each (with their leading space) in the
// usual BPE vocabularies.
var commonWords = strings.Fields(`the of and to in is that for it as was with be by on not he this are or
his from at which but have an they you were her she there been one all we their has would when if so no
will more can out who up said what its about than into them only other new some could time these two may
first then do any like my now over such our man me even most made after also did many before must through
back years where much your way well down should because each just those people how too little state good
very make world still own see men work long get here between both life being under never day same another
know while last might us great old year off come since against go came right used take three`)

// text is n tokens of text for (k, id).
func (x texter) text(k kind, id uint64, n int) string {
	if n <= 0 {
		return ""
	}
	rng := rand.New(rand.NewPCG(x.seed^uint64(k)*0x9e3779b97f4a7c15, id))
	var b strings.Builder
	if x.vocab == Words {
		b.Grow(n * 6)
		for range n {
			b.WriteByte(' ')
			b.WriteString(commonWords[rng.IntN(len(commonWords))])
		}
		return b.String()
	}
	b.Grow(n)
	word := 0
	for b.Len() < n {
		if word > 2 && rng.IntN(6) == 0 {
			b.WriteByte(' ')
			word = 0
			continue
		}
		b.WriteByte(byte('a' + rng.IntN(26)))
		word++
	}
	return b.String()
}
