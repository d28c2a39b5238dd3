package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// genRequest is the part of a completions or chat request the simulator
// uses. Unknown fields are ignored, as a router forwards bodies verbatim.
type genRequest struct {
	Model                string          `json:"model"`
	Prompt               json.RawMessage `json:"prompt"`
	Messages             json.RawMessage `json:"messages"`
	Tools                json.RawMessage `json:"tools"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	AddSpecialTokens     *bool           `json:"add_special_tokens"`
	MaxTokens            *int64          `json:"max_tokens"`
	MaxCompletionTokens  *int64          `json:"max_completion_tokens"`
	N                    *int64          `json:"n"`
	Stream               bool            `json:"stream"`
	StreamOptions        *streamOptions  `json:"stream_options"`
	CacheSalt            *string         `json:"cache_salt"`
	KVTransferParams     json.RawMessage `json:"kv_transfer_params"`

	kv *kvTransferParams // KVTransferParams, checked
}

type streamOptions struct {
	IncludeUsage         bool `json:"include_usage"`
	ContinuousUsageStats bool `json:"continuous_usage_stats"`
}

// promptInput is one prompt of a completions request: text or token ids.
type promptInput struct {
	text   string
	ids    []uint32
	isText bool
}

// maxBatch bounds the prompts of one completions request.
const maxBatch = 1024

// apiError is an OpenAI-shaped error with its HTTP status.
type apiError struct {
	status int
	typ    string
	msg    string
	param  string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(format string, args ...any) *apiError {
	return &apiError{status: 400, typ: "BadRequestError", msg: fmt.Sprintf(format, args...)}
}

// parseGenRequest decodes a completions (chat=false) or chat body and checks
// the fields the simulator acts on.
func parseGenRequest(body []byte, chat bool) (*genRequest, error) {
	var r genRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&r); err != nil {
		return nil, badRequest("invalid JSON body: %v", err)
	}
	if dec.More() {
		return nil, badRequest("invalid JSON body: trailing data")
	}
	if chat {
		if isNull(r.Messages) {
			return nil, &apiError{status: 400, typ: "BadRequestError", msg: "messages: field required", param: "messages"}
		}
		if r.Messages[0] != '[' {
			return nil, &apiError{status: 400, typ: "BadRequestError", msg: "messages: must be a list", param: "messages"}
		}
	} else if isNull(r.Prompt) {
		return nil, &apiError{status: 400, typ: "BadRequestError", msg: "prompt: field required", param: "prompt"}
	}
	if r.N != nil && *r.N != 1 {
		return nil, &apiError{status: 400, typ: "BadRequestError", msg: "the simulator supports n=1 only", param: "n"}
	}
	for _, p := range []struct {
		name string
		v    *int64
	}{{"max_tokens", r.MaxTokens}, {"max_completion_tokens", r.MaxCompletionTokens}} {
		if p.v != nil && *p.v < 1 {
			return nil, &apiError{status: 400, typ: "BadRequestError", msg: fmt.Sprintf("%s must be at least 1, got %d.", p.name, *p.v), param: p.name}
		}
	}
	if r.CacheSalt != nil && *r.CacheSalt == "" {
		return nil, &apiError{status: 400, typ: "BadRequestError", msg: "Parameter 'cache_salt' must be a non-empty string if provided.", param: "cache_salt"}
	}
	if r.ContinueFinalMessage && r.AddGenerationPrompt != nil && *r.AddGenerationPrompt {
		return nil, badRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
	}
	kv, err := parseKVTransferParams(r.KVTransferParams)
	if err != nil {
		return nil, err
	}
	r.kv = kv
	return &r, nil
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// maxTokens is the request's output budget, or def when it gives none.
func (r *genRequest) maxTokens(def int) int {
	v := r.MaxTokens
	if r.MaxCompletionTokens != nil {
		v = r.MaxCompletionTokens
	}
	if v == nil {
		return def
	}
	if *v > math.MaxInt32 {
		return math.MaxInt32
	}
	return int(*v)
}

// parsePrompts reads a completions prompt: a string, a list of strings, a
// list of token ids, or a list of token-id lists.
func parsePrompts(raw json.RawMessage) ([]promptInput, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return nil, errPromptShape
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, errPromptShape
		}
		return []promptInput{{text: s, isText: true}}, nil
	case '[':
	default:
		return nil, errPromptShape
	}
	if j := skipSpace(raw, 1); j < len(raw) && (raw[j] == '-' || raw[j] >= '0' && raw[j] <= '9') {
		return parseFlatIDs(raw)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, errPromptShape
	}
	if len(items) == 0 {
		return nil, errors.New("prompt: must not be empty")
	}
	if len(items) > maxBatch {
		return nil, fmt.Errorf("prompt: batch of %d prompts exceeds %d", len(items), maxBatch)
	}
	out := make([]promptInput, 0, len(items))
	for i, it := range items {
		it = bytes.TrimSpace(it)
		if len(it) == 0 {
			return nil, errPromptShape
		}
		switch it[0] {
		case '"':
			var s string
			if err := json.Unmarshal(it, &s); err != nil {
				return nil, errPromptShape
			}
			out = append(out, promptInput{text: s, isText: true})
		case '[':
			ids, err := parseIDs(it)
			if err != nil {
				return nil, fmt.Errorf("prompt[%d]: %w", i, err)
			}
			if len(ids) == 0 {
				return nil, fmt.Errorf("prompt[%d]: must not be empty", i)
			}
			out = append(out, promptInput{ids: ids})
		default:
			return nil, errPromptShape
		}
	}
	return out, nil
}

func parseFlatIDs(raw []byte) ([]promptInput, error) {
	ids, err := parseIDs(raw)
	if err != nil {
		return nil, err
	}
	return []promptInput{{ids: ids}}, nil
}

var errPromptShape = errors.New("prompt: want a string, a list of strings, a list of token ids or a list of token-id lists")

// parseIDs reads a JSON list of token ids (non-negative 32-bit integer
// literals). It scans the bytes directly: token lists are the bulk of a
// token-id request and encoding/json's generic path costs several times more.
func parseIDs(raw []byte) ([]uint32, error) {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return nil, errors.New("token ids: want a list of integers")
	}
	i = skipSpace(raw, i+1)
	ids := make([]uint32, 0, len(raw)/4+1)
	if i < len(raw) && raw[i] == ']' {
		return ids, endOfValue(raw, i+1)
	}
	for {
		start := i
		var v uint64
		for i < len(raw) && raw[i] >= '0' && raw[i] <= '9' {
			v = v*10 + uint64(raw[i]-'0')
			if v > math.MaxUint32 {
				return nil, fmt.Errorf("token id %d is not a non-negative 32-bit integer", len(ids))
			}
			i++
		}
		if i == start || (raw[start] == '0' && i-start > 1) || (i < len(raw) && (raw[i] == '.' || raw[i] == 'e' || raw[i] == 'E')) {
			return nil, fmt.Errorf("token id %d is not a non-negative 32-bit integer", len(ids))
		}
		ids = append(ids, uint32(v))
		i = skipSpace(raw, i)
		if i >= len(raw) {
			return nil, errors.New("token ids: unterminated list")
		}
		switch raw[i] {
		case ',':
			i = skipSpace(raw, i+1)
		case ']':
			return ids, endOfValue(raw, i+1)
		default:
			return nil, fmt.Errorf("token id %d is not a non-negative 32-bit integer", len(ids))
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

func endOfValue(b []byte, i int) error {
	if skipSpace(b, i) != len(b) {
		return errors.New("token ids: trailing data after the list")
	}
	return nil
}

// tokenizeRequest is the body of /tokenize: a prompt or chat messages.
type tokenizeRequest struct {
	Model                string          `json:"model"`
	Prompt               *string         `json:"prompt"`
	Messages             json.RawMessage `json:"messages"`
	Tools                json.RawMessage `json:"tools"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	AddSpecialTokens     *bool           `json:"add_special_tokens"`
	ReturnTokenStrs      bool            `json:"return_token_strs"`
}

type detokenizeRequest struct {
	Model  string          `json:"model"`
	Tokens json.RawMessage `json:"tokens"`
}

func decodeStrict(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		return badRequest("invalid JSON body: %v", err)
	}
	if dec.More() {
		return badRequest("invalid JSON body: trailing data")
	}
	return nil
}
