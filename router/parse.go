package router

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sync"

	"github.com/valyala/fastjson"
	"github.com/valyala/fastjson/fastfloat"

	"github.com/prefixrouter/prefixrouter/tokenize"
	"github.com/prefixrouter/prefixrouter/tokenize/jsonspan"
)

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
	// User is the OpenAI "user" field, when a string; SessionID the
	// X-Session-Id header. Both name a conversation (holdback arms).
	User, SessionID string
	Stream          bool
	IncludeUsage    bool
	// CustomTemplate is set when the request brings its own chat_template:
	// local rendering would not match what the pod renders.
	CustomTemplate bool
	// PromptUnknown is set when the router cannot derive the prompt the pod
	// renders (a Responses body with tools, a previous response or items
	// other than text messages): the request is routed on load.
	PromptUnknown bool
	// TextBytes is the size of the text the router does not read (a
	// forwarded body, a Responses input it does not convert), the basis of
	// its token estimate.
	TextBytes int
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

// ParseRequest extracts the routing fields of a completions, chat or
// responses body into r (which it resets); of a forwarded endpoint's body
// (embeddings, score, ...) it reads only the model, which those endpoints
// may leave out. Only the fields the router needs are looked at
// and validated; unknown fields are the pod's business.
//
// The body is read once: one strict pass (RFC 8259, as the pod's parser
// reads it) checks the whole document and notes where each routing field's
// value lies, reading token-id prompts and checking chat messages on the
// way, because those are the long values and a second look at them costs
// as much as the first. The short fields are then read from their spans.
// Field errors are only reported once the whole body is known to be JSON,
// and only for the last occurrence of a key, as before.
func ParseRequest(ep Endpoint, body []byte, r *Request) error {
	ids := r.PromptIDs[:0]
	*r = Request{Endpoint: ep, PromptIDs: ids}
	p := bodyParser{b: body, ep: ep, ids: ids}
	if err := p.scan(); err != nil {
		return err
	}
	if !p.object {
		return &BadRequest{Message: "request body must be a JSON object"}
	}

	switch p.kind(fModel) {
	case 0, 'n':
		if ep.modelRequired() {
			return badParam("model", "you must provide a model parameter")
		}
	case '"':
		if r.Model = p.str(fModel); r.Model == "" && ep.modelRequired() {
			return badParam("model", "must not be empty")
		}
	default:
		return badParam("model", "must be a string")
	}
	if !ep.routed() {
		// The pod reads the rest; the router only needs the model, and
		// the body's size as a guess at the work.
		r.TextBytes = len(body)
		return nil
	}

	var err error
	if r.Stream, err = p.optBool(fStream, "stream", false); err != nil {
		return err
	}
	if k := p.kind(fStreamOptions); k != 0 && k != 'n' {
		if k != '{' {
			return badParam("stream_options", "must be an object")
		}
		vs, _ := lastMember(body, p.f[fStreamOptions].s, "include_usage")
		if r.IncludeUsage, err = boolAt(body, vs, false, "stream_options.include_usage"); err != nil {
			return err
		}
	}
	if p.kind(fUser) == '"' {
		// Only to keep a conversation in one holdback arm; the pod judges
		// the field.
		r.User = p.str(fUser)
	}
	if k := p.kind(fCacheSalt); k != 0 && k != 'n' {
		if k != '"' {
			return badParam("cache_salt", "must be a string")
		}
		if r.CacheSalt = p.str(fCacheSalt); r.CacheSalt == "" {
			// vLLM rejects an empty salt rather than treating it as absent.
			return badParam("cache_salt", "must be a non-empty string")
		}
	}

	switch ep {
	case EndpointCompletions:
		if r.AddSpecialTokens, err = p.optBool(fAddSpecialTokens, "add_special_tokens", true); err != nil {
			return err
		}
		return p.prompt(r)
	case EndpointChat:
		if r.AddSpecialTokens, err = p.optBool(fAddSpecialTokens, "add_special_tokens", false); err != nil {
			return err
		}
		return p.chat(r)
	case EndpointResponses:
		return p.responses(r)
	}
	return fmt.Errorf("router: unknown endpoint %d", ep)
}

