package sim

import (
	"encoding/json"
)

// Tokenizer is what a pod needs from its model's tokenizer. The tokenize
// package's models satisfy it through tokenizeModel; tests may supply their
// own.
type Tokenizer interface {
	Encode(text string, addSpecialTokens bool) ([]uint32, error)
	Decode(ids []uint32, skipSpecialTokens bool) (string, error)
	// EncodeChat renders the chat template and encodes the result with
	// add_special_tokens=false, as vLLM's chat endpoints do.
	EncodeChat(req ChatInput) (prompt string, ids []uint32, err error)
}

// ChatInput is the part of a chat request the template sees.
type ChatInput struct {
	Messages             json.RawMessage
	Tools                json.RawMessage
	ChatTemplateKwargs   json.RawMessage
	AddGenerationPrompt  bool
	ContinueFinalMessage bool
}

// lorem is the text generated tokens are drawn from: encoded once per model,
// cycled through by every request.
const lorem = " Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco laboris nisi ut aliquip ex ea commodo consequat."

// outputTokens encodes lorem with tok; without a usable encoding it falls
// back to byte values.
func outputTokens(tok Tokenizer) []uint32 {
	if tok != nil {
		if ids, err := tok.Encode(lorem, false); err == nil && len(ids) > 0 {
			return ids
		}
	}
	ids := make([]uint32, len(lorem))
	for i := 0; i < len(lorem); i++ {
		ids[i] = uint32(lorem[i])
	}
	return ids
}
