package tokenize

import (
	"errors"
	"fmt"
	"strings"

	"github.com/prefixrouter/prefixrouter/tokenize/chat"
)

// jinjaChat renders a model's Jinja chat template the way transformers'
// apply_chat_template does.
type jinjaChat struct {
	t *chat.Template
	// base holds the variables every render sees the same: the special
	// tokens and additional_special_tokens. Renders layer their own
	// variables over it (chat.Template.RenderOver) rather than copy it.
	base *chat.Vars
	// values caches decoded messages and tools (nil: decode every time).
	values *valueCache
}

func newJinjaChat(src string, specials map[string]string, extra []string) (*jinjaChat, error) {
	t, err := chat.Compile(src)
	if err != nil {
		return nil, err
	}
	base := chat.NewDict()
	// transformers: render(messages, tools, documents, add_generation_prompt,
	// **special_tokens_map, **kwargs).
	for _, k := range specialTokenNames {
		if v, ok := specials[k]; ok {
			base.Set(k, v)
		}
	}
	if len(extra) > 0 {
		l := &chat.List{}
		for _, s := range extra {
			l.Items = append(l.Items, s)
		}
		base.Set("additional_special_tokens", l)
	}
	return &jinjaChat{t: t, base: base}, nil
}

// TemplateError is a chat template that raised while rendering a request
// (raise_exception or a Python error): the request, not the server, is at
// fault.
type TemplateError struct{ Err error }

func (e *TemplateError) Error() string { return "chat template: " + e.Err.Error() }
func (e *TemplateError) Unwrap() error { return e.Err }

func (j *jinjaChat) render(req ChatRequest) (string, error) {
	msgs, err := j.values.decode(req.Messages)
	if err != nil {
		return "", fmt.Errorf("messages: %w", err)
	}
	ml, ok := msgs.(*chat.List)
	if !ok {
		return "", errors.New("messages: want a JSON array")
	}
	tools, err := j.values.decode(req.Tools)
	if err != nil {
		return "", fmt.Errorf("tools: %w", err)
	}
	kwargs, err := j.values.decode(req.ChatTemplateKwargs)
	if err != nil {
		return "", fmt.Errorf("chat_template_kwargs: %w", err)
	}
	// Later keys win, as in transformers' render call: kwargs override the
	// special tokens in base, and the request's own fields cannot be
	// overridden by kwargs.
	vars := chat.NewDict()
	if kw, ok := kwargs.(*chat.Dict); ok {
		for _, k := range kw.Keys() {
			v, _ := kw.Get(k)
			vars.Set(k, v)
		}
	} else if kwargs != nil {
		return "", errors.New("chat_template_kwargs: want a JSON object")
	}
	vars.Set("messages", ml)
	vars.Set("tools", tools)
	if _, ok := vars.Get("documents"); !ok {
		vars.Set("documents", nil)
	}
	vars.Set("add_generation_prompt", req.AddGenerationPrompt)
	out, err := j.t.RenderOver(j.base, vars)
	if err != nil {
		return "", &TemplateError{Err: err}
	}
	if req.ContinueFinalMessage {
		return continueFinal(out, ml)
	}
	return out, nil
}

// continueFinal cuts the render right after the final message's content, as
// transformers does for continue_final_message.
func continueFinal(out string, msgs *chat.List) (string, error) {
	if len(msgs.Items) == 0 {
		return "", errors.New("continue_final_message needs at least one message")
	}
	last, _ := msgs.Items[len(msgs.Items)-1].(*chat.Dict)
	if last == nil {
		return "", errors.New("continue_final_message: the final message is not an object")
	}
	c, _ := last.Get("content")
	final, ok := c.(string)
	if l, isList := c.(*chat.List); isList {
		ok = false
		for i := len(l.Items) - 1; i >= 0; i-- {
			if part, isDict := l.Items[i].(*chat.Dict); isDict {
				if t, has := part.Get("text"); has {
					final, ok = t.(string)
					break
				}
			}
		}
	}
	if !ok {
		return "", errors.New("continue_final_message is set but the final message has no text to continue")
	}
	trimmed := strings.TrimSpace(final)
	loc := strings.LastIndex(out, trimmed)
	if loc < 0 {
		return "", errors.New("continue_final_message is set but the final message does not appear in the rendered chat")
	}
	left := strings.TrimLeft(final, " \t\n\r\v\f")
	if strings.HasPrefix(out[loc:], left) {
		return out[:loc+len(left)], nil
	}
	return out[:loc+len(trimmed)], nil
}
