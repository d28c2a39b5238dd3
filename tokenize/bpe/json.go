package bpe

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/prefixrouter/prefixrouter/tokenize/jsonspan"
	"github.com/valyala/fastjson"
)

// The tokenizer.json schema, as written by HuggingFace tokenizers. The
// model (vocabulary and merges, nearly all of a file's bytes) and the added
// tokens are decoded by decodeFile; the small components are kept raw
// because their fields depend on "type", and decoded by their parsers with
// encoding/json.

type fileJSON struct {
	AddedTokens   []addedTokenJS
	Normalizer    json.RawMessage
	PreTokenizer  json.RawMessage
	Model         *modelJS // nil when absent or null
	PostProcessor json.RawMessage
	Decoder       json.RawMessage
}

type addedTokenJS struct {
	ID         uint32
	Content    string
	SingleWord bool
	LStrip     bool
	RStrip     bool
	Normalized bool
	Special    bool
}

type modelJS struct {
	Type                    string
	Vocab                   map[string]uint32
	HasMerges               bool // "merges" is present, even as null
	Merges                  [][2]string
	UnkToken                *string
	FuseUnk                 bool
	ByteFallback            bool
	IgnoreMerges            bool
	ContinuingSubwordPrefix *string
	EndOfWordSuffix         *string
	Dropout                 *float64
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

// errDuplicateField is wrapped by decodeFile's error for an object that
// names one of its fields twice. HF's deserializer (serde) refuses such a
// file too; encoding/json would have let the last one win.
var errDuplicateField = errors.New("duplicate field")

// decodeFile decodes a tokenizer.json. It reads what encoding/json would
// have read into the schema's structs (field names matched ignoring case,
// null leaving a field unset, strings with invalid UTF-8 or lone surrogates
// repaired to U+FFFD, ids that are not unsigned 32-bit integers refused),
// except that a repeated field is an error and that nesting deeper than
// encoding/json's 10,000 levels is not; the tokenize/bpe tests hold it to
// encoding/json. It exists because encoding/json's reflection made
// loading a 150k-token tokenizer take over a second; see
// BenchmarkLoad.
func decodeFile(data []byte) (fileJSON, error) {
	var f fileJSON
	r, err := newReader(data)
	if err != nil {
		return f, err
	}
	if r.null() {
		return f, nil
	}
	var seen fields
	err = r.object("tokenizer.json", func(key string) error {
		var err error
		switch {
		case seen.is(key, "version"):
			_, err = r.strOrNull("version")
		case seen.is(key, "added_tokens"):
			f.AddedTokens, err = r.addedTokens()
		case seen.is(key, "normalizer"):
			f.Normalizer = r.raw()
		case seen.is(key, "pre_tokenizer"):
			f.PreTokenizer = r.raw()
		case seen.is(key, "model"):
			f.Model, err = r.model()
		case seen.is(key, "post_processor"):
			f.PostProcessor = r.raw()
		case seen.is(key, "decoder"):
			f.Decoder = r.raw()
		default:
			r.raw()
		}
		if seen.err != nil {
			return seen.err
		}
		return err
	})
	return f, err
}

// reader walks JSON that fastjson.ValidateBytes accepted.
type reader struct {
	data []byte
	pos  int
}

// newReader validates data and returns a reader at its value. Validating
// first lets the walk skip values with jsonspan.End and tell a scalar's
// type by its first byte.
func newReader(data []byte) (*reader, error) {
	if err := fastjson.ValidateBytes(data); err != nil {
		return nil, err
	}
	r := &reader{data: data}
	r.ws()
	return r, nil
}

func (r *reader) ws() { r.pos = jsonspan.SkipWS(r.data, r.pos) }

// null consumes a null.
func (r *reader) null() bool {
	if r.data[r.pos] != 'n' {
		return false
	}
	r.pos += len("null")
	r.ws()
	return true
}

// raw consumes any value and returns its bytes.
func (r *reader) raw() json.RawMessage {
	start := r.pos
	r.pos, _ = jsonspan.End(r.data, start) // valid JSON: always ok
	raw := r.data[start:r.pos]
	r.ws()
	return raw
}

// kind names a value's JSON type for errors.
func (r *reader) kind() string {
	switch r.data[r.pos] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a bool"
	case 'n':
		return "null"
	}
	return "a number"
}

func (r *reader) typeError(what, want string) error {
	return fmt.Errorf("%s: want %s, got %s", what, want, r.kind())
}

