package bpe

import (
	"encoding/json"
	"fmt"
)

// The tokenizer.json schema, as written by HuggingFace tokenizers. Component
// objects are decoded lazily (json.RawMessage) because their fields depend on
// "type".

type fileJSON struct {
	Version       string          `json:"version"`
	AddedTokens   []addedTokenJS  `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	Model         json.RawMessage `json:"model"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Truncation    json.RawMessage `json:"truncation"`
	Padding       json.RawMessage `json:"padding"`
}

type addedTokenJS struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type typed struct {
	Type string `json:"type"`
}

// patternJS is {"String": "..."} or {"Regex": "..."}.
type patternJS struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}

func componentType(raw json.RawMessage) (string, error) {
	var t typed
	if err := json.Unmarshal(raw, &t); err != nil {
		return "", err
	}
	if t.Type == "" {
		return "", fmt.Errorf("component without a type")
	}
	return t.Type, nil
}
