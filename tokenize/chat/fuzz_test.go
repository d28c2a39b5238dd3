package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/metrics"
	"testing"
	"time"
)

// fuzzSteps is the work budget of a fuzzed render (Template.MaxSteps).
const fuzzSteps = 100_000

// fuzzAllocLimit bounds what one fuzzed render may allocate. Within
// fuzzSteps steps a template can build little (a step per 64 bytes); one
// operation may overshoot by the size of a value, itself at most
// maxOutput, so a render that allocates more has done work its budget did
// not count.
const fuzzAllocLimit = 1 << 30

// FuzzTemplate compiles and renders arbitrary template sources: errors are
// fine; panics are not, nor a render that differs from a second render of
// the same template, nor output past the limit, nor allocating more than
// the step budget allows. The budget, spent by every builtin on what it
// builds or scans, bounds the work; wall time plays no part.
func FuzzTemplate(f *testing.F) {
	for _, name := range []string{"qwen3", "deepseek_v3", "llama3_1", "py_whitespace", "py_ints"} {
		if src, err := os.ReadFile(filepath.Join(chatData, "templates", name+".jinja")); err == nil {
			f.Add(string(src))
		}
	}
	for _, s := range []string{
		"{{ x }}", "{% for a in range(3) %}{{ loop.index }}{% endfor %}", "{%- if a is defined -%}x{% else %}y{% endif %}",
		"{{ [1,2,3][::-1]|join(',') }}", "{{ {'a': 1.5, 'b': none}|tojson }}", "{% set ns = namespace(a=1) %}{% set ns.a = 2 %}{{ ns.a }}",
		"{% macro m(a, b=2) %}{{ a ~ b }}{% endmacro %}{{ m(1) }}", "{{ 'a b'.split() }}", "{% raw %}{{ x }}{% endraw %}",
		"{{ raise_exception('no') }}", "{{ 1 // 0 }}", "{{ x.y.z }}", "{# c #}  {% if true %}\n  a\n{% endif %}",
		"{{ 2**64 // 3 }}{{ 9007199254740993 == 9007199254740992.0 }}", "{{ '\\u3000 a\\x1c'.strip() }}{{ x|center(9) }}",
		"{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
	} {
		f.Add(s)
	}
	vars := NewDict()
	msgs, _ := FromJSON([]byte(`[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":{"a":1,"n":12345678901234567890}}}]}]`))
	vars.Set("messages", msgs)
	vars.Set("add_generation_prompt", true)
	vars.Set("x", "text")
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	f.Fuzz(func(t *testing.T, src string) {
		tmpl, err := Compile(src)
		if err != nil {
			return
		}
		tmpl.MaxSteps = fuzzSteps
		tmpl.Now = func() time.Time { return now }
		before := allocatedBytes()
		out, err := tmpl.Render(vars)
		if n := allocatedBytes() - before; n > fuzzAllocLimit {
			t.Fatalf("render allocated %d bytes within %d steps (err %v) for %q", n, fuzzSteps, err, src)
		}
		if len(out) > maxOutput {
			t.Fatalf("output of %d bytes, past the %d limit, for %q", len(out), maxOutput, src)
		}
		out2, err2 := tmpl.Render(vars)
		if out2 != out || fmt.Sprint(err2) != fmt.Sprint(err) {
			t.Fatalf("two renders of %q differ:\n%q, %v\n%q, %v", src, out, err, out2, err2)
		}
	})
}

// allocatedBytes is the heap allocated so far by the process.
func allocatedBytes() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// FuzzMessages renders the real templates on arbitrary message JSON.
func FuzzMessages(f *testing.F) {
	var tmpls []*Template
	for _, name := range []string{"qwen3", "deepseek_v3"} {
		src, err := os.ReadFile(filepath.Join(chatData, "templates", name+".jinja"))
		if err != nil {
			f.Fatal(err)
		}
		tmpl, err := Compile(string(src))
		if err != nil {
			f.Fatal(err)
		}
		tmpls = append(tmpls, tmpl)
	}
	raw, err := os.ReadFile(filepath.Join(chatData, "cases.json"))
	if err != nil {
		f.Fatal(err)
	}
	var cases map[string]struct {
		Messages json.RawMessage `json:"messages"`
		Tools    json.RawMessage `json:"tools"`
	}
	if err := json.Unmarshal(raw, &cases); err != nil {
		f.Fatal(err)
	}
	for _, c := range cases {
		f.Add([]byte(c.Messages), []byte(c.Tools))
	}
	f.Fuzz(func(t *testing.T, msgs, tools []byte) {
		mv, err := FromJSON(msgs)
		if err != nil {
			return
		}
		tv, err := FromJSON(tools)
		if err != nil {
			tv = nil
		}
		vars := NewDict()
		vars.Set("messages", mv)
		vars.Set("tools", tv)
		vars.Set("add_generation_prompt", true)
		for _, tmpl := range tmpls {
			_, _ = tmpl.Render(vars)
		}
	})
}