// field names a top-level member the router reads.
type field uint8

const (
	fModel field = iota
	fStream
	fStreamOptions
	fCacheSalt
	fAddSpecialTokens
	fPrompt
	fMessages
	fTools
	fChatTemplateKwargs
	fAddGenerationPrompt
	fContinueFinalMessage
	fChatTemplate
	fInput
	fInstructions
	fPreviousResponseID
	fUser
	nFields
	fOther = nFields
)

func fieldOf(name []byte) field {
	switch string(name) {
	case "model":
		return fModel
	case "stream":
		return fStream
	case "stream_options":
		return fStreamOptions
	case "cache_salt":
		return fCacheSalt
	case "add_special_tokens":
		return fAddSpecialTokens
	case "prompt":
		return fPrompt
	case "messages":
		return fMessages
	case "tools":
		return fTools
	case "chat_template_kwargs":
		return fChatTemplateKwargs
	case "add_generation_prompt":
		return fAddGenerationPrompt
	case "continue_final_message":
		return fContinueFinalMessage
	case "chat_template":
		return fChatTemplate
	case "input":
		return fInput
	case "instructions":
		return fInstructions
	case "previous_response_id":
		return fPreviousResponseID
	case "user":
		return fUser
	}
	return fOther
}

// span is where a value lies in the body; e == 0 means absent (a value
// inside the top-level object never ends at offset 0).
type span struct{ s, e int }

// bodyParser is the state of one strict pass over a request body.
type bodyParser struct {
	b      []byte
	ep     Endpoint
	object bool
	// f holds the span of the last occurrence of each routing field:
	// with duplicate keys the pod's parser (Python's json) keeps the last
	// one, and so must the router, or it would route one prompt and
	// forward another.
	f [nFields]span

	// The last "prompt" of a completions body, when it is an array of plain
	// decimal ids, read during the pass (fastIDs).
	ids     []uint32
	fastIDs bool

	// The last "messages" of a chat body, when it is an array: its length
	// and the first message the router would refuse.
	msgCount int
	msgErr   *BadRequest
}

func (p *bodyParser) fail(i int, what string) error {
	return &BadRequest{Message: fmt.Sprintf("request body is not valid JSON: %s at offset %d", what, i)}
}

func (p *bodyParser) scan() error {
	b := p.b
	i := skipWS(b, 0)
	var err error
	if i < len(b) && b[i] == '{' {
		p.object = true
		i, err = p.topObject(i)
	} else {
		i, err = p.value(i, 0)
	}
	if err != nil {
		return err
	}
	if i = skipWS(b, i); i < len(b) {
		return p.fail(i, "unexpected data after the top-level value")
	}
	return nil
}

// topObject reads the top-level object (depth 1) and records the spans of
// the routing fields.
func (p *bodyParser) topObject(i int) (int, error) {
	b := p.b
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1, nil
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return i, p.fail(i, "expected a key")
		}
		ks := i
		end, esc, err := p.stringToken(i)
		if err != nil {
			return end, err
		}
		f := fieldOf(keyName(b[ks:end], esc))
		i = skipWS(b, end)
		if i >= len(b) || b[i] != ':' {
			return i, p.fail(i, "expected ':'")
		}
		i = skipWS(b, i+1)
		vs := i
		switch {
		case f == fPrompt && p.ep == EndpointCompletions:
			i, err = p.promptValue(i)
		case f == fMessages && p.ep == EndpointChat:
			i, err = p.messagesValue(i)
		default:
			i, err = p.value(i, 1)
		}
		if err != nil {
			return i, err
		}
		if f < nFields {
			p.f[f] = span{vs, i}
		}
		var done bool
		if i, done, err = p.afterElement(i, '}'); err != nil || done {
			return i, err
		}
	}
}

// keyName is the decoded name of a raw key token, for comparison only
// (switch string(...) on it does not allocate). Escaped keys are rare: they
// take encoding/json's decoder rather than a second one kept here.
func keyName(raw []byte, esc bool) []byte {
	if !esc {
		return raw[1 : len(raw)-1]
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return nil
	}
	return []byte(s)
}

