package chat

import (
	"errors"
	"fmt"
	"html"
	"math"
	"math/big"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

func kwOr(kw *Dict, args []Value, i int, name string, def Value) Value {
	if i < len(args) {
		return args[i]
	}
	if v, ok := kw.Get(name); ok {
		return v
	}
	return def
}

// filter applies a filter and spends its work (see spend): a step per
// item or 64 bytes of the input it scans, before, and of what it builds,
// after. Filters that return a value they were given (default, first,
// min...) build nothing.
func (e *evaluator) filter(name string, v Value, args []Value, kw *Dict) (Value, error) {
	switch name {
	case "length", "count", "wordcount", "int", "float", "list", "first", "last", "reverse", "truncate":
		// Work that grows with a str input (counting or listing its
		// characters), however small the result; a list's length is
		// known.
		if str, ok := v.(string); ok {
			if err := e.spendOn(str); err != nil {
				return nil, err
			}
		}
	case "sum", "min", "max", "unique", "select", "reject", "selectattr", "rejectattr", "map", "join", "batch":
		// A pass over the items, however small the result.
		if err := e.spendOn(v); err != nil {
			return nil, err
		}
	case "sort", "dictsort":
		// n log n comparisons.
		n := 0
		switch x := v.(type) {
		case *List:
			n = len(x.Items)
		case *Dict:
			n = x.Len()
		case string:
			n = len(x)
		}
		e.spend(n * bits.Len(uint(n)))
		if err := e.spent(); err != nil {
			return nil, err
		}
	}
	out, err := e.applyFilter(name, v, args, kw)
	if err != nil {
		return nil, err
	}
	switch name {
	case "default", "d", "safe", "first", "last", "min", "max", "attr", "length", "count", "wordcount":
		return out, nil
	}
	return out, e.spendOn(out)
}

func (e *evaluator) applyFilter(name string, v Value, args []Value, kw *Dict) (Value, error) {
	// Filters other than default and tests of definedness fail on
	// Undefined the way Jinja's default Undefined does when used.
	switch name {
	case "tojson":
		var indent *int
		if iv := kwOr(kw, args, 0, "indent", nil); iv != nil {
			n := int(max(-1, min(toInt(iv, 0), maxOutput+1))) // every negative indent is none
			indent = &n
		}
		sortKeys := truthy(kwOr(kw, nil, 0, "sort_keys", false))
		if u, ok := v.(Undefined); ok {
			return nil, fmt.Errorf("TypeError: Object of type Undefined is not JSON serializable (%v)", u.err())
		}
		return toJSON(v, indent, sortKeys)
	case "default", "d":
		def := kwOr(kw, args, 0, "default_value", "")
		boolean := truthy(kwOr(kw, args, 1, "boolean", false))
		if _, u := v.(Undefined); u || (boolean && !truthy(v)) {
			return def, nil
		}
		return v, nil
	case "length", "count":
		return length(v)
	case "string":
		return str(v), nil
	case "safe", "e", "escape", "forceescape":
		if name == "safe" {
			return v, nil
		}
		return html.EscapeString(str(v)), nil
	case "trim":
		s, err := strIn(name, v)
		if err != nil {
			return nil, err
		}
		chars := kwOr(kw, args, 0, "chars", nil)
		if chars == nil {
			return pyStripSpace(s, true, true), nil
		}
		return pyStrip(s, []Value{chars}, true, true)
	case "upper", "lower", "title", "capitalize":
		s, err := strIn(name, v)
		if err != nil {
			return nil, err
		}
		switch name {
		case "upper":
			return strings.ToUpper(s), nil
		case "lower":
			return strings.ToLower(s), nil
		case "title":
			return jinjaTitle(s), nil
		}
		return pyCapitalize(s), nil
	case "replace":
		s, err := strIn(name, v)
		if err != nil {
			return nil, err
		}
		if len(args) < 2 {
			return nil, argErr("replace", 2, len(args))
		}
		count := int64(-1)
		if c := kwOr(kw, args, 2, "count", nil); c != nil {
			count = toInt(c, -1)
		}
		return replaceChecked(s, str(args[0]), str(args[1]), int(count))
	case "indent":
		s, err := strIn(name, v)
		if err != nil {
			return nil, err
		}
		width := kwOr(kw, args, 0, "width", int64(4))
		pad := ""
		if ws, ok := width.(string); ok {
			pad = ws
		} else {
			pad = strings.Repeat(" ", int(max(0, min(toInt(width, 4), 1000))))
		}
		first := truthy(kwOr(kw, args, 1, "first", false))
		blank := truthy(kwOr(kw, args, 2, "blank", false))
		return jinjaIndent(s, pad, first, blank)
	case "first", "last":
		items, err := e.iterate(v)
		if err != nil {
			return nil, err
		}
		if len(items) == 0 {
			return Undefined{hint: "No first item, sequence was empty."}, nil
		}
		if name == "first" {
			return items[0], nil
		}
		return items[len(items)-1], nil
	case "join":
		items, err := e.iterate(v)
		if err != nil {
			return nil, err
		}
		sep := str(kwOr(kw, args, 0, "d", ""))
		attr := kwOr(kw, args, 1, "attribute", nil)
		parts := make([]string, len(items))
		total := 0
		for i, it := range items {
			if attr != nil {
				if it, err = getItem(it, attr); err != nil {
					return nil, err
				}
			}
			parts[i] = str(it)
			if total += len(parts[i]); total > maxOutput {
				return nil, errValueTooLarge()
			}
		}
		return joinChecked(parts, sep)
	case "list":
		items, err := e.iterate(v)
		if err != nil {
			return nil, err
		}
		return &List{Items: slices.Clone(items)}, nil
	case "items":
		d, ok := v.(*Dict)
		if !ok {
			if _, u := v.(Undefined); u {
				return &List{}, nil
			}
			return nil, fmt.Errorf("TypeError: items filter needs a mapping, got %s", typeName(v))
		}
		return dictMethod(d, "items").(callable)(e, nil, NewDict())
	case "dictsort":
		d, ok := v.(*Dict)
		if !ok {
			return nil, fmt.Errorf("TypeError: dictsort needs a mapping, got %s", typeName(v))
		}
		keys := slices.Clone(d.keys)
		if truthy(kwOr(kw, args, 0, "case_sensitive", false)) {
			slices.Sort(keys)
		} else {
			slices.SortStableFunc(keys, func(a, b string) int { return strings.Compare(strings.ToLower(a), strings.ToLower(b)) })
		}
		if truthy(kwOr(kw, args, 2, "reverse", false)) {
			slices.Reverse(keys)
		}
		out := &List{}
		for _, k := range keys {
			out.Items = append(out.Items, &List{Items: []Value{k, d.at(k)}, Tuple: true})
		}
		return out, nil
	case "reverse":
		if s, ok := v.(string); ok {
			rs := []rune(s)
			slices.Reverse(rs)
			return string(rs), nil
		}
		items, err := e.iterate(v)
		if err != nil {
			return nil, err
		}
		out := slices.Clone(items)
		slices.Reverse(out)
		return &List{Items: out}, nil
	case "sort":
		items, err := e.iterate(v)
		if err != nil {
			return nil, err
		}
		out := slices.Clone(items)
		reverse := truthy(kwOr(kw, args, 0, "reverse", false))
		caseSensitive := truthy(kwOr(kw, args, 1, "case_sensitive", false))
		attr := kwOr(kw, args, 2, "attribute", nil)
		key := func(x Value) Value {
			if attr != nil {
				x, _ = getItem(x, attr)
			}
			if s, ok := x.(string); ok && !caseSensitive {
				return strings.ToLower(s)
			}
			return x
		}
		var sortErr error
		slices.SortStableFunc(out, func(a, b Value) int {
			ka, kb := key(a), key(b)
			if lt, err := e.compare("<", ka, kb); err != nil {
				sortErr = err
			} else if lt {
				return -1
			}
			if gt, _ := e.compare(">", ka, kb); gt {
				return 1
			}
			return 0
		})
		if sortErr != nil {
			return nil, sortErr
		}
		if reverse {
			slices.Reverse(out)
		}
		return &List{Items: out}, nil
	case "unique":
		items, err := e.iterate(v)
		if err != nil {
			return nil, err
		}
		// Jinja keeps a set of the keys seen: items that hash alike and
		// compare equal (1, 1.0 and True) count once, unhashable ones
		// (lists, dicts) are a TypeError.
		key := itemKey(kwOr(kw, args, 1, "attribute", nil), truthy(kwOr(kw, args, 0, "case_sensitive", false)))
		seen := make(map[string]bool, len(items))
		out := &List{}
		var hb strings.Builder
		for _, it := range items {
			k, err := key(it)
			if err != nil {
				return nil, err
			}
			hb.Reset()
			if err := writeHashKey(&hb, k); err != nil {
				return nil, err
			}
			if h := hb.String(); !seen[h] {
				seen[h] = true
				out.Items = append(out.Items, it)
			}
		}
		return out, nil
	case "map":
		items, err := e.iterate(v)
		if err != nil {
			return nil, err
		}
		out := &List{}
		if attr, ok := kw.Get("attribute"); ok {
			def, hasDef := kw.Get("default")
			for _, it := range items {
				x, err := getItem(it, attr)
				if err != nil {
					return nil, err
				}
				if _, u := x.(Undefined); u && hasDef {
					x = def
				}
				out.Items = append(out.Items, x)
			}
			return out, nil
		}
		if len(args) == 0 {
			return nil, errors.New("TypeError: map needs a filter name or attribute=")
		}
		fname := str(args[0])
		for _, it := range items {
			x, err := e.filter(fname, it, args[1:], kw)
			if err != nil {
				return nil, err
			}
			out.Items = append(out.Items, x)
		}
		return out, nil
	case "select", "reject", "selectattr", "rejectattr":
		items, err := e.iterate(v)
		if err != nil {
			return nil, err
		}
		attrMode := strings.HasSuffix(name, "attr")
		want := strings.HasPrefix(name, "select")
		rest := args
		var attr Value
		if attrMode {
			if len(args) == 0 {
				return nil, fmt.Errorf("TypeError: %s needs an attribute", name)
			}
			attr, rest = args[0], args[1:]
		}
		out := &List{}
		for _, it := range items {
			x := it
			if attrMode {
				if x, err = getItem(it, attr); err != nil {
					return nil, err
				}
			}
			var ok bool
			if len(rest) == 0 {
				ok = truthy(x)
			} else if ok, err = e.runTest(str(rest[0]), x, rest[1:]); err != nil {
				return nil, err
			}
			if ok == want {
				out.Items = append(out.Items, it)
			}
		}
		return out, nil
	case "int":
		return intFilter(v, kwOr(kw, args, 0, "default", int64(0)), kwOr(kw, args, 1, "base", int64(10)))
	case "float":
		// float(value), the default on TypeError and ValueError only.
		switch x := v.(type) {
		case int64, float64, bool, *big.Int:
			f, _, err := floatOf(x)
			return f, err
		case string:
			if f, ok := pyFloatString(x); ok {
				return f, nil
			}
		case Undefined:
			return nil, x.err()
		}
		return kwOr(kw, args, 0, "default", 0.0), nil
	case "abs":
		switch x := v.(type) {
		case int64, bool, *big.Int:
			n, z, _ := intOf(x)
			if (z == nil && n >= 0) || (z != nil && z.Sign() >= 0) {
				return normInt(bigOf(n, z))
			}
			return intNeg(n, z)
		case float64:
			return math.Abs(x), nil
		}
		return nil, fmt.Errorf("TypeError: bad operand type for abs(): '%s'", typeName(v))
	case "round":
		return roundFilter(v, kwOr(kw, args, 0, "precision", int64(0)), str(kwOr(kw, args, 1, "method", "common")))
	case "sum":
		items, err := e.iterate(v)
		if err != nil {
			return nil, err
		}
		total := kwOr(kw, args, 1, "start", int64(0))
		attr := kwOr(kw, args, 0, "attribute", nil)
		for _, it := range items {
			if attr != nil {
				if it, err = getItem(it, attr); err != nil {
					return nil, err
				}
			}
			if total, err = binop("+", total, it); err != nil {
				return nil, err
			}
		}
		return total, nil
	case "min", "max":
		items, err := e.iterate(v)
		if err != nil {
			return nil, err
		}
		if len(items) == 0 {
			return Undefined{hint: "No aggregated item, sequence was empty."}, nil
		}
		key := itemKey(kwOr(kw, args, 1, "attribute", nil), truthy(kwOr(kw, args, 0, "case_sensitive", false)))
		best := items[0]
		bestKey, err := key(best)
		if err != nil {
			return nil, err
		}
		op := "<"
		if name == "max" {
			op = ">"
		}
		for _, it := range items[1:] {
			k, err := key(it)
			if err != nil {
				return nil, err
			}
			better, err := e.compare(op, k, bestKey)
			if err != nil {
				return nil, err
			}
			if better {
				best, bestKey = it, k
			}
		}
		return best, nil
	case "format":
		f, err := strIn(name, v)
		if err != nil {
			return nil, err
		}
		if kw.Len() > 0 {
			return pyPercent(f, nil, kw)
		}
		return pyPercent(f, args, nil)
	case "attr":
		if len(args) != 1 {
			return nil, argErr("attr", 1, len(args))
		}
		return getAttr(v, str(args[0]))
	case "wordcount":
		return int64(len(strings.FieldsFunc(str(v), func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsNumber(r) && r != '_' }))), nil
	case "center":
		w := int(max(0, min(toInt(kwOr(kw, args, 0, "width", int64(80)), 80), maxRepeat)))
		return pyCenter(str(v), w), nil
	case "truncate":
		// Jinja's do_truncate, with its default leeway of 5.
		s := str(v)
		n := toInt(kwOr(kw, args, 0, "length", int64(255)), 255)
		killwords := truthy(kwOr(kw, args, 1, "killwords", false))
		end := str(kwOr(kw, args, 2, "end", "..."))
		leeway := toInt(kwOr(kw, args, 3, "leeway", int64(5)), 5)
		endLen := int64(utf8.RuneCountInString(end))
		if n < endLen {
			return nil, fmt.Errorf("AssertionError: expected length >= %d, got %d", endLen, n)
		}
		if leeway < 0 {
			return nil, fmt.Errorf("AssertionError: expected leeway >= 0, got %d", leeway)
		}
		rs := []rune(s)
		if l := int64(len(rs)); l <= n || l-n <= leeway {
			return s, nil
		}
		head := string(rs[:n-endLen])
		if !killwords {
			if i := strings.LastIndexByte(head, ' '); i >= 0 {
				head = head[:i]
			}
		}
		return head + end, nil
	case "batch":
		items, err := e.iterate(v)
		if err != nil {
			return nil, err
		}
		n := int(toInt(kwOr(kw, args, 0, "linecount", int64(1)), 1))
		if n <= 0 {
			return nil, errors.New("ValueError: batch size must be positive")
		}
		out := &List{}
		for i := 0; i < len(items); i += n {
			out.Items = append(out.Items, &List{Items: slices.Clone(items[i:min(i+n, len(items))])})
		}
		return out, nil
	}
	return nil, fmt.Errorf("TemplateRuntimeError: no filter named '%s'", name)
}