// FuzzFromJSON checks the hand-written JSON parser against encoding/json:
// same accept/reject decision, and the same value.
func FuzzFromJSON(f *testing.F) {
	for _, s := range []string{`{"a":[1,2.5,"x\u00e9\ud83d\ude00"],"b":null,"c":true}`, `[]`, `"\n"`, `-0.1e3`, `{"a":1}x`, `[1,]`, `"\ud800"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		v, err := FromJSON(raw)
		var std any
		stdErr := json.Unmarshal(raw, &std)
		var rangeErr *json.UnmarshalTypeError
		if errors.As(stdErr, &rangeErr) {
			return // out-of-range numbers: Python reads inf, encoding/json refuses
		}
		if (err == nil) != (stdErr == nil) {
			t.Fatalf("FromJSON err %v, encoding/json err %v for %q", err, stdErr, raw)
		}
		if err != nil {
			return
		}
		// Compare through a canonical re-encoding of both.
		ours, err := toJSON(v, nil, true)
		if err != nil {
			t.Fatal(err)
		}
		var back any
		if err := json.Unmarshal([]byte(ours), &back); err != nil {
			t.Fatalf("tojson output %q is not JSON: %v", ours, err)
		}
		// Python reads "-0" as the int 0; encoding/json as float -0.
		a, _ := json.Marshal(noNegZero(back))
		b, _ := json.Marshal(noNegZero(std))
		if string(a) != string(b) {
			t.Fatalf("value differs for %q:\n ours %s\n std  %s", raw, a, b)
		}
	})
}

func noNegZero(v any) any {
	switch v := v.(type) {
	case float64:
		if v == 0 {
			return 0.0
		}
	case []any:
		for i := range v {
			v[i] = noNegZero(v[i])
		}
	case map[string]any:
		for k := range v {
			v[k] = noNegZero(v[k])
		}
	}
	return v
}

// FuzzArrayElems checks ArrayElems + FromJSONElem against FromJSON: when
// the split succeeds and every element decodes, FromJSON gives the list of
// those values; a valid array always splits; and whatever FromJSON rejects
// never decodes element by element.
func FuzzArrayElems(f *testing.F) {
	for _, s := range []string{`[]`, ` [1, "a\"b\\", {"x":[1,{}]}, null] `, `[1,]`, `[,1]`, `[1 2]`, `[{"a":"]"}]`, `["\\"]`, `[[[]]]`, `[{]}]`, `[1]x`, `[tru]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		whole, wholeErr := FromJSON(raw)
		elems, ok := ArrayElems(raw)
		if !ok {
			if l, isList := whole.(*List); wholeErr == nil && isList {
				t.Fatalf("valid array %q (%d items) did not split", raw, len(l.Items))
			}
			return
		}
		items := make([]Value, len(elems))
		for i, e := range elems {
			v, err := FromJSONElem(e)
			if err != nil {
				return // the caller falls back to FromJSON
			}
			items[i] = v
		}
		if wholeErr != nil {
			t.Fatalf("%q: elements %q decode but FromJSON fails: %v", raw, elems, wholeErr)
		}
		l, isList := whole.(*List)
		if !isList || len(l.Items) != len(items) {
			t.Fatalf("%q: split into %d elements, FromJSON gives %#v", raw, len(items), whole)
		}
		for i := range items {
			a, _ := toJSON(items[i], nil, false)
			b, _ := toJSON(l.Items[i], nil, false)
			if a != b || typeName(items[i]) != typeName(l.Items[i]) {
				t.Fatalf("%q element %d: %s, FromJSON %s", raw, i, a, b)
			}
		}
	})
}
