package tokenize

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/prefixrouter/prefixrouter/tokenize/hub"
)

// SpecForms lists the accepted --tokenizer forms; parse errors end with it.
const SpecForms = "MODEL (a local model directory, else the hub repository MODEL), " +
	"MODEL=PATH (a model directory or a tokenizer.json), MODEL=hf:ORG/NAME[@REVISION], " +
	"MODEL=bytes, MODEL:remote= (the pods tokenize); " +
	"MODEL:MODE=... or MODEL:MODE sets the mode (local, remote or auto)"

// hubPrefix marks a hub repository where a path could stand.
const hubPrefix = "hf:"

// Spec is one --tokenizer value.
type Spec struct {
	// Text is the value as the user typed it, for messages.
	Text string
	// Name is the served model name requests carry.
	Name string
	// Path is a model directory, a tokenizer.json or "bytes"; empty with
	// Hub nil for a model the pods tokenize.
	Path string
	// Hub is the repository whose files are fetched, when set.
	Hub *hub.Ref
	// Mode is the model's mode; HasMode says the text named it (the
	// caller may apply its own default otherwise).
	Mode    Mode
	HasMode bool
}

// ParseSpec parses a --tokenizer value (see SpecForms). A value without
// '=' names a local path when one exists, else a hub repository, as vLLM
// reads its model argument; the served name is then the value without
// "hf:" and without the revision.
func ParseSpec(text string) (Spec, error) {
	bad := func(format string, args ...any) (Spec, error) {
		return Spec{}, fmt.Errorf("%s; accepted forms: %s", fmt.Sprintf(format, args...), SpecForms)
	}
	lhs, src, hasSource := strings.Cut(text, "=")
	s := Spec{Text: text, Name: lhs}
	if i := strings.LastIndexByte(lhs, ':'); i >= 0 && lhs[i+1:] != "" {
		if m, err := ParseMode(lhs[i+1:]); err == nil {
			s.Name, s.Mode, s.HasMode = lhs[:i], m, true
		}
	}
	if s.Name == "" {
		return bad("empty model name")
	}
	if hasSource {
		if ref, ok := strings.CutPrefix(src, hubPrefix); ok {
			r, err := hub.ParseRef(ref)
			if err != nil {
				return bad("%v", err)
			}
			s.Hub = &r
		} else {
			s.Path = src
		}
		return s, nil
	}
	// The bare form: MODEL, hf:MODEL, or a local path.
	ref, explicitHub := strings.CutPrefix(s.Name, hubPrefix)
	if !explicitHub {
		if _, err := os.Stat(s.Name); err == nil {
			s.Path = s.Name
			return s, nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return bad("%v", err)
		}
	}
	r, err := hub.ParseRef(ref)
	if err != nil {
		if explicitHub {
			return bad("%v", err)
		}
		return bad("%q is neither a local path (none exists) nor a hub repository: %v", s.Name, err)
	}
	s.Name, s.Hub = r.Repo, &r
	return s, nil
}
