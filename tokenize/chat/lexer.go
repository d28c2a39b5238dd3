package chat

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Token kinds of the template lexer.
type tokKind int

const (
	tText tokKind = iota
	tVarBegin
	tVarEnd
	tBlockBegin
	tBlockEnd
	tName
	tString
	tInt
	tFloat
	tOp
	tEOF
)

type token struct {
	kind tokKind
	val  string
	line int
}

// lex splits a template into tokens with Jinja2's whitespace rules as
// transformers configures them: trim_blocks, lstrip_blocks, '-' and '+'
// modifiers, and keep_trailing_newline=False.
func lex(src string) ([]token, error) {
	src = strings.ReplaceAll(src, "\r\n", "\n")
	src = strings.ReplaceAll(src, "\r", "\n")
	src = strings.TrimSuffix(src, "\n")
	lx := &lexer{src: src, line: 1}
	if err := lx.run(); err != nil {
		return nil, err
	}
	return lx.toks, nil
}

type lexer struct {
	src  string
	pos  int
	line int
	toks []token
	// stripNext removes leading whitespace of the next text ('-' modifier);
	// trimNext removes one newline (trim_blocks).
	stripNext, trimNext bool
}

func (lx *lexer) emitText(text string, lineStart bool, tagKind byte, tagMod byte) {
	if lx.stripNext {
		t := strings.TrimLeftFunc(text, isPySpace)
		if len(t) < len(text) {
			lineStart = text[len(text)-len(t)-1] == '\n'
		}
		text = t
	} else if lx.trimNext && strings.HasPrefix(text, "\n") {
		text, lineStart = text[1:], true
	}
	lx.stripNext, lx.trimNext = false, false
	switch {
	case tagMod == '-':
		text = strings.TrimRightFunc(text, isPySpace)
	case tagMod != '+' && (tagKind == '%' || tagKind == '#'):
		// lstrip_blocks: drop the white space before a block or comment
		// tag when it is all that precedes the tag on its line.
		i := strings.LastIndexByte(text, '\n')
		if i >= 0 || lineStart {
			tail := text[i+1:]
			if strings.TrimFunc(tail, isPySpace) == "" {
				text = text[:i+1]
			}
		}
	}
	if text != "" {
		lx.toks = append(lx.toks, token{kind: tText, val: text, line: lx.line})
	}
}

func (lx *lexer) run() error {
	for {
		textStart := lx.pos
		lineStart := textStart == 0 || lx.src[textStart-1] == '\n'
		i := lx.nextTag(lx.pos)
		if i < 0 {
			lx.emitText(lx.src[textStart:], lineStart, 0, 0)
			lx.toks = append(lx.toks, token{kind: tEOF, line: lx.line})
			return nil
		}
		kind := lx.src[i+1]
		var mod byte
		if i+2 < len(lx.src) && (lx.src[i+2] == '-' || lx.src[i+2] == '+') {
			mod = lx.src[i+2]
		}
		text := lx.src[textStart:i]
		lx.emitText(text, lineStart, kind, mod)
		lx.line += strings.Count(text, "\n")
		lx.pos = i + 2
		if mod != 0 {
			lx.pos++
		}
		switch kind {
		case '#':
			end := strings.Index(lx.src[lx.pos:], "#}")
			if end < 0 {
				return fmt.Errorf("line %d: unclosed comment", lx.line)
			}
			body := lx.src[lx.pos : lx.pos+end]
			lx.line += strings.Count(body, "\n")
			lx.pos += end + 2
			if strings.HasSuffix(body, "-") {
				lx.stripNext = true
			} else if !strings.HasSuffix(body, "+") {
				lx.trimNext = true
			}
		case '{':
			lx.toks = append(lx.toks, token{kind: tVarBegin, line: lx.line})
			if err := lx.lexExpr("}}", tVarEnd); err != nil {
				return err
			}
		case '%':
			if raw, ok := lx.rawBlock(); ok {
				lx.toks = append(lx.toks, token{kind: tText, val: raw, line: lx.line})
				continue
			}
			lx.toks = append(lx.toks, token{kind: tBlockBegin, line: lx.line})
			if err := lx.lexExpr("%}", tBlockEnd); err != nil {
				return err
			}
		}
	}
}

// nextTag finds the next "{{", "{%" or "{#" at or after from.
func (lx *lexer) nextTag(from int) int {
	for i := from; i+1 < len(lx.src); i++ {
		if lx.src[i] == '{' {
			switch lx.src[i+1] {
			case '{', '%', '#':
				return i
			}
		}
	}
	return -1
}

