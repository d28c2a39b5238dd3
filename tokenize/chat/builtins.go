package chat

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
)

type timeLike interface {
	Format(string) string
}

func argErr(name string, want int, got int) error {
	return fmt.Errorf("TypeError: %s() takes %d argument(s) (%d given)", name, want, got)
}

func strArg(name string, v Value) (string, error) {
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("TypeError: %s() argument must be str, not %s", name, typeName(v))
	}
	return s, nil
}

// pyStrip is Python's str.strip family: whitespace by default, else the
// given character set.
func pyStrip(s string, args []Value, left, right bool) (string, error) {
	if len(args) > 1 {
		return "", argErr("strip", 1, len(args))
	}
	if len(args) == 0 || args[0] == nil {
		return pyStripSpace(s, left, right), nil
	}
	cut, err := strArg("strip", args[0])
	if err != nil {
		return "", err
	}
	if left {
		s = strings.TrimLeft(s, cut)
	}
	if right {
		s = strings.TrimRight(s, cut)
	}
	return s, nil
}

// method makes a builtin function that spends the work of what it builds.
func method(f func(args []Value, kw *Dict) (Value, error)) callable {
	return func(e *evaluator, args []Value, kw *Dict) (Value, error) {
		v, err := f(args, kw)
		if err != nil {
			return nil, err
		}
		return v, e.spendOn(v)
	}
}

