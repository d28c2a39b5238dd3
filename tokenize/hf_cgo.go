//go:build hftokenizers

package tokenize

import (
	"fmt"

	hf "github.com/daulet/tokenizers"
)

// hfAvailable reports that this build links HuggingFace's Rust tokenizers
// (build tag hftokenizers; needs libtokenizers.a on the linker path, see
// github.com/daulet/tokenizers). tokenizer.json models then encode with it
// instead of the pure-Go encoder; chat templates and the transformers BOS
// rules stay in Go.
const hfAvailable = true

type hfEncoder struct {
	t *hf.Tokenizer
	// With a transformers add_bos_token/add_eos_token override the
	// post-processor is replaced: encode bare, then add these.
	override       bool
	prefix, suffix []uint32
}

func newHFEncoder(file string, override bool, prefix, suffix []uint32) (encoder, error) {
	t, err := hf.FromFile(file)
	if err != nil {
		return nil, fmt.Errorf("load %s with HF tokenizers: %w", file, err)
	}
	return &hfEncoder{t: t, override: override, prefix: prefix, suffix: suffix}, nil
}

func (e *hfEncoder) encode(text string, addSpecial bool) ([]uint32, error) {
	if e.override {
		ids, _ := e.t.Encode(text, false)
		if !addSpecial {
			return ids, nil
		}
		out := make([]uint32, 0, len(e.prefix)+len(ids)+len(e.suffix))
		out = append(append(append(out, e.prefix...), ids...), e.suffix...)
		return out, nil
	}
	ids, _ := e.t.Encode(text, addSpecial)
	return ids, nil
}

func (e *hfEncoder) decode(ids []uint32, skipSpecial bool) (string, error) {
	return e.t.Decode(ids, skipSpecial), nil
}
