package chat

import (
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"
)

type stmt any
type expr any

type (
	textNode   struct{ s string }
	outputNode struct{ e expr }
	ifNode     struct {
		conds  []expr
		bodies [][]stmt
		els    []stmt
	}
	forNode struct {
		targets   []string
		iter      expr
		cond      expr
		body, els []stmt
	}
	setNode struct {
		names []string // one name, or several for tuple unpacking
		ns    string   // set ns.attr = ...: ns holds "ns", names[0] the attr
		e     expr
		body  []stmt // block set
	}
	macroNode struct {
		name     string
		params   []string
		defaults []expr // aligned with params; nil = required
		body     []stmt
	}
	callBlockNode struct {
		call *callExpr
		body []stmt
	}
	filterBlockNode struct {
		f    *filterExpr // with e == nil: applied to the body
		body []stmt
	}
	breakNode    struct{}
	continueNode struct{}
)

type (
	literal  struct{ v Value }
	nameExpr struct {
		n string
		// undef is the Undefined a missing name evaluates to, built once:
		// templates probe optional variables on every render.
		undef Value
	}
	attrExpr struct {
		obj  expr
		name string
		// undefDict is the Undefined a dict without the key gives, built
		// once: templates probe optional message keys (tool_calls,
		// reasoning_content) on every message.
		undefDict Value
	}
	itemExpr  struct{ obj, idx expr }
	sliceExpr struct {
		obj, start, stop, step expr
	}
	callExpr struct {
		fn     expr
		args   []expr
		kwKeys []string
		kwVals []expr
	}
	filterExpr struct {
		e      expr // nil inside a filter block
		name   string
		args   []expr
		kwKeys []string
		kwVals []expr
	}
	testExpr struct {
		e      expr
		name   string
		args   []expr
		negate bool
	}
	binExpr struct {
		op   string
		l, r expr
		// chain lists the operands of a left-nested a + b + c ... ending
		// here, flattened at parse time so that evaluating it allocates
		// nothing (see plusParts); nil for other operators.
		chain []expr
	}
	unaryExpr struct {
		op string
		x  expr
	}
	compareExpr struct {
		first expr
		ops   []string
		rest  []expr
	}
	condExpr  struct{ cond, a, b expr }
	listExpr  struct{ items []expr }
	tupleExpr struct{ items []expr }
	dictExpr  struct{ keys, vals []expr }
)

type parser struct {
	toks []token
	pos  int
}

func (p *parser) peek() token { return p.toks[p.pos] }
func (p *parser) next() token {
	t := p.toks[p.pos]
	if t.kind != tEOF {
		p.pos++
	}
	return t
}

func (p *parser) errf(format string, args ...any) error {
	return fmt.Errorf("TemplateSyntaxError: line %d: %s", p.peek().line, fmt.Sprintf(format, args...))
}

func (p *parser) isOp(v string) bool {
	t := p.peek()
	return t.kind == tOp && t.val == v
}

func (p *parser) isName(v string) bool {
	t := p.peek()
	return t.kind == tName && t.val == v
}

func (p *parser) expectOp(v string) error {
	if !p.isOp(v) {
		return p.errf("expected %q, got %q", v, p.peek().val)
	}
	p.next()
	return nil
}

func (p *parser) expectName() (string, error) {
	t := p.peek()
	if t.kind != tName {
		return "", p.errf("expected a name, got %q", t.val)
	}
	p.next()
	return t.val, nil
}

func (p *parser) expectBlockEnd() error {
	if p.peek().kind != tBlockEnd {
		return p.errf("expected end of block tag, got %q", p.peek().val)
	}
	p.next()
	return nil
}

func parse(toks []token) ([]stmt, error) {
	p := &parser{toks: toks}
	body, end, err := p.parseBody(nil)
	if err != nil {
		return nil, err
	}
	if end != "" {
		return nil, p.errf("unexpected {%% %s %%}", end)
	}
	return body, nil
}