// value checks the JSON value at b[i] whose parent is at depth depth and
// returns the index just past it. Depth is bounded as fastjson bounded it
// (every value counts, the top-level one is at depth 1), so the router
// keeps accepting and refusing the same bodies.
func (p *bodyParser) value(i, depth int) (int, error) {
	b := p.b
	if i >= len(b) {
		return i, p.fail(i, "unexpected end of input")
	}
	depth++
	if depth > fastjson.MaxDepth {
		return i, p.fail(i, fmt.Sprintf("nesting deeper than %d", fastjson.MaxDepth))
	}
	c := b[i]
	switch c {
	case '"':
		end, _, err := p.stringToken(i)
		return end, err
	case '{':
		return p.objectValue(i, depth)
	case '[':
		return p.array(i, depth)
	case 't':
		return p.literal(i, "true")
	case 'f':
		return p.literal(i, "false")
	case 'n':
		return p.literal(i, "null")
	}
	if c == '-' || isDigit(c) {
		end, what := scanNumber(b, i)
		if what != "" {
			return end, p.fail(i, what)
		}
		return end, nil
	}
	return i, p.fail(i, "unexpected character")
}

func (p *bodyParser) literal(i int, lit string) (int, error) {
	if !bytes.HasPrefix(p.b[i:], []byte(lit)) {
		return i, p.fail(i, "unexpected word")
	}
	return i + len(lit), nil
}

// stringToken checks the string token at b[i] == '"': no raw control
// characters, only the escapes JSON defines. It returns the index past the
// closing quote and whether the string has escapes.
func (p *bodyParser) stringToken(i int) (int, bool, error) {
	b := p.b
	n := len(b)
	esc := false
	i++
	for {
		for i < n && !strSpecial[b[i]] {
			i++
		}
		if i >= n {
			return i, esc, p.fail(i, "unterminated string")
		}
		c := b[i]
		if c == '"' {
			return i + 1, esc, nil
		}
		if c < 0x20 {
			return i, esc, p.fail(i, fmt.Sprintf("control character 0x%02x in a string", c))
		}
		esc = true
		if i+1 >= n {
			return i, esc, p.fail(i, "unterminated escape")
		}
		switch b[i+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			i += 2
		case 'u':
			if i+5 >= n || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) || !isHex(b[i+5]) {
				return i, esc, p.fail(i, "bad \\u escape")
			}
			i += 6
		default:
			return i, esc, p.fail(i, "invalid escape")
		}
	}
}

// objectValue checks the object at b[i] == '{', itself at depth depth.
func (p *bodyParser) objectValue(i, depth int) (int, error) {
	b := p.b
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1, nil
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return i, p.fail(i, "expected a key")
		}
		end, _, err := p.stringToken(i)
		if err != nil {
			return end, err
		}
		i = skipWS(b, end)
		if i >= len(b) || b[i] != ':' {
			return i, p.fail(i, "expected ':'")
		}
		if i, err = p.value(skipWS(b, i+1), depth); err != nil {
			return i, err
		}
		var done bool
		if i, done, err = p.afterElement(i, '}'); err != nil || done {
			return i, err
		}
	}
}

// array checks the array at b[i] == '[', itself at depth depth.
func (p *bodyParser) array(i, depth int) (int, error) {
	b := p.b
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return i + 1, nil
	}
	for {
		var err error
		if i, err = p.value(i, depth); err != nil {
			return i, err
		}
		var done bool
		if i, done, err = p.afterElement(i, ']'); err != nil || done {
			return i, err
		}
	}
}

// promptValue reads a completions prompt. The common large case, one
// prompt of plain decimal token ids, is read into ids as it is checked;
// anything else is only checked here and read from its span afterwards.
func (p *bodyParser) promptValue(i int) (int, error) {
	if i < len(p.b) && p.b[i] == '[' {
		ids, end, ok := scanIDs(p.ids[:0], p.b, i)
		p.ids = ids // keep the capacity either way
		if ok {
			p.fastIDs = true
			return end, nil
		}
	}
	p.fastIDs = false
	return p.value(i, 1)
}

