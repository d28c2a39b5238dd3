//go:build !hftokenizers

package tokenize

import "errors"

// hfAvailable is false in the default build: tokenizer.json models encode
// with the pure-Go encoder. Build with -tags hftokenizers to use
// HuggingFace's Rust tokenizers instead.
const hfAvailable = false

func newHFEncoder(string, bool, []uint32, []uint32) (encoder, error) {
	return nil, errors.New("built without the hftokenizers tag")
}