// parseBody parses statements until a block tag named in ends (consumed up
// to the tag name) or EOF; it returns the tag name found.
func (p *parser) parseBody(ends []string) ([]stmt, string, error) {
	var body []stmt
	for {
		t := p.peek()
		switch t.kind {
		case tEOF:
			if len(ends) > 0 {
				return nil, "", p.errf("unexpected end of template, expected one of %v", ends)
			}
			return body, "", nil
		case tText:
			p.next()
			body = append(body, &textNode{t.val})
		case tVarBegin:
			p.next()
			e, err := p.parseExpr()
			if err != nil {
				return nil, "", err
			}
			if p.peek().kind != tVarEnd {
				return nil, "", p.errf("expected }}, got %q", p.peek().val)
			}
			p.next()
			body = append(body, &outputNode{e})
		case tBlockBegin:
			p.next()
			kw := p.peek()
			if kw.kind != tName {
				return nil, "", p.errf("expected a statement name")
			}
			if slices.Contains(ends, kw.val) {
				p.next()
				return body, kw.val, nil
			}
			s, err := p.parseStmt()
			if err != nil {
				return nil, "", err
			}
			if s != nil {
				body = append(body, s)
			}
		default:
			return nil, "", p.errf("unexpected %q", t.val)
		}
	}
}

func (p *parser) parseStmt() (stmt, error) {
	kw := p.next().val
	switch kw {
	case "if":
		return p.parseIf()
	case "for":
		return p.parseFor()
	case "set":
		return p.parseSet()
	case "macro":
		return p.parseMacro()
	case "call":
		return p.parseCallBlock()
	case "filter":
		return p.parseFilterBlock()
	case "break", "continue":
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		if kw == "break" {
			return &breakNode{}, nil
		}
		return &continueNode{}, nil
	case "generation":
		// transformers' AssistantTracker: the tag just renders its body.
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		body, _, err := p.parseBody([]string{"endgeneration"})
		if err != nil {
			return nil, err
		}
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		return &ifNode{conds: []expr{&literal{true}}, bodies: [][]stmt{body}}, nil
	}
	return nil, p.errf("unknown statement %q", kw)
}

func (p *parser) parseIf() (stmt, error) {
	n := &ifNode{}
	for {
		c, err := p.parseExpr()
		if err != nil {
			return nil, err
		}
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		body, end, err := p.parseBody([]string{"elif", "else", "endif"})
		if err != nil {
			return nil, err
		}
		n.conds = append(n.conds, c)
		n.bodies = append(n.bodies, body)
		switch end {
		case "elif":
			continue
		case "else":
			if err := p.expectBlockEnd(); err != nil {
				return nil, err
			}
			if n.els, _, err = p.parseBody([]string{"endif"}); err != nil {
				return nil, err
			}
		}
		return n, p.expectBlockEnd()
	}
}

func (p *parser) parseTargets() ([]string, error) {
	var names []string
	paren := p.isOp("(")
	if paren {
		p.next()
	}
	for {
		n, err := p.expectName()
		if err != nil {
			return nil, err
		}
		names = append(names, n)
		if !p.isOp(",") {
			break
		}
		p.next()
	}
	if paren {
		if err := p.expectOp(")"); err != nil {
			return nil, err
		}
	}
	return names, nil
}

