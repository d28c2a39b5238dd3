package chat

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"reflect"
	"strings"
	"time"
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

// frame is one scope's variables at run time: a slot per name the scope
// can bind, numbered at compile time (see compile.go), so a lookup indexes
// instead of comparing names.
type frame struct {
	slots  []slot
	parent *frame
}

// slot is a variable; set distinguishes a name bound to None from a name
// not bound yet, which a lookup passes over to the enclosing scopes.
type slot struct {
	v   Value
	set bool
}

// frame4 is a frame with room for its slots, allocated at once: loop and
// macro scopes rarely have more than a few names.
type frame4 struct {
	frame
	buf [4]slot
}

func newFrame(parent *frame, n int) *frame {
	if n <= len(frame4{}.buf) {
		f := &frame4{frame: frame{parent: parent}}
		f.slots = f.buf[:n]
		return &f.frame
	}
	return &frame{slots: make([]slot, n), parent: parent}
}

func (f *frame) bind(i int, v Value) { f.slots[i] = slot{v, true} }

// slotRef is a scope that can bind a name: hops frames out from the frame
// of the scope using it, at slot.
type slotRef struct{ hops, slot int }

type evaluator struct {
	out *strings.Builder
	// outCharged is how much of out its steps have paid for.
	outCharged int
	strs       []string // operands of the "+" chains being evaluated
	steps      int
	maxSteps   int
	depth      int
	now        func() time.Time
	// vars and base are the render's variables (base under vars), read in
	// place rather than copied per render: below every scope's slots.
	vars, base *Dict
	// globals caches, per render, the value of each name no scope of the
	// template binds (messages, tools, ...): vars and base do not change
	// during a render, so the first lookup's answer holds for the rest.
	globals []slot
	strsBuf [16]string // strs' first backing array, allocated with e
}

// lookup finds a name as the interpreter's scoping does: the innermost
// scope that has bound it, then the render's variables. Builtins come
// after, and only for expressions (set ns.attr does not see them).
func (e *evaluator) lookup(f *frame, refs []slotRef, n string) (Value, bool) {
	hops := 0
	for _, r := range refs {
		for ; hops < r.hops; hops++ {
			f = f.parent
		}
		if s := &f.slots[r.slot]; s.set {
			return s.v, true
		}
	}
	return e.lookupVars(n)
}

func (e *evaluator) lookupVars(n string) (Value, bool) {
	if e.vars != nil {
		if v, ok := e.vars.Get(n); ok {
			return v, true
		}
	}
	if e.base != nil {
		if v, ok := e.base.Get(n); ok {
			return v, true
		}
	}
	return nil, false
}

type macro struct {
	code    *macroCode
	closure *frame
}

type loopInfo struct {
	index0, length int
	items          []Value
}

// step counts a statement run, and the output written since the last
// statement (a step per workBytes). Only statements write output, and a
// statement's own step comes before any of its output, so checking the
// output size here alone finds it past the limit exactly where a check on
// every step would.
func (e *evaluator) step() error {
	if err := e.tick(); err != nil {
		return err
	}
	return e.outputSpent()
}

func (e *evaluator) outputSpent() error {
	n := e.out.Len()
	if n > maxOutput {
		return errOutputLimit()
	}
	e.steps += (n - e.outCharged) / workBytes
	e.outCharged = n - (n-e.outCharged)%workBytes
	return e.spent()
}

func errOutputLimit() error {
	return errors.New("RuntimeError: template output exceeded the size limit")
}

// Work beyond a step per expression and statement: a builtin that builds
// or scans a value spends a step per workBytes bytes of a str, per item of
// a list or dict and per word of a big int, before the work when the work
// depends on an input and after it for what it built. Spending does not
// fail by itself: a render whose steps pass the limit fails at its next
// tick and when it ends, so a loop inside a builtin needs only to stop
// early (spent() != nil) and no answer it gives after the limit is seen.
// A str, the only value a single operation can grow without bound, is
// refused past maxOutput bytes, so one call overshoots the budget by at
// most that much work.
const workBytes = 64