// rawBlock handles {% raw %}...{% endraw %}; lx.pos is just inside "{%".
func (lx *lexer) rawBlock() (string, bool) {
	rest := strings.TrimLeftFunc(lx.src[lx.pos:], isPySpace)
	if !strings.HasPrefix(rest, "raw") {
		return "", false
	}
	rest = strings.TrimLeftFunc(rest[3:], isPySpace)
	closeMod := byte(0)
	if strings.HasPrefix(rest, "-%}") || strings.HasPrefix(rest, "+%}") {
		closeMod = rest[0]
		rest = rest[1:]
	}
	if !strings.HasPrefix(rest, "%}") {
		return "", false
	}
	bodyStart := len(lx.src) - len(rest) + 2
	// Find {% endraw %} allowing modifiers and spaces.
	for j := bodyStart; j < len(lx.src); j++ {
		if !strings.HasPrefix(lx.src[j:], "{%") {
			continue
		}
		k := j + 2
		endMod := byte(0)
		if k < len(lx.src) && (lx.src[k] == '-' || lx.src[k] == '+') {
			endMod = lx.src[k]
			k++
		}
		r := strings.TrimLeftFunc(lx.src[k:], isPySpace)
		if !strings.HasPrefix(r, "endraw") {
			continue
		}
		r = strings.TrimLeftFunc(r[6:], isPySpace)
		tailMod := byte(0)
		if strings.HasPrefix(r, "-%}") || strings.HasPrefix(r, "+%}") {
			tailMod = r[0]
			r = r[1:]
		}
		if !strings.HasPrefix(r, "%}") {
			continue
		}
		body := lx.src[bodyStart:j]
		if closeMod == '-' {
			body = strings.TrimLeftFunc(body, isPySpace)
		} else if closeMod != '+' {
			body = strings.TrimPrefix(body, "\n")
		}
		if endMod == '-' {
			body = strings.TrimRightFunc(body, isPySpace)
		}
		lx.line += strings.Count(lx.src[lx.pos:len(lx.src)-len(r)+2], "\n")
		lx.pos = len(lx.src) - len(r) + 2
		if tailMod == '-' {
			lx.stripNext = true
		} else if tailMod != '+' {
			lx.trimNext = true
		}
		return body, true
	}
	return "", false
}

const opChars = "+-*/%~()[]{},.:|=<>!"

// lexExpr tokenizes an expression until the closing delimiter.
func (lx *lexer) lexExpr(end string, endKind tokKind) error {
	src := lx.src
	for {
		for lx.pos < len(src) {
			r, n := utf8.DecodeRuneInString(src[lx.pos:])
			if !isPySpace(r) {
				break
			}
			if r == '\n' {
				lx.line++
			}
			lx.pos += n
		}
		if lx.pos >= len(src) {
			return fmt.Errorf("line %d: unclosed tag (want %q)", lx.line, end)
		}
		rest := src[lx.pos:]
		if (rest[0] == '-' || rest[0] == '+') && strings.HasPrefix(rest[1:], end) {
			lx.toks = append(lx.toks, token{kind: endKind, line: lx.line})
			lx.pos += 1 + len(end)
			// '+%}' keeps the newline trim_blocks would remove.
			lx.stripNext = rest[0] == '-'
			return nil
		}
		if strings.HasPrefix(rest, end) {
			lx.toks = append(lx.toks, token{kind: endKind, line: lx.line})
			lx.pos += len(end)
			if endKind == tBlockEnd {
				lx.trimNext = true
			}
			return nil
		}
		c := rest[0]
		switch {
		case c == '"' || c == '\'':
			s, n, err := unquote(rest)
			if err != nil {
				return fmt.Errorf("line %d: %w", lx.line, err)
			}
			lx.line += strings.Count(rest[:n], "\n")
			lx.toks = append(lx.toks, token{kind: tString, val: s, line: lx.line})
			lx.pos += n
		case c >= '0' && c <= '9':
			n, isFloat := scanNumber(rest)
			k := tInt
			if isFloat {
				k = tFloat
			}
			lx.toks = append(lx.toks, token{kind: k, val: strings.ReplaceAll(rest[:n], "_", ""), line: lx.line})
			lx.pos += n
		case c == '_' || isLetter(c):
			n := 1
			for n < len(rest) && (rest[n] == '_' || isLetter(rest[n]) || (rest[n] >= '0' && rest[n] <= '9')) {
				n++
			}
			lx.toks = append(lx.toks, token{kind: tName, val: rest[:n], line: lx.line})
			lx.pos += n
		case strings.IndexByte(opChars, c) >= 0:
			op := string(c)
			for _, two := range []string{"//", "**", "==", "!=", "<=", ">="} {
				if strings.HasPrefix(rest, two) {
					op = two
					break
				}
			}
			if op == "!" {
				return fmt.Errorf("line %d: unexpected '!'", lx.line)
			}
			lx.toks = append(lx.toks, token{kind: tOp, val: op, line: lx.line})
			lx.pos += len(op)
		default:
			return fmt.Errorf("line %d: unexpected character %q", lx.line, c)
		}
	}
}

