package tokenize

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
)

// Mode says where a model's token ids come from.
type Mode int32

const (
	// ModeLocal encodes in process.
	ModeLocal Mode = iota
	// ModeRemote asks the pod's render (or /tokenize) endpoint.
	ModeRemote
	// ModeAuto encodes locally and compares a sample against the pod in the
	// background; the first mismatch switches the model to remote.
	ModeAuto
)

func (m Mode) String() string {
	switch m {
	case ModeLocal:
		return "local"
	case ModeRemote:
		return "remote"
	case ModeAuto:
		return "auto"
	}
	return fmt.Sprintf("mode(%d)", int32(m))
}

// ParseMode parses local, remote or auto.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "local", "":
		return ModeLocal, nil
	case "remote":
		return ModeRemote, nil
	case "auto":
		return ModeAuto, nil
	}
	return 0, fmt.Errorf("unknown tokenizer mode %q (want local, remote or auto)", s)
}

var (
	// ErrUnknownModel is returned by Registry.Model for a name never added.
	ErrUnknownModel = errors.New("unknown model")
	// ErrNoLocal means the model has no local tokenizer (remote-only).
	ErrNoLocal = errors.New("no local tokenizer")
	// ErrNoTemplate means the model has no usable chat template locally.
	ErrNoTemplate = errors.New("no chat template")
)

// ChatRequest is the part of a chat completion request that decides the
// prompt. JSON fields stay raw so key order reaches the template unchanged.
type ChatRequest struct {
	Messages            json.RawMessage `json:"messages"`
	Tools               json.RawMessage `json:"tools,omitempty"`
	ChatTemplateKwargs  json.RawMessage `json:"chat_template_kwargs,omitempty"`
	AddGenerationPrompt bool            `json:"add_generation_prompt"`
	// ContinueFinalMessage leaves the last message open (transformers'
	// continue_final_message); it excludes AddGenerationPrompt.
	ContinueFinalMessage bool `json:"continue_final_message,omitempty"`
	// Body is the client's original request body. Remote rendering sends it
	// unchanged when set, so the pod sees exactly what the client sent.
	Body json.RawMessage `json:"-"`
}

// detached returns a copy of req that owns its bytes. A sampled comparison
// runs after the caller has answered, when the buffer a server's request
// fields point into may hold the next request.
func (req ChatRequest) detached() ChatRequest {
	req.Messages = bytes.Clone(req.Messages)
	req.Tools = bytes.Clone(req.Tools)
	req.ChatTemplateKwargs = bytes.Clone(req.ChatTemplateKwargs)
	req.Body = bytes.Clone(req.Body)
	return req
}

// Result is a mode-aware tokenization.
type Result struct {
	// Prompt is the rendered chat prompt when known (always for local chat).
	Prompt string
	IDs    []uint32
	// Mode is where the ids came from: ModeLocal or ModeRemote.
	Mode Mode
}

// encoder is a local tokenizer: the tokenizer.json encoder or the bytes model.
type encoder interface {
	encode(text string, addSpecial bool) ([]uint32, error)
	decode(ids []uint32, skipSpecial bool) (string, error)
}

// renderer turns a chat request into a prompt: a Jinja chat template or the
// bytes model's fixed format.
type renderer interface {
	render(req ChatRequest) (string, error)
}

// Model is one served model's tokenizer. Its methods are safe for concurrent
// use.
type Model struct {
	name    string
	enc     encoder  // nil: remote only
	chat    renderer // nil: no local template (see chatErr)
	chatErr error    // why chat is nil
	reg     *Registry
	mode    atomic.Int32
	// configured is the mode asked for; mode may later move to remote.
	configured Mode
	// rate is an average of bytes per token over finished streams (float64
	// bits; 0 before the first), for estimating a prompt read in part.
	rate atomic.Uint64
}

// bytesPerToken is the model's recent bytes per token, 4 before any.
func (m *Model) bytesPerToken() float64 {
	if r := math.Float64frombits(m.rate.Load()); r > 0 {
		return r
	}
	return 4
}

// observeRate folds one finished prompt into the average; a lost update
// between racing requests costs nothing but a sample.
func (m *Model) observeRate(bytes, tokens int) {
	if bytes == 0 || tokens == 0 {
		return
	}
	r := float64(bytes) / float64(tokens)
	if old := math.Float64frombits(m.rate.Load()); old > 0 {
		r = 0.9*old + 0.1*r
	}
	m.rate.Store(math.Float64bits(r))
}

// Name is the model name the model was registered under.
func (m *Model) Name() string { return m.name }

// Mode is the model's current mode (auto can switch itself to remote).
func (m *Model) Mode() Mode { return Mode(m.mode.Load()) }

// HasLocal reports whether the model can encode in process.
func (m *Model) HasLocal() bool { return m.enc != nil }

// Encode tokenizes text locally. addSpecialTokens follows transformers: the
// post-processor's BOS/EOS are added when true.
func (m *Model) Encode(text string, addSpecialTokens bool) ([]uint32, error) {
	if m.enc == nil {
		return nil, fmt.Errorf("model %s: %w", m.name, ErrNoLocal)
	}
	return m.enc.encode(text, addSpecialTokens)
}

// Decode turns ids back into text (the /detokenize endpoint).
func (m *Model) Decode(ids []uint32, skipSpecialTokens bool) (string, error) {
	if m.enc == nil {
		return "", fmt.Errorf("model %s: %w", m.name, ErrNoLocal)
	}
	return m.enc.decode(ids, skipSpecialTokens)
}

// RenderChat renders the chat template locally.
func (m *Model) RenderChat(req ChatRequest) (string, error) {
	if m.chat == nil {
		if m.chatErr != nil {
			return "", fmt.Errorf("model %s: %w: %w", m.name, ErrNoTemplate, m.chatErr)
		}
		return "", fmt.Errorf("model %s: %w", m.name, ErrNoTemplate)
	}
	if req.ContinueFinalMessage && req.AddGenerationPrompt {
		return "", errors.New("continue_final_message and add_generation_prompt cannot both be set")
	}
	return m.chat.render(req)
}

// EncodeChat renders the template and encodes the prompt with
// add_special_tokens=false, as vLLM's chat endpoints do.
func (m *Model) EncodeChat(req ChatRequest) (string, []uint32, error) {
	prompt, err := m.RenderChat(req)
	if err != nil {
		return "", nil, err
	}
	ids, err := m.Encode(prompt, false)
	if err != nil {
		return "", nil, err
	}
	return prompt, ids, nil
}