// strMethod is a method of str s. Each scans s (or may), so a call
// spends s's work first and then that of what it builds.
func strMethod(s string, name string) Value {
	m := func(f func(e *evaluator, args []Value, kw *Dict) (Value, error)) callable {
		return func(e *evaluator, args []Value, kw *Dict) (Value, error) {
			if err := e.spendOn(s); err != nil {
				return nil, err
			}
			v, err := f(e, args, kw)
			if err != nil {
				return nil, err
			}
			return v, e.spendOn(v)
		}
	}
	switch name {
	case "strip", "lstrip", "rstrip":
		return m(func(_ *evaluator, args []Value, _ *Dict) (Value, error) {
			return pyStrip(s, args, name != "rstrip", name != "lstrip")
		})
	case "upper":
		return m(func(*evaluator, []Value, *Dict) (Value, error) { return strings.ToUpper(s), nil })
	case "lower":
		return m(func(*evaluator, []Value, *Dict) (Value, error) { return strings.ToLower(s), nil })
	case "title":
		return m(func(*evaluator, []Value, *Dict) (Value, error) { return pyTitle(s), nil })
	case "capitalize":
		return m(func(*evaluator, []Value, *Dict) (Value, error) { return pyCapitalize(s), nil })
	case "startswith", "endswith":
		return m(func(_ *evaluator, args []Value, _ *Dict) (Value, error) {
			if len(args) != 1 {
				return nil, argErr(name, 1, len(args))
			}
			var cands []Value
			if l, ok := args[0].(*List); ok {
				cands = l.Items
			} else {
				cands = []Value{args[0]}
			}
			for _, c := range cands {
				p, err := strArg(name, c)
				if err != nil {
					return nil, err
				}
				if (name == "startswith" && strings.HasPrefix(s, p)) || (name == "endswith" && strings.HasSuffix(s, p)) {
					return true, nil
				}
			}
			return false, nil
		})
	case "split", "rsplit":
		return m(func(_ *evaluator, args []Value, kw *Dict) (Value, error) {
			var sep Value
			maxsplit := int64(-1)
			if len(args) > 0 {
				sep = args[0]
			} else if v, ok := kw.Get("sep"); ok {
				sep = v
			}
			if len(args) > 1 {
				maxsplit, _ = asInt(args[1])
			} else if v, ok := kw.Get("maxsplit"); ok {
				maxsplit, _ = asInt(v)
			}
			var parts []string
			switch {
			case sep == nil && name == "split":
				parts = pySplitSpace(s, maxsplit)
			case sep == nil:
				parts = pyRSplitSpace(s, maxsplit)
			default:
				sp, err := strArg(name, sep)
				if err != nil {
					return nil, err
				}
				if sp == "" {
					return nil, errors.New("ValueError: empty separator")
				}
				switch {
				case maxsplit < 0:
					parts = strings.Split(s, sp)
				case name == "split":
					parts = strings.SplitN(s, sp, int(maxsplit)+1)
				default:
					parts = rsplitN(s, sp, int(maxsplit))
				}
			}
			out := &List{Items: make([]Value, len(parts))}
			for i, p := range parts {
				out.Items[i] = p
			}
			return out, nil
		})
	case "splitlines":
		return m(func(_ *evaluator, args []Value, kw *Dict) (Value, error) {
			lines := pySplitLines(s, truthy(kwOr(kw, args, 0, "keepends", false)))
			out := &List{Items: make([]Value, len(lines))}
			for i, l := range lines {
				out.Items[i] = l
			}
			return out, nil
		})
	case "replace":
		return m(func(_ *evaluator, args []Value, _ *Dict) (Value, error) {
			if len(args) < 2 || len(args) > 3 {
				return nil, argErr("replace", 2, len(args))
			}
			o, err := strArg("replace", args[0])
			if err != nil {
				return nil, err
			}
			n, err := strArg("replace", args[1])
			if err != nil {
				return nil, err
			}
			count := int64(-1)
			if len(args) == 3 {
				count, _ = asInt(args[2])
			}
			return replaceChecked(s, o, n, int(count))
		})
	case "find", "rfind", "index", "rindex", "count":
		return m(func(_ *evaluator, args []Value, _ *Dict) (Value, error) {
			if len(args) != 1 {
				return nil, argErr(name, 1, len(args))
			}
			sub, err := strArg(name, args[0])
			if err != nil {
				return nil, err
			}
			var i int
			switch name {
			case "count":
				return int64(strings.Count(s, sub)), nil
			case "find", "index":
				i = strings.Index(s, sub)
			default:
				i = strings.LastIndex(s, sub)
			}
			if i < 0 && (name == "index" || name == "rindex") {
				return nil, errors.New("ValueError: substring not found")
			}
			if i >= 0 {
				i = len([]rune(s[:i]))
			}
			return int64(i), nil
		})
	case "join":
		return m(func(e *evaluator, args []Value, _ *Dict) (Value, error) {
			if len(args) != 1 {
				return nil, argErr("join", 1, len(args))
			}
			items, err := e.iterate(args[0])
			if err != nil {
				return nil, err
			}
			parts := make([]string, len(items))
			for i, it := range items {
				p, ok := it.(string)
				if !ok {
					return nil, fmt.Errorf("TypeError: sequence item %d: expected str instance, %s found", i, typeName(it))
				}
				parts[i] = p
			}
			return joinChecked(parts, s)
		})
	case "isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower":
		return m(func(*evaluator, []Value, *Dict) (Value, error) { return strPredicate(s, name), nil })
	case "format":
		return m(func(_ *evaluator, args []Value, kw *Dict) (Value, error) { return pyFormat(s, args, kw) })
	}
	return nil
}

func rsplitN(s, sep string, n int) []string {
	var out []string
	for n > 0 {
		i := strings.LastIndex(s, sep)
		if i < 0 {
			break
		}
		out = append(out, s[i+len(sep):])
		s = s[:i]
		n--
	}
	out = append(out, s)
	slices.Reverse(out)
	return out
}

