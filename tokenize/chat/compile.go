package chat

import (
	"fmt"
	"math/big"
	"strings"
)

// The parser's tree is compiled once into Go closures: each node becomes a
// function that evaluates it, with its operator, names and constants
// resolved up front, instead of a type switch and string comparisons on
// every evaluation. Chat templates are short and rendered on every request,
// so the interpreter's own overhead, not the work the template asks for, was
// most of a render.
//
// Every closure counts the evaluation steps the tree walker counted (one per
// statement run and one per expression node evaluated), so the step limit
// trips at the same point; closures that fuse several nodes add their steps
// where no error or output can come between them.

type (
	evalFn func(e *evaluator, f *frame) (Value, error)
	execFn func(e *evaluator, f *frame) error
)

// scope is a compile-time scope: the names its frame may bind, each with a
// slot. Jinja scoping here is lexical: the root (the template body), each
// for loop body (targets, loop, and what it sets), each macro and call
// block body (parameters, caller, varargs, what it sets). if, filter and
// block-set bodies share their enclosing scope.
type scope struct {
	parent *scope
	slots  map[string]int
}

func newScope(parent *scope) *scope { return &scope{parent: parent, slots: map[string]int{}} }

func (s *scope) declare(n string) int {
	if i, ok := s.slots[n]; ok {
		return i
	}
	i := len(s.slots)
	s.slots[n] = i
	return i
}

// declareBody declares what the statements of body bind in s. It runs
// before any of the scope's names are compiled, as a name set late in a
// loop body is seen early in the next iteration.
func (s *scope) declareBody(body []stmt) {
	for _, st := range body {
		switch st := st.(type) {
		case *setNode:
			if st.ns == "" {
				for _, n := range st.names {
					s.declare(n)
				}
			}
			s.declareBody(st.body)
		case *macroNode:
			s.declare(st.name)
		case *forNode:
			s.declareBody(st.els) // the else branch runs in this scope
		case *ifNode:
			for _, b := range st.bodies {
				s.declareBody(b)
			}
			s.declareBody(st.els)
		case *filterBlockNode:
			s.declareBody(st.body)
		}
	}
}

// resolve lists the scopes, innermost first, that may hold n at run time.
func (s *scope) resolve(n string) []slotRef {
	var refs []slotRef
	for hops := 0; s != nil; s, hops = s.parent, hops+1 {
		if i, ok := s.slots[n]; ok {
			refs = append(refs, slotRef{hops, i})
		}
	}
	return refs
}

type compiler struct {
	sc      *scope
	globals map[string]int // shared by the nested compilers of a template
}

func (c *compiler) nested(sc *scope) *compiler { return &compiler{sc: sc, globals: c.globals} }

// macroCode is a compiled macro or call block body.
type macroCode struct {
	name                    string
	params                  []string
	paramSlots              []int
	defaults                []evalFn // aligned with params; nil = required
	callerSlot, varargsSlot int
	nslots                  int
	body                    []execFn
}

type forCode struct {
	iter, cond evalFn
	targets    []int
	loop       int
	nslots     int
	body, els  []execFn
}

type sliceCode struct {
	obj    evalFn
	bounds [3]evalFn
}

// compileTemplate compiles a parsed template; with the body it returns the
// sizes a render allocates: the root scope's slots and the globals cache.
func compileTemplate(body []stmt) (code []execFn, nslots, nglobals int) {
	root := newScope(nil)
	root.declareBody(body)
	c := &compiler{sc: root, globals: map[string]int{}}
	code = c.body(body)
	return code, len(root.slots), len(c.globals)
}

func (c *compiler) body(body []stmt) []execFn {
	out := make([]execFn, len(body))
	for i, s := range body {
		out[i] = c.stmt(s)
	}
	return out
}

func (c *compiler) exprs(xs []expr) []evalFn {
	if xs == nil {
		return nil
	}
	out := make([]evalFn, len(xs))
	for i, x := range xs {
		out[i] = c.expr(x)
	}
	return out
}

