package chat

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
)

// errBreak and errContinue unwind loop bodies.
var (
	errBreak    = errors.New("break")
	errContinue = errors.New("continue")
)

// Limits that keep a hostile template or input from hanging the router.
const (
	maxOutput       = 64 << 20
	defaultMaxSteps = 10_000_000
	maxCallDepth    = 200
	maxRepeat       = 1 << 20
	maxRange        = 100_000
)

// frame is one scope. Scopes hold a handful of names (the loop variable,
// loop, a few sets), so an ordered Dict's slice scan beats a Go map, and a
// frame costs no allocation until something is set in it.
type frame struct {
	vars   Dict
	parent *frame
	// globals are the render's variables, read in place rather than copied
	// per render: the outermost scope, below anything set at top level.
	globals *Dict
}

func (f *frame) lookup(n string) (Value, bool) {
	for ; f != nil; f = f.parent {
		if v, ok := f.vars.Get(n); ok {
			return v, true
		}
		if f.globals != nil {
			if v, ok := f.globals.Get(n); ok {
				return v, true
			}
		}
	}
	return nil, false
}

func (f *frame) set(n string, v Value) { f.vars.Set(n, v) }

type evaluator struct {
	out      *strings.Builder
	strs     []string // operands of the "+" chains being evaluated
	steps    int
	maxSteps int
	depth    int
	now      func() timeLike
}

type macro struct {
	n       *macroNode
	closure *frame
}

type loopInfo struct {
	index0, length int
	items          []Value
}

func (e *evaluator) step() error {
	e.steps++
	if e.steps > e.maxSteps {
		return errors.New("RuntimeError: template exceeded the evaluation step limit")
	}
	if e.out.Len() > maxOutput {
		return errors.New("RuntimeError: template output exceeded the size limit")
	}
	return nil
}

func (e *evaluator) render(body []stmt, f *frame) error {
	for _, s := range body {
		if err := e.step(); err != nil {
			return err
		}
		if err := e.exec(s, f); err != nil {
			return err
		}
	}
	return nil
}

func (e *evaluator) exec(s stmt, f *frame) error {
	switch s := s.(type) {
	case *textNode:
		e.out.WriteString(s.s)
	case *outputNode:
		if x, ok := isPlusChain(s.e); ok {
			start, _, v, isStr, err := e.plusParts(x, f)
			if err != nil {
				return err
			}
			if !isStr {
				e.out.WriteString(str(v))
				return nil
			}
			for _, p := range e.strs[start:] {
				e.out.WriteString(p)
			}
			e.strs = e.strs[:start]
			return nil
		}
		v, err := e.eval(s.e, f)
		if err != nil {
			return err
		}
		e.out.WriteString(str(v))
	case *ifNode:
		for i, c := range s.conds {
			v, err := e.eval(c, f)
			if err != nil {
				return err
			}
			if truthy(v) {
				return e.render(s.bodies[i], f)
			}
		}
		return e.render(s.els, f)
	case *forNode:
		return e.execFor(s, f)
	case *setNode:
		return e.execSet(s, f)
	case *macroNode:
		f.set(s.n(), &macro{n: s, closure: f})
	case *callBlockNode:
		caller := &macro{n: &macroNode{name: "caller", body: s.body}, closure: f}
		c := *s.call
		fn, err := e.eval(c.fn, f)
		if err != nil {
			return err
		}
		args, kw, err := e.evalArgs(c.args, c.kwKeys, c.kwVals, f)
		if err != nil {
			return err
		}
		if kw == noKwargs {
			kw = NewDict()
		}
		kw.Set("caller", caller)
		v, err := e.call(fn, args, kw)
		if err != nil {
			return err
		}
		e.out.WriteString(str(v))
	case *filterBlockNode:
		saved := e.out
		var buf strings.Builder
		e.out = &buf
		err := e.render(s.body, f)
		e.out = saved
		if err != nil {
			return err
		}
		v, err := e.applyFilter(s.f, buf.String(), f)
		if err != nil {
			return err
		}
		e.out.WriteString(str(v))
	case *breakNode:
		return errBreak
	case *continueNode:
		return errContinue
	default:
		return fmt.Errorf("internal: unknown statement %T", s)
	}
	return nil
}