func strPredicate(s, name string) bool {
	if s == "" {
		return false
	}
	cased := false
	for _, r := range s {
		switch name {
		case "isdigit":
			if !unicode.IsDigit(r) {
				return false
			}
		case "isalpha":
			if !unicode.IsLetter(r) {
				return false
			}
		case "isalnum":
			if !unicode.IsLetter(r) && !unicode.IsNumber(r) {
				return false
			}
		case "isspace":
			if !isPySpace(r) {
				return false
			}
		case "isupper":
			if unicode.IsLower(r) {
				return false
			}
			cased = cased || unicode.IsUpper(r)
		case "islower":
			if unicode.IsUpper(r) {
				return false
			}
			cased = cased || unicode.IsLower(r)
		}
	}
	if name == "isupper" || name == "islower" {
		return cased
	}
	return true
}

func pyCapitalize(s string) string {
	rs := []rune(strings.ToLower(s))
	if len(rs) > 0 {
		rs[0] = unicode.ToTitle(rs[0])
	}
	return string(rs)
}

// pyFormat supports "{}" / "{0}" / "{name}" fields without format specs.
func pyFormat(s string, args []Value, kw *Dict) (Value, error) {
	var b strings.Builder
	auto := 0
	for i := 0; i < len(s); i++ {
		if b.Len() > maxOutput {
			return nil, errValueTooLarge()
		}
		c := s[i]
		if c == '{' && i+1 < len(s) && s[i+1] == '{' {
			b.WriteByte('{')
			i++
			continue
		}
		if c == '}' && i+1 < len(s) && s[i+1] == '}' {
			b.WriteByte('}')
			i++
			continue
		}
		if c != '{' {
			b.WriteByte(c)
			continue
		}
		j := strings.IndexByte(s[i:], '}')
		if j < 0 {
			return nil, errors.New("ValueError: Single '{' encountered in format string")
		}
		field := s[i+1 : i+j]
		i += j
		var v Value
		switch n, err := strconv.Atoi(field); {
		case field == "":
			if auto >= len(args) {
				return nil, errors.New("IndexError: Replacement index out of range for positional args tuple")
			}
			v = args[auto]
			auto++
		case err == nil:
			if n >= len(args) {
				return nil, errors.New("IndexError: Replacement index out of range for positional args tuple")
			}
			v = args[n]
		default:
			var ok bool
			if v, ok = kw.Get(field); !ok {
				return nil, fmt.Errorf("KeyError: '%s'", field)
			}
		}
		b.WriteString(str(v))
	}
	return b.String(), nil
}

func dictMethod(d *Dict, name string) Value {
	switch name {
	case "items":
		return method(func([]Value, *Dict) (Value, error) {
			out := &List{Items: make([]Value, len(d.keys))}
			for i, k := range d.keys {
				out.Items[i] = &List{Items: []Value{k, d.at(k)}, Tuple: true}
			}
			return out, nil
		})
	case "keys":
		return method(func([]Value, *Dict) (Value, error) {
			out := &List{Items: make([]Value, len(d.keys))}
			for i, k := range d.keys {
				out.Items[i] = k
			}
			return out, nil
		})
	case "values":
		return method(func([]Value, *Dict) (Value, error) {
			out := &List{Items: make([]Value, len(d.keys))}
			for i, k := range d.keys {
				out.Items[i] = d.at(k)
			}
			return out, nil
		})
	case "get":
		// A lookup: it builds nothing, so it spends nothing.
		return callable(func(_ *evaluator, args []Value, _ *Dict) (Value, error) {
			if len(args) < 1 || len(args) > 2 {
				return nil, argErr("get", 1, len(args))
			}
			if k, ok := args[0].(string); ok {
				if v, ok := d.Get(k); ok {
					return v, nil
				}
			}
			if len(args) == 2 {
				return args[1], nil
			}
			return nil, nil
		})
	}
	return nil
}