func isLetter(c byte) bool { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') }

// scanNumber measures the number at the start of s as Jinja's lexer does:
// a float (digits with a fraction or an exponent) first, else an integer,
// either 0b/0o/0x and digits of that base, or decimal digits without a
// leading zero ("0", "00" are integers; "012" is "0" then "12"), with
// single underscores between digits throughout.
func scanNumber(s string) (int, bool) {
	digitsOf := func(n int, ok func(byte) bool) int {
		for n < len(s) && (ok(s[n]) || (s[n] == '_' && n+1 < len(s) && ok(s[n+1]))) {
			n++
		}
		return n
	}
	isDec := func(c byte) bool { return c >= '0' && c <= '9' }
	n := digitsOf(0, isDec)
	isFloat := false
	if n+1 < len(s) && s[n] == '.' && isDec(s[n+1]) {
		isFloat = true
		n = digitsOf(n+1, isDec)
	}
	if n < len(s) && (s[n] == 'e' || s[n] == 'E') {
		m := n + 1
		if m < len(s) && (s[m] == '+' || s[m] == '-') {
			m++
		}
		if m < len(s) && isDec(s[m]) {
			isFloat = true
			n = digitsOf(m, isDec)
		}
	}
	if isFloat || s[0] != '0' {
		return n, isFloat
	}
	if len(s) > 2 {
		var ok func(byte) bool
		switch s[1] | 0x20 {
		case 'b':
			ok = func(c byte) bool { return c == '0' || c == '1' }
		case 'o':
			ok = func(c byte) bool { return c >= '0' && c <= '7' }
		case 'x':
			ok = func(c byte) bool { return isDec(c) || (c|0x20 >= 'a' && c|0x20 <= 'f') }
		}
		if ok != nil {
			// The prefix may be followed by one underscore.
			m := 2
			if s[m] == '_' {
				m++
			}
			if m < len(s) && ok(s[m]) {
				return digitsOf(m, ok), false
			}
		}
	}
	return digitsOf(0, func(c byte) bool { return c == '0' }), false
}

// unquote reads a Python string literal with its escapes; it returns the
// value and the number of source bytes consumed.
func unquote(s string) (string, int, error) {
	q := s[0]
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		if c == q {
			return b.String(), i + 1, nil
		}
		if c != '\\' || i+1 >= len(s) {
			b.WriteByte(c)
			continue
		}
		i++
		switch e := s[i]; e {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case '\\', '\'', '"':
			b.WriteByte(e)
		case 'a':
			b.WriteByte('\a')
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'v':
			b.WriteByte('\v')
		case '\n':
		case 'x', 'u', 'U':
			n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
			if i+n >= len(s) {
				return "", 0, fmt.Errorf("truncated \\%c escape", e)
			}
			var r rune
			for _, h := range s[i+1 : i+1+n] {
				d := hexVal(byte(h))
				if d < 0 {
					return "", 0, fmt.Errorf("bad \\%c escape", e)
				}
				r = r*16 + rune(d)
			}
			b.WriteRune(r)
			i += n
		case '0', '1', '2', '3', '4', '5', '6', '7':
			r := rune(e - '0')
			for k := 0; k < 2 && i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '7'; k++ {
				i++
				r = r*8 + rune(s[i]-'0')
			}
			b.WriteRune(r)
		default:
			b.WriteByte('\\')
			b.WriteByte(e)
		}
	}
	return "", 0, fmt.Errorf("unterminated string")
}

func hexVal(c byte) int {
	if d := pyDigit(rune(c)); d < 16 {
		return d
	}
	return -1
}