// scanIDs reads a JSON array of plain non-negative decimal integers below
// 2^32 ("[1, 2,3]") starting at b[i] == '[' and returns the index past it;
// ok is false for anything else (signs, fractions, exponents, other types,
// malformed JSON), which the caller then checks in full. What it accepts is
// valid JSON, so it doubles as the check.
func scanIDs(dst []uint32, b []byte, i int) (ids []uint32, end int, ok bool) {
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return dst, i, false
	}
	// This loop is most of the cost of a token-id request: whitespace is
	// only looked for when the next byte could be some (<= ' '), and the
	// range is checked once per id (10 digits cannot overflow uint64).
	for {
		start := i
		var n uint64
		for i < len(b) {
			d := b[i] - '0'
			if d > 9 {
				break
			}
			n = n*10 + uint64(d)
			i++
		}
		if i == start || i-start > 10 || n > math.MaxUint32 || (b[start] == '0' && i-start > 1) || len(dst) >= maxPromptIDs {
			return dst, i, false
		}
		dst = append(dst, uint32(n))
		if i < len(b) && b[i] <= ' ' {
			i = skipWS(b, i)
		}
		if i >= len(b) {
			return dst, i, false
		}
		switch b[i] {
		case ',':
			if i++; i < len(b) && b[i] <= ' ' {
				i = skipWS(b, i)
			}
		case ']':
			return dst, i + 1, true
		default:
			return dst, i, false
		}
	}
}

// messagesValue checks a chat "messages" value and, when it is an array,
// each message's role and content types in the same pass, keeping the
// first refusal for after the whole body has been checked.
func (p *bodyParser) messagesValue(i int) (int, error) {
	b := p.b
	p.msgCount, p.msgErr = 0, nil
	if i >= len(b) || b[i] != '[' {
		return p.value(i, 1)
	}
	// The array is at depth 2, its elements at 3.
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return i + 1, nil
	}
	for k := 0; ; k++ {
		var err error
		if i < len(b) && b[i] == '{' {
			i, err = p.message(i, k)
		} else {
			if p.msgErr == nil && i < len(b) {
				p.msgErr = badParam(fmt.Sprintf("messages[%d]", k), "must be an object")
			}
			i, err = p.value(i, 2)
		}
		if err != nil {
			return i, err
		}
		p.msgCount++
		var done bool
		if i, done, err = p.afterElement(i, ']'); err != nil || done {
			return i, err
		}
	}
}

// message checks message k, an object at depth 3, noting the type of its
// last "role" and "content" by their first byte.
func (p *bodyParser) message(i, k int) (int, error) {
	b := p.b
	var role, content byte
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		i++
	} else {
	members:
		for {
			if i >= len(b) || b[i] != '"' {
				return i, p.fail(i, "expected a key")
			}
			ks := i
			end, esc, err := p.stringToken(i)
			if err != nil {
				return end, err
			}
			i = skipWS(b, end)
			if i >= len(b) || b[i] != ':' {
				return i, p.fail(i, "expected ':'")
			}
			vs := skipWS(b, i+1)
			if i, err = p.value(vs, 3); err != nil {
				return i, err
			}
			switch string(keyName(b[ks:end], esc)) {
			case "role":
				role = b[vs]
			case "content":
				content = b[vs]
			}
			var done bool
			if i, done, err = p.afterElement(i, '}'); err != nil {
				return i, err
			} else if done {
				break members
			}
		}
	}
	if p.msgErr == nil {
		switch {
		case role == 0:
			p.msgErr = badParam(fmt.Sprintf("messages[%d].role", k), "is required")
		case role != '"':
			p.msgErr = badParam(fmt.Sprintf("messages[%d].role", k), "must be a string")
		case content != 0 && content != '"' && content != '[' && content != 'n':
			p.msgErr = badParam(fmt.Sprintf("messages[%d].content", k), "must be a string, an array of content parts or null")
		}
	}
	return i, nil
}

// kind is the first byte of field f's value ('"', '{', '[', 't', 'f',
// 'n', '-' or a digit), or 0 when the field is absent.
func (p *bodyParser) kind(f field) byte {
	if p.f[f].e == 0 {
		return 0
	}
	return p.b[p.f[f].s]
}

// str decodes field f, a checked string token.
func (p *bodyParser) str(f field) string {
	return decodeString(p.b[p.f[f].s:p.f[f].e])
}