func (n *macroNode) n() string { return n.name }

func (e *evaluator) execSet(s *setNode, f *frame) error {
	var v Value
	if s.body != nil {
		saved := e.out
		var buf strings.Builder
		e.out = &buf
		err := e.render(s.body, f)
		e.out = saved
		if err != nil {
			return err
		}
		v = buf.String()
	} else {
		var err error
		if v, err = e.eval(s.e, f); err != nil {
			return err
		}
	}
	if s.ns != "" {
		nsv, _ := f.lookup(s.ns)
		ns, ok := nsv.(*Namespace)
		if !ok {
			return fmt.Errorf("TemplateRuntimeError: cannot assign attribute on non-namespace object")
		}
		ns.d.Set(s.names[0], v)
		return nil
	}
	return unpack(f, s.names, v)
}

// unpack binds v to names in f as Python assignment does: one name takes
// the value, several take the items of an iterable of the same length.
func unpack(f *frame, names []string, v Value) error {
	if len(names) == 1 {
		f.set(names[0], v)
		return nil
	}
	items, err := iterate(v)
	if err != nil {
		return err
	}
	if len(items) != len(names) {
		return fmt.Errorf("ValueError: expected %d values to unpack, got %d", len(names), len(items))
	}
	for i, n := range names {
		f.set(n, items[i])
	}
	return nil
}

func (e *evaluator) execFor(s *forNode, f *frame) error {
	it, err := e.eval(s.iter, f)
	if err != nil {
		return err
	}
	items, err := iterate(it)
	if err != nil {
		return err
	}
	inner := &frame{parent: f}
	bind := func(v Value) error { return unpack(inner, s.targets, v) }
	if s.cond != nil {
		// The loop filter runs before the loop, so loop.length counts only
		// the kept items.
		var kept []Value
		for _, v := range items {
			if err := bind(v); err != nil {
				return err
			}
			c, err := e.eval(s.cond, inner)
			if err != nil {
				return err
			}
			if truthy(c) {
				kept = append(kept, v)
			}
		}
		items = kept
	}
	if len(items) == 0 {
		return e.render(s.els, f)
	}
	loop := &loopInfo{length: len(items), items: items}
	inner.set("loop", loop)
	for i, v := range items {
		loop.index0 = i
		if err := bind(v); err != nil {
			return err
		}
		err := e.render(s.body, inner)
		if errors.Is(err, errBreak) {
			break
		}
		if err != nil && !errors.Is(err, errContinue) {
			return err
		}
	}
	return nil
}

// iterate lists the items a for loop sees: list items, dict keys, string
// characters. None and numbers are not iterable.
func iterate(v Value) ([]Value, error) {
	switch v := v.(type) {
	case *List:
		return v.Items, nil
	case *Dict:
		out := make([]Value, len(v.keys))
		for i, k := range v.keys {
			out[i] = k
		}
		return out, nil
	case string:
		out := make([]Value, 0, len(v))
		for _, r := range v {
			out = append(out, string(r))
		}
		return out, nil
	case Undefined:
		return nil, nil
	case *Namespace:
		return iterate(v.d)
	}
	return nil, fmt.Errorf("TypeError: '%s' object is not iterable", typeName(v))
}