// object calls field for each key; field consumes the value.
func (r *reader) object(what string, field func(key string) error) error {
	return r.members('{', '}', what, "an object", func(int) error {
		key, err := r.str(what)
		if err != nil {
			return err
		}
		r.pos++ // ':'
		r.ws()
		return field(key)
	})
}

// array calls elem for each element; elem consumes it.
func (r *reader) array(what string, elem func(i int) error) error {
	return r.members('[', ']', what, "an array", elem)
}

// members walks an object or an array between open and end; member
// consumes one member.
func (r *reader) members(open, end byte, what, want string, member func(i int) error) error {
	if r.data[r.pos] != open {
		return r.typeError(what, want)
	}
	r.pos++
	r.ws()
	if r.data[r.pos] == end {
		r.pos++
		r.ws()
		return nil
	}
	for i := 0; ; i++ {
		if err := member(i); err != nil {
			return err
		}
		c := r.data[r.pos] // ',' or end
		r.pos++
		r.ws()
		if c == end {
			return nil
		}
	}
}

// str consumes a string. One without escapes that is valid UTF-8 (nearly
// every string of a tokenizer.json) is copied as it is; any other goes
// through encoding/json, for its handling of escapes, invalid UTF-8 and
// lone surrogates.
func (r *reader) str(what string) (string, error) {
	if r.data[r.pos] != '"' {
		return "", r.typeError(what, "a string")
	}
	start := r.pos + 1
	if n := bytes.IndexByte(r.data[start:], '"'); n >= 0 {
		s := r.data[start : start+n]
		if bytes.IndexByte(s, '\\') < 0 && utf8.Valid(s) {
			r.pos = start + n + 1
			r.ws()
			return string(s), nil
		}
	}
	var s string
	if err := json.Unmarshal(r.raw(), &s); err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	return s, nil
}

// optStr consumes a string or a null (nil).
func (r *reader) optStr(what string) (*string, error) {
	if r.null() {
		return nil, nil
	}
	s, err := r.str(what)
	return &s, err
}

// strOrNull consumes a string, or a null as "" (encoding/json leaves a
// string unset on null).
func (r *reader) strOrNull(what string) (string, error) {
	if r.null() {
		return "", nil
	}
	return r.str(what)
}

// bool consumes a bool, or a null as false.
func (r *reader) bool(what string) (bool, error) {
	switch r.data[r.pos] {
	case 't':
		r.raw()
		return true, nil
	case 'f', 'n':
		r.raw()
		return false, nil
	}
	return false, r.typeError(what, "a bool")
}

// uint32 consumes an unsigned 32-bit integer, or a null as 0.
func (r *reader) uint32(what string) (uint32, error) {
	if r.null() {
		return 0, nil
	}
	if c := r.data[r.pos]; c != '-' && (c < '0' || c > '9') {
		return 0, r.typeError(what, "an unsigned 32-bit integer")
	}
	raw := r.raw()
	n, err := strconv.ParseUint(string(raw), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%s: %s is not an unsigned 32-bit integer", what, raw)
	}
	return uint32(n), nil
}

// optFloat consumes a number or a null (nil).
func (r *reader) optFloat(what string) (*float64, error) {
	if r.null() {
		return nil, nil
	}
	if c := r.data[r.pos]; c != '-' && (c < '0' || c > '9') {
		return nil, r.typeError(what, "a number")
	}
	raw := r.raw()
	x, err := strconv.ParseFloat(string(raw), 64)
	if err != nil {
		return nil, fmt.Errorf("%s: %s is out of range", what, raw)
	}
	return &x, nil
}

// fields matches an object's keys to its field names as encoding/json does
// (ignoring case) and records a field seen twice.
type fields struct {
	seen []string
	err  error
}

func (s *fields) is(key, name string) bool {
	if !strings.EqualFold(key, name) {
		return false
	}
	for _, n := range s.seen {
		if n == name {
			s.err = fmt.Errorf("%w %q", errDuplicateField, name)
		}
	}
	s.seen = append(s.seen, name)
	return true
}

