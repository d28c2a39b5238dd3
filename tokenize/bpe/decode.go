package bpe

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// decoder turns tokens back into text pieces (HF's decode_chain).
type decoder interface {
	decode(toks []string) []string
}

func parseDecoder(raw json.RawMessage) (decoder, error) {
	if isNull(raw) {
		return nil, nil
	}
	typ, err := componentType(raw)
	if err != nil {
		return nil, fmt.Errorf("decoder: %w", err)
	}
	switch typ {
	case "ByteLevel":
		return byteLevelDec{}, nil
	case "ByteFallback":
		return byteFallbackDec{}, nil
	case "Fuse":
		return fuseDec{}, nil
	case "Strip":
		var s struct {
			Content string `json:"content"`
			Start   int    `json:"start"`
			Stop    int    `json:"stop"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("decoder Strip: %w", err)
		}
		r, _ := utf8.DecodeRuneInString(s.Content)
		return stripDec{c: r, start: s.Start, stop: s.Stop}, nil
	case "Replace":
		var r struct {
			Pattern patternJS `json:"pattern"`
			Content string    `json:"content"`
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			return nil, fmt.Errorf("decoder Replace: %w", err)
		}
		re, err := compilePattern(r.Pattern)
		if err != nil {
			return nil, fmt.Errorf("decoder Replace: %w", err)
		}
		return replaceDec{replace{re: re, content: r.Content}}, nil
	case "Metaspace":
		var s struct {
			Replacement    string `json:"replacement"`
			PrependScheme  string `json:"prepend_scheme"`
			AddPrefixSpace *bool  `json:"add_prefix_space"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("decoder Metaspace: %w", err)
		}
		m, err := newMetaspace(s.Replacement, s.PrependScheme, s.AddPrefixSpace)
		if err != nil {
			return nil, fmt.Errorf("decoder Metaspace: %w", err)
		}
		return metaspaceDec{m}, nil
	case "Sequence":
		var s struct {
			Decoders []json.RawMessage `json:"decoders"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("decoder Sequence: %w", err)
		}
		var seq sequenceDec
		for i, d := range s.Decoders {
			dd, err := parseDecoder(d)
			if err != nil {
				return nil, fmt.Errorf("decoder Sequence[%d]: %w", i, err)
			}
			if dd != nil {
				seq = append(seq, dd)
			}
		}
		return seq, nil
	}
	return nil, fmt.Errorf("unsupported decoder type %q", typ)
}

type sequenceDec []decoder

func (q sequenceDec) decode(toks []string) []string {
	for _, d := range q {
		toks = d.decode(toks)
	}
	return toks
}

// byteLevelDec maps stand-in runes back to bytes; a token holding any rune
// outside the map (an added token like DeepSeek's) keeps its own bytes.
type byteLevelDec struct{}

func (byteLevelDec) decode(toks []string) []string {
	var buf []byte
	for _, t := range toks {
		start := len(buf)
		ok := true
		for _, r := range t {
			b, found := runeToByte[r]
			if !found {
				ok = false
				break
			}
			buf = append(buf, b)
		}
		if !ok {
			buf = append(buf[:start], t...)
		}
	}
	return []string{strings.ToValidUTF8(string(buf), "\uFFFD")}
}

// byteFallbackDec turns runs of <0xXX> tokens into text; invalid UTF-8
// becomes one U+FFFD per byte, like HF.
type byteFallbackDec struct{}

func (byteFallbackDec) decode(toks []string) []string {
	out := make([]string, 0, len(toks))
	var pending []byte
	flush := func() {
		if len(pending) == 0 {
			return
		}
		if utf8.Valid(pending) {
			out = append(out, string(pending))
		} else {
			for range pending {
				out = append(out, "\uFFFD")
			}
		}
		pending = pending[:0]
	}
	for _, t := range toks {
		if len(t) == 6 && strings.HasPrefix(t, "<0x") && t[5] == '>' {
			if b, err := strconv.ParseUint(t[3:5], 16, 8); err == nil {
				pending = append(pending, byte(b))
				continue
			}
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

type fuseDec struct{}

func (fuseDec) decode(toks []string) []string { return []string{strings.Join(toks, "")} }

type stripDec struct {
	c           rune
	start, stop int
}

func (s stripDec) decode(toks []string) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		for n := 0; n < s.start && strings.HasPrefix(t, string(s.c)); n++ {
			t = t[utf8.RuneLen(s.c):]
		}
		for n := 0; n < s.stop && strings.HasSuffix(t, string(s.c)); n++ {
			t = t[:len(t)-utf8.RuneLen(s.c)]
		}
		out[i] = t
	}
	return out
}

type replaceDec struct{ r replace }

func (d replaceDec) decode(toks []string) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		s, err := d.r.normalize(t)
		if err != nil {
			s = t
		}
		out[i] = s
	}
	return out
}

type metaspaceDec struct{ m *metaspace }

func (d metaspaceDec) decode(toks []string) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		t = strings.ReplaceAll(t, d.m.replacement, " ")
		if i == 0 && d.m.scheme != "never" {
			t = strings.TrimPrefix(t, " ")
		}
		out[i] = t
	}
	return out
}
