package bpe

import (
	"encoding/json"
	"fmt"
	"strings"
)

// The reference decoder: tokenizer.json read into tagged structs with
// encoding/json, as the loader did before decodeFile. decodeFile must read
// what it reads (see TestDecodeFileMatchesReference and FuzzParse), and
// BenchmarkLoad times the two side by side.

type refFileJSON struct {
	Version       string          `json:"version"`
	AddedTokens   []refAddedToken `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	Model         json.RawMessage `json:"model"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Truncation    json.RawMessage `json:"truncation"`
	Padding       json.RawMessage `json:"padding"`
}

type refAddedToken struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type refModelJS struct {
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

// referenceDecode is decodeFile done with encoding/json.
func referenceDecode(data []byte) (fileJSON, error) {
	var rf refFileJSON
	if err := json.Unmarshal(data, &rf); err != nil {
		return fileJSON{}, err
	}
	f := fileJSON{Normalizer: rf.Normalizer, PreTokenizer: rf.PreTokenizer,
		PostProcessor: rf.PostProcessor, Decoder: rf.Decoder}
	if rf.AddedTokens != nil {
		f.AddedTokens = make([]addedTokenJS, 0, len(rf.AddedTokens))
	}
	for _, a := range rf.AddedTokens {
		f.AddedTokens = append(f.AddedTokens, addedTokenJS(a))
	}
	if isNull(rf.Model) {
		return f, nil
	}
	m, err := referenceModel(rf.Model)
	f.Model = m
	return f, err
}

// referenceModel decodes a tokenizer.json's "model" with encoding/json.
func referenceModel(raw json.RawMessage) (*modelJS, error) {
	var js refModelJS
	if err := json.Unmarshal(raw, &js); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	merges, err := referenceMerges(js.Merges)
	if err != nil {
		return nil, err
	}
	return &modelJS{Type: js.Type, Vocab: js.Vocab, HasMerges: js.Merges != nil, Merges: merges,
		UnkToken: js.UnkToken, FuseUnk: js.FuseUnk, ByteFallback: js.ByteFallback,
		IgnoreMerges: js.IgnoreMerges, ContinuingSubwordPrefix: js.ContinuingSubwordPrefix,
		EndOfWordSuffix: js.EndOfWordSuffix, Dropout: js.Dropout}, nil
}

// referenceMerges accepts both forms: ["a b", ...] and [["a", "b"], ...].
func referenceMerges(raw json.RawMessage) ([][2]string, error) {
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

// parseModel builds a model from the JSON of a tokenizer.json's "model".
func parseModel(raw []byte) (*model, error) {
	r, err := newReader(raw)
	if err != nil {
		return nil, err
	}
	js, err := r.model()
	if err != nil {
		return nil, err
	}
	return newModel(js)
}