func length(v Value) (Value, error) {
	switch x := v.(type) {
	case string:
		return int64(len([]rune(x))), nil
	case *List:
		return int64(len(x.Items)), nil
	case *Dict:
		return int64(x.Len()), nil
	case Undefined:
		return int64(0), nil
	}
	return nil, fmt.Errorf("TypeError: object of type '%s' has no len()", typeName(v))
}

func strIn(filter string, v Value) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case Undefined:
		return "", nil
	}
	return str(v), nil
}

// itemKey is Jinja's make_attrgetter for min, max and unique: the item's
// attribute (or the item), lowercased when it is a str and the filter is
// not case-sensitive.
func itemKey(attr Value, caseSensitive bool) func(Value) (Value, error) {
	return func(x Value) (Value, error) {
		if attr != nil {
			var err error
			if x, err = getItem(x, attr); err != nil {
				return nil, err
			}
		}
		if s, ok := x.(string); ok && !caseSensitive {
			return strings.ToLower(s), nil
		}
		return x, nil
	}
}

// intFilter is Jinja's int filter: int(value) (int(value, base) for a
// str), else int(float(value)), else the default. An infinite float is
// Python's OverflowError, which the filter does not catch.
func intFilter(v, def, base Value) (Value, error) {
	switch x := v.(type) {
	case int64, *big.Int:
		return x, nil
	case bool:
		return boolInt(x), nil
	case float64:
		if math.IsNaN(x) {
			return def, nil
		}
		return floatToInt(x)
	case string:
		if b, ok := base.(int64); ok {
			if n, ok := pyIntString(x, b); ok {
				return n, nil
			}
		}
		if f, ok := pyFloatString(x); ok {
			if n, err := floatToInt(f); err == nil {
				return n, nil
			}
		}
		return def, nil
	case Undefined:
		return nil, x.err()
	}
	return def, nil
}

