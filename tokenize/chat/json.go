package chat

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/prefixrouter/prefixrouter/tokenize/jsonspan"
)

// FromJSON converts JSON into template values, keeping object key order and
// Python's int/float distinction (json.loads semantics). It is a small
// hand-written parser: encoding/json's token API was most of a warm chat
// tokenization.
func FromJSON(raw []byte) (Value, error) {
	p := &jsonParser{s: raw}
	p.ws()
	v, err := p.value(0)
	if err != nil {
		return nil, err
	}
	p.ws()
	if p.i != len(p.s) {
		return nil, fmt.Errorf("JSON: trailing data at offset %d", p.i)
	}
	return v, nil
}

const maxJSONDepth = 10000

type jsonParser struct {
	s []byte
	i int
}

func (p *jsonParser) ws() { p.i = jsonspan.SkipWS(p.s, p.i) }

func (p *jsonParser) errf(format string, args ...any) error {
	return fmt.Errorf("JSON at offset %d: %s", p.i, fmt.Sprintf(format, args...))
}

func (p *jsonParser) value(depth int) (Value, error) {
	if depth > maxJSONDepth {
		return nil, p.errf("nested deeper than %d", maxJSONDepth)
	}
	if p.i >= len(p.s) {
		return nil, p.errf("unexpected end of input")
	}
	switch c := p.s[p.i]; {
	case c == '{':
		p.i++
		d := NewDict()
		p.ws()
		if p.i < len(p.s) && p.s[p.i] == '}' {
			p.i++
			return d, nil
		}
		for {
			p.ws()
			if p.i >= len(p.s) || p.s[p.i] != '"' {
				return nil, p.errf("want an object key")
			}
			k, err := p.str()
			if err != nil {
				return nil, err
			}
			p.ws()
			if p.i >= len(p.s) || p.s[p.i] != ':' {
				return nil, p.errf("want ':'")
			}
			p.i++
			p.ws()
			v, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			d.Set(k, v)
			p.ws()
			if p.i < len(p.s) && p.s[p.i] == ',' {
				p.i++
				continue
			}
			if p.i < len(p.s) && p.s[p.i] == '}' {
				p.i++
				return d, nil
			}
			return nil, p.errf("want ',' or '}'")
		}
	case c == '[':
		p.i++
		l := &List{}
		p.ws()
		if p.i < len(p.s) && p.s[p.i] == ']' {
			p.i++
			return l, nil
		}
		for {
			p.ws()
			v, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			l.Items = append(l.Items, v)
			p.ws()
			if p.i < len(p.s) && p.s[p.i] == ',' {
				p.i++
				continue
			}
			if p.i < len(p.s) && p.s[p.i] == ']' {
				p.i++
				return l, nil
			}
			return nil, p.errf("want ',' or ']'")
		}
	case c == '"':
		return p.str()
	case c == 't' || c == 'f' || c == 'n':
		for _, lit := range []struct {
			s string
			v Value
		}{{"true", true}, {"false", false}, {"null", nil}} {
			if strings.HasPrefix(string(p.s[p.i:min(p.i+5, len(p.s))]), lit.s) {
				p.i += len(lit.s)
				return lit.v, nil
			}
		}
		return nil, p.errf("invalid literal")
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	}
	return nil, p.errf("unexpected character %q", p.s[p.i])
}

func (p *jsonParser) number() (Value, error) {
	start := p.i
	if p.s[p.i] == '-' {
		p.i++
	}
	digits := func() int {
		n := 0
		for p.i < len(p.s) && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
			p.i++
			n++
		}
		return n
	}
	if p.i < len(p.s) && p.s[p.i] == '0' {
		// JSON forbids leading zeros: "0" stands alone.
		p.i++
	} else if digits() == 0 {
		return nil, p.errf("invalid number")
	}
	isFloat := false
	if p.i < len(p.s) && p.s[p.i] == '.' {
		p.i++
		isFloat = true
		if digits() == 0 {
			return nil, p.errf("invalid number")
		}
	}
	if p.i < len(p.s) && (p.s[p.i] == 'e' || p.s[p.i] == 'E') {
		p.i++
		isFloat = true
		if p.i < len(p.s) && (p.s[p.i] == '+' || p.s[p.i] == '-') {
			p.i++
		}
		if digits() == 0 {
			return nil, p.errf("invalid number")
		}
	}
	lit := string(p.s[start:p.i])
	if !isFloat {
		if n, err := strconv.ParseInt(lit, 10, 64); err == nil {
			return n, nil
		}
		// Beyond int64: Python's json reads an exact int, up to its
		// 4300-digit limit.
		if len(lit) > maxIntDigits+1 {
			return nil, p.errf("%v", errIntTooLarge())
		}
		z, _ := new(big.Int).SetString(lit, 10)
		v, err := normInt(z)
		if err != nil {
			return nil, p.errf("%v", err)
		}
		return v, nil
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil && !math.IsInf(f, 0) {
		return nil, p.errf("invalid number %q", lit)
	}
	return f, nil
}

// str reads a JSON string; p.s[p.i] is the opening quote.
func (p *jsonParser) str() (string, error) {
	p.i++
	start := p.i
	j := bytes.IndexByte(p.s[p.i:], '"')
	if j < 0 {
		return "", errors.New("JSON: unterminated string")
	}
	seg := p.s[p.i : p.i+j]
	if bytes.IndexByte(seg, '\\') >= 0 {
		return p.strSlow(start, j)
	}
	ascii, ctrl := scanBytes(seg)
	if ctrl >= 0 {
		p.i += ctrl
		return "", p.errf("control character in string")
	}
	p.i += j + 1
	if !ascii && !utf8.Valid(seg) {
		return fixUTF8(string(seg)), nil
	}
	return string(seg), nil
}

