package router

import (
	"encoding/json"

	"github.com/valyala/fastjson"
)

// responses reads a /v1/responses body. vLLM renders a Responses request
// through the model's chat template, from messages it builds as follows:
// the instructions, when not empty, as a system message; a string input as
// a user message; each message item of an input array as a message of its
// role and content, whose input_text and output_text parts read as text
// parts. The router builds the same messages and routes the request like
// chat. What it cannot derive as the pod does leaves the prompt unknown,
// and the request is routed on load: tools (vLLM converts them to its own
// form before rendering), a previous response (the conversation stored on
// the pod that answered it), a prompt template, items other than messages
// (function calls and their outputs, reasoning) and parts other than text
// (images, files).
func (p *bodyParser) responses(r *Request) error {
	r.BatchSize = 1
	r.Chat.AddGenerationPrompt = true
	switch p.kind(fInput) {
	case '"', '[':
	case 0, 'n':
		return badParam("input", "you must provide an input")
	default:
		return badParam("input", "must be a string or an array of input items")
	}
	switch p.kind(fInstructions) {
	case 0, 'n', '"':
	default:
		return badParam("instructions", "must be a string")
	}
	in, instr := p.f[fInput], p.f[fInstructions]
	r.TextBytes = in.e - in.s + instr.e - instr.s
	set := func(f field) bool { k := p.kind(f); return k != 0 && k != 'n' }
	if set(fPreviousResponseID) || set(fPrompt) || (p.kind(fTools) == '[' && countElems(p.b, p.f[fTools].s) > 0) {
		r.PromptUnknown = true
		return nil
	}
	msgs, ok := responsesMessages(p.b, instr, in)
	if !ok {
		r.PromptUnknown = true
		return nil
	}
	r.Chat.Messages = msgs
	return nil
}

// responsesMessages builds the chat messages of a Responses request from
// the spans of its instructions (absent: e == 0) and input; ok is false
// when the input holds anything responsesMessage cannot convert.
func responsesMessages(b []byte, instr, in span) (json.RawMessage, bool) {
	out := make([]byte, 0, in.e-in.s+instr.e-instr.s+64)
	out = append(out, '[')
	// A JSON string token of two bytes is "": vLLM skips empty instructions.
	if instr.e != 0 && b[instr.s] == '"' && instr.e-instr.s > 2 {
		out = append(out, `{"role":"system","content":`...)
		out = append(out, b[instr.s:instr.e]...)
		out = append(out, "},"...)
	}
	if b[in.s] == '"' {
		out = append(out, `{"role":"user","content":`...)
		out = append(out, b[in.s:in.e]...)
		out = append(out, "}]"...)
		return out, true
	}
	p := parserPool.Get()
	defer parserPool.Put(p)
	v, err := p.ParseBytes(b[in.s:in.e])
	if err != nil {
		return nil, false
	}
	items, _ := v.Array()
	if len(items) == 0 {
		return nil, false
	}
	for _, item := range items {
		var ok bool
		if out, ok = responsesMessage(out, item); !ok {
			return nil, false
		}
		out = append(out, ',')
	}
	out[len(out)-1] = ']'
	return out, true
}

// responsesMessage appends a message input item as a chat message: its role
// and its content, a string or text parts; ok is false for any other item.
func responsesMessage(out []byte, item *fastjson.Value) ([]byte, bool) {
	o, err := item.Object()
	if err != nil {
		return out, false
	}
	if t := member(o, "type"); t != nil && string(t.GetStringBytes()) != "message" {
		return out, false
	}
	role, content := member(o, "role"), member(o, "content")
	if role == nil || role.Type() != fastjson.TypeString || content == nil {
		return out, false
	}
	out = append(out, `{"role":`...)
	out = role.MarshalTo(out)
	out = append(out, `,"content":`...)
	switch content.Type() {
	case fastjson.TypeString:
		out = content.MarshalTo(out)
	case fastjson.TypeArray:
		parts, _ := content.Array()
		if len(parts) == 0 {
			return out, false
		}
		out = append(out, '[')
		for i, part := range parts {
			po, err := part.Object()
			if err != nil {
				return out, false
			}
			text := member(po, "text")
			if text == nil || text.Type() != fastjson.TypeString {
				return out, false
			}
			switch string(member(po, "type").GetStringBytes()) {
			case "input_text", "output_text", "text":
			default:
				return out, false
			}
			if i > 0 {
				out = append(out, ',')
			}
			out = append(out, `{"type":"text","text":`...)
			out = text.MarshalTo(out)
			out = append(out, '}')
		}
		out = append(out, ']')
	default:
		return out, false
	}
	return append(out, '}'), true
}