// roundFilter is Jinja's round filter: Python's round(value, precision)
// ("common": an int stays an int, a float is rounded half to even on its
// exact value), or math.ceil/math.floor of value * 10**precision divided
// back.
func roundFilter(v, precision Value, method string) (Value, error) {
	if u, ok := v.(Undefined); ok {
		return nil, u.err()
	}
	prec, ok := precision.(int64)
	if !ok {
		if b, isBool := precision.(bool); isBool {
			prec, ok = boolInt(b), true
		}
	}
	if !ok {
		return nil, fmt.Errorf("TypeError: '%s' object cannot be interpreted as an integer", typeName(precision))
	}
	switch method {
	case "common":
		switch x := v.(type) {
		case int64, bool, *big.Int:
			n, z, _ := intOf(x)
			return pyRoundInt(n, z, prec)
		case float64:
			return pyRoundFloat(x, prec), nil
		}
		return nil, fmt.Errorf("TypeError: type %s doesn't define __round__ method", typeName(v))
	case "ceil", "floor":
		p, err := binop("**", int64(10), prec)
		if err != nil {
			return nil, err
		}
		scaled, err := binop("*", v, p)
		if err != nil {
			return nil, err
		}
		if f, isFloat := scaled.(float64); isFloat {
			if method == "ceil" {
				f = math.Ceil(f)
			} else {
				f = math.Floor(f)
			}
			if scaled, err = floatToInt(f); err != nil {
				return nil, err
			}
		}
		return binop("/", scaled, p)
	}
	return nil, errors.New("FilterArgumentError: method must be common, ceil or floor")
}

