package tokenize

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// errNotFound marks an endpoint the pod does not serve (404/405), which
// triggers the /tokenize fallback.
var errNotFound = errors.New("endpoint not served")

// RemoteError is a non-2xx answer from the pod; for a chat request whose
// template raises, the pod's 400 arrives here.
type RemoteError struct {
	URL    string
	Status int
	Body   string
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("%s: HTTP %d: %s", e.URL, e.Status, e.Body)
}

func (r *Registry) remoteChat(ctx context.Context, model string, req ChatRequest, baseURL string) (Result, error) {
	body := req.Body
	if len(body) == 0 {
		var err error
		body, err = chatBody(model, req)
		if err != nil {
			return Result{Mode: ModeRemote}, err
		}
	}
	res, err := r.post(ctx, baseURL, "/v1/chat/completions/render", body)
	if errors.Is(err, errNotFound) {
		// /tokenize takes only the prompt-shaping fields, never the whole
		// completion request.
		if body, err = chatBody(model, req); err != nil {
			return Result{Mode: ModeRemote}, err
		}
		res, err = r.post(ctx, baseURL, "/tokenize", body)
	}
	return res, err
}

func chatBody(model string, req ChatRequest) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(`{"model":`)
	name, _ := json.Marshal(model)
	b.Write(name)
	field := func(k string, v json.RawMessage) {
		if len(bytes.TrimSpace(v)) == 0 {
			return
		}
		fmt.Fprintf(&b, ",%q:", k)
		b.Write(v)
	}
	field("messages", req.Messages)
	field("tools", req.Tools)
	field("chat_template_kwargs", req.ChatTemplateKwargs)
	fmt.Fprintf(&b, `,"add_generation_prompt":%t,"continue_final_message":%t}`, req.AddGenerationPrompt, req.ContinueFinalMessage)
	if !json.Valid(b.Bytes()) {
		return nil, errors.New("chat request: messages, tools or chat_template_kwargs is not valid JSON")
	}
	return b.Bytes(), nil
}

func (r *Registry) remotePrompt(ctx context.Context, model, prompt string, addSpecial bool, baseURL string) (Result, error) {
	body, err := json.Marshal(map[string]any{"model": model, "prompt": prompt, "add_special_tokens": addSpecial})
	if err != nil {
		return Result{Mode: ModeRemote}, err
	}
	res, err := r.post(ctx, baseURL, "/v1/completions/render", body)
	if errors.Is(err, errNotFound) {
		res, err = r.post(ctx, baseURL, "/tokenize", body)
	}
	if err == nil && res.Prompt == "" {
		res.Prompt = prompt
	}
	return res, err
}

func (r *Registry) post(ctx context.Context, baseURL, path string, body []byte) (Result, error) {
	res := Result{Mode: ModeRemote}
	if baseURL == "" {
		return res, errors.New("remote tokenization needs a pod base URL")
	}
	url := strings.TrimRight(baseURL, "/") + path
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return res, fmt.Errorf("remote tokenize: %w", err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	if a := r.authorization(); a != "" {
		hreq.Header.Set("Authorization", a)
	}
	resp, err := r.client.Do(hreq)
	if err != nil {
		return res, fmt.Errorf("remote tokenize: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return res, fmt.Errorf("remote tokenize %s: read: %w", url, err)
	}
	if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed {
		return res, fmt.Errorf("%s: %w", url, errNotFound)
	}
	if resp.StatusCode/100 != 2 {
		msg := strings.TrimSpace(string(raw))
		if len(msg) > 512 {
			msg = msg[:512]
		}
		return res, &RemoteError{URL: url, Status: resp.StatusCode, Body: msg}
	}
	prompt, ids, err := parseRenderResponse(raw)
	if err != nil {
		return res, fmt.Errorf("remote tokenize %s: %w", url, err)
	}
	res.Prompt, res.IDs = prompt, ids
	return res, nil
}

// parseRenderResponse reads ids (and the prompt when present) from the
// shapes vLLM versions answer with; see the package documentation.
func parseRenderResponse(raw []byte) (string, []uint32, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '[' {
		var arr []json.RawMessage
		if err := json.Unmarshal(raw, &arr); err != nil {
			return "", nil, err
		}
		if len(arr) == 0 {
			return "", nil, errors.New("empty response array")
		}
		raw = arr[0]
	}
	var obj struct {
		TokenIDs       *[]uint32 `json:"token_ids"`
		PromptTokenIDs *[]uint32 `json:"prompt_token_ids"`
		Tokens         *[]uint32 `json:"tokens"`
		Prompt         string    `json:"prompt"`
		PromptText     string    `json:"prompt_text"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", nil, fmt.Errorf("decode response: %w", err)
	}
	prompt := obj.Prompt
	if prompt == "" {
		prompt = obj.PromptText
	}
	for _, ids := range []*[]uint32{obj.TokenIDs, obj.PromptTokenIDs, obj.Tokens} {
		if ids != nil {
			return prompt, *ids, nil
		}
	}
	return "", nil, errors.New("response has no token_ids, prompt_token_ids or tokens")
}