// decodeString decodes a checked JSON string token. Strings with escapes
// are decoded by fastjson, as they always were, so the router sees the
// same model names and prompts as before.
func decodeString(tok []byte) string {
	inner := tok[1 : len(tok)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		return string(inner)
	}
	fp := parserPool.Get()
	defer parserPool.Put(fp)
	v, err := fp.ParseBytes(tok)
	if err != nil {
		return string(inner) // unreachable: tok was checked
	}
	sb, _ := v.StringBytes()
	return string(sb)
}

func (p *bodyParser) optBool(f field, key string, def bool) (bool, error) {
	if p.f[f].e == 0 {
		return def, nil
	}
	return boolAt(p.b, p.f[f].s, def, key)
}

// boolAt reads the optional boolean whose value starts at b[vs] (vs == 0:
// absent).
func boolAt(b []byte, vs int, def bool, param string) (bool, error) {
	if vs == 0 {
		return def, nil
	}
	switch b[vs] {
	case 'n':
		return def, nil
	case 't':
		return true, nil
	case 'f':
		return false, nil
	}
	return false, badParam(param, "must be a boolean")
}

// lastMember returns the span of the last value of key in the checked
// object at b[s] == '{'; vs == 0 when the key is absent.
func lastMember(b []byte, s int, key string) (vs, ve int) {
	i := skipWS(b, s+1)
	for i < len(b) && b[i] != '}' {
		ks := i
		i = skipValue(b, i)
		k := b[ks:i]
		i = skipWS(b, skipWS(b, i)+1) // past ':'
		v0 := i
		i = skipValue(b, i)
		if keyEquals(k, key) {
			vs, ve = v0, i
		}
		if i = skipWS(b, i); i < len(b) && b[i] == ',' {
			i = skipWS(b, i+1)
		}
	}
	return vs, ve
}

// forElems calls fn with the index and span of each element of the checked
// array at b[s] == '[' until fn returns false.
func forElems(b []byte, s int, fn func(k, vs, ve int) bool) {
	i := skipWS(b, s+1)
	for k := 0; i < len(b) && b[i] != ']'; k++ {
		vs := i
		i = skipValue(b, i)
		if !fn(k, vs, i) {
			return
		}
		if i = skipWS(b, i); i < len(b) && b[i] == ',' {
			i = skipWS(b, i+1)
		}
	}
}

func countElems(b []byte, s int) int {
	n := 0
	forElems(b, s, func(int, int, int) bool { n++; return true })
	return n
}

func (p *bodyParser) prompt(r *Request) error {
	b := p.b
	switch p.kind(fPrompt) {
	case 0, 'n':
		return badParam("prompt", "you must provide a prompt")
	case '"':
		if r.PromptText = p.str(fPrompt); r.PromptText == "" {
			return badParam("prompt", "must not be empty")
		}
		r.BatchSize = 1
		return nil
	case '[':
	default:
		return badParam("prompt", "must be a string, an array of strings, an array of token ids or an array of token-id arrays")
	}
	if p.fastIDs {
		r.PromptIDs, r.HasIDs, r.BatchSize = p.ids, true, 1
		return nil
	}
	s := p.f[fPrompt].s
	n := countElems(b, s)
	if n == 0 {
		return badParam("prompt", "must not be empty")
	}
	switch first := b[skipWS(b, s+1)]; {
	case first == '-' || isDigit(first):
		// One prompt as token ids, with a form the pass did not read
		// (an exponent, a fraction, a sign): checked value by value.
		ids, err := appendSpanIDs(p.ids[:0], b, s, n, "prompt")
		if err != nil {
			return err
		}
		r.PromptIDs, r.HasIDs, r.BatchSize = ids, true, 1
		return nil
	case first == '"':
		var err error
		forElems(b, s, func(k, vs, ve int) bool {
			if b[vs] != '"' {
				err = badParam(fmt.Sprintf("prompt[%d]", k), "must be a string like the other elements")
				return false
			}
			if ve-vs == 2 {
				err = badParam(fmt.Sprintf("prompt[%d]", k), "must not be empty")
				return false
			}
			if k == 0 {
				r.PromptText = decodeString(b[vs:ve])
			}
			return true
		})
		if err != nil {
			return err
		}
		r.BatchSize = n
		return nil
	case first == '[':
		var err error
		forElems(b, s, func(k, vs, ve int) bool {
			param := fmt.Sprintf("prompt[%d]", k)
			if b[vs] != '[' {
				err = badParam(param, "must be an array of token ids like the other elements")
				return false
			}
			m := countElems(b, vs)
			if m == 0 {
				err = badParam(param, "must not be empty")
				return false
			}
			if k == 0 {
				var ids []uint32
				if ids, err = appendSpanIDs(p.ids[:0], b, vs, m, "prompt[0]"); err != nil {
					return false
				}
				p.ids, r.PromptIDs = ids, ids
				return true
			}
			err = checkSpanIDs(b, vs, param)
			return err == nil
		})
		if err != nil {
			return err
		}
		r.HasIDs, r.BatchSize = true, n
		return nil
	}
	return badParam("prompt[0]", "must be a string, a token id or an array of token ids")
}