// spend counts n steps of bulk work.
func (e *evaluator) spend(n int) { e.steps += n }

// spent is the step-limit error once the budget is spent.
func (e *evaluator) spent() error {
	if e.steps > e.maxSteps {
		return errStepLimit()
	}
	return nil
}

// spendOn counts the work of building or scanning v and refuses a str
// past the output limit.
func (e *evaluator) spendOn(v Value) error {
	switch x := v.(type) {
	case string:
		if len(x) > maxOutput {
			return errValueTooLarge()
		}
		e.steps += len(x) / workBytes
	case *List:
		e.steps += len(x.Items)
	case *Dict:
		e.steps += x.Len()
	case *big.Int:
		e.steps += len(x.Bits())
	default:
		return nil
	}
	return e.spent()
}

func errValueTooLarge() error {
	return errors.New("MemoryError: string result too large")
}

// tick counts an expression evaluated.
func (e *evaluator) tick() error {
	e.steps++
	if e.steps > e.maxSteps {
		return errStepLimit()
	}
	return nil
}

// ticks counts n expressions evaluated with nothing that can fail between
// them.
func (e *evaluator) ticks(n int) error {
	e.steps += n
	if e.steps > e.maxSteps {
		return errStepLimit()
	}
	return nil
}

func errStepLimit() error {
	return errors.New("RuntimeError: template exceeded the evaluation step limit")
}

func (e *evaluator) render(body []execFn, f *frame) error {
	for _, s := range body {
		if err := e.step(); err != nil {
			return err
		}
		if err := s(e, f); err != nil {
			return err
		}
	}
	return nil
}

// renderTo renders body into a string instead of the output (macros, block
// sets, filter blocks).
func (e *evaluator) renderTo(body []execFn, f *frame) (string, error) {
	saved, savedCharged := e.out, e.outCharged
	var buf strings.Builder
	e.out, e.outCharged = &buf, 0
	err := e.render(body, f)
	if err == nil {
		err = e.outputSpent()
	}
	e.out, e.outCharged = saved, savedCharged
	if err != nil {
		return "", err
	}
	return buf.String(), nil
}

// unpack binds v to slots in f as Python assignment does: one name takes
// the value, several take the items of an iterable of the same length.
func (e *evaluator) unpack(f *frame, slots []int, v Value) error {
	if len(slots) == 1 {
		f.bind(slots[0], v)
		return nil
	}
	items, err := e.iterate(v)
	if err != nil {
		return err
	}
	if len(items) != len(slots) {
		return fmt.Errorf("ValueError: expected %d values to unpack, got %d", len(slots), len(items))
	}
	for i, s := range slots {
		f.bind(s, items[i])
	}
	return nil
}

