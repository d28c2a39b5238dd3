package router

// The parser as it was before the single strict pass: fastjson for
// structure, strictJSON for what fastjson tolerates, rawMember/scanIDs for
// spans and ids. It stays here as the reference FuzzParseAgainstReference
// compares ParseRequest with, and strictJSON stays the lexical oracle of
// FuzzParseRequest.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"

	"github.com/valyala/fastjson"
)

// ParseRequest extracts the routing fields of a completions or chat body
// into r (which it resets). Only the fields the router needs are looked at
// and validated; unknown fields are the pod's business.
func refParseRequest(ep Endpoint, body []byte, r *Request) error {
	ids := r.PromptIDs[:0]
	*r = Request{Endpoint: ep, PromptIDs: ids}
	p := parserPool.Get()
	defer parserPool.Put(p)
	v, err := p.ParseBytes(body)
	if err != nil {
		return &BadRequest{Message: "request body is not valid JSON: " + err.Error()}
	}
	if err := strictJSON(body); err != nil {
		return err
	}
	o, err := v.Object()
	if err != nil {
		return &BadRequest{Message: "request body must be a JSON object"}
	}

	mv := member(o, "model")
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

	if r.Stream, err = refOptBool(o, "stream", false); err != nil {
		return err
	}
	if so := member(o, "stream_options"); so != nil && so.Type() != fastjson.TypeNull {
		soo, err := so.Object()
		if err != nil {
			return badParam("stream_options", "must be an object")
		}
		if r.IncludeUsage, err = refOptBool(soo, "include_usage", false); err != nil {
			return badParam("stream_options.include_usage", "must be a boolean")
		}
	}
	if sv := member(o, "cache_salt"); sv != nil && sv.Type() != fastjson.TypeNull {
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
		if r.AddSpecialTokens, err = refOptBool(o, "add_special_tokens", true); err != nil {
			return err
		}
		return refParsePrompt(member(o, "prompt"), body, r)
	case EndpointChat:
		if r.AddSpecialTokens, err = refOptBool(o, "add_special_tokens", false); err != nil {
			return err
		}
		return refParseChat(o, body, r)
	}
	return fmt.Errorf("router: unknown endpoint %d", ep)
}

func refOptBool(o *fastjson.Object, key string, def bool) (bool, error) {
	v := member(o, key)
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

func refParsePrompt(v *fastjson.Value, body []byte, r *Request) error {
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
		// One prompt as token ids. Plain decimal ids are read straight
		// from the body; anything else takes the checked path below.
		if ids, ok := refScanIDs(r.PromptIDs[:0], rawMember(body, "prompt")); ok && len(ids) == len(arr) {
			r.PromptIDs, r.HasIDs, r.BatchSize = ids, true, 1
			return nil
		}
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
			} else if err := refCheckIDs(inner, fmt.Sprintf("prompt[%d]", i)); err != nil {
				return err
			}
		}
		r.HasIDs, r.BatchSize = true, len(arr)
		return nil
	}
	return badParam("prompt[0]", "must be a string, a token id or an array of token ids")
}

func refTokenID(v *fastjson.Value, param string, i int) (uint32, error) {
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
		id, err := refTokenID(e, param, i)
		if err != nil {
			return dst, err
		}
		dst = append(dst, id)
	}
	return dst, nil
}

func refCheckIDs(arr []*fastjson.Value, param string) error {
	for i, e := range arr {
		if _, err := refTokenID(e, param, i); err != nil {
			return err
		}
	}
	return nil
}

func refParseChat(o *fastjson.Object, body []byte, r *Request) error {
	mv := member(o, "messages")
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
		role := member(mo, "role")
		if role == nil {
			return badParam(fmt.Sprintf("messages[%d].role", i), "is required")
		}
		if role.Type() != fastjson.TypeString {
			return badParam(fmt.Sprintf("messages[%d].role", i), "must be a string")
		}
		if c := member(mo, "content"); c != nil {
			switch c.Type() {
			case fastjson.TypeString, fastjson.TypeArray, fastjson.TypeNull:
			default:
				return badParam(fmt.Sprintf("messages[%d].content", i), "must be a string, an array of content parts or null")
			}
		}
	}
	r.Chat.Messages = json.RawMessage(rawMember(body, "messages"))
	if tv := member(o, "tools"); tv != nil && tv.Type() != fastjson.TypeNull {
		if tv.Type() != fastjson.TypeArray {
			return badParam("tools", "must be an array")
		}
		r.Chat.Tools = json.RawMessage(rawMember(body, "tools"))
	}
	if kv := member(o, "chat_template_kwargs"); kv != nil && kv.Type() != fastjson.TypeNull {
		if kv.Type() != fastjson.TypeObject {
			return badParam("chat_template_kwargs", "must be an object")
		}
		r.Chat.ChatTemplateKwargs = json.RawMessage(rawMember(body, "chat_template_kwargs"))
	}
	if r.Chat.AddGenerationPrompt, err = refOptBool(o, "add_generation_prompt", true); err != nil {
		return err
	}
	if r.Chat.ContinueFinalMessage, err = refOptBool(o, "continue_final_message", false); err != nil {
		return err
	}
	if r.Chat.AddGenerationPrompt && r.Chat.ContinueFinalMessage {
		// vLLM refuses the combination; so do we, before a pod sees it.
		if v := member(o, "add_generation_prompt"); v != nil && v.Type() == fastjson.TypeTrue {
			return badParam("continue_final_message", "cannot be combined with add_generation_prompt=true")
		}
		// Implicit add_generation_prompt default gives way.
		r.Chat.AddGenerationPrompt = false
	}
	if ct := member(o, "chat_template"); ct != nil && ct.Type() != fastjson.TypeNull {
		if ct.Type() != fastjson.TypeString {
			return badParam("chat_template", "must be a string")
		}
		r.CustomTemplate = true
	}
	r.Chat.Body = body
	r.BatchSize = 1
	return nil
}