// tokenIDAt reads the token id whose value is b[vs:ve], element i of param.
func tokenIDAt(b []byte, vs, ve int, param string, i int) (uint32, error) {
	if c := b[vs]; c != '-' && !isDigit(c) {
		return 0, badParam(fmt.Sprintf("%s[%d]", param, i), "token ids must be integers")
	}
	// fastfloat is what fastjson's Float64 used: the same ids pass.
	f, err := fastfloat.Parse(string(b[vs:ve]))
	if err != nil || f < 0 || f > math.MaxUint32 || f != math.Trunc(f) {
		return 0, badParam(fmt.Sprintf("%s[%d]", param, i), "token ids must be non-negative integers below 2^32")
	}
	return uint32(f), nil
}

// appendSpanIDs appends the n token ids of the checked array at b[s].
func appendSpanIDs(dst []uint32, b []byte, s, n int, param string) ([]uint32, error) {
	if n > maxPromptIDs {
		return dst, badParam(param, "too many token ids (%d > %d)", n, maxPromptIDs)
	}
	var err error
	forElems(b, s, func(k, vs, ve int) bool {
		var id uint32
		if id, err = tokenIDAt(b, vs, ve, param, k); err != nil {
			return false
		}
		dst = append(dst, id)
		return true
	})
	return dst, err
}

// checkSpanIDs checks the token ids of the checked array at b[s] (a batch
// element after the first: only the first routes).
func checkSpanIDs(b []byte, s int, param string) error {
	var err error
	forElems(b, s, func(k, vs, ve int) bool {
		_, err = tokenIDAt(b, vs, ve, param, k)
		return err == nil
	})
	return err
}

func (p *bodyParser) chat(r *Request) error {
	b := p.b
	switch p.kind(fMessages) {
	case 0, 'n':
		return badParam("messages", "you must provide messages")
	case '[':
	default:
		return badParam("messages", "must be an array")
	}
	if p.msgCount == 0 {
		return badParam("messages", "must not be empty")
	}
	if p.msgErr != nil {
		return p.msgErr
	}
	// Raw spans, not re-serialized values: the chat template must see the
	// client's key order, and copying a long conversation through a
	// re-encoder costs more than the rest of the parse.
	r.Chat.Messages = json.RawMessage(b[p.f[fMessages].s:p.f[fMessages].e])
	if k := p.kind(fTools); k != 0 && k != 'n' {
		if k != '[' {
			return badParam("tools", "must be an array")
		}
		r.Chat.Tools = json.RawMessage(b[p.f[fTools].s:p.f[fTools].e])
	}
	if k := p.kind(fChatTemplateKwargs); k != 0 && k != 'n' {
		if k != '{' {
			return badParam("chat_template_kwargs", "must be an object")
		}
		r.Chat.ChatTemplateKwargs = json.RawMessage(b[p.f[fChatTemplateKwargs].s:p.f[fChatTemplateKwargs].e])
	}
	var err error
	if r.Chat.AddGenerationPrompt, err = p.optBool(fAddGenerationPrompt, "add_generation_prompt", true); err != nil {
		return err
	}
	if r.Chat.ContinueFinalMessage, err = p.optBool(fContinueFinalMessage, "continue_final_message", false); err != nil {
		return err
	}
	if r.Chat.AddGenerationPrompt && r.Chat.ContinueFinalMessage {
		// vLLM refuses the combination; so do we, before a pod sees it.
		if p.kind(fAddGenerationPrompt) == 't' {
			return badParam("continue_final_message", "cannot be combined with add_generation_prompt=true")
		}
		// Implicit add_generation_prompt default gives way.
		r.Chat.AddGenerationPrompt = false
	}
	if k := p.kind(fChatTemplate); k != 0 && k != 'n' {
		if k != '"' {
			return badParam("chat_template", "must be a string")
		}
		r.CustomTemplate = true
	}
	r.Chat.Body = b
	r.BatchSize = 1
	return nil
}

