package chat

import (
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Value is a template value with Python semantics. Concrete types:
// nil (None), Undefined, bool, int64 and *big.Int (int, see ints.go),
// float64, string, *List, *Dict, *Namespace, *loopInfo and callables.
type Value = any

// Undefined is a missing variable, attribute or item. Printing it gives "",
// testing it gives false; using it in arithmetic or taking its attribute is
// an UndefinedError, as in Jinja2's default Undefined.
type Undefined struct {
	hint string
	// format and args build the hint only when an error needs it: missing
	// attributes are common and usually harmless.
	format string
	args   []any
}

// List is a Python list (immutable inside templates, as in transformers'
// ImmutableSandboxedEnvironment).
type List struct {
	Items []Value
	// Tuple marks a Python tuple (from literals, dict.items(), dictsort):
	// it prints as (a, b) and never equals a list.
	Tuple bool
}

// Dict is a Python dict that keeps insertion order. Small dicts (chat
// messages) scan a slice; an index map appears past smallDict keys.
type Dict struct {
	keys []string
	vals []Value
	idx  map[string]int
}

const smallDict = 8

// NewDict returns an empty ordered dict.
func NewDict() *Dict { return &Dict{} }

func (d *Dict) index(k string) int {
	if d.idx != nil {
		if i, ok := d.idx[k]; ok {
			return i
		}
		return -1
	}
	for i, kk := range d.keys {
		if kk == k {
			return i
		}
	}
	return -1
}

// Set inserts or replaces a key, keeping first-insertion order.
func (d *Dict) Set(k string, v Value) {
	if i := d.index(k); i >= 0 {
		d.vals[i] = v
		return
	}
	d.keys = append(d.keys, k)
	d.vals = append(d.vals, v)
	switch {
	case d.idx != nil:
		d.idx[k] = len(d.keys) - 1
	case len(d.keys) > smallDict:
		d.idx = make(map[string]int, 2*len(d.keys))
		for i, kk := range d.keys {
			d.idx[kk] = i
		}
	}
}

// Get looks a key up.
func (d *Dict) Get(k string) (Value, bool) {
	if i := d.index(k); i >= 0 {
		return d.vals[i], true
	}
	return nil, false
}

// at returns the value of an existing key.
func (d *Dict) at(k string) Value {
	v, _ := d.Get(k)
	return v
}

// Keys returns the keys in insertion order.
func (d *Dict) Keys() []string { return d.keys }

// Len is the number of keys.
func (d *Dict) Len() int { return len(d.keys) }

// Namespace is Jinja2's namespace(): the one mutable object templates get.
type Namespace struct{ d *Dict }

type callable func(e *evaluator, args []Value, kwargs *Dict) (Value, error)

// typeName is Python's type name, for error messages.
func typeName(v Value) string {
	switch v := v.(type) {
	case nil:
		return "NoneType"
	case Undefined:
		return "Undefined"
	case bool:
		return "bool"
	case int64, *big.Int:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case *List:
		if v.Tuple {
			return "tuple"
		}
		return "list"
	case *Dict:
		return "dict"
	case *Namespace:
		return "Namespace"
	case *loopInfo:
		return "LoopContext"
	case callable, *macro:
		return "function"
	}
	return fmt.Sprintf("%T", v)
}

func truthy(v Value) bool {
	switch v := v.(type) {
	case nil, Undefined:
		return false
	case bool:
		return v
	case int64:
		return v != 0
	case *big.Int:
		return true // never zero: zero is an int64
	case float64:
		return v != 0
	case string:
		return v != ""
	case *List:
		return len(v.Items) > 0
	case *Dict:
		return v.Len() > 0
	}
	return true
}

// str is Python's str() as Jinja prints it.
func str(v Value) string {
	switch v := v.(type) {
	case Undefined:
		return ""
	case string:
		return v
	}
	return repr(v)
}

// repr is Python's repr().
func repr(v Value) string {
	var b strings.Builder
	writeRepr(&b, v, 0)
	return b.String()
}

func writeRepr(b *strings.Builder, v Value, depth int) {
	if depth > 200 {
		b.WriteString("...")
		return
	}
	if b.Len() > maxOutput {
		// Past the limit the text is refused wherever it goes (output,
		// a str value): the rest need not be written.
		return
	}
	switch v := v.(type) {
	case nil:
		b.WriteString("None")
	case Undefined:
		b.WriteString("")
	case bool:
		if v {
			b.WriteString("True")
		} else {
			b.WriteString("False")
		}
	case int64:
		b.WriteString(strconv.FormatInt(v, 10))
	case *big.Int:
		b.WriteString(v.String())
	case float64:
		b.WriteString(pyFloat(v))
	case string:
		b.WriteString(pyStrRepr(v))
	case *List:
		open, end := byte('['), "]"
		if v.Tuple {
			open, end = '(', ")"
			if len(v.Items) == 1 {
				end = ",)"
			}
		}
		b.WriteByte(open)
		for i, it := range v.Items {
			if i > 0 {
				b.WriteString(", ")
			}
			writeRepr(b, it, depth+1)
		}
		b.WriteString(end)
	case *Dict:
		b.WriteByte('{')
		for i, k := range v.keys {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(pyStrRepr(k))
			b.WriteString(": ")
			writeRepr(b, v.at(k), depth+1)
		}
		b.WriteByte('}')
	case *Namespace:
		b.WriteString("<Namespace ")
		writeRepr(b, v.d, depth+1)
		b.WriteString(">")
	default:
		fmt.Fprintf(b, "<%s>", typeName(v))
	}
}

// pyFloat formats like Python's float repr: shortest round-trip digits,
// fixed notation for exponents in [-4, 16), else scientific.
func pyFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	s := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±XX
	mant, expS, _ := strings.Cut(s, "e")
	exp, _ := strconv.Atoi(expS)
	neg := strings.HasPrefix(mant, "-")
	mant = strings.TrimPrefix(mant, "-")
	digits := strings.Replace(mant, ".", "", 1)
	sign := ""
	if neg {
		sign = "-"
	}
	if exp < -4 || exp >= 16 {
		m := digits[:1]
		if len(digits) > 1 {
			m += "." + digits[1:]
		}
		es := "+"
		if exp < 0 {
			es, exp = "-", -exp
		}
		return fmt.Sprintf("%s%se%s%02d", sign, m, es, exp)
	}
	var out string
	switch {
	case exp < 0:
		out = "0." + strings.Repeat("0", -exp-1) + digits
	case exp+1 >= len(digits):
		out = digits + strings.Repeat("0", exp+1-len(digits)) + ".0"
	default:
		out = digits[:exp+1] + "." + digits[exp+1:]
	}
	return sign + out
}