// strSlow decodes a string with escapes from start, where p.i is;
// sizeHint (the bytes up to the first quote) sizes its buffer. Runs
// between escapes are copied whole: chat texts escape little more than
// their newlines.
func (p *jsonParser) strSlow(start, sizeHint int) (string, error) {
	var b strings.Builder
	b.Grow(sizeHint)
	b.Write(p.s[start:p.i])
	for p.i < len(p.s) {
		run := p.i
		for run < len(p.s) && !strStop[p.s[run]] {
			run++
		}
		b.Write(p.s[p.i:run])
		if p.i = run; p.i >= len(p.s) {
			break
		}
		c := p.s[p.i]
		switch {
		case c == '"':
			p.i++
			return fixUTF8(b.String()), nil
		case c < 0x20:
			return "", p.errf("control character in string")
		}
		if p.i+1 >= len(p.s) {
			break
		}
		e := p.s[p.i+1]
		p.i += 2
		switch e {
		case '"', '\\', '/':
			b.WriteByte(e)
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'u':
			r, ok := p.hex4()
			if !ok {
				return "", p.errf("bad \\u escape")
			}
			if utf16.IsSurrogate(r) {
				// A pair decodes to one rune; a lone surrogate becomes
				// U+FFFD (Go strings cannot hold it).
				if p.i+1 < len(p.s) && p.s[p.i] == '\\' && p.s[p.i+1] == 'u' {
					save := p.i
					p.i += 2
					if r2, ok := p.hex4(); ok {
						if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
							b.WriteRune(d)
							continue
						}
					}
					p.i = save
				}
				r = utf8.RuneError
			}
			b.WriteRune(r)
		default:
			return "", p.errf("bad escape \\%c", e)
		}
	}
	return "", errors.New("JSON: unterminated string")
}

func (p *jsonParser) hex4() (rune, bool) {
	if p.i+4 > len(p.s) {
		return 0, false
	}
	var r rune
	for _, c := range p.s[p.i : p.i+4] {
		d := hexVal(c)
		if d < 0 {
			return 0, false
		}
		r = r*16 + rune(d)
	}
	p.i += 4
	return r, true
}

// fixUTF8 replaces each invalid byte with U+FFFD, as encoding/json does.
func fixUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		b.WriteRune(r)
		i += n
	}
	return b.String()
}

// strStop marks the bytes a string's plain run stops at: its closing
// quote, an escape, a control byte (an error).
var strStop = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// scanBytes reports whether seg is all ASCII and the offset of its first
// control byte (< 0x20), or -1; eight bytes at a time, as message texts
// are most of a chat request.
func scanBytes(seg []byte) (ascii bool, ctrl int) {
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	var high uint64
	i := 0
	for ; i+8 <= len(seg); i += 8 {
		w := binary.LittleEndian.Uint64(seg[i:])
		high |= w
		// A byte below 0x20 sets its high bit in (w - 0x20..) &^ w.
		if (w-0x20*lo)&^w&hi != 0 {
			for j := i; j < i+8; j++ {
				if seg[j] < 0x20 {
					return false, j
				}
			}
		}
	}
	for ; i < len(seg); i++ {
		if seg[i] < 0x20 {
			return false, i
		}
		high |= uint64(seg[i])
	}
	return high&hi == 0, -1
}

// ArrayElems splits raw, a JSON array, into the raw bytes of its elements
// without decoding them, so that a caller can reuse the decoded value of an
// element it has seen before (chat messages repeat turn after turn). It only
// finds boundaries: each element must still go through FromJSONElem, which
// validates it. ok is false when raw is not an array whose boundaries this
// scan can find; the caller then decodes raw with FromJSON, whose error (if
// any) is the one to report.
//
// If ok is true and FromJSONElem accepts every element, FromJSON(raw) is a
// *List of exactly those values: the scan accepts only '[' elem (',' elem)*
// ']' with JSON whitespace between, and an element whose extent the scan got
// wrong cannot be a single valid JSON value.
func ArrayElems(raw []byte) (elems [][]byte, ok bool) {
	i := jsonspan.SkipWS(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return nil, false
	}
	i = jsonspan.SkipWS(raw, i+1)
	if i < len(raw) && raw[i] == ']' {
		return [][]byte{}, jsonspan.SkipWS(raw, i+1) == len(raw)
	}
	elems = make([][]byte, 0, 16) // a chat's messages: fewer regrowths
	for {
		end, ok := jsonspan.End(raw, i)
		if !ok {
			return nil, false
		}
		elems = append(elems, raw[i:end])
		i = jsonspan.SkipWS(raw, end)
		if i >= len(raw) {
			return nil, false
		}
		switch raw[i] {
		case ',':
			i = jsonspan.SkipWS(raw, i+1)
		case ']':
			return elems, jsonspan.SkipWS(raw, i+1) == len(raw)
		default:
			return nil, false
		}
	}
}

// FromJSONElem decodes one element found by ArrayElems exactly as FromJSON
// decodes it inside its array (one level down, for the depth limit).
func FromJSONElem(raw []byte) (Value, error) {
	p := &jsonParser{s: raw}
	v, err := p.value(1)
	if err != nil {
		return nil, err
	}
	if p.i != len(p.s) {
		return nil, fmt.Errorf("JSON: trailing data at offset %d", p.i)
	}
	return v, nil
}