func (c *compiler) stmt(s stmt) execFn {
	switch s := s.(type) {
	case *textNode:
		text := s.s
		return func(e *evaluator, _ *frame) error {
			e.out.WriteString(text)
			return nil
		}
	case *outputNode:
		return c.output(s)
	case *ifNode:
		conds := make([]condFn, len(s.conds))
		for i, x := range s.conds {
			conds[i] = c.cond(x)
		}
		bodies := make([][]execFn, len(s.bodies))
		for i, b := range s.bodies {
			bodies[i] = c.body(b)
		}
		els := c.body(s.els)
		if len(conds) == 1 {
			cond, body := conds[0], bodies[0]
			return func(e *evaluator, f *frame) error {
				ok, err := cond(e, f)
				if err != nil {
					return err
				}
				if ok {
					return e.render(body, f)
				}
				return e.render(els, f)
			}
		}
		return func(e *evaluator, f *frame) error {
			for i, cond := range conds {
				ok, err := cond(e, f)
				if err != nil {
					return err
				}
				if ok {
					return e.render(bodies[i], f)
				}
			}
			return e.render(els, f)
		}
	case *forNode:
		return c.forLoop(s)
	case *setNode:
		return c.set(s)
	case *macroNode:
		code := c.macro(s.name, s.params, s.defaults, s.body)
		i := c.sc.slots[s.name]
		return func(_ *evaluator, f *frame) error {
			f.bind(i, &macro{code: code, closure: f})
			return nil
		}
	case *callBlockNode:
		code := c.macro("caller", nil, nil, s.body)
		fn := c.expr(s.call.fn)
		args, kwKeys, kwVals := c.exprs(s.call.args), s.call.kwKeys, c.exprs(s.call.kwVals)
		return func(e *evaluator, f *frame) error {
			caller := &macro{code: code, closure: f}
			fv, err := fn(e, f)
			if err != nil {
				return err
			}
			args, kw, err := e.evalArgs(args, kwKeys, kwVals, f)
			if err != nil {
				return err
			}
			if kw == noKwargs {
				kw = NewDict()
			}
			kw.Set("caller", caller)
			return e.emit(e.call(fv, args, kw))
		}
	case *filterBlockNode:
		body := c.body(s.body)
		fc := c.filterCall(s.f)
		return func(e *evaluator, f *frame) error {
			s, err := e.renderTo(body, f)
			if err != nil {
				return err
			}
			return e.emit(fc.apply(e, s, f))
		}
	case *breakNode:
		return func(*evaluator, *frame) error { return errBreak }
	case *continueNode:
		return func(*evaluator, *frame) error { return errContinue }
	}
	err := fmt.Errorf("internal: unknown statement %T", s)
	return func(*evaluator, *frame) error { return err }
}