// rawMember returns the raw bytes of a top-level member's value in a JSON
// object that has already been validated, without re-serializing it: the
// chat template must see the client's key order, and copying a long
// conversation through a re-encoder costs more than the rest of the parse.
// It returns nil when the key is absent. Duplicate keys: the last wins, as in
// Python's json.loads (what the pod uses).
func rawMember(body []byte, key string) []byte {
	i := skipWS(body, 0)
	if i >= len(body) || body[i] != '{' {
		return nil
	}
	i++
	var found []byte
	for {
		i = skipWS(body, i)
		if i >= len(body) || body[i] == '}' {
			return found
		}
		if body[i] == ',' {
			i++
			continue
		}
		ks := i
		i = skipValue(body, i)
		k := body[ks:i]
		i = skipWS(body, i)
		if i >= len(body) || body[i] != ':' {
			return found
		}
		i = skipWS(body, i+1)
		vs := i
		i = skipValue(body, i)
		if keyEquals(k, key) {
			found = body[vs:i]
		}
	}
}

// scanIDs reads a JSON array of plain non-negative decimal integers below
// 2^32 ("[1, 2,3]"); ok is false for anything else (signs, fractions,
// exponents, other types), which the caller then checks value by value.
func refScanIDs(dst []uint32, raw []byte) ([]uint32, bool) {
	i := skipWS(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return dst, false
	}
	i = skipWS(raw, i+1)
	if i < len(raw) && raw[i] == ']' {
		return dst, false
	}
	for {
		start := i
		var n uint64
		for i < len(raw) && raw[i] >= '0' && raw[i] <= '9' {
			n = n*10 + uint64(raw[i]-'0')
			if n > math.MaxUint32 {
				return dst, false
			}
			i++
		}
		if i == start || (raw[start] == '0' && i-start > 1) || len(dst) >= maxPromptIDs {
			return dst, false
		}
		dst = append(dst, uint32(n))
		i = skipWS(raw, i)
		if i >= len(raw) {
			return dst, false
		}
		switch raw[i] {
		case ',':
			i = skipWS(raw, i+1)
		case ']':
			return dst, true
		default:
			return dst, false
		}
	}
}

// strictJSON rejects what fastjson tolerates but JSON (RFC 8259, and the
// pod's parser) does not: raw control characters and unknown escapes in
// strings, leading zeros, bare words such as NaN or Inf, and malformed
// signs and fractions. fastjson has already checked the structure; this is
// one table-driven pass over the bytes.
func strictJSON(body []byte) error {
	bad := func(i int, what string) error {
		return &BadRequest{Message: fmt.Sprintf("request body is not valid JSON: %s at offset %d", what, i)}
	}
	n := len(body)
	for i := 0; i < n; i++ {
		c := body[i]
		switch outClass[c] {
		case clsPlain:
			continue
		case clsSpace:
			continue
		case clsQuote:
			// A string: skip plain bytes fast, check escapes and controls.
			i++
			for i < n {
				for i < n && !refStrSpecial[body[i]] {
					i++
				}
				if i >= n {
					return bad(i, "unterminated string")
				}
				c := body[i]
				if c == '"' {
					break
				}
				if c < 0x20 {
					return bad(i, fmt.Sprintf("control character 0x%02x in a string", c))
				}
				// backslash
				if i+1 >= n {
					return bad(i, "unterminated escape")
				}
				switch body[i+1] {
				case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
					i += 2
				case 'u':
					if i+5 >= n || !isHex(body[i+2]) || !isHex(body[i+3]) || !isHex(body[i+4]) || !isHex(body[i+5]) {
						return bad(i, "bad \\u escape")
					}
					i += 6
				default:
					return bad(i, "invalid escape")
				}
			}
			continue
		}
		switch {
		case c == '-' || isDigit(c):
			end, what := scanNumber(body, i)
			if what != "" {
				return bad(i, what)
			}
			i = end - 1
		case c == 't' || c == 'f' || c == 'n':
			lit := "null"
			if c == 't' {
				lit = "true"
			} else if c == 'f' {
				lit = "false"
			}
			if !bytes.HasPrefix(body[i:], []byte(lit)) {
				return bad(i, "unexpected word")
			}
			i += len(lit) - 1
			if i+1 < n && !isDelimiter(body[i+1]) {
				return bad(i+1, "unexpected character after "+lit)
			}
		default:
			return bad(i, "unexpected character")
		}
	}
	return nil
}

const (
	clsCheck uint8 = iota // needs a closer look (numbers, words)
	clsPlain              // structure
	clsSpace
	clsQuote
)

var outClass, refStrSpecial = func() (out [256]uint8, str [256]bool) {
	for _, c := range []byte("{}[]:,") {
		out[c] = clsPlain
	}
	for _, c := range []byte(" \t\r\n") {
		out[c] = clsSpace
	}
	out['"'] = clsQuote
	for c := 0; c < 0x20; c++ {
		str[c] = true
	}
	str['"'], str['\\'] = true, true
	return
}()