func (p *parser) parseFor() (stmt, error) {
	n := &forNode{}
	var err error
	if n.targets, err = p.parseTargets(); err != nil {
		return nil, err
	}
	if !p.isName("in") {
		return nil, p.errf("expected 'in' in for loop")
	}
	p.next()
	// The iterable cannot contain a bare conditional: "if" starts the filter.
	if n.iter, err = p.parseOr(); err != nil {
		return nil, err
	}
	if p.isName("if") {
		p.next()
		if n.cond, err = p.parseOr(); err != nil {
			return nil, err
		}
	}
	if p.isName("recursive") {
		return nil, p.errf("recursive loops are not supported")
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	body, end, err := p.parseBody([]string{"else", "endfor"})
	if err != nil {
		return nil, err
	}
	n.body = body
	if end == "else" {
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		if n.els, _, err = p.parseBody([]string{"endfor"}); err != nil {
			return nil, err
		}
	}
	return n, p.expectBlockEnd()
}

func (p *parser) parseSet() (stmt, error) {
	n := &setNode{}
	first, err := p.expectName()
	if err != nil {
		return nil, err
	}
	switch {
	case p.isOp("."):
		p.next()
		attr, err := p.expectName()
		if err != nil {
			return nil, err
		}
		n.ns, n.names = first, []string{attr}
	case p.isOp(","):
		n.names = []string{first}
		for p.isOp(",") {
			p.next()
			nm, err := p.expectName()
			if err != nil {
				return nil, err
			}
			n.names = append(n.names, nm)
		}
	default:
		n.names = []string{first}
	}
	if p.peek().kind == tBlockEnd && n.ns == "" && len(n.names) == 1 {
		p.next()
		if n.body, _, err = p.parseBody([]string{"endset"}); err != nil {
			return nil, err
		}
		return n, p.expectBlockEnd()
	}
	if err := p.expectOp("="); err != nil {
		return nil, err
	}
	if n.e, err = p.parseTupleOrExpr(); err != nil {
		return nil, err
	}
	return n, p.expectBlockEnd()
}

func (p *parser) parseMacro() (stmt, error) {
	n := &macroNode{}
	var err error
	if n.name, err = p.expectName(); err != nil {
		return nil, err
	}
	if err := p.expectOp("("); err != nil {
		return nil, err
	}
	for !p.isOp(")") {
		name, err := p.expectName()
		if err != nil {
			return nil, err
		}
		var def expr
		if p.isOp("=") {
			p.next()
			if def, err = p.parseExpr(); err != nil {
				return nil, err
			}
		}
		n.params = append(n.params, name)
		n.defaults = append(n.defaults, def)
		if !p.isOp(",") {
			break
		}
		p.next()
	}
	if err := p.expectOp(")"); err != nil {
		return nil, err
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	if n.body, _, err = p.parseBody([]string{"endmacro"}); err != nil {
		return nil, err
	}
	return n, p.expectBlockEnd()
}

func (p *parser) parseCallBlock() (stmt, error) {
	e, err := p.parseExpr()
	if err != nil {
		return nil, err
	}
	c, ok := e.(*callExpr)
	if !ok {
		return nil, p.errf("call block needs a call expression")
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	body, _, err := p.parseBody([]string{"endcall"})
	if err != nil {
		return nil, err
	}
	return &callBlockNode{call: c, body: body}, p.expectBlockEnd()
}

func (p *parser) parseFilterBlock() (stmt, error) {
	f, err := p.parseFilterCall(nil)
	if err != nil {
		return nil, err
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	body, _, err := p.parseBody([]string{"endfilter"})
	if err != nil {
		return nil, err
	}
	return &filterBlockNode{f: f, body: body}, p.expectBlockEnd()
}

// parseTupleOrExpr parses "a, b" as a tuple (set statements allow it).
func (p *parser) parseTupleOrExpr() (expr, error) {
	e, err := p.parseExpr()
	if err != nil {
		return nil, err
	}
	if !p.isOp(",") {
		return e, nil
	}
	items := []expr{e}
	for p.isOp(",") {
		p.next()
		if p.peek().kind == tBlockEnd {
			break
		}
		e, err := p.parseExpr()
		if err != nil {
			return nil, err
		}
		items = append(items, e)
	}
	return &tupleExpr{items}, nil
}

func (p *parser) parseExpr() (expr, error) {
	e, err := p.parseOr()
	if err != nil {
		return nil, err
	}
	for p.isName("if") {
		p.next()
		c, err := p.parseOr()
		if err != nil {
			return nil, err
		}
		var b expr
		if p.isName("else") {
			p.next()
			if b, err = p.parseExpr(); err != nil {
				return nil, err
			}
		}
		e = &condExpr{cond: c, a: e, b: b}
	}
	return e, nil
}

func (p *parser) parseOr() (expr, error) {
	l, err := p.parseAnd()
	if err != nil {
		return nil, err
	}
	for p.isName("or") {
		p.next()
		r, err := p.parseAnd()
		if err != nil {
			return nil, err
		}
		l = &binExpr{op: "or", l: l, r: r}
	}
	return l, nil
}

func (p *parser) parseAnd() (expr, error) {
	l, err := p.parseNot()
	if err != nil {
		return nil, err
	}
	for p.isName("and") {
		p.next()
		r, err := p.parseNot()
		if err != nil {
			return nil, err
		}
		l = &binExpr{op: "and", l: l, r: r}
	}
	return l, nil
}

func (p *parser) parseNot() (expr, error) {
	if p.isName("not") {
		p.next()
		x, err := p.parseNot()
		if err != nil {
			return nil, err
		}
		return &unaryExpr{"not", x}, nil
	}
	return p.parseCompare()
}

func (p *parser) parseCompare() (expr, error) {
	first, err := p.parseMath1()
	if err != nil {
		return nil, err
	}
	c := &compareExpr{first: first}
	for {
		t := p.peek()
		var op string
		switch {
		case t.kind == tOp && (t.val == "==" || t.val == "!=" || t.val == "<" || t.val == "<=" || t.val == ">" || t.val == ">="):
			op = t.val
			p.next()
		case t.kind == tName && t.val == "in":
			op = "in"
			p.next()
		case t.kind == tName && t.val == "not" && p.toks[p.pos+1].kind == tName && p.toks[p.pos+1].val == "in":
			op = "not in"
			p.next()
			p.next()
		default:
			if len(c.ops) == 0 {
				return first, nil
			}
			return c, nil
		}
		r, err := p.parseMath1()
		if err != nil {
			return nil, err
		}
		c.ops = append(c.ops, op)
		c.rest = append(c.rest, r)
	}
}

func (p *parser) parseMath1() (expr, error) {
	l, err := p.parseConcat()
	if err != nil {
		return nil, err
	}
	for p.isOp("+") || p.isOp("-") {
		op := p.next().val
		r, err := p.parseConcat()
		if err != nil {
			return nil, err
		}
		b := &binExpr{op: op, l: l, r: r}
		if op == "+" {
			if lb, ok := l.(*binExpr); ok && lb.op == "+" {
				// lb is only ever evaluated as part of this chain, so
				// its chain's array may be extended in place.
				b.chain = append(lb.chain, r)
			} else {
				b.chain = []expr{l, r}
			}
		}
		l = b
	}
	return l, nil
}

func (p *parser) parseConcat() (expr, error) {
	l, err := p.parseMath2()
	if err != nil {
		return nil, err
	}
	for p.isOp("~") {
		p.next()
		r, err := p.parseMath2()
		if err != nil {
			return nil, err
		}
		l = &binExpr{op: "~", l: l, r: r}
	}
	return l, nil
}

func (p *parser) parseMath2() (expr, error) {
	l, err := p.parsePow()
	if err != nil {
		return nil, err
	}
	for p.isOp("*") || p.isOp("/") || p.isOp("//") || p.isOp("%") {
		op := p.next().val
		r, err := p.parsePow()
		if err != nil {
			return nil, err
		}
		l = &binExpr{op: op, l: l, r: r}
	}
	return l, nil
}

func (p *parser) parsePow() (expr, error) {
	l, err := p.parseUnary(true)
	if err != nil {
		return nil, err
	}
	for p.isOp("**") {
		p.next()
		r, err := p.parseUnary(true)
		if err != nil {
			return nil, err
		}
		l = &binExpr{op: "**", l: l, r: r}
	}
	return l, nil
}

func (p *parser) parseUnary(withFilter bool) (expr, error) {
	var e expr
	var err error
	if p.isOp("-") || p.isOp("+") {
		op := p.next().val
		x, err := p.parseUnary(false)
		if err != nil {
			return nil, err
		}
		e = &unaryExpr{op, x}
	} else {
		if e, err = p.parsePrimary(); err != nil {
			return nil, err
		}
	}
	if e, err = p.parsePostfix(e); err != nil {
		return nil, err
	}
	if withFilter {
		return p.parseFilterExpr(e)
	}
	return e, nil
}

func (p *parser) parsePrimary() (expr, error) {
	t := p.next()
	switch t.kind {
	case tName:
		switch t.val {
		case "true", "True":
			return &literal{true}, nil
		case "false", "False":
			return &literal{false}, nil
		case "none", "None":
			return &literal{nil}, nil
		}
		return &nameExpr{n: t.val, undef: Undefined{format: "'%s' is undefined", args: []any{t.val}}}, nil
	case tString:
		s := t.val
		// Adjacent string literals concatenate, as in Python.
		for p.peek().kind == tString {
			s += p.next().val
		}
		return &literal{s}, nil
	case tInt:
		v, err := intLiteral(t.val)
		if err != nil {
			return nil, p.errf("%v", err)
		}
		return &literal{v}, nil
	case tFloat:
		v, err := strconv.ParseFloat(t.val, 64)
		if err != nil {
			return nil, p.errf("bad number %q", t.val)
		}
		return &literal{v}, nil
	case tOp:
		switch t.val {
		case "(":
			if p.isOp(")") {
				p.next()
				return &tupleExpr{}, nil
			}
			e, err := p.parseExpr()
			if err != nil {
				return nil, err
			}
			if p.isOp(",") {
				items := []expr{e}
				for p.isOp(",") {
					p.next()
					if p.isOp(")") {
						break
					}
					e, err := p.parseExpr()
					if err != nil {
						return nil, err
					}
					items = append(items, e)
				}
				e = &tupleExpr{items}
			}
			return e, p.expectOp(")")
		case "[":
			l := &listExpr{}
			for !p.isOp("]") {
				e, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				l.items = append(l.items, e)
				if !p.isOp(",") {
					break
				}
				p.next()
			}
			return l, p.expectOp("]")
		case "{":
			d := &dictExpr{}
			for !p.isOp("}") {
				k, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				if err := p.expectOp(":"); err != nil {
					return nil, err
				}
				v, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				d.keys = append(d.keys, k)
				d.vals = append(d.vals, v)
				if !p.isOp(",") {
					break
				}
				p.next()
			}
			return d, p.expectOp("}")
		}
	}
	p.pos--
	return nil, p.errf("unexpected %q", t.val)
}

func (p *parser) parsePostfix(e expr) (expr, error) {
	for {
		switch {
		case p.isOp("."):
			p.next()
			t := p.next()
			switch t.kind {
			case tName:
				e = &attrExpr{obj: e, name: t.val, undefDict: Undefined{format: "'dict object' has no attribute '%s'", args: []any{t.val}}}
			case tInt:
				v, err := intLiteral(t.val)
				if err != nil {
					return nil, p.errf("%v", err)
				}
				e = &itemExpr{e, &literal{v}}
			default:
				return nil, p.errf("expected an attribute name")
			}
		case p.isOp("["):
			p.next()
			var parts [3]expr
			n, isSlice := 0, false
			for {
				if !p.isOp(":") && !p.isOp("]") {
					x, err := p.parseExpr()
					if err != nil {
						return nil, err
					}
					parts[n] = x
				}
				if p.isOp(":") && n < 2 {
					p.next()
					n++
					isSlice = true
					continue
				}
				break
			}
			if err := p.expectOp("]"); err != nil {
				return nil, err
			}
			if isSlice {
				e = &sliceExpr{e, parts[0], parts[1], parts[2]}
			} else {
				if parts[0] == nil {
					return nil, p.errf("empty subscript")
				}
				e = &itemExpr{e, parts[0]}
			}
		case p.isOp("("):
			c := &callExpr{fn: e}
			if err := p.parseArgs(&c.args, &c.kwKeys, &c.kwVals); err != nil {
				return nil, err
			}
			e = c
		default:
			return e, nil
		}
	}
}

// parseArgs parses "(a, b, k=v)"; the "(" is next.
func (p *parser) parseArgs(args *[]expr, kwKeys *[]string, kwVals *[]expr) error {
	if err := p.expectOp("("); err != nil {
		return err
	}
	for !p.isOp(")") {
		if p.peek().kind == tName && p.toks[p.pos+1].kind == tOp && p.toks[p.pos+1].val == "=" {
			k := p.next().val
			p.next()
			v, err := p.parseExpr()
			if err != nil {
				return err
			}
			*kwKeys = append(*kwKeys, k)
			*kwVals = append(*kwVals, v)
		} else {
			v, err := p.parseExpr()
			if err != nil {
				return err
			}
			*args = append(*args, v)
		}
		if !p.isOp(",") {
			break
		}
		p.next()
	}
	return p.expectOp(")")
}

func (p *parser) parseFilterCall(e expr) (*filterExpr, error) {
	name, err := p.expectName()
	if err != nil {
		return nil, err
	}
	for p.isOp(".") { // dotted filter names
		p.next()
		n, err := p.expectName()
		if err != nil {
			return nil, err
		}
		name += "." + n
	}
	f := &filterExpr{e: e, name: name}
	if p.isOp("(") {
		if err := p.parseArgs(&f.args, &f.kwKeys, &f.kwVals); err != nil {
			return nil, err
		}
	}
	return f, nil
}

func (p *parser) parseFilterExpr(e expr) (expr, error) {
	for {
		switch {
		case p.isOp("|"):
			p.next()
			f, err := p.parseFilterCall(e)
			if err != nil {
				return nil, err
			}
			e = f
		case p.isName("is"):
			p.next()
			t := &testExpr{e: e}
			if p.isName("not") {
				p.next()
				t.negate = true
			}
			name, err := p.expectName()
			if err != nil {
				return nil, err
			}
			t.name = name
			switch {
			case p.isOp("("):
				var kk []string
				var kv []expr
				if err := p.parseArgs(&t.args, &kk, &kv); err != nil {
					return nil, err
				}
			case p.startsTestArg():
				// "is divisibleby 3", "is sameas none": one bare argument.
				a, err := p.parseUnary(false)
				if err != nil {
					return nil, err
				}
				t.args = []expr{a}
			}
			e = t
		default:
			return e, nil
		}
	}
}

// startsTestArg mirrors Jinja: a test takes a bare argument when the next
// token can start an expression and is not an operator keyword.
func (p *parser) startsTestArg() bool {
	t := p.peek()
	switch t.kind {
	case tString, tInt, tFloat:
		return true
	case tName:
		switch t.val {
		case "else", "or", "and", "is", "in", "not", "if":
			return false
		}
		return true
	case tOp:
		return t.val == "[" || t.val == "{"
	}
	return false
}

// intLiteral is the value of an integer token (underscores removed; a
// 0b/0o/0x prefix gives the base), exact however large, up to Python's
// 4300-digit limit for decimal text.
func intLiteral(lit string) (Value, error) {
	if v, err := strconv.ParseInt(lit, 0, 64); err == nil {
		return v, nil
	}
	decimal := !strings.HasPrefix(lit, "0") || len(lit) < 2 || strings.Trim(lit, "0") == ""
	if decimal && len(lit) > maxIntDigits {
		return nil, errIntTooLarge()
	}
	z, ok := new(big.Int).SetString(lit, 0)
	if !ok {
		return nil, fmt.Errorf("bad integer %q", lit)
	}
	return normInt(z)
}