// pyStrRepr is Python's repr of a str.
func pyStrRepr(s string) string {
	q := byte('\'')
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		q = '"'
	}
	var b strings.Builder
	b.WriteByte(q)
	for _, r := range s {
		switch {
		case r == rune(q) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r > 0x7f && !unicode.IsPrint(r) && r != utf8.RuneError:
			switch {
			case r < 0x100:
				fmt.Fprintf(&b, `\x%02x`, r)
			case r < 0x10000:
				fmt.Fprintf(&b, `\u%04x`, r)
			default:
				fmt.Fprintf(&b, `\U%08x`, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte(q)
	return b.String()
}

// toJSON is Python's json.dumps(v, ensure_ascii=False, indent=indent,
// sort_keys=sortKeys) with default separators.
func toJSON(v Value, indent *int, sortKeys bool) (string, error) {
	var b strings.Builder
	if err := writeJSON(&b, v, indent, sortKeys, 0); err != nil {
		return "", err
	}
	return b.String(), nil
}

func writeJSON(b *strings.Builder, v Value, indent *int, sortKeys bool, level int) error {
	if level > 1000 {
		return fmt.Errorf("ValueError: nesting too deep for tojson")
	}
	if b.Len() > maxOutput {
		return errValueTooLarge()
	}
	nl := func(l int) {
		if indent != nil {
			b.WriteByte('\n')
			// A negative indent is no indent, as " " * -1 is "".
			if pad := *indent * l; pad > 0 && pad <= maxOutput {
				b.WriteString(strings.Repeat(" ", pad))
			} else if pad > maxOutput {
				b.WriteString(strings.Repeat(" ", maxOutput+1))
			}
		}
	}
	itemSep := ", "
	if indent != nil {
		itemSep = ","
	}
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		if v {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case int64:
		b.WriteString(strconv.FormatInt(v, 10))
	case *big.Int:
		b.WriteString(v.String())
	case float64:
		switch {
		case math.IsInf(v, 1):
			b.WriteString("Infinity")
		case math.IsInf(v, -1):
			b.WriteString("-Infinity")
		case math.IsNaN(v):
			b.WriteString("NaN")
		default:
			b.WriteString(pyFloat(v))
		}
	case string:
		writeJSONString(b, v)
	case *List:
		if len(v.Items) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, it := range v.Items {
			if i > 0 {
				b.WriteString(itemSep)
			}
			nl(level + 1)
			if err := writeJSON(b, it, indent, sortKeys, level+1); err != nil {
				return err
			}
		}
		nl(level)
		b.WriteByte(']')
	case *Dict:
		if v.Len() == 0 {
			b.WriteString("{}")
			return nil
		}
		keys := v.keys
		if sortKeys {
			keys = append([]string(nil), keys...)
			sortStrings(keys)
		}
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(itemSep)
			}
			nl(level + 1)
			writeJSONString(b, k)
			b.WriteString(": ")
			if err := writeJSON(b, v.at(k), indent, sortKeys, level+1); err != nil {
				return err
			}
		}
		nl(level)
		b.WriteByte('}')
	default:
		return fmt.Errorf("TypeError: Object of type %s is not JSON serializable", typeName(v))
	}
	return nil
}

func writeJSONString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if r < 0x20 {
				fmt.Fprintf(b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}
