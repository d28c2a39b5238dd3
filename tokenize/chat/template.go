// Package chat owns chat-template rendering: a Jinja2 interpreter with the
// semantics transformers' apply_chat_template gives templates (sandboxed,
// trim_blocks, lstrip_blocks, loop controls, Python value printing,
// tojson = json.dumps(ensure_ascii=False) with key order kept,
// raise_exception, strftime_now, the generation tag).
//
// It is its own interpreter rather than gonja because chat templates need a
// Python value model gonja lacks: ordered dicts (tools | tojson), Python
// printing of None/True/floats, arbitrary-precision ints (ints.go), str
// methods with Python's white space (pystr.go), and Jinja's Undefined
// behaviour. testdata/chat holds Python's renders that it must match byte
// for byte (testdata/chat/README.md says how they were made).
package chat

import (
	"fmt"
	"strings"
	"sync/atomic"
	"time"
)

// Template is a compiled chat template, safe for concurrent use.
type Template struct {
	body     []execFn
	nslots   int // the root scope's variables
	nglobals int // names no scope binds (evaluator.globals)
	// Now returns the time strftime_now formats; tests pin it.
	Now func() time.Time
	// MaxSteps bounds the work of a render (0: 10 million steps, far
	// above any real chat): a step per expression and statement evaluated
	// and per 64 bytes or item a builtin builds or scans (see spend in
	// eval.go). A template that works past it fails.
	MaxSteps int
	sizeHint atomic.Int64 // largest output so far, to size the next one
}

// Compile parses a template source.
func Compile(src string) (*Template, error) {
	toks, err := lex(src)
	if err != nil {
		return nil, fmt.Errorf("TemplateSyntaxError: %w", err)
	}
	tree, err := parse(toks)
	if err != nil {
		return nil, err
	}
	body, nslots, nglobals := compileTemplate(tree)
	return &Template{body: body, nslots: nslots, nglobals: nglobals, Now: time.Now}, nil
}

// Vars are the template's variables, in insertion order.
type Vars = Dict

// Render renders with the given variables, which it only reads. Errors
// carry Python's exception class name first ("TypeError: ...",
// "UndefinedError: ...", "TemplateError: ..." for raise_exception).
func (t *Template) Render(vars *Vars) (string, error) {
	return t.render(nil, vars)
}

// RenderOver renders with vars layered over base: a name vars lacks is
// looked up in base, as if base's keys had been set first and vars' after.
// Variables that are the same for every render (a model's special tokens)
// are then built once instead of copied into each render's variables.
func (t *Template) RenderOver(base, vars *Vars) (string, error) {
	return t.render(base, vars)
}

func (t *Template) render(base, vars *Vars) (string, error) {
	var out strings.Builder
	out.Grow(int(t.sizeHint.Load()))
	now := t.Now
	if now == nil {
		now = time.Now
	}
	e := &evaluator{out: &out, maxSteps: t.MaxSteps, now: now, vars: vars, base: base}
	e.strs = e.strsBuf[:0]
	if t.nglobals > 0 {
		e.globals = make([]slot, t.nglobals)
	}
	if e.maxSteps <= 0 {
		e.maxSteps = defaultMaxSteps
	}
	defer func() {
		// Remember the output size so the next render allocates once.
		if n := int64(out.Len()); n > t.sizeHint.Load() && n < maxOutput {
			t.sizeHint.Store(n)
		}
	}()
	err := e.render(t.body, newFrame(nil, t.nslots))
	if err == nil {
		// The last statement's output and any work after the last tick.
		err = e.outputSpent()
	}
	if err != nil {
		switch err {
		case errBreak, errContinue:
			return "", fmt.Errorf("TemplateSyntaxError: break or continue outside a loop")
		}
		return "", err
	}
	return out.String(), nil
}