func (r *reader) addedTokens() ([]addedTokenJS, error) {
	if r.null() {
		return nil, nil
	}
	out := []addedTokenJS{}
	err := r.array("added_tokens", func(i int) error {
		var a addedTokenJS
		what := fmt.Sprintf("added_tokens[%d]", i)
		if r.null() {
			out = append(out, a)
			return nil
		}
		var seen fields
		err := r.object(what, func(key string) error {
			var err error
			switch {
			case seen.is(key, "id"):
				a.ID, err = r.uint32(what + ".id")
			case seen.is(key, "content"):
				a.Content, err = r.strOrNull(what + ".content")
			case seen.is(key, "single_word"):
				a.SingleWord, err = r.bool(what + ".single_word")
			case seen.is(key, "lstrip"):
				a.LStrip, err = r.bool(what + ".lstrip")
			case seen.is(key, "rstrip"):
				a.RStrip, err = r.bool(what + ".rstrip")
			case seen.is(key, "normalized"):
				a.Normalized, err = r.bool(what + ".normalized")
			case seen.is(key, "special"):
				a.Special, err = r.bool(what + ".special")
			default:
				r.raw()
			}
			if seen.err != nil {
				return seen.err
			}
			return err
		})
		out = append(out, a)
		return err
	})
	return out, err
}

func (r *reader) model() (*modelJS, error) {
	if r.null() {
		return nil, nil
	}
	var m modelJS
	var seen fields
	err := r.object("model", func(key string) error {
		var err error
		switch {
		case seen.is(key, "type"):
			m.Type, err = r.strOrNull("model: type")
		case seen.is(key, "vocab"):
			m.Vocab, err = r.vocab()
		case seen.is(key, "merges"):
			m.HasMerges = true
			m.Merges, err = r.merges()
		case seen.is(key, "unk_token"):
			m.UnkToken, err = r.optStr("model: unk_token")
		case seen.is(key, "fuse_unk"):
			m.FuseUnk, err = r.bool("model: fuse_unk")
		case seen.is(key, "byte_fallback"):
			m.ByteFallback, err = r.bool("model: byte_fallback")
		case seen.is(key, "ignore_merges"):
			m.IgnoreMerges, err = r.bool("model: ignore_merges")
		case seen.is(key, "continuing_subword_prefix"):
			m.ContinuingSubwordPrefix, err = r.optStr("model: continuing_subword_prefix")
		case seen.is(key, "end_of_word_suffix"):
			m.EndOfWordSuffix, err = r.optStr("model: end_of_word_suffix")
		case seen.is(key, "dropout"):
			m.Dropout, err = r.optFloat("model: dropout")
		default:
			r.raw()
		}
		if seen.err != nil {
			return fmt.Errorf("model: %w", seen.err)
		}
		return err
	})
	if err != nil && m.Type != "" && m.Type != "BPE" {
		// Another model's fields do not fit BPE's; its type is the news.
		return nil, fmt.Errorf("unsupported model type %q", m.Type)
	}
	return &m, err
}

// vocab consumes the token -> id object; a repeated token keeps its last
// id, as in a map. null is a nil map.
func (r *reader) vocab() (map[string]uint32, error) {
	if r.null() {
		return nil, nil
	}
	// About one entry per 12 bytes in the files we know, so the map seldom
	// grows while it fills.
	end, _ := jsonspan.End(r.data, r.pos)
	vocab := make(map[string]uint32, (end-r.pos)/12)
	err := r.object("model: vocab", func(tok string) error {
		id, err := r.uint32("id")
		if err != nil {
			return fmt.Errorf("model: vocab: token %q: %w", tok, err)
		}
		vocab[tok] = id
		return nil
	})
	return vocab, err
}

// merges consumes both forms: ["a b", ...] and [["a", "b"], ...].
func (r *reader) merges() ([][2]string, error) {
	if r.null() {
		return nil, nil
	}
	// About one merge per 16 bytes in the files we know.
	end, _ := jsonspan.End(r.data, r.pos)
	out := make([][2]string, 0, (end-r.pos)/16)
	err := r.array("model: merges", func(i int) error {
		if r.data[r.pos] == '"' {
			s, err := r.str("model: merges")
			if err != nil {
				return err
			}
			a, b, ok := strings.Cut(s, " ")
			if !ok || strings.Contains(b, " ") {
				return fmt.Errorf("merges[%d] %q: want two space-separated tokens", i, s)
			}
			out = append(out, [2]string{a, b})
			return nil
		}
		var pair [2]string
		n := 0
		bad := r.data[r.pos] != '['
		if !bad {
			err := r.array("model: merges", func(j int) error {
				n++
				if j >= 2 {
					r.raw()
					return nil
				}
				if r.data[r.pos] != '"' && r.data[r.pos] != 'n' {
					bad = true
					r.raw()
					return nil
				}
				var err error
				pair[j], err = r.strOrNull("model: merges")
				return err
			})
			if err != nil {
				return err
			}
		}
		if bad || n != 2 {
			return fmt.Errorf("merges[%d]: want a pair of strings", i)
		}
		out = append(out, pair)
		return nil
	})
	return out, err
}