func listMethod(l *List, name string) Value {
	switch name {
	case "index":
		return callable(func(e *evaluator, args []Value, _ *Dict) (Value, error) {
			if len(args) != 1 {
				return nil, argErr("index", 1, len(args))
			}
			for i, it := range l.Items {
				if e.equal(it, args[0]) {
					return int64(i), e.spent()
				}
			}
			if err := e.spent(); err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("ValueError: %s is not in list", repr(args[0]))
		})
	case "count":
		return callable(func(e *evaluator, args []Value, _ *Dict) (Value, error) {
			if len(args) != 1 {
				return nil, argErr("count", 1, len(args))
			}
			n := int64(0)
			for _, it := range l.Items {
				if e.equal(it, args[0]) {
					n++
				}
			}
			return n, e.spent()
		})
	case "append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse":
		return method(func([]Value, *Dict) (Value, error) {
			return nil, fmt.Errorf("SecurityError: access to attribute '%s' of 'list' object is unsafe", name)
		})
	}
	return nil
}

// globals are the functions every template sees.
var globals = map[string]Value{
	"range": method(func(args []Value, _ *Dict) (Value, error) {
		if len(args) < 1 || len(args) > 3 {
			return nil, argErr("range", 1, len(args))
		}
		bounds := [3]Value{int64(0), nil, int64(1)}
		for i, a := range args {
			if _, _, ok := intOf(a); !ok {
				return nil, fmt.Errorf("TypeError: '%s' object cannot be interpreted as an integer", typeName(a))
			}
			if len(args) == 1 {
				i = 1
			}
			bounds[i] = a
		}
		return pyRange(bounds[0], bounds[1], bounds[2])
	}),
	"namespace": method(func(args []Value, kw *Dict) (Value, error) {
		ns := &Namespace{d: NewDict()}
		for _, a := range args {
			if d, ok := a.(*Dict); ok {
				for _, k := range d.keys {
					ns.d.Set(k, d.at(k))
				}
			}
		}
		for _, k := range kw.keys {
			ns.d.Set(k, kw.at(k))
		}
		return ns, nil
	}),
	"dict": method(func(args []Value, kw *Dict) (Value, error) {
		d := NewDict()
		for _, a := range args {
			if src, ok := a.(*Dict); ok {
				for _, k := range src.keys {
					d.Set(k, src.at(k))
				}
			}
		}
		for _, k := range kw.keys {
			d.Set(k, kw.at(k))
		}
		return d, nil
	}),
	"raise_exception": method(func(args []Value, _ *Dict) (Value, error) {
		msg := ""
		if len(args) > 0 {
			msg = str(args[0])
		}
		return nil, &RaiseError{Msg: msg}
	}),
	"strftime_now": callable(func(e *evaluator, args []Value, _ *Dict) (Value, error) {
		if len(args) != 1 {
			return nil, argErr("strftime_now", 1, len(args))
		}
		f, err := strArg("strftime_now", args[0])
		if err != nil {
			return nil, err
		}
		return strftime(e.now(), f), nil
	}),
}

// RaiseError is raise_exception(msg) from a template: the request is
// invalid for this model.
type RaiseError struct{ Msg string }

func (e *RaiseError) Error() string { return "TemplateError: " + e.Msg }

// strftime implements the C strftime directives templates use.
func strftime(t timeLike, f string) string {
	tm, ok := t.(time.Time)
	if !ok {
		return f
	}
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 == len(f) {
			b.WriteByte(f[i])
			continue
		}
		i++
		switch f[i] {
		case 'Y':
			fmt.Fprintf(&b, "%04d", tm.Year())
		case 'y':
			fmt.Fprintf(&b, "%02d", tm.Year()%100)
		case 'm':
			fmt.Fprintf(&b, "%02d", int(tm.Month()))
		case 'd':
			fmt.Fprintf(&b, "%02d", tm.Day())
		case 'e':
			fmt.Fprintf(&b, "%2d", tm.Day())
		case 'H':
			fmt.Fprintf(&b, "%02d", tm.Hour())
		case 'I':
			h := tm.Hour() % 12
			if h == 0 {
				h = 12
			}
			fmt.Fprintf(&b, "%02d", h)
		case 'M':
			fmt.Fprintf(&b, "%02d", tm.Minute())
		case 'S':
			fmt.Fprintf(&b, "%02d", tm.Second())
		case 'p':
			b.WriteString(tm.Format("PM"))
		case 'B':
			b.WriteString(tm.Month().String())
		case 'b', 'h':
			b.WriteString(tm.Month().String()[:3])
		case 'A':
			b.WriteString(tm.Weekday().String())
		case 'a':
			b.WriteString(tm.Weekday().String()[:3])
		case 'j':
			fmt.Fprintf(&b, "%03d", tm.YearDay())
		case 'Z':
			b.WriteString(tm.Format("MST"))
		case 'z':
			b.WriteString(tm.Format("-0700"))
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(f[i])
		}
	}
	return b.String()
}

