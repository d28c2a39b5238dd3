package sim

import (
	"fmt"
	"log/slog"

	"github.com/prefixrouter/prefixrouter/tokenize"
)

// tokenizeModel adapts a tokenize.Model to Tokenizer.
type tokenizeModel struct{ m *tokenize.Model }

func (t tokenizeModel) Encode(text string, add bool) ([]uint32, error) { return t.m.Encode(text, add) }

func (t tokenizeModel) Decode(ids []uint32, skip bool) (string, error) { return t.m.Decode(ids, skip) }

func (t tokenizeModel) EncodeChat(in ChatInput) (string, []uint32, error) {
	return t.m.EncodeChat(tokenize.ChatRequest{
		Messages:             in.Messages,
		Tools:                in.Tools,
		ChatTemplateKwargs:   in.ChatTemplateKwargs,
		AddGenerationPrompt:  in.AddGenerationPrompt,
		ContinueFinalMessage: in.ContinueFinalMessage,
	})
}

// BytesTokenizer is the tokenize package's built-in bytes model: one token
// per UTF-8 byte plus four special tokens and a ChatML-like template.
func BytesTokenizer() Tokenizer { return tokenizeModel{tokenize.Bytes()} }

// newTokenizer loads the tokenizer a pod serves model with: "bytes" (or
// empty) is the built-in bytes model, anything else a model directory or
// tokenizer.json file loaded through a private tokenize registry. close
// releases the registry.
func newTokenizer(model, path string, log *slog.Logger) (tok Tokenizer, close func(), err error) {
	if path == "" || path == "bytes" {
		return BytesTokenizer(), func() {}, nil
	}
	reg := tokenize.NewRegistry(tokenize.Options{Logger: log})
	m, err := reg.Add(model, path, tokenize.ModeLocal)
	if err != nil {
		reg.Close()
		return nil, nil, fmt.Errorf("tokenizer for %s: %w", model, err)
	}
	return tokenizeModel{m}, reg.Close, nil
}