// pyRoundFloat is round(x, ndigits) for a float: the exact binary value
// rounded half to even at the decimal digit, as CPython does.
func pyRoundFloat(x float64, ndigits int64) float64 {
	switch {
	case math.IsInf(x, 0) || math.IsNaN(x) || x == 0 || ndigits > 400:
		return x
	case ndigits >= 0:
		f, _ := strconv.ParseFloat(strconv.FormatFloat(x, 'f', int(ndigits), 64), 64)
		return f
	case ndigits < -400:
		return math.Copysign(0, x)
	}
	p := new(big.Int).Exp(big.NewInt(10), big.NewInt(-ndigits), nil)
	r := new(big.Rat).SetFloat64(x)
	r.Quo(r, new(big.Rat).SetInt(p))
	q, m := new(big.Int).DivMod(r.Num(), r.Denom(), new(big.Int))
	switch c := new(big.Int).Lsh(m, 1).Cmp(r.Denom()); {
	case c > 0, c == 0 && q.Bit(0) == 1:
		q.Add(q, big.NewInt(1))
	}
	f, _ := new(big.Float).SetInt(q.Mul(q, p)).Float64()
	return math.Copysign(f, x)
}

// writeHashKey writes a key that two hashable values share exactly when
// Python's set would count them once: equal numbers of any type share the
// key of the int or float they equal, tuples combine their items' keys.
func writeHashKey(b *strings.Builder, v Value) error {
	switch x := v.(type) {
	case nil:
		b.WriteString("N")
	case string:
		b.WriteString("s")
		b.WriteString(strconv.Itoa(len(x)))
		b.WriteByte(':')
		b.WriteString(x)
	case int64, bool, *big.Int:
		n, z, _ := intOf(x)
		b.WriteString("i")
		b.WriteString(bigOf(n, z).String())
	case float64:
		if x == math.Trunc(x) && !math.IsInf(x, 0) {
			iv, _ := floatToInt(x)
			return writeHashKey(b, iv)
		}
		b.WriteString("f")
		b.WriteString(strconv.FormatFloat(x, 'g', -1, 64))
	case *List:
		if !x.Tuple {
			return errors.New("TypeError: unhashable type: 'list'")
		}
		b.WriteString("(")
		for _, it := range x.Items {
			if err := writeHashKey(b, it); err != nil {
				return err
			}
			b.WriteByte(',')
		}
		b.WriteString(")")
	case *Dict:
		return errors.New("TypeError: unhashable type: 'dict'")
	case Undefined:
		b.WriteString("U") // Jinja's Undefineds are all equal
	default:
		// Namespaces, loops, macros and functions hash by identity.
		fmt.Fprintf(b, "o%p", x)
	}
	return nil
}