func (e *evaluator) execFor(s *forCode, f *frame) error {
	it, err := s.iter(e, f)
	if err != nil {
		return err
	}
	items, err := e.iterate(it)
	if err != nil {
		return err
	}
	inner := newFrame(f, s.nslots)
	if s.cond != nil {
		// The loop filter runs before the loop, so loop.length counts only
		// the kept items.
		var kept []Value
		for _, v := range items {
			if err := e.unpack(inner, s.targets, v); err != nil {
				return err
			}
			c, err := s.cond(e, inner)
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
	inner.bind(s.loop, loop)
	for i, v := range items {
		loop.index0 = i
		if len(s.targets) == 1 {
			inner.bind(s.targets[0], v)
		} else if err := e.unpack(inner, s.targets, v); err != nil {
			return err
		}
		if err := e.render(s.body, inner); err != nil {
			if errors.Is(err, errBreak) {
				break
			}
			if !errors.Is(err, errContinue) {
				return err
			}
		}
	}
	return nil
}

// iterate is the package function iterate, spending the work of listing a
// str's characters or a dict's keys before it is done.
func (e *evaluator) iterate(v Value) ([]Value, error) {
	switch x := v.(type) {
	case string:
		e.spend(len(x))
	case *Dict:
		e.spend(x.Len())
	}
	if err := e.spent(); err != nil {
		return nil, err
	}
	return iterate(v)
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

func (e *evaluator) evalArgs(args []evalFn, kk []string, kv []evalFn, f *frame) ([]Value, *Dict, error) {
	out := make([]Value, len(args))
	for i, a := range args {
		v, err := a(e, f)
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
		v, err := kv[i](e, f)
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
	n := m.code
	fr := newFrame(m.closure, n.nslots)
	if len(args) > len(n.params) {
		return nil, fmt.Errorf("TypeError: macro '%s' takes not more than %d argument(s)", n.name, len(n.params))
	}
	for i, p := range n.params {
		switch {
		case i < len(args):
			fr.bind(n.paramSlots[i], args[i])
		default:
			if v, ok := kw.Get(p); ok {
				fr.bind(n.paramSlots[i], v)
			} else if n.defaults[i] != nil {
				v, err := n.defaults[i](e, fr)
				if err != nil {
					return nil, err
				}
				fr.bind(n.paramSlots[i], v)
			} else {
				fr.bind(n.paramSlots[i], Undefined{format: "parameter '%s' was not provided", args: []any{p}})
			}
		}
	}
	if c, ok := kw.Get("caller"); ok {
		fr.bind(n.callerSlot, c)
	}
	extra := &List{}
	for i := len(n.params); i < len(args); i++ {
		extra.Items = append(extra.Items, args[i])
	}
	fr.bind(n.varargsSlot, extra)
	return e.renderTo(n.body, fr)
}

func (e *evaluator) evalSlice(x *sliceCode, f *frame) (Value, error) {
	obj, err := x.obj(e, f)
	if err != nil {
		return nil, err
	}
	var bounds [3]int64
	var set [3]bool
	for i, b := range x.bounds {
		if b == nil {
			continue
		}
		v, err := b(e, f)
		if err != nil {
			return nil, err
		}
		if v == nil {
			continue
		}
		n, z, ok := intOf(v)
		if !ok {
			return nil, fmt.Errorf("TypeError: slice indices must be integers or None")
		}
		if z != nil {
			// Beyond int64 a bound selects as the int64 limit of its
			// sign does: both are past either end of any sequence.
			n = math.MaxInt64
			if z.Sign() < 0 {
				n = math.MinInt64
			}
		}
		bounds[i], set[i] = n, true
	}
	switch o := obj.(type) {
	case *List:
		start, step, count, err := pySlice(len(o.Items), bounds, set)
		if err != nil {
			return nil, err
		}
		e.spend(count)
		if err := e.spent(); err != nil {
			return nil, err
		}
		out := make([]Value, count)
		for i := range out {
			out[i] = o.Items[start+int64(i)*step]
		}
		return &List{Items: out}, nil
	case string:
		if err := e.spendOn(o); err != nil {
			return nil, err
		}
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
func (e *evaluator) evalPlusChain(chain []operand, f *frame) (Value, error) {
	start, total, v, isStr, err := e.plusParts(chain, f)
	if err != nil || !isStr {
		return v, err
	}
	s := joinStrings(e.strs[start:], total)
	e.strs = e.strs[:start]
	return s, e.spendOn(s)
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
func (e *evaluator) plusParts(chain []operand, f *frame) (start, total int, v Value, isStr bool, err error) {
	start = len(e.strs)
	for i := range chain {
		v, err := chain[i].fn(e, f)
		if err != nil {
			e.strs = e.strs[:start]
			return start, 0, nil, false, err
		}
		if vs, ok := v.(string); ok {
			e.strs = append(e.strs, vs)
			if total += len(vs); total > maxOutput {
				e.strs = e.strs[:start]
				return start, 0, nil, false, errValueTooLarge()
			}
			continue
		}
		// Python's pairwise semantics from here on, in order.
		acc := v
		if i > 0 {
			acc, err = binop("+", joinStrings(e.strs[start:], total), v)
		}
		e.strs = e.strs[:start]
		if err == nil {
			err = e.spendOn(acc)
		}
		if err != nil {
			return start, 0, nil, false, err
		}
		for j := range chain[i+1:] {
			v, err := chain[i+1+j].fn(e, f)
			if err != nil {
				return start, 0, nil, false, err
			}
			if acc, err = binop("+", acc, v); err != nil {
				return start, 0, nil, false, err
			}
			if err := e.spendOn(acc); err != nil {
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
		nv := r
		if !sOK {
			s, sOK = r.(string)
			nv = l
		}
		if n, nb, isInt := intOf(nv); sOK && isInt {
			if nb != nil {
				return nil, errors.New("OverflowError: cannot fit 'int' into an index-sized integer")
			}
			if n <= 0 {
				return "", nil
			}
			if n > maxRepeat || int64(len(s))*n > maxRepeat {
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
	if v, ok, err := intBinop(op, l, r); ok {
		return v, err
	}
	if isNumber(l) && isNumber(r) {
		af, _, err := floatOf(l)
		if err != nil {
			return nil, err
		}
		bf, _, err := floatOf(r)
		if err != nil {
			return nil, err
		}
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
			q, _ := floatFloorDivMod(af, bf)
			return q, nil
		case "%":
			if bf == 0 {
				return nil, errors.New("ZeroDivisionError: float modulo")
			}
			_, m := floatFloorDivMod(af, bf)
			return m, nil
		case "**":
			return floatPow(af, bf)
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

// equal is Python ==. Each item of a list or dict it compares is a step
// of work; once the budget is spent it answers false at once, which the
// render never shows (see spend).
func (e *evaluator) equal(a, b Value) bool {
	// Strings first: templates compare roles and types to literals all the
	// time, and a str never equals a number.
	if as, ok := a.(string); ok {
		bs, ok := b.(string)
		return ok && as == bs
	}
	if c, unordered, ok := numCompare(a, b); ok {
		return c == 0 && !unordered
	}
	if isNumber(a) || isNumber(b) {
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
		if ok && a == bl {
			return true // Python compares items by identity first
		}
		if !ok || a.Tuple != bl.Tuple || len(a.Items) != len(bl.Items) {
			return false
		}
		for i := range a.Items {
			if e.steps++; e.steps > e.maxSteps || !e.equal(a.Items[i], bl.Items[i]) {
				return false
			}
		}
		return true
	case *Dict:
		bd, ok := b.(*Dict)
		if ok && a == bd {
			return true
		}
		if !ok || a.Len() != bd.Len() {
			return false
		}
		for _, k := range a.keys {
			bv, ok := bd.Get(k)
			if e.steps++; e.steps > e.maxSteps || !ok || !e.equal(a.at(k), bv) {
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

func (e *evaluator) compare(op string, l, r Value) (bool, error) {
	switch op {
	case "==":
		return e.equal(l, r), e.spent()
	case "!=":
		return !e.equal(l, r), e.spent()
	case "in", "not in":
		ok, err := e.contains(r, l)
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
	if isNumber(l) {
		var unordered, ok bool
		if c, unordered, ok = numCompare(l, r); !ok {
			return false, fmt.Errorf("TypeError: '%s' not supported between instances of '%s' and '%s'", op, typeName(l), typeName(r))
		}
		if unordered {
			return false, nil // NaN
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
func (e *evaluator) contains(hay, needle Value) (bool, error) {
	switch h := hay.(type) {
	case string:
		n, ok := needle.(string)
		if !ok {
			return false, fmt.Errorf("TypeError: 'in <string>' requires string as left operand, not %s", typeName(needle))
		}
		if err := e.spendOn(h); err != nil {
			return false, err
		}
		return strings.Contains(h, n), nil
	case *List:
		for _, it := range h.Items {
			if e.steps++; e.equal(it, needle) {
				return true, e.spent()
			}
			if err := e.spent(); err != nil {
				return false, err
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
		return e.contains(h.d, needle)
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
