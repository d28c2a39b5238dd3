package bpe

import (
	"encoding/json"
	"fmt"
	"slices"
)

// postProcessor adds the special tokens of add_special_tokens=true. Only
// single sequences are supported: OpenAI requests never encode pairs.
type postProcessor interface {
	resolve(vocab map[string]uint32) error
	apply(ids []uint32) []uint32
	// affixes returns the ids apply puts before and after the sequence;
	// ok is false when apply is not of that form (a template without
	// exactly one sequence), so the ids cannot be produced a prefix at a
	// time.
	affixes() (prefix, suffix []uint32, ok bool)
}

func parsePostProcessor(raw json.RawMessage) (postProcessor, error) {
	if isNull(raw) {
		return noPost{}, nil
	}
	typ, err := componentType(raw)
	if err != nil {
		return nil, fmt.Errorf("post_processor: %w", err)
	}
	switch typ {
	case "ByteLevel":
		// Only offsets change; ids are untouched.
		return noPost{}, nil
	case "Sequence":
		var s struct {
			Processors []json.RawMessage `json:"processors"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("post_processor Sequence: %w", err)
		}
		var seq sequencePost
		for i, p := range s.Processors {
			pp, err := parsePostProcessor(p)
			if err != nil {
				return nil, fmt.Errorf("post_processor Sequence[%d]: %w", i, err)
			}
			seq = append(seq, pp)
		}
		return seq, nil
	case "TemplateProcessing":
		var s struct {
			Single []struct {
				SpecialToken *struct {
					ID string `json:"id"`
				} `json:"SpecialToken"`
				Sequence *struct {
					ID string `json:"id"`
				} `json:"Sequence"`
			} `json:"single"`
			SpecialTokens map[string]struct {
				IDs []uint32 `json:"ids"`
			} `json:"special_tokens"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("post_processor TemplateProcessing: %w", err)
		}
		tp := &templateProcessing{}
		for i, it := range s.Single {
			switch {
			case it.Sequence != nil:
				tp.single = append(tp.single, templatePiece{seq: true})
			case it.SpecialToken != nil:
				st, ok := s.SpecialTokens[it.SpecialToken.ID]
				if !ok {
					return nil, fmt.Errorf("post_processor TemplateProcessing: single[%d]: special token %q not in special_tokens", i, it.SpecialToken.ID)
				}
				tp.single = append(tp.single, templatePiece{ids: st.IDs})
			default:
				return nil, fmt.Errorf("post_processor TemplateProcessing: single[%d]: want SpecialToken or Sequence", i)
			}
		}
		return tp, nil
	case "BertProcessing", "RobertaProcessing":
		var s struct {
			Sep [2]json.RawMessage `json:"sep"`
			Cls [2]json.RawMessage `json:"cls"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("post_processor %s: %w", typ, err)
		}
		var sep, cls uint32
		if err := json.Unmarshal(s.Sep[1], &sep); err != nil {
			return nil, fmt.Errorf("post_processor %s: sep: %w", typ, err)
		}
		if err := json.Unmarshal(s.Cls[1], &cls); err != nil {
			return nil, fmt.Errorf("post_processor %s: cls: %w", typ, err)
		}
		return &templateProcessing{single: []templatePiece{{ids: []uint32{cls}}, {seq: true}, {ids: []uint32{sep}}}}, nil
	}
	return nil, fmt.Errorf("unsupported post_processor type %q", typ)
}

type noPost struct{}

func (noPost) resolve(map[string]uint32) error     { return nil }
func (noPost) apply(ids []uint32) []uint32         { return ids }
func (noPost) affixes() ([]uint32, []uint32, bool) { return nil, nil, true }

type sequencePost []postProcessor

func (q sequencePost) resolve(v map[string]uint32) error {
	for _, p := range q {
		if err := p.resolve(v); err != nil {
			return err
		}
	}
	return nil
}

func (q sequencePost) apply(ids []uint32) []uint32 {
	for _, p := range q {
		ids = p.apply(ids)
	}
	return ids
}

// affixes composes the members' affixes: each wraps what the ones before
// it produced.
func (q sequencePost) affixes() (prefix, suffix []uint32, ok bool) {
	for _, p := range q {
		pre, suf, ok := p.affixes()
		if !ok {
			return nil, nil, false
		}
		prefix = append(slices.Clone(pre), prefix...)
		suffix = append(suffix, suf...)
	}
	return prefix, suffix, true
}

type templatePiece struct {
	seq bool
	ids []uint32
}

type templateProcessing struct {
	single []templatePiece
}

func (tp *templateProcessing) resolve(map[string]uint32) error { return nil }

func (tp *templateProcessing) affixes() (prefix, suffix []uint32, ok bool) {
	seqs := 0
	for _, p := range tp.single {
		switch {
		case p.seq:
			seqs++
		case seqs == 0:
			prefix = append(prefix, p.ids...)
		default:
			suffix = append(suffix, p.ids...)
		}
	}
	return prefix, suffix, seqs == 1
}

func (tp *templateProcessing) apply(ids []uint32) []uint32 {
	n := len(ids)
	for _, p := range tp.single {
		n += len(p.ids)
	}
	out := make([]uint32, 0, n)
	for _, p := range tp.single {
		if p.seq {
			out = append(out, ids...)
		} else {
			out = append(out, p.ids...)
		}
	}
	return out
}