func sortStrings(s []string) { sort.Strings(s) }

func (e *evaluator) runTest(name string, v Value, args []Value) (bool, error) {
	switch name {
	case "defined":
		_, u := v.(Undefined)
		return !u, nil
	case "undefined":
		_, u := v.(Undefined)
		return u, nil
	case "none":
		return v == nil, nil
	case "string":
		_, ok := v.(string)
		return ok, nil
	case "number":
		return isNumber(v), nil
	case "integer":
		return isInt(v), nil
	case "float":
		_, ok := v.(float64)
		return ok, nil
	case "boolean":
		_, ok := v.(bool)
		return ok, nil
	case "true":
		b, ok := v.(bool)
		return ok && b, nil
	case "false":
		b, ok := v.(bool)
		return ok && !b, nil
	case "mapping":
		switch v.(type) {
		case *Dict:
			return true, nil
		}
		return false, nil
	case "iterable":
		switch v.(type) {
		case *List, *Dict, string, Undefined:
			return true, nil
		}
		return false, nil
	case "sequence":
		switch v.(type) {
		case *List, *Dict, string:
			return true, nil
		}
		return false, nil
	case "callable":
		switch v.(type) {
		case callable, *macro:
			return true, nil
		}
		return false, nil
	case "odd", "even":
		// Jinja: value % 2 == 1 (or == 0), so 3.0 is odd.
		m, err := binop("%", v, int64(2))
		if err != nil {
			return false, err
		}
		return e.equal(m, boolInt(name == "odd")), nil
	case "divisibleby":
		if len(args) != 1 {
			return false, argErr("divisibleby", 1, len(args))
		}
		m, err := binop("%", v, args[0])
		if err != nil {
			return false, err
		}
		return e.equal(m, int64(0)), nil
	case "eq", "equalto", "==", "ne", "!=", "lt", "le", "gt", "ge", "lessthan", "greaterthan", "<", "<=", ">", ">=":
		if len(args) != 1 {
			return false, argErr(name, 1, len(args))
		}
		op := map[string]string{"eq": "==", "equalto": "==", "ne": "!=", "lt": "<", "lessthan": "<", "le": "<=",
			"gt": ">", "greaterthan": ">", "ge": ">="}[name]
		if op == "" {
			op = name
		}
		return e.compare(op, v, args[0])
	case "in":
		if len(args) != 1 {
			return false, argErr("in", 1, len(args))
		}
		return e.contains(args[0], v)
	case "sameas":
		if len(args) != 1 {
			return false, argErr("sameas", 1, len(args))
		}
		switch v.(type) {
		case nil, bool:
			return v == args[0], nil
		case Undefined:
			return false, nil // every lookup makes a new Undefined object
		}
		return e.equal(v, args[0]) && typeName(v) == typeName(args[0]), nil
	case "lower", "upper":
		s, ok := v.(string)
		if !ok {
			return false, nil
		}
		if name == "lower" {
			return s == strings.ToLower(s), nil
		}
		return s == strings.ToUpper(s), nil
	}
	return false, fmt.Errorf("TemplateRuntimeError: no test named '%s'", name)
}