func (c *compiler) output(s *outputNode) execFn {
	if x, ok := s.e.(*binExpr); ok && len(x.chain) == 2 {
		// {{ '<｜User｜>' + message['content'] }}: written in two parts
		// rather than concatenated first, after the "+"'s own step.
		ops := c.operands(x.chain)
		if ops[0].simple && ops[1].simple {
			return func(e *evaluator, f *frame) error {
				if err := e.tick(); err != nil {
					return err
				}
				return e.writeChain(ops, f)
			}
		}
	}
	if x, ok := isPlusChain(s.e); ok {
		ops := c.operands(x.chain)
		direct := true
		for _, o := range ops {
			direct = direct && o.simple
		}
		if direct {
			return func(e *evaluator, f *frame) error { return e.writeChain(ops, f) }
		}
		return func(e *evaluator, f *frame) error {
			start, _, v, isStr, err := e.plusParts(ops, f)
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
	}
	o := c.operand(s.e)
	return func(e *evaluator, f *frame) error {
		return e.emit(o.fn(e, f))
	}
}

// writeChain outputs a "+" chain of simple operands as plusParts would,
// but writes each string as it comes. That is only the same output because
// the operands are simple: once the first is a str, any later non-str is an
// error, and a simple operand's errors (undefined, the step limit) end the
// render, so what was written is never seen; break and continue, which a
// loop would catch, can only come out of a call.
func (e *evaluator) writeChain(ops []operand, f *frame) error {
	start := e.out.Len()
	for i := range ops {
		o := &ops[i]
		var v Value
		var err error
		switch {
		case o.isStr:
			if err := e.tick(); err != nil {
				return err
			}
			e.out.WriteString(o.str)
			continue
		case o.ac != nil:
			if err := e.ticks(o.ac.steps); err != nil {
				return err
			}
			v, err = o.ac.of(e.get(f, o.nc))
		default:
			v, err = o.fn(e, f)
		}
		if err != nil {
			return err
		}
		if s, ok := v.(string); ok {
			e.out.WriteString(s)
			if e.out.Len() > maxOutput {
				return errOutputLimit()
			}
			continue
		}
		if i > 0 {
			_, err := binop("+", e.out.String()[start:], v)
			if err == nil {
				err = fmt.Errorf("internal: str + %s did not fail", typeName(v))
			}
			return err
		}
		// Python's pairwise semantics, in order.
		acc := v
		for j := range ops[1:] {
			v, err := ops[1+j].fn(e, f)
			if err != nil {
				return err
			}
			if acc, err = binop("+", acc, v); err != nil {
				return err
			}
		}
		e.out.WriteString(str(acc))
		return nil
	}
	return nil
}

func (c *compiler) forLoop(s *forNode) execFn {
	// The iterable and the else branch belong to the enclosing scope.
	fc := &forCode{iter: c.expr(s.iter), els: c.body(s.els)}
	inner := newScope(c.sc)
	for _, n := range s.targets {
		fc.targets = append(fc.targets, inner.declare(n))
	}
	fc.loop = inner.declare("loop")
	inner.declareBody(s.body)
	ic := c.nested(inner)
	if s.cond != nil {
		fc.cond = ic.expr(s.cond)
	}
	fc.body = ic.body(s.body)
	fc.nslots = len(inner.slots)
	return func(e *evaluator, f *frame) error { return e.execFor(fc, f) }
}

func (c *compiler) set(s *setNode) execFn {
	var value operand
	if s.body != nil {
		body := c.body(s.body)
		value.fn = func(e *evaluator, f *frame) (Value, error) { return e.renderTo(body, f) }
	} else {
		value = c.operand(s.e)
	}
	if s.ns != "" {
		refs, name, attr := c.sc.resolve(s.ns), s.ns, s.names[0]
		return func(e *evaluator, f *frame) error {
			v, err := value.fn(e, f)
			if err != nil {
				return err
			}
			nsv, _ := e.lookup(f, refs, name)
			ns, ok := nsv.(*Namespace)
			if !ok {
				return fmt.Errorf("TemplateRuntimeError: cannot assign attribute on non-namespace object")
			}
			ns.d.Set(attr, v)
			return nil
		}
	}
	slots := make([]int, len(s.names))
	for i, n := range s.names {
		slots[i] = c.sc.slots[n]
	}
	if len(slots) == 1 {
		i := slots[0]
		return func(e *evaluator, f *frame) error {
			v, err := value.fn(e, f)
			if err != nil {
				return err
			}
			f.bind(i, v)
			return nil
		}
	}
	return func(e *evaluator, f *frame) error {
		v, err := value.fn(e, f)
		if err != nil {
			return err
		}
		return e.unpack(f, slots, v)
	}
}

func (c *compiler) macro(name string, params []string, defaults []expr, body []stmt) *macroCode {
	ms := newScope(c.sc)
	m := &macroCode{name: name, params: params}
	for _, p := range params {
		m.paramSlots = append(m.paramSlots, ms.declare(p))
	}
	m.callerSlot = ms.declare("caller")
	m.varargsSlot = ms.declare("varargs")
	ms.declareBody(body)
	mc := c.nested(ms)
	m.defaults = make([]evalFn, len(defaults))
	for i, d := range defaults {
		if d != nil {
			m.defaults[i] = mc.expr(d)
		}
	}
	m.body = mc.body(body)
	m.nslots = len(ms.slots)
	return m
}

// filterCode is a compiled filter application, less its input.
type filterCode struct {
	name         string
	args, kwVals []evalFn
	kwKeys       []string
}

func (c *compiler) filterCall(x *filterExpr) *filterCode {
	return &filterCode{name: x.name, args: c.exprs(x.args), kwKeys: x.kwKeys, kwVals: c.exprs(x.kwVals)}
}

func (fc *filterCode) apply(e *evaluator, v Value, f *frame) (Value, error) {
	args, kw, err := e.evalArgs(fc.args, fc.kwKeys, fc.kwVals, f)
	if err != nil {
		return nil, err
	}
	return e.filter(fc.name, v, args, kw)
}

// emit writes a statement's value to the output, or passes its error on.
func (e *evaluator) emit(v Value, err error) error {
	if err != nil {
		return err
	}
	e.out.WriteString(str(v))
	return nil
}

// tickThen counts the node's step, then evaluates its first operand: the
// prologue of most nodes.
func tickThen(e *evaluator, f *frame, fn evalFn) (Value, error) {
	if err := e.tick(); err != nil {
		return nil, err
	}
	return fn(e, f)
}

// tickBoth counts the node's step, then evaluates its two operands in
// order.
func tickBoth(e *evaluator, f *frame, a, b evalFn) (Value, Value, error) {
	av, err := tickThen(e, f, a)
	if err != nil {
		return nil, nil, err
	}
	bv, err := b(e, f)
	if err != nil {
		return nil, nil, err
	}
	return av, bv, nil
}

func (c *compiler) expr(x expr) evalFn {
	switch x := x.(type) {
	case *literal:
		v := x.v
		return func(e *evaluator, _ *frame) (Value, error) {
			if err := e.tick(); err != nil {
				return nil, err
			}
			return v, nil
		}
	case *nameExpr:
		return c.name(x)
	case *attrExpr:
		return c.attr(x)
	case *itemExpr:
		if nc, ac, ok := c.nameKey(x); ok {
			// message['role']: the name's, the key's and the item's steps
			// counted at once, as nothing between them can fail.
			return func(e *evaluator, f *frame) (Value, error) {
				if err := e.ticks(3); err != nil {
					return nil, err
				}
				return ac.of(e.get(f, nc))
			}
		}
		obj, idx := c.expr(x.obj), c.expr(x.idx)
		return func(e *evaluator, f *frame) (Value, error) {
			o, i, err := tickBoth(e, f, obj, idx)
			if err != nil {
				return nil, err
			}
			if s, ok := o.(string); ok {
				// Indexing a str counts characters up to the index.
				if err := e.spendOn(s); err != nil {
					return nil, err
				}
			}
			return getItem(o, i)
		}
	case *sliceExpr:
		sc := &sliceCode{obj: c.expr(x.obj)}
		for i, b := range [3]expr{x.start, x.stop, x.step} {
			if b != nil {
				sc.bounds[i] = c.expr(b)
			}
		}
		return func(e *evaluator, f *frame) (Value, error) {
			if err := e.tick(); err != nil {
				return nil, err
			}
			return e.evalSlice(sc, f)
		}
	case *callExpr:
		return c.call(x)
	case *filterExpr:
		in, fc := c.expr(x.e), c.filterCall(x)
		if (x.name == "length" || x.name == "count") && len(x.args) == 0 && len(x.kwKeys) == 0 {
			return func(e *evaluator, f *frame) (Value, error) {
				v, err := tickThen(e, f, in)
				if err != nil {
					return nil, err
				}
				if s, ok := v.(string); ok && len(s) >= workBytes {
					// Counting characters, as e.filter would spend.
					if err := e.spendOn(s); err != nil {
						return nil, err
					}
				}
				return length(v)
			}
		}
		return func(e *evaluator, f *frame) (Value, error) {
			v, err := tickThen(e, f, in)
			if err != nil {
				return nil, err
			}
			return fc.apply(e, v, f)
		}
	case *testExpr:
		return boxed(c.test(x))
	case *binExpr:
		return c.bin(x)
	case *unaryExpr:
		return c.unary(x)
	case *compareExpr:
		return boxed(c.compare(x))
	case *condExpr:
		cond, a := c.expr(x.cond), c.expr(x.a)
		var b evalFn
		if x.b != nil {
			b = c.expr(x.b)
		}
		return func(e *evaluator, f *frame) (Value, error) {
			v, err := tickThen(e, f, cond)
			if err != nil {
				return nil, err
			}
			if truthy(v) {
				return a(e, f)
			}
			if b == nil {
				return Undefined{hint: "the inline if-expression evaluated to false and no else section was defined"}, nil
			}
			return b(e, f)
		}
	case *listExpr:
		return c.sequence(x.items, false)
	case *tupleExpr:
		return c.sequence(x.items, true)
	case *dictExpr:
		keys, vals := c.exprs(x.keys), c.exprs(x.vals)
		return func(e *evaluator, f *frame) (Value, error) {
			if err := e.tick(); err != nil {
				return nil, err
			}
			d := NewDict()
			for i := range keys {
				k, err := keys[i](e, f)
				if err != nil {
					return nil, err
				}
				ks, ok := k.(string)
				if !ok {
					return nil, fmt.Errorf("TypeError: only string dict keys are supported, got %s", typeName(k))
				}
				v, err := vals[i](e, f)
				if err != nil {
					return nil, err
				}
				d.Set(ks, v)
			}
			return d, nil
		}
	}
	err := fmt.Errorf("internal: unknown expression %T", x)
	return func(e *evaluator, _ *frame) (Value, error) {
		if err := e.tick(); err != nil {
			return nil, err
		}
		return nil, err
	}
}

func (c *compiler) sequence(items []expr, tuple bool) evalFn {
	xs := c.exprs(items)
	return func(e *evaluator, f *frame) (Value, error) {
		if err := e.tick(); err != nil {
			return nil, err
		}
		l := &List{Items: make([]Value, len(xs)), Tuple: tuple}
		for i, x := range xs {
			v, err := x(e, f)
			if err != nil {
				return nil, err
			}
			l.Items[i] = v
		}
		return l, nil
	}
}

// operand is a compiled expression that also keeps, as data, the shapes
// the hottest sites (output "+" chains, comparisons, conditions) evaluate
// in line rather than through its closure: a str literal, and name.attr or
// name['attr'] (message.role, loop.last, ns.x, message['content']).
type operand struct {
	fn evalFn
	// simple: evaluating it calls nothing, so it can only fail with an
	// error that ends the render (see writeChain).
	simple bool
	str    string // the literal, when isStr
	isStr  bool
	nc     *nameCode // name.attr: the name
	ac     *attrCode // name.attr: the attribute; nil for other shapes
}

func (c *compiler) operand(x expr) operand {
	o := operand{fn: c.expr(x), simple: isSimple(x)}
	switch x := x.(type) {
	case *literal:
		o.str, o.isStr = x.v.(string)
	default:
		o.nc, o.ac, _ = c.nameKey(x)
	}
	return o
}

func (c *compiler) operands(xs []expr) []operand {
	out := make([]operand, len(xs))
	for i, x := range xs {
		out[i] = c.operand(x)
	}
	return out
}

func isSimple(x expr) bool {
	switch x := x.(type) {
	case *literal, *nameExpr:
		return true
	case *attrExpr:
		return isSimple(x.obj)
	case *itemExpr:
		return isSimple(x.obj) && isSimple(x.idx)
	}
	return false
}

// nameCode is a compiled variable reference.
type nameCode struct {
	n         string
	refs      []slotRef
	local     int // the slot when the innermost scope binds the name, else -1
	global    int // the evaluator.globals cache entry when no scope does, else -1
	builtin   Value
	isBuiltin bool
	undef     Value // prebuilt: templates probe optional variables on every render
}

func (c *compiler) nameCode(x *nameExpr) *nameCode {
	nc := &nameCode{n: x.n, refs: c.sc.resolve(x.n), local: -1, global: -1, undef: x.undef}
	if len(nc.refs) > 0 && nc.refs[0].hops == 0 {
		nc.local = nc.refs[0].slot
	}
	if len(nc.refs) == 0 {
		i, ok := c.globals[x.n]
		if !ok {
			i = len(c.globals)
			c.globals[x.n] = i
		}
		nc.global = i
	}
	nc.builtin, nc.isBuiltin = globals[x.n]
	return nc
}

func (e *evaluator) get(f *frame, nc *nameCode) Value {
	// A loop variable or a set in this scope: no walk.
	if i := nc.local; i >= 0 && f.slots[i].set {
		return f.slots[i].v
	}
	return e.getOuter(f, nc)
}

func (e *evaluator) getOuter(f *frame, nc *nameCode) Value {
	if nc.global >= 0 {
		g := &e.globals[nc.global]
		if !g.set {
			*g = slot{e.getGlobal(nc), true}
		}
		return g.v
	}
	if v, ok := e.lookup(f, nc.refs, nc.n); ok {
		return v
	}
	return nc.fallback()
}

// getGlobal looks up a name no scope binds.
func (e *evaluator) getGlobal(nc *nameCode) Value {
	if v, ok := e.lookupVars(nc.n); ok {
		return v
	}
	return nc.fallback()
}

// fallback is what a name no scope or variable holds evaluates to.
func (nc *nameCode) fallback() Value {
	if nc.isBuiltin {
		return nc.builtin
	}
	return nc.undef
}

func (c *compiler) name(x *nameExpr) evalFn {
	nc := c.nameCode(x)
	return func(e *evaluator, f *frame) (Value, error) {
		if err := e.tick(); err != nil {
			return nil, err
		}
		return e.get(f, nc), nil
	}
}

// attrCode is a compiled obj.name or obj['name'], less obj.
type attrCode struct {
	name string
	// item: obj['name'], getItem's lookup (items first) rather than
	// getAttr's.
	item bool
	// steps: what evaluating name.attr (2) or name['attr'] (3) counts.
	steps int
	// method: name is a dict method, which a dict's attribute lookup finds
	// before its items.
	method bool
	loop   int // loop's attribute, by number
	// undefDict is the Undefined a dict without the key gives, built
	// once: templates probe optional message keys (tool_calls,
	// reasoning_content) on every message.
	undefDict Value
}

func newAttrCode(x *attrExpr) *attrCode {
	return &attrCode{name: x.name, steps: 2, method: dictMethod(&Dict{}, x.name) != nil, loop: loopFieldOf(x.name), undefDict: x.undefDict}
}

func newItemCode(key string) *attrCode {
	return &attrCode{name: key, item: true, steps: 3, method: dictMethod(&Dict{}, key) != nil,
		undefDict: Undefined{format: "'dict object' has no attribute %s", args: []any{repr(key)}}}
}

// nameKey recognizes name.attr and name['attr'].
func (c *compiler) nameKey(x expr) (*nameCode, *attrCode, bool) {
	switch x := x.(type) {
	case *attrExpr:
		if nx, ok := x.obj.(*nameExpr); ok {
			return c.nameCode(nx), newAttrCode(x), true
		}
	case *itemExpr:
		nx, ok := x.obj.(*nameExpr)
		key, isStr := strLiteral(x.idx)
		if ok && isStr {
			return c.nameCode(nx), newItemCode(key), true
		}
	}
	return nil, nil, false
}

// of is getAttr, or getItem, with the name's lookups done at compile time.
func (ac *attrCode) of(o Value) (Value, error) {
	if ac.item {
		if d, ok := o.(*Dict); ok {
			if v, ok := d.Get(ac.name); ok {
				return v, nil
			}
			if ac.method {
				return dictMethod(d, ac.name), nil
			}
			return ac.undefDict, nil
		}
		return getItem(o, ac.name)
	}
	switch o := o.(type) {
	case *Dict:
		if ac.method {
			return dictMethod(o, ac.name), nil
		}
		if v, ok := o.Get(ac.name); ok {
			return v, nil
		}
		return ac.undefDict, nil
	case *loopInfo:
		return o.field(ac.loop, ac.name), nil
	case *Namespace:
		if v, ok := o.d.Get(ac.name); ok {
			return v, nil
		}
	}
	return getAttr(o, ac.name)
}

func (c *compiler) attr(x *attrExpr) evalFn {
	ac := newAttrCode(x)
	if nx, ok := x.obj.(*nameExpr); ok {
		// message.content, loop.first, ns.x: the name's step and lookup
		// fused into the attribute's.
		nc := c.nameCode(nx)
		return func(e *evaluator, f *frame) (Value, error) {
			if err := e.ticks(2); err != nil {
				return nil, err
			}
			return ac.of(e.get(f, nc))
		}
	}
	obj := c.expr(x.obj)
	return func(e *evaluator, f *frame) (Value, error) {
		o, err := tickThen(e, f, obj)
		if err != nil {
			return nil, err
		}
		return ac.of(o)
	}
}

const (
	loopOther = iota
	loopIndex0
	loopIndex
	loopFirst
	loopLast
	loopLength
)

// loopFieldOf numbers the loop attributes templates use on every
// iteration.
func loopFieldOf(name string) int {
	switch name {
	case "index0":
		return loopIndex0
	case "index":
		return loopIndex
	case "first":
		return loopFirst
	case "last":
		return loopLast
	case "length":
		return loopLength
	}
	return loopOther
}

func (l *loopInfo) field(code int, name string) Value {
	switch code {
	case loopIndex0:
		return int64(l.index0)
	case loopIndex:
		return int64(l.index0 + 1)
	case loopFirst:
		return l.index0 == 0
	case loopLast:
		return l.index0 == l.length-1
	case loopLength:
		return int64(l.length)
	}
	return l.attr(name)
}

func (c *compiler) call(x *callExpr) evalFn {
	fn := c.expr(x.fn)
	args, kwKeys, kwVals := c.exprs(x.args), x.kwKeys, c.exprs(x.kwVals)
	return func(e *evaluator, f *frame) (Value, error) {
		fv, err := tickThen(e, f, fn)
		if err != nil {
			return nil, err
		}
		a, kw, err := e.evalArgs(args, kwKeys, kwVals, f)
		if err != nil {
			return nil, err
		}
		return e.call(fv, a, kw)
	}
}

func (c *compiler) bin(x *binExpr) evalFn {
	if lb, ok := x.l.(*binExpr); ok && x.op == "+" && lb.op == "+" {
		ops := c.operands(x.chain)
		return func(e *evaluator, f *frame) (Value, error) {
			if err := e.tick(); err != nil {
				return nil, err
			}
			return e.evalPlusChain(ops, f)
		}
	}
	op := x.op
	switch op {
	case "and", "or":
		l, r, and := c.expr(x.l), c.expr(x.r), op == "and"
		return func(e *evaluator, f *frame) (Value, error) {
			lv, err := tickThen(e, f, l)
			if err != nil {
				return nil, err
			}
			if truthy(lv) != and {
				return lv, nil
			}
			return r(e, f)
		}
	}
	l, r := c.expr(x.l), c.expr(x.r)
	intOp := byte(0)
	switch op {
	case "+", "-", "*":
		intOp = op[0]
	}
	return func(e *evaluator, f *frame) (Value, error) {
		lv, rv, err := tickBoth(e, f, l, r)
		if err != nil {
			return nil, err
		}
		if intOp != 0 {
			// Index arithmetic (messages|length - 1 - loop.index0),
			// which binop does after checking every other operand type.
			if a, ok := lv.(int64); ok {
				if b, ok := rv.(int64); ok {
					if v, done, err := int64Binop(op, a, b); done {
						return v, err
					}
				}
			}
		}
		v, err := binop(op, lv, rv)
		if err != nil {
			return nil, err
		}
		return v, e.spendOn(v)
	}
}

func (c *compiler) unary(x *unaryExpr) evalFn {
	if l, ok := x.x.(*literal); ok && x.op == "-" {
		// -1 in messages[::-1]: negated once, not boxed anew per render.
		var v Value
		switch n := l.v.(type) {
		case int64, *big.Int:
			small, z, _ := intOf(n)
			v, _ = intNeg(small, z) // within the digit limit, as n is
		case float64:
			v = -n
		}
		if v != nil {
			return func(e *evaluator, _ *frame) (Value, error) {
				if err := e.ticks(2); err != nil {
					return nil, err
				}
				return v, nil
			}
		}
	}
	in := c.expr(x.x)
	var apply func(v Value) (Value, error)
	switch x.op {
	case "not":
		apply = func(v Value) (Value, error) { return !truthy(v), nil }
	case "-":
		apply = func(v Value) (Value, error) {
			switch n := v.(type) {
			case int64, bool, *big.Int:
				small, z, _ := intOf(n)
				return intNeg(small, z)
			case float64:
				return -n, nil
			}
			if u, ok := v.(Undefined); ok {
				return nil, u.err()
			}
			return nil, fmt.Errorf("TypeError: bad operand type for unary -: '%s'", typeName(v))
		}
	case "+":
		apply = func(v Value) (Value, error) {
			switch n := v.(type) {
			case int64, float64, *big.Int:
				return v, nil
			case bool:
				return boolInt(n), nil
			}
			if u, ok := v.(Undefined); ok {
				return nil, u.err()
			}
			return nil, fmt.Errorf("TypeError: bad operand type for unary +: '%s'", typeName(v))
		}
	default:
		err := fmt.Errorf("internal: unknown expression %T", x)
		apply = func(Value) (Value, error) { return nil, err }
	}
	return func(e *evaluator, f *frame) (Value, error) {
		v, err := tickThen(e, f, in)
		if err != nil {
			return nil, err
		}
		return apply(v)
	}
}

// condFn is an expression compiled for a boolean context (if, elif, and,
// or, not): it gives truthy(value), which a comparison or test computes
// without boxing a bool and and/or need not keep their operand.
type condFn func(e *evaluator, f *frame) (bool, error)

func (c *compiler) cond(x expr) condFn {
	switch x := x.(type) {
	case *binExpr:
		if x.op == "and" || x.op == "or" {
			// truthy(a and b) is truthy(a) && truthy(b), with b evaluated
			// only when a is truthy; or alike.
			l, r, and := c.cond(x.l), c.cond(x.r), x.op == "and"
			return func(e *evaluator, f *frame) (bool, error) {
				if err := e.tick(); err != nil {
					return false, err
				}
				lb, err := l(e, f)
				if err != nil || lb != and {
					return lb, err
				}
				return r(e, f)
			}
		}
	case *unaryExpr:
		if x.op == "not" {
			in := c.cond(x.x)
			return func(e *evaluator, f *frame) (bool, error) {
				if err := e.tick(); err != nil {
					return false, err
				}
				b, err := in(e, f)
				return !b, err
			}
		}
	case *compareExpr:
		return c.compare(x)
	case *testExpr:
		return c.test(x)
	}
	o := c.operand(x)
	if o.ac != nil {
		// if message.tool_calls
		nc, ac := o.nc, o.ac
		return func(e *evaluator, f *frame) (bool, error) {
			if err := e.ticks(ac.steps); err != nil {
				return false, err
			}
			v, err := ac.of(e.get(f, nc))
			if err != nil {
				return false, err
			}
			return truthy(v), nil
		}
	}
	return func(e *evaluator, f *frame) (bool, error) {
		val, err := o.fn(e, f)
		if err != nil {
			return false, err
		}
		return truthy(val), nil
	}
}

// boxed is a boolean expression in a value context.
func boxed(cf condFn) evalFn {
	return func(e *evaluator, f *frame) (Value, error) {
		b, err := cf(e, f)
		if err != nil {
			return nil, err
		}
		return b, nil
	}
}

func (c *compiler) test(x *testExpr) condFn {
	in, args, name, negate := c.operand(x.e), c.exprs(x.args), x.name, x.negate
	if len(args) == 0 {
		// The tests chat templates use on optional fields, without
		// runTest's dispatch on the name.
		var is func(Value) bool
		switch name {
		case "defined":
			is = func(v Value) bool { _, u := v.(Undefined); return !u }
		case "none":
			is = func(v Value) bool { return v == nil }
		case "string":
			is = func(v Value) bool { _, ok := v.(string); return ok }
		}
		if is != nil {
			return func(e *evaluator, f *frame) (bool, error) {
				if err := e.tick(); err != nil {
					return false, err
				}
				v, err := in.fn(e, f)
				if err != nil {
					return false, err
				}
				return is(v) != negate, nil
			}
		}
	}
	return func(e *evaluator, f *frame) (bool, error) {
		if err := e.tick(); err != nil {
			return false, err
		}
		v, err := in.fn(e, f)
		if err != nil {
			return false, err
		}
		targs := make([]Value, len(args))
		for i, a := range args {
			if targs[i], err = a(e, f); err != nil {
				return false, err
			}
		}
		r, err := e.runTest(name, v, targs)
		if err != nil {
			return false, err
		}
		return r != negate, nil
	}
}

func (c *compiler) compare(x *compareExpr) condFn {
	if len(x.ops) == 1 {
		return c.compare1(x.ops[0], x.first, x.rest[0])
	}
	first, rest, ops := c.expr(x.first), c.exprs(x.rest), x.ops
	return func(e *evaluator, f *frame) (bool, error) {
		if err := e.tick(); err != nil {
			return false, err
		}
		l, err := first(e, f)
		if err != nil {
			return false, err
		}
		for i, op := range ops {
			r, err := rest[i](e, f)
			if err != nil {
				return false, err
			}
			ok, err := e.compare(op, l, r)
			if err != nil {
				return false, err
			}
			if !ok {
				return false, nil
			}
			l = r
		}
		return true, nil
	}
}

// compare1 compiles a single comparison, the only kind chat templates
// write, with fast paths for a string literal operand (message.role ==
// "user", '</think>' in message.content) and for two ints.
func (c *compiler) compare1(op string, lx, rx expr) condFn {
	if s, ok := strLiteral(rx); ok && (op == "==" || op == "!=") {
		l, eq := c.operand(lx), op == "=="
		if l.ac != nil {
			nc, ac := l.nc, l.ac
			return func(e *evaluator, f *frame) (bool, error) {
				if err := e.ticks(1 + ac.steps); err != nil {
					return false, err
				}
				lv, err := ac.of(e.get(f, nc))
				if err != nil {
					return false, err
				}
				if err := e.tick(); err != nil {
					return false, err
				}
				ls, ok := lv.(string)
				return (ok && ls == s) == eq, nil
			}
		}
		return func(e *evaluator, f *frame) (bool, error) {
			if err := e.tick(); err != nil {
				return false, err
			}
			lv, err := l.fn(e, f)
			if err != nil {
				return false, err
			}
			if err := e.tick(); err != nil {
				return false, err
			}
			// equal with a str: only an equal str equals it.
			ls, ok := lv.(string)
			return (ok && ls == s) == eq, nil
		}
	}
	if s, ok := strLiteral(lx); ok && (op == "in" || op == "not in") {
		r, in := c.operand(rx), op == "in"
		return func(e *evaluator, f *frame) (bool, error) {
			var rv Value
			var err error
			if r.ac != nil {
				if err := e.ticks(2 + r.ac.steps); err != nil {
					return false, err
				}
				rv, err = r.ac.of(e.get(f, r.nc))
			} else {
				if err := e.ticks(2); err != nil {
					return false, err
				}
				rv, err = r.fn(e, f)
			}
			if err != nil {
				return false, err
			}
			if h, ok := rv.(string); ok {
				if len(h) >= workBytes {
					if err := e.spendOn(h); err != nil {
						return false, err
					}
				}
				return strings.Contains(h, s) == in, nil
			}
			ok, err := e.contains(rv, s)
			if err != nil {
				return false, err
			}
			return ok == in, nil
		}
	}
	l, r := c.operand(lx), c.operand(rx)
	var ints func(a, b int64) bool
	switch op {
	case "<":
		ints = func(a, b int64) bool { return a < b }
	case "<=":
		ints = func(a, b int64) bool { return a <= b }
	case ">":
		ints = func(a, b int64) bool { return a > b }
	case ">=":
		ints = func(a, b int64) bool { return a >= b }
	case "==":
		ints = func(a, b int64) bool { return a == b }
	case "!=":
		ints = func(a, b int64) bool { return a != b }
	}
	return func(e *evaluator, f *frame) (bool, error) {
		if err := e.tick(); err != nil {
			return false, err
		}
		lv, err := l.fn(e, f)
		if err != nil {
			return false, err
		}
		rv, err := r.fn(e, f)
		if err != nil {
			return false, err
		}
		if ints != nil {
			if a, ok := lv.(int64); ok {
				if b, ok := rv.(int64); ok {
					return ints(a, b), nil
				}
			}
		}
		return e.compare(op, lv, rv)
	}
}

func strLiteral(x expr) (string, bool) {
	if l, ok := x.(*literal); ok {
		s, ok := l.v.(string)
		return s, ok
	}
	return "", false
}