func (e *evaluator) eval(x expr, f *frame) (Value, error) {
	if err := e.step(); err != nil {
		return nil, err
	}
	switch x := x.(type) {
	case *literal:
		return x.v, nil
	case *nameExpr:
		if v, ok := f.lookup(x.n); ok {
			return v, nil
		}
		if g, ok := globals[x.n]; ok {
			return g, nil
		}
		return x.undef, nil
	case *attrExpr:
		obj, err := e.eval(x.obj, f)
		if err != nil {
			return nil, err
		}
		if d, ok := obj.(*Dict); ok {
			// getAttr's dict case, with the Undefined prebuilt.
			if m := dictMethod(d, x.name); m != nil {
				return m, nil
			}
			if v, ok := d.Get(x.name); ok {
				return v, nil
			}
			return x.undefDict, nil
		}
		return getAttr(obj, x.name)
	case *itemExpr:
		obj, err := e.eval(x.obj, f)
		if err != nil {
			return nil, err
		}
		idx, err := e.eval(x.idx, f)
		if err != nil {
			return nil, err
		}
		return getItem(obj, idx)
	case *sliceExpr:
		return e.evalSlice(x, f)
	case *callExpr:
		fn, err := e.eval(x.fn, f)
		if err != nil {
			return nil, err
		}
		args, kw, err := e.evalArgs(x.args, x.kwKeys, x.kwVals, f)
		if err != nil {
			return nil, err
		}
		return e.call(fn, args, kw)
	case *filterExpr:
		v, err := e.eval(x.e, f)
		if err != nil {
			return nil, err
		}
		return e.applyFilter(x, v, f)
	case *testExpr:
		v, err := e.eval(x.e, f)
		if err != nil {
			return nil, err
		}
		args := make([]Value, len(x.args))
		for i, a := range x.args {
			if args[i], err = e.eval(a, f); err != nil {
				return nil, err
			}
		}
		r, err := runTest(x.name, v, args)
		if err != nil {
			return nil, err
		}
		return r != x.negate, nil
	case *binExpr:
		return e.evalBin(x, f)
	case *unaryExpr:
		v, err := e.eval(x.x, f)
		if err != nil {
			return nil, err
		}
		switch x.op {
		case "not":
			return !truthy(v), nil
		case "-":
			switch n := v.(type) {
			case int64:
				return -n, nil
			case float64:
				return -n, nil
			case bool:
				return -boolInt(n), nil
			}
			if u, ok := v.(Undefined); ok {
				return nil, u.err()
			}
			return nil, fmt.Errorf("TypeError: bad operand type for unary -: '%s'", typeName(v))
		case "+":
			switch v.(type) {
			case int64, float64:
				return v, nil
			}
			return nil, fmt.Errorf("TypeError: bad operand type for unary +: '%s'", typeName(v))
		}
	case *compareExpr:
		l, err := e.eval(x.first, f)
		if err != nil {
			return nil, err
		}
		for i, op := range x.ops {
			r, err := e.eval(x.rest[i], f)
			if err != nil {
				return nil, err
			}
			ok, err := compare(op, l, r)
			if err != nil {
				return nil, err
			}
			if !ok {
				return false, nil
			}
			l = r
		}
		return true, nil
	case *condExpr:
		c, err := e.eval(x.cond, f)
		if err != nil {
			return nil, err
		}
		if truthy(c) {
			return e.eval(x.a, f)
		}
		if x.b == nil {
			return Undefined{hint: "the inline if-expression evaluated to false and no else section was defined"}, nil
		}
		return e.eval(x.b, f)
	case *listExpr:
		l := &List{Items: make([]Value, len(x.items))}
		for i, it := range x.items {
			v, err := e.eval(it, f)
			if err != nil {
				return nil, err
			}
			l.Items[i] = v
		}
		return l, nil
	case *tupleExpr:
		l := &List{Items: make([]Value, len(x.items)), Tuple: true}
		for i, it := range x.items {
			v, err := e.eval(it, f)
			if err != nil {
				return nil, err
			}
			l.Items[i] = v
		}
		return l, nil
	case *dictExpr:
		d := NewDict()
		for i := range x.keys {
			k, err := e.eval(x.keys[i], f)
			if err != nil {
				return nil, err
			}
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("TypeError: only string dict keys are supported, got %s", typeName(k))
			}
			v, err := e.eval(x.vals[i], f)
			if err != nil {
				return nil, err
			}
			d.Set(ks, v)
		}
		return d, nil
	}
	return nil, fmt.Errorf("internal: unknown expression %T", x)
}