func toInt(v Value, def int64) int64 {
	switch v := v.(type) {
	case int64:
		return v
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return def
		}
		return int64(v)
	case bool:
		return boolInt(v)
	case string:
		s := strings.TrimSpace(v)
		if i, err := strconv.ParseInt(s, 10, 64); err == nil {
			return i
		}
		if f, err := strconv.ParseFloat(s, 64); err == nil {
			return int64(f)
		}
	}
	return def
}

// pyPercent is Python's printf-style "fmt % args" for the conversions
// templates use: %s %r %d %i %f %x %% with optional flags, width and
// precision, and %(name)s with a mapping.
func pyPercent(f string, args []Value, whole Value) (Value, error) {
	var b strings.Builder
	next := 0
	for i := 0; i < len(f); i++ {
		if b.Len() > maxOutput {
			return nil, errValueTooLarge()
		}
		if f[i] != '%' {
			b.WriteByte(f[i])
			continue
		}
		i++
		if i >= len(f) {
			return nil, errors.New("ValueError: incomplete format")
		}
		var arg Value
		named := false
		if f[i] == '(' {
			j := strings.IndexByte(f[i:], ')')
			if j < 0 {
				return nil, errors.New("ValueError: incomplete format key")
			}
			d, ok := whole.(*Dict)
			if !ok {
				return nil, errors.New("TypeError: format requires a mapping")
			}
			key := f[i+1 : i+j]
			v, ok := d.Get(key)
			if !ok {
				return nil, fmt.Errorf("KeyError: '%s'", key)
			}
			arg, named = v, true
			i += j + 1
		}
		spec := i
		for i < len(f) && strings.IndexByte("-+ #0123456789.", f[i]) >= 0 {
			i++
		}
		if i >= len(f) {
			return nil, errors.New("ValueError: incomplete format")
		}
		conv := f[i]
		if conv == '%' {
			b.WriteByte('%')
			continue
		}
		if !named {
			if next >= len(args) {
				return nil, errors.New("TypeError: not enough arguments for format string")
			}
			arg = args[next]
			next++
		}
		flags := f[spec:i]
		switch conv {
		case 's', 'r', 'a':
			text := str(arg)
			if conv != 's' {
				text = repr(arg)
			}
			// Python pads a str with spaces only: '%05s' is '    x'.
			rest := strings.TrimLeft(flags, "-+ #0")
			lead := strings.ReplaceAll(flags[:len(flags)-len(rest)], "0", "")
			b.WriteString(fmt.Sprintf("%"+lead+rest+"s", text))
		case 'd', 'i', 'u', 'x', 'X', 'o', 'f', 'F', 'e', 'E', 'g', 'G':
			out, err := percentNumber(flags, conv, arg)
			if err != nil {
				return nil, err
			}
			b.WriteString(out)
		default:
			return nil, fmt.Errorf("ValueError: unsupported format character '%c'", conv)
		}
	}
	if next < len(args) && len(args) > 1 {
		return nil, errors.New("TypeError: not all arguments converted during string formatting")
	}
	return b.String(), nil
}