// keyEquals compares a raw JSON string token with key; keys with escapes
// are decoded first (rare).
func keyEquals(raw []byte, key string) bool {
	if len(raw) < 2 {
		return false
	}
	return string(keyName(raw, bytes.IndexByte(raw[1:len(raw)-1], '\\') >= 0)) == key
}

// strSpecial marks the bytes that end the fast run inside a string: the
// quote, the backslash and raw control characters.
var strSpecial = func() (str [256]bool) {
	for c := 0; c < 0x20; c++ {
		str[c] = true
	}
	str['"'], str['\\'] = true, true
	return
}()

// afterElement reads what follows an object member or an array element: a
// ',' (more to come, returned past it and its white space) or the closing
// byte (done, returned past it).
func (p *bodyParser) afterElement(i int, close byte) (int, bool, error) {
	b := p.b
	i = skipWS(b, i)
	if i >= len(b) {
		if close == '}' {
			return i, false, p.fail(i, "unterminated object")
		}
		return i, false, p.fail(i, "unterminated array")
	}
	switch b[i] {
	case ',':
		return skipWS(b, i+1), false, nil
	case close:
		return i + 1, true, nil
	}
	return i, false, p.fail(i, "expected ',' or '"+string(close)+"'")
}

func skipWS(b []byte, i int) int { return jsonspan.SkipWS(b, i) }

// skipValue returns the index just past the checked JSON value at b[i].
func skipValue(b []byte, i int) int {
	end, _ := jsonspan.End(b, i)
	return end
}

// scanNumber checks the JSON number grammar from body[i] on:
// -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?, ending at a
// delimiter. It returns the index after the number, or what is wrong.
func scanNumber(body []byte, i int) (int, string) {
	n := len(body)
	j := i
	if body[j] == '-' {
		j++
	}
	switch {
	case j >= n || !isDigit(body[j]):
		return j, "malformed minus"
	case body[j] == '0':
		j++
		if j < n && isDigit(body[j]) {
			return j, "leading zero"
		}
	default:
		for j < n && isDigit(body[j]) {
			j++
		}
	}
	if j < n && body[j] == '.' {
		j++
		if j >= n || !isDigit(body[j]) {
			return j, "malformed fraction"
		}
		for j < n && isDigit(body[j]) {
			j++
		}
	}
	if j < n && (body[j] == 'e' || body[j] == 'E') {
		j++
		if j < n && (body[j] == '+' || body[j] == '-') {
			j++
		}
		if j >= n || !isDigit(body[j]) {
			return j, "malformed exponent"
		}
		for j < n && isDigit(body[j]) {
			j++
		}
	}
	if j < n && !isDelimiter(body[j]) {
		return j, "malformed number"
	}
	return j, ""
}

// isDelimiter reports whether c may follow a number or literal.
func isDelimiter(c byte) bool {
	switch c {
	case ',', ']', '}', ' ', '\t', '\r', '\n':
		return true
	}
	return false
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isHex(c byte) bool { return isDigit(c) || (c|0x20 >= 'a' && c|0x20 <= 'f') }

// member returns the last value of key in o: with duplicate keys the pod's
// parser (Python's json) keeps the last one, and so must the router, or it
// would route one prompt and forward another.
func member(o *fastjson.Object, key string) *fastjson.Value {
	var last *fastjson.Value
	o.Visit(func(k []byte, v *fastjson.Value) {
		if string(k) == key {
			last = v
		}
	})
	return last
}
