package router

import (
	"encoding/json"
	"fmt"
	"math"
	"sync"

	"github.com/valyala/fastjson"

	"github.com/prefixrouter/prefixrouter/tokenize"
)

// Endpoint is the OpenAI API a routed request was sent to.
type Endpoint uint8

// Routed endpoints.
const (
	EndpointCompletions Endpoint = iota + 1
	EndpointChat
)

func (e Endpoint) String() string {
	switch e {
	case EndpointCompletions:
		return "completions"
	case EndpointChat:
		return "chat"
	}
	return "unknown"
}

// Path is the upstream path of the endpoint.
func (e Endpoint) Path() string {
	if e == EndpointChat {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// Request is what the router needs to know about one OpenAI request. The
// body itself is forwarded unchanged; these fields only decide the target.
type Request struct {
	Endpoint Endpoint
	Model    string

	// Completions: the prompt is text (PromptText), or token ids
	// (PromptIDs, HasIDs). A batch prompt is routed by its first element;
	// BatchSize says how many prompts the body carries.
	PromptText string
	PromptIDs  []uint32
	HasIDs     bool
	BatchSize  int

	// Chat: the fields the chat template sees.
	Chat tokenize.ChatRequest

	// AddSpecialTokens follows vLLM's per-endpoint default: true for
	// completions, false for chat.
	AddSpecialTokens bool
	CacheSalt        string
	Stream           bool
	IncludeUsage     bool
	// CustomTemplate is set when the request brings its own chat_template:
	// local rendering would not match what the pod renders.
	CustomTemplate bool
}

// BadRequest is a client error found while parsing: it maps to an
// OpenAI-shaped 400 naming the offending parameter.
type BadRequest struct {
	Param   string
	Message string
}

func (e *BadRequest) Error() string {
	if e.Param == "" {
		return e.Message
	}
	return e.Param + ": " + e.Message
}

func badParam(param, format string, args ...any) *BadRequest {
	return &BadRequest{Param: param, Message: fmt.Sprintf(format, args...)}
}

// maxPromptIDs bounds a token-id prompt so a hostile body cannot make the
// router allocate without limit beyond the body size itself.
const maxPromptIDs = 1 << 22

var parserPool fastjson.ParserPool

// reqPool recycles Request values (and their PromptIDs capacity).
var reqPool = sync.Pool{New: func() any { return new(Request) }}

func acquireRequest() *Request { return reqPool.Get().(*Request) }

func releaseRequest(r *Request) {
	ids := r.PromptIDs[:0]
	if cap(ids) > 1<<16 {
		ids = nil
	}
	*r = Request{PromptIDs: ids}
	reqPool.Put(r)
}

// ParseRequest extracts the routing fields of a completions or chat body
// into r (which it resets). Only the fields the router needs are looked at
// and validated; unknown fields are the pod's business.
func ParseRequest(ep Endpoint, body []byte, r *Request) error {
	ids := r.PromptIDs[:0]
	*r = Request{Endpoint: ep, PromptIDs: ids}
	p := parserPool.Get()
	defer parserPool.Put(p)
	v, err := p.ParseBytes(body)
	if err != nil {
		return &BadRequest{Message: "request body is not valid JSON: " + err.Error()}
	}
	o, err := v.Object()
	if err != nil {
		return &BadRequest{Message: "request body must be a JSON object"}
	}

	mv := o.Get("model")
	if mv == nil || mv.Type() == fastjson.TypeNull {
		return badParam("model", "you must provide a model parameter")
	}
	mb, err := mv.StringBytes()
	if err != nil {
		return badParam("model", "must be a string")
	}
	if len(mb) == 0 {
		return badParam("model", "must not be empty")
	}
	r.Model = string(mb)

	if r.Stream, err = optBool(o, "stream", false); err != nil {
		return err
	}
	if so := o.Get("stream_options"); so != nil && so.Type() != fastjson.TypeNull {
		soo, err := so.Object()
		if err != nil {
			return badParam("stream_options", "must be an object")
		}
		if r.IncludeUsage, err = optBool(soo, "include_usage", false); err != nil {
			return badParam("stream_options.include_usage", "must be a boolean")
		}
	}
	if sv := o.Get("cache_salt"); sv != nil && sv.Type() != fastjson.TypeNull {
		sb, err := sv.StringBytes()
		if err != nil {
			return badParam("cache_salt", "must be a string")
		}
		if len(sb) == 0 {
			// vLLM rejects an empty salt rather than treating it as absent.
			return badParam("cache_salt", "must be a non-empty string")
		}
		r.CacheSalt = string(sb)
	}

	switch ep {
	case EndpointCompletions:
		if r.AddSpecialTokens, err = optBool(o, "add_special_tokens", true); err != nil {
			return err
		}
		return parsePrompt(o.Get("prompt"), r)
	case EndpointChat:
		if r.AddSpecialTokens, err = optBool(o, "add_special_tokens", false); err != nil {
			return err
		}
		return parseChat(o, body, r)
	}
	return fmt.Errorf("router: unknown endpoint %d", ep)
}

func optBool(o *fastjson.Object, key string, def bool) (bool, error) {
	v := o.Get(key)
	if v == nil || v.Type() == fastjson.TypeNull {
		return def, nil
	}
	switch v.Type() {
	case fastjson.TypeTrue:
		return true, nil
	case fastjson.TypeFalse:
		return false, nil
	}
	return false, badParam(key, "must be a boolean")
}

func parsePrompt(v *fastjson.Value, r *Request) error {
	if v == nil || v.Type() == fastjson.TypeNull {
		return badParam("prompt", "you must provide a prompt")
	}
	switch v.Type() {
	case fastjson.TypeString:
		b, _ := v.StringBytes()
		if len(b) == 0 {
			return badParam("prompt", "must not be empty")
		}
		r.PromptText = string(b)
		r.BatchSize = 1
		return nil
	case fastjson.TypeArray:
	default:
		return badParam("prompt", "must be a string, an array of strings, an array of token ids or an array of token-id arrays")
	}
	arr, _ := v.Array()
	if len(arr) == 0 {
		return badParam("prompt", "must not be empty")
	}
	switch arr[0].Type() {
	case fastjson.TypeNumber:
		// One prompt as token ids.
		ids, err := appendIDs(r.PromptIDs[:0], arr, "prompt")
		if err != nil {
			return err
		}
		r.PromptIDs, r.HasIDs, r.BatchSize = ids, true, 1
		return nil
	case fastjson.TypeString:
		for i, e := range arr {
			b, err := e.StringBytes()
			if err != nil {
				return badParam(fmt.Sprintf("prompt[%d]", i), "must be a string like the other elements")
			}
			if len(b) == 0 {
				return badParam(fmt.Sprintf("prompt[%d]", i), "must not be empty")
			}
			if i == 0 {
				r.PromptText = string(b)
			}
		}
		r.BatchSize = len(arr)
		return nil
	case fastjson.TypeArray:
		for i, e := range arr {
			inner, err := e.Array()
			if err != nil {
				return badParam(fmt.Sprintf("prompt[%d]", i), "must be an array of token ids like the other elements")
			}
			if len(inner) == 0 {
				return badParam(fmt.Sprintf("prompt[%d]", i), "must not be empty")
			}
			if i == 0 {
				ids, err := appendIDs(r.PromptIDs[:0], inner, "prompt[0]")
				if err != nil {
					return err
				}
				r.PromptIDs = ids
			} else if err := checkIDs(inner, fmt.Sprintf("prompt[%d]", i)); err != nil {
				return err
			}
		}
		r.HasIDs, r.BatchSize = true, len(arr)
		return nil
	}
	return badParam("prompt[0]", "must be a string, a token id or an array of token ids")
}

func tokenID(v *fastjson.Value, param string, i int) (uint32, error) {
	if v.Type() != fastjson.TypeNumber {
		return 0, badParam(fmt.Sprintf("%s[%d]", param, i), "token ids must be integers")
	}
	f, err := v.Float64()
	if err != nil || f < 0 || f > math.MaxUint32 || f != math.Trunc(f) {
		return 0, badParam(fmt.Sprintf("%s[%d]", param, i), "token ids must be non-negative integers below 2^32")
	}
	return uint32(f), nil
}

func appendIDs(dst []uint32, arr []*fastjson.Value, param string) ([]uint32, error) {
	if len(arr) > maxPromptIDs {
		return dst, badParam(param, "too many token ids (%d > %d)", len(arr), maxPromptIDs)
	}
	for i, e := range arr {
		id, err := tokenID(e, param, i)
		if err != nil {
			return dst, err
		}
		dst = append(dst, id)
	}
	return dst, nil
}

func checkIDs(arr []*fastjson.Value, param string) error {
	for i, e := range arr {
		if _, err := tokenID(e, param, i); err != nil {
			return err
		}
	}
	return nil
}

func parseChat(o *fastjson.Object, body []byte, r *Request) error {
	mv := o.Get("messages")
	if mv == nil || mv.Type() == fastjson.TypeNull {
		return badParam("messages", "you must provide messages")
	}
	msgs, err := mv.Array()
	if err != nil {
		return badParam("messages", "must be an array")
	}
	if len(msgs) == 0 {
		return badParam("messages", "must not be empty")
	}
	for i, m := range msgs {
		mo, err := m.Object()
		if err != nil {
			return badParam(fmt.Sprintf("messages[%d]", i), "must be an object")
		}
		role := mo.Get("role")
		if role == nil {
			return badParam(fmt.Sprintf("messages[%d].role", i), "is required")
		}
		if role.Type() != fastjson.TypeString {
			return badParam(fmt.Sprintf("messages[%d].role", i), "must be a string")
		}
		if c := mo.Get("content"); c != nil {
			switch c.Type() {
			case fastjson.TypeString, fastjson.TypeArray, fastjson.TypeNull:
			default:
				return badParam(fmt.Sprintf("messages[%d].content", i), "must be a string, an array of content parts or null")
			}
		}
	}
	r.Chat.Messages = json.RawMessage(mv.MarshalTo(nil))
	if tv := o.Get("tools"); tv != nil && tv.Type() != fastjson.TypeNull {
		if tv.Type() != fastjson.TypeArray {
			return badParam("tools", "must be an array")
		}
		r.Chat.Tools = json.RawMessage(tv.MarshalTo(nil))
	}
	if kv := o.Get("chat_template_kwargs"); kv != nil && kv.Type() != fastjson.TypeNull {
		if kv.Type() != fastjson.TypeObject {
			return badParam("chat_template_kwargs", "must be an object")
		}
		r.Chat.ChatTemplateKwargs = json.RawMessage(kv.MarshalTo(nil))
	}
	if r.Chat.AddGenerationPrompt, err = optBool(o, "add_generation_prompt", true); err != nil {
		return err
	}
	if r.Chat.ContinueFinalMessage, err = optBool(o, "continue_final_message", false); err != nil {
		return err
	}
	if r.Chat.AddGenerationPrompt && r.Chat.ContinueFinalMessage {
		// vLLM refuses the combination; so do we, before a pod sees it.
		if v := o.Get("add_generation_prompt"); v != nil && v.Type() == fastjson.TypeTrue {
			return badParam("continue_final_message", "cannot be combined with add_generation_prompt=true")
		}
		// Implicit add_generation_prompt default gives way.
		r.Chat.AddGenerationPrompt = false
	}
	if ct := o.Get("chat_template"); ct != nil && ct.Type() != fastjson.TypeNull {
		if ct.Type() != fastjson.TypeString {
			return badParam("chat_template", "must be a string")
		}
		r.CustomTemplate = true
	}
	r.Chat.Body = body
	r.BatchSize = 1
	return nil
}

// ParseModelField reads only "model" from a /tokenize or /detokenize body;
// an absent model is "" (vLLM accepts it there and uses its only model).
func ParseModelField(body []byte) (string, error) {
	p := parserPool.Get()
	defer parserPool.Put(p)
	v, err := p.ParseBytes(body)
	if err != nil {
		return "", &BadRequest{Message: "request body is not valid JSON: " + err.Error()}
	}
	if v.Type() != fastjson.TypeObject {
		return "", &BadRequest{Message: "request body must be a JSON object"}
	}
	mv := v.Get("model")
	if mv == nil || mv.Type() == fastjson.TypeNull {
		return "", nil
	}
	b, err := mv.StringBytes()
	if err != nil {
		return "", badParam("model", "must be a string")
	}
	return string(b), nil
}