// percentNumber is one numeric conversion of Python's printf-style
// formatting: %d takes any real number (a float is truncated, exactly),
// %x and %o only ints, the float conversions any number.
func percentNumber(flags string, conv byte, arg Value) (string, error) {
	switch conv {
	case 'd', 'i', 'u', 'x', 'X', 'o':
		var iv Value
		switch x := arg.(type) {
		case int64, *big.Int:
			iv = x
		case bool:
			iv = boolInt(x)
		case float64:
			if conv != 'd' && conv != 'i' && conv != 'u' {
				return "", fmt.Errorf("TypeError: %%%c format: an integer is required, not float", conv)
			}
			var err error
			if iv, err = floatToInt(x); err != nil {
				return "", err
			}
		default:
			if conv == 'd' || conv == 'i' || conv == 'u' {
				return "", fmt.Errorf("TypeError: %%%c format: a real number is required, not %s", conv, typeName(arg))
			}
			return "", fmt.Errorf("TypeError: %%%c format: an integer is required, not %s", conv, typeName(arg))
		}
		verb := string(conv)
		switch conv {
		case 'i', 'u':
			verb = "d"
		case 'o':
			if strings.Contains(flags, "#") {
				// Python's alternate octal form is 0o17, Go's %O.
				flags, verb = strings.ReplaceAll(flags, "#", ""), "O"
			}
		}
		return fmt.Sprintf("%"+flags+verb, iv), nil
	}
	x, ok, err := floatOf(arg)
	if !ok {
		return "", fmt.Errorf("TypeError: must be real number, not %s", typeName(arg))
	}
	if err != nil {
		return "", err
	}
	if math.IsInf(x, 0) || math.IsNaN(x) {
		// Python writes inf and nan (INF, NAN for the capital
		// conversions), padded like a string.
		word := "inf"
		switch {
		case math.IsNaN(x):
			word = "nan"
		case x < 0:
			word = "-inf"
		case strings.Contains(flags, "+"):
			word = "+inf"
		case strings.Contains(flags, " "):
			word = " inf"
		}
		if conv == 'F' || conv == 'E' || conv == 'G' {
			word = strings.ToUpper(word)
		}
		width := strings.TrimLeft(flags, "-+ #0")
		width, _, _ = strings.Cut(width, ".")
		align := ""
		if strings.Contains(flags, "-") {
			align = "-"
		}
		return fmt.Sprintf("%"+align+width+"s", word), nil
	}
	if !strings.Contains(flags, ".") {
		flags += ".6" // Python's default precision, for %g as well
	}
	return fmt.Sprintf("%"+flags+string(conv), x), nil
}

// pyRange is list(range(start, stop, step)) for ints, as far as Jinja's
// sandbox allows (MAX_RANGE items).
func pyRange(start, stop, step Value) (Value, error) {
	a, az, _ := intOf(start)
	b, bz, _ := intOf(stop)
	c, cz, _ := intOf(step)
	if cz == nil && c == 0 {
		return nil, errors.New("ValueError: range() arg 3 must not be zero")
	}
	if az == nil && bz == nil && cz == nil && c != math.MinInt64 {
		// The length, without overflow: |stop - start| fits a uint64.
		var span, st uint64
		switch {
		case c > 0 && b > a:
			span, st = uint64(b)-uint64(a), uint64(c)
		case c < 0 && b < a:
			span, st = uint64(a)-uint64(b), uint64(-c)
		default:
			return &List{}, nil
		}
		n := (span-1)/st + 1
		if n > maxRange {
			return nil, errRangeTooBig()
		}
		out := &List{Items: make([]Value, n)}
		for i := range out.Items {
			out.Items[i] = a + int64(i)*c // each fits: it lies between start and stop
		}
		return out, nil
	}
	x, y, d := bigOf(a, az), bigOf(b, bz), bigOf(c, cz)
	span := new(big.Int).Sub(y, x)
	if span.Sign() != d.Sign() || span.Sign() == 0 {
		return &List{}, nil
	}
	n := new(big.Int).Quo(new(big.Int).Sub(span, big.NewInt(int64(d.Sign()))), d)
	n.Add(n, big.NewInt(1))
	if !n.IsInt64() || n.Int64() > maxRange {
		return nil, errRangeTooBig()
	}
	out := &List{Items: make([]Value, n.Int64())}
	z := new(big.Int).Set(x)
	for i := range out.Items {
		v, err := normInt(new(big.Int).Set(z))
		if err != nil {
			return nil, err
		}
		out.Items[i] = v
		z.Add(z, d)
	}
	return out, nil
}

func errRangeTooBig() error {
	return fmt.Errorf("OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d)", maxRange)
}