func (u Undefined) err() error {
	hint := u.hint
	if u.format != "" {
		hint = fmt.Sprintf(u.format, u.args...)
	}
	if hint == "" {
		return errors.New("UndefinedError: value is undefined")
	}
	return errors.New("UndefinedError: " + hint)
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// noKwargs is the kwargs of every call that passes none. Callees only read
// kwargs, so one shared empty dict spares an allocation per call; the one
// writer, a call block adding "caller", makes its own.
var noKwargs = &Dict{}

func (e *evaluator) evalArgs(args []expr, kk []string, kv []expr, f *frame) ([]Value, *Dict, error) {
	out := make([]Value, len(args))
	for i, a := range args {
		v, err := e.eval(a, f)
		if err != nil {
			return nil, nil, err
		}
		out[i] = v
	}
	if len(kk) == 0 {
		return out, noKwargs, nil
	}
	kw := NewDict()
	for i, k := range kk {
		v, err := e.eval(kv[i], f)
		if err != nil {
			return nil, nil, err
		}
		kw.Set(k, v)
	}
	return out, kw, nil
}

func (e *evaluator) call(fn Value, args []Value, kw *Dict) (Value, error) {
	e.depth++
	defer func() { e.depth-- }()
	if e.depth > maxCallDepth {
		return nil, errors.New("RecursionError: maximum call depth exceeded")
	}
	switch fn := fn.(type) {
	case callable:
		return fn(e, args, kw)
	case *macro:
		return e.callMacro(fn, args, kw)
	case Undefined:
		return nil, fn.err()
	}
	return nil, fmt.Errorf("TypeError: '%s' object is not callable", typeName(fn))
}

func (e *evaluator) callMacro(m *macro, args []Value, kw *Dict) (Value, error) {
	fr := &frame{parent: m.closure}
	n := m.n
	if len(args) > len(n.params) {
		return nil, fmt.Errorf("TypeError: macro '%s' takes not more than %d argument(s)", n.name, len(n.params))
	}
	for i, p := range n.params {
		switch {
		case i < len(args):
			fr.set(p, args[i])
		default:
			if v, ok := kw.Get(p); ok {
				fr.set(p, v)
			} else if n.defaults[i] != nil {
				v, err := e.eval(n.defaults[i], fr)
				if err != nil {
					return nil, err
				}
				fr.set(p, v)
			} else {
				fr.set(p, Undefined{format: "parameter '%s' was not provided", args: []any{p}})
			}
		}
	}
	if c, ok := kw.Get("caller"); ok {
		fr.set("caller", c)
	}
	extra := &List{}
	for i := len(n.params); i < len(args); i++ {
		extra.Items = append(extra.Items, args[i])
	}
	fr.set("varargs", extra)
	saved := e.out
	var buf strings.Builder
	e.out = &buf
	err := e.render(n.body, fr)
	e.out = saved
	if err != nil {
		return nil, err
	}
	return buf.String(), nil
}

func (e *evaluator) evalSlice(x *sliceExpr, f *frame) (Value, error) {
	obj, err := e.eval(x.obj, f)
	if err != nil {
		return nil, err
	}
	var bounds [3]int64
	var set [3]bool
	for i, b := range [3]expr{x.start, x.stop, x.step} {
		if b == nil {
			continue
		}
		v, err := e.eval(b, f)
		if err != nil {
			return nil, err
		}
		if v == nil {
			continue
		}
		n, ok := v.(int64)
		if !ok {
			return nil, fmt.Errorf("TypeError: slice indices must be integers or None")
		}
		bounds[i], set[i] = n, true
	}
	switch o := obj.(type) {
	case *List:
		start, step, count, err := pySlice(len(o.Items), bounds, set)
		if err != nil {
			return nil, err
		}
		out := make([]Value, count)
		for i := range out {
			out[i] = o.Items[start+int64(i)*step]
		}
		return &List{Items: out}, nil
	case string:
		rs := []rune(o)
		start, step, count, err := pySlice(len(rs), bounds, set)
		if err != nil {
			return nil, err
		}
		var b strings.Builder
		for i := 0; i < count; i++ {
			b.WriteRune(rs[start+int64(i)*step])
		}
		return b.String(), nil
	case Undefined:
		return nil, o.err()
	}
	return nil, fmt.Errorf("TypeError: '%s' object is not subscriptable", typeName(obj))
}

// pySlice is what Python's seq[start:stop:step] selects from n items (a
// bound is used where set says it was given): the first index, the step and
// the number of indices. Counting instead of listing the indices keeps
// messages[::-1], which chat templates do on every render, to one
// allocation.
func pySlice(n int, b [3]int64, set [3]bool) (start, step int64, count int, err error) {
	step = 1
	if set[2] {
		step = b[2]
	}
	if step == 0 {
		return 0, 0, 0, errors.New("ValueError: slice step cannot be zero")
	}
	ln := int64(n)
	clamp := func(i int, def, lo, hi int64) int64 {
		if !set[i] {
			return def
		}
		v := b[i]
		if v < 0 {
			v += ln
		}
		return max(lo, min(v, hi))
	}
	if step > 0 {
		start, stop := clamp(0, 0, 0, ln), clamp(1, ln, 0, ln)
		if start >= stop {
			return start, step, 0, nil
		}
		// stop-start is at most n, so neither this nor the caller's
		// start+i*step can overflow, however large the step.
		return start, step, int(1 + (stop-start-1)/step), nil
	}
	start, stop := clamp(0, ln-1, -1, ln-1), clamp(1, -1, -1, ln-1)
	if start <= stop {
		return start, step, 0, nil
	}
	if step == math.MinInt64 {
		return start, step, 1, nil // -step overflows; one index fits anyway
	}
	return start, step, int(1 + (start-stop-1)/(-step)), nil
}

// evalPlusChain evaluates a left-deep a + b + c ... in Python's order but
// without a new string per "+" (chat templates concatenate whole messages
// this way).
func (e *evaluator) evalPlusChain(x *binExpr, f *frame) (Value, error) {
	start, total, v, isStr, err := e.plusParts(x, f)
	if err != nil || !isStr {
		return v, err
	}
	s := joinStrings(e.strs[start:], total)
	e.strs = e.strs[:start]
	return s, nil
}

func isPlusChain(x expr) (*binExpr, bool) {
	b, ok := x.(*binExpr)
	return b, ok && len(b.chain) > 2
}

// plusParts evaluates the operands of a "+" chain. While they are all
// strings it leaves them unjoined on e.strs from start on, with their total
// length, and isStr true: output then writes them directly, and the caller
// truncates e.strs back to start. Otherwise it returns Python's pairwise
// result. e.strs is a stack shared by nested chains (an operand may itself
// render a macro with chains), so no chain allocates its own list.
func (e *evaluator) plusParts(x *binExpr, f *frame) (start, total int, v Value, isStr bool, err error) {
	start = len(e.strs)
	for i, o := range x.chain {
		v, err := e.eval(o, f)
		if err != nil {
			e.strs = e.strs[:start]
			return start, 0, nil, false, err
		}
		if vs, ok := v.(string); ok {
			e.strs = append(e.strs, vs)
			total += len(vs)
			continue
		}
		// Python's pairwise semantics from here on, in order.
		acc := v
		if i > 0 {
			acc, err = binop("+", joinStrings(e.strs[start:], total), v)
		}
		e.strs = e.strs[:start]
		if err != nil {
			return start, 0, nil, false, err
		}
		for _, o := range x.chain[i+1:] {
			v, err := e.eval(o, f)
			if err != nil {
				return start, 0, nil, false, err
			}
			if acc, err = binop("+", acc, v); err != nil {
				return start, 0, nil, false, err
			}
		}
		return start, 0, acc, false, nil
	}
	return start, total, nil, true, nil
}

func joinStrings(strs []string, total int) string {
	var b strings.Builder
	b.Grow(total)
	for _, s := range strs {
		b.WriteString(s)
	}
	return b.String()
}

func (e *evaluator) evalBin(x *binExpr, f *frame) (Value, error) {
	if x.op == "+" {
		if l, ok := x.l.(*binExpr); ok && l.op == "+" {
			return e.evalPlusChain(x, f)
		}
	}
	l, err := e.eval(x.l, f)
	if err != nil {
		return nil, err
	}
	switch x.op {
	case "and":
		if !truthy(l) {
			return l, nil
		}
		return e.eval(x.r, f)
	case "or":
		if truthy(l) {
			return l, nil
		}
		return e.eval(x.r, f)
	}
	r, err := e.eval(x.r, f)
	if err != nil {
		return nil, err
	}
	return binop(x.op, l, r)
}

func binop(op string, l, r Value) (Value, error) {
	if u, ok := l.(Undefined); ok && op != "~" {
		return nil, u.err()
	}
	if u, ok := r.(Undefined); ok && op != "~" {
		return nil, u.err()
	}
	if op == "~" {
		return str(l) + str(r), nil
	}
	if op == "+" {
		switch a := l.(type) {
		case string:
			if b, ok := r.(string); ok {
				return a + b, nil
			}
			return nil, fmt.Errorf("TypeError: can only concatenate str (not \"%s\") to str", typeName(r))
		case *List:
			if b, ok := r.(*List); ok {
				if a.Tuple != b.Tuple {
					return nil, fmt.Errorf("TypeError: can only concatenate %s (not \"%s\") to %s", typeName(a), typeName(b), typeName(a))
				}
				items := append(append([]Value{}, a.Items...), b.Items...)
				return &List{Items: items, Tuple: a.Tuple}, nil
			}
			return nil, fmt.Errorf("TypeError: can only concatenate list (not \"%s\") to list", typeName(r))
		}
	}
	if op == "*" {
		s, sOK := l.(string)
		n, nOK := r.(int64)
		if !sOK {
			s, sOK = r.(string)
			n, nOK = l.(int64)
		}
		if sOK && nOK {
			if n <= 0 {
				return "", nil
			}
			if int64(len(s))*n > maxRepeat {
				return nil, errors.New("MemoryError: string repetition result too large")
			}
			return strings.Repeat(s, int(n)), nil
		}
	}
	if op == "%" {
		if f, ok := l.(string); ok {
			args := []Value{r}
			if t, ok := r.(*List); ok && t.Tuple {
				args = t.Items
			}
			return pyPercent(f, args, r)
		}
	}
	ai, aInt := asInt(l)
	bi, bInt := asInt(r)
	if aInt && bInt {
		switch op {
		case "+":
			return ai + bi, nil
		case "-":
			return ai - bi, nil
		case "*":
			return ai * bi, nil
		case "/":
			if bi == 0 {
				return nil, errors.New("ZeroDivisionError: division by zero")
			}
			return float64(ai) / float64(bi), nil
		case "//":
			if bi == 0 {
				return nil, errors.New("ZeroDivisionError: integer division or modulo by zero")
			}
			q := ai / bi
			if (ai%bi != 0) && ((ai < 0) != (bi < 0)) {
				q--
			}
			return q, nil
		case "%":
			if bi == 0 {
				return nil, errors.New("ZeroDivisionError: integer division or modulo by zero")
			}
			m := ai % bi
			if m != 0 && ((m < 0) != (bi < 0)) {
				m += bi
			}
			return m, nil
		case "**":
			if bi >= 0 {
				res := int64(1)
				for k := int64(0); k < bi && k < 64; k++ {
					res *= ai
				}
				return res, nil
			}
			return math.Pow(float64(ai), float64(bi)), nil
		}
	}
	af, aNum := asFloat(l)
	bf, bNum := asFloat(r)
	if aNum && bNum {
		switch op {
		case "+":
			return af + bf, nil
		case "-":
			return af - bf, nil
		case "*":
			return af * bf, nil
		case "/":
			if bf == 0 {
				return nil, errors.New("ZeroDivisionError: float division by zero")
			}
			return af / bf, nil
		case "//":
			if bf == 0 {
				return nil, errors.New("ZeroDivisionError: float floor division by zero")
			}
			return math.Floor(af / bf), nil
		case "%":
			if bf == 0 {
				return nil, errors.New("ZeroDivisionError: float modulo")
			}
			m := math.Mod(af, bf)
			if m != 0 && ((m < 0) != (bf < 0)) {
				m += bf
			}
			return m, nil
		case "**":
			return math.Pow(af, bf), nil
		}
	}
	return nil, fmt.Errorf("TypeError: unsupported operand type(s) for %s: '%s' and '%s'", op, typeName(l), typeName(r))
}

func asInt(v Value) (int64, bool) {
	switch v := v.(type) {
	case int64:
		return v, true
	case bool:
		return boolInt(v), true
	}
	return 0, false
}

func asFloat(v Value) (float64, bool) {
	switch v := v.(type) {
	case int64:
		return float64(v), true
	case float64:
		return v, true
	case bool:
		return float64(boolInt(v)), true
	}
	return 0, false
}

// equal is Python ==.
func equal(a, b Value) bool {
	// Strings first: templates compare roles and types to literals all the
	// time, and a str never equals a number.
	if as, ok := a.(string); ok {
		bs, ok := b.(string)
		return ok && as == bs
	}
	if af, ok := asFloat(a); ok {
		if bf, ok := asFloat(b); ok {
			return af == bf
		}
		return false
	}
	switch a := a.(type) {
	case nil:
		return b == nil
	case Undefined:
		_, ok := b.(Undefined)
		return ok
	case string:
		bs, ok := b.(string)
		return ok && a == bs
	case *List:
		bl, ok := b.(*List)
		if !ok || a.Tuple != bl.Tuple || len(a.Items) != len(bl.Items) {
			return false
		}
		for i := range a.Items {
			if !equal(a.Items[i], bl.Items[i]) {
				return false
			}
		}
		return true
	case *Dict:
		bd, ok := b.(*Dict)
		if !ok || a.Len() != bd.Len() {
			return false
		}
		for _, k := range a.keys {
			bv, ok := bd.Get(k)
			if !ok || !equal(a.at(k), bv) {
				return false
			}
		}
		return true
	case *Namespace, *loopInfo, *macro:
		return a == b // identity, as Python compares these objects
	case callable:
		// Globals are single objects (range == range); methods are bound
		// anew on every access, so they never compare equal.
		bc, ok := b.(callable)
		return ok && isGlobal(a) && reflect.ValueOf(a).Pointer() == reflect.ValueOf(bc).Pointer()
	}
	return false
}

func isGlobal(c callable) bool {
	p := reflect.ValueOf(c).Pointer()
	for _, g := range globals {
		if gc, ok := g.(callable); ok && reflect.ValueOf(gc).Pointer() == p {
			return true
		}
	}
	return false
}

func compare(op string, l, r Value) (bool, error) {
	switch op {
	case "==":
		return equal(l, r), nil
	case "!=":
		return !equal(l, r), nil
	case "in", "not in":
		ok, err := contains(r, l)
		if err != nil {
			return false, err
		}
		return ok == (op == "in"), nil
	}
	if u, ok := l.(Undefined); ok {
		return false, u.err()
	}
	if u, ok := r.(Undefined); ok {
		return false, u.err()
	}
	var c int
	if af, ok := asFloat(l); ok {
		bf, ok := asFloat(r)
		if !ok {
			return false, fmt.Errorf("TypeError: '%s' not supported between instances of '%s' and '%s'", op, typeName(l), typeName(r))
		}
		switch {
		case af < bf:
			c = -1
		case af > bf:
			c = 1
		}
	} else if as, ok := l.(string); ok {
		bs, ok := r.(string)
		if !ok {
			return false, fmt.Errorf("TypeError: '%s' not supported between instances of '%s' and '%s'", op, typeName(l), typeName(r))
		}
		c = strings.Compare(as, bs)
	} else {
		return false, fmt.Errorf("TypeError: '%s' not supported between instances of '%s' and '%s'", op, typeName(l), typeName(r))
	}
	switch op {
	case "<":
		return c < 0, nil
	case "<=":
		return c <= 0, nil
	case ">":
		return c > 0, nil
	case ">=":
		return c >= 0, nil
	}
	return false, fmt.Errorf("internal: unknown comparison %s", op)
}

// contains is Python's "needle in hay".
func contains(hay, needle Value) (bool, error) {
	switch h := hay.(type) {
	case string:
		n, ok := needle.(string)
		if !ok {
			return false, fmt.Errorf("TypeError: 'in <string>' requires string as left operand, not %s", typeName(needle))
		}
		return strings.Contains(h, n), nil
	case *List:
		for _, it := range h.Items {
			if equal(it, needle) {
				return true, nil
			}
		}
		return false, nil
	case *Dict:
		k, ok := needle.(string)
		if !ok {
			return false, nil
		}
		_, found := h.Get(k)
		return found, nil
	case *Namespace:
		return contains(h.d, needle)
	case Undefined:
		return false, nil
	}
	return false, fmt.Errorf("TypeError: argument of type '%s' is not iterable", typeName(hay))
}

// getAttr is Jinja's obj.name: attributes (methods) first, then items.
func getAttr(obj Value, name string) (Value, error) {
	switch o := obj.(type) {
	case Undefined:
		return nil, o.err()
	case *Dict:
		if m := dictMethod(o, name); m != nil {
			return m, nil
		}
		if v, ok := o.Get(name); ok {
			return v, nil
		}
		return Undefined{format: "'dict object' has no attribute '%s'", args: []any{name}}, nil
	case *Namespace:
		if v, ok := o.d.Get(name); ok {
			return v, nil
		}
		return Undefined{format: "'Namespace object' has no attribute '%s'", args: []any{name}}, nil
	case *loopInfo:
		return o.attr(name), nil
	case string:
		if m := strMethod(o, name); m != nil {
			return m, nil
		}
	case *List:
		if m := listMethod(o, name); m != nil {
			return m, nil
		}
	}
	return Undefined{format: "'%s object' has no attribute '%s'", args: []any{typeName(obj), name}}, nil
}

// getItem is Jinja's obj[idx]: items first, then attributes.
func getItem(obj Value, idx Value) (Value, error) {
	switch o := obj.(type) {
	case Undefined:
		return nil, o.err()
	case *Dict:
		if k, ok := idx.(string); ok {
			if v, ok := o.Get(k); ok {
				return v, nil
			}
			if m := dictMethod(o, k); m != nil {
				return m, nil
			}
		}
		return Undefined{format: "'dict object' has no attribute %s", args: []any{repr(idx)}}, nil
	case *List:
		if i, ok := asInt(idx); ok {
			n := int64(len(o.Items))
			if i < 0 {
				i += n
			}
			if i >= 0 && i < n {
				return o.Items[i], nil
			}
			return Undefined{format: "list object has no element %s", args: []any{repr(idx)}}, nil
		}
	case string:
		if i, ok := asInt(idx); ok {
			rs := []rune(o)
			n := int64(len(rs))
			if i < 0 {
				i += n
			}
			if i >= 0 && i < n {
				return string(rs[i]), nil
			}
			return Undefined{format: "str object has no element %s", args: []any{repr(idx)}}, nil
		}
	case *Namespace, *loopInfo:
		if k, ok := idx.(string); ok {
			return getAttr(obj, k)
		}
	}
	if k, ok := idx.(string); ok {
		return getAttr(obj, k)
	}
	return Undefined{format: "'%s object' has no attribute %s", args: []any{typeName(obj), repr(idx)}}, nil
}

func (l *loopInfo) attr(name string) Value {
	i, n := l.index0, l.length
	switch name {
	case "index0":
		return int64(i)
	case "index":
		return int64(i + 1)
	case "revindex":
		return int64(n - i)
	case "revindex0":
		return int64(n - i - 1)
	case "first":
		return i == 0
	case "last":
		return i == n-1
	case "length":
		return int64(n)
	case "depth":
		return int64(1)
	case "depth0":
		return int64(0)
	case "previtem":
		if i > 0 {
			return l.items[i-1]
		}
		return Undefined{hint: "there is no previous item"}
	case "nextitem":
		if i+1 < n {
			return l.items[i+1]
		}
		return Undefined{hint: "there is no next item"}
	case "cycle":
		return callable(func(_ *evaluator, args []Value, _ *Dict) (Value, error) {
			if len(args) == 0 {
				return nil, errors.New("TypeError: no items for cycling given")
			}
			return args[i%len(args)], nil
		})
	}
	return Undefined{format: "'LoopContext object' has no attribute '%s'", args: []any{name}}
}
