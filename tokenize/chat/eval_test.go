package chat

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestRenderExpressions(t *testing.T) {
	tests := []struct {
		src, want string
		err       bool
	}{
		{src: `{{ [1,2,3,4,5][1:4] }}`, want: `[2, 3, 4]`},
		{src: `{{ [1,2,3,4,5][::-2] }}`, want: `[5, 3, 1]`},
		{src: `{{ [1,2,3][0:10:9223372036854775807] }}`, want: `[1]`},
		{src: `{{ [1,2,3][5:0:-9223372036854775807] }}`, want: `[3]`},
		{src: `{{ "héllo"[1:3] }}`, want: `él`},
		{src: `{{ none }}|{{ true }}|{{ 1.0 }}|{{ 1e-05 }}|{{ 1e16 }}|{{ 0.1 + 0.2 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 / 2 }}`, want: `None|True|1.0|1e-05|1e+16|0.30000000000000004|3|-4|3.5`},
		{src: `{{ {"b": 1, "a": [1.5, none, "é\n"]} | tojson }}`, want: `{"b": 1, "a": [1.5, null, "é\n"]}`},
		{src: `{{ {"b": 1, "a": 2} | tojson(indent=2) }}`, want: "{\n  \"b\": 1,\n  \"a\": 2\n}"},
		{src: `{{ {'a': 'x', "b": none} }}`, want: `{'a': 'x', 'b': None}`},
		{src: `{{ "it's" ~ 1 }}`, want: `it's1`},
		{src: `{{ ["it's"] }}`, want: `["it's"]`},
		{src: `{% for k, v in {"x": 1, "y": 2}.items() %}{{ k }}={{ v }}{% if not loop.last %},{% endif %}{% endfor %}`, want: `x=1,y=2`},
		{src: `{% for i in range(5) if i is odd %}{{ loop.index }}/{{ loop.length }}{% else %}none{% endfor %}`, want: `1/22/2`},
		{src: `{% for i in [] %}x{% else %}empty{% endfor %}`, want: `empty`},
		{src: `{% for i in range(10) %}{% if i == 3 %}{% break %}{% endif %}{% if i == 1 %}{% continue %}{% endif %}{{ i }}{% endfor %}`, want: `02`},
		{src: `{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}`, want: `1`},
		{src: `{% set ns = namespace(x=1) %}{% for i in [1] %}{% set ns.x = 2 %}{% endfor %}{{ ns.x }}`, want: `2`},
		{src: `{% macro m(a, b="d") %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(1, b=2) }}`, want: `[1d][12]`},
		// Names resolve to compile-time slots: the innermost loop's loop, a
		// loop variable shadowing a top-level set only inside the loop, a
		// macro reading the scope it was defined in, a set inside an if.
		{src: `{% for a in [1,2] %}{% for b in [3] %}{{ a }}{{ b }}{{ loop.index }}{% endfor %}{{ loop.index }}{% endfor %}`, want: `13112312`},
		{src: `{% set x = 'out' %}{% macro m() %}{{ x }}{% endmacro %}{% for x in ['in'] %}{{ x }}{% endfor %}{{ m() }}{{ x }}`, want: `inoutout`},
		{src: `{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}`, want: `321`},
		{src: `{% if true %}{% set t = 1 %}{% endif %}{{ t }}`, want: `1`},
		{src: `{{ {'items': 1}['items'] }}|{{ {'items': 1}.items() }}|{{ {'a': 1}['b'] is defined }}`, want: `1|[('items', 1)]|False`},
		{src: `{{ "  a b  ".strip() }}|{{ "xxaxx".strip("x") }}|{{ "a,b".split(",") }}|{{ "Ab".upper() }}|{{ "ab".startswith(("x", "a")) }}`, want: `a b|a|['a', 'b']|AB|True`},
		{src: `{{ x is defined }}|{{ x is none }}|{{ 3 is divisibleby 3 }}|{{ "a" is string }}|{{ {} is mapping }}`, want: `False|False|True|True|True`},
		{src: `{{ [3,1,2]|sort|join(",") }}|{{ [1,1,2]|unique|list|length }}|{{ [{"a":1},{"a":2}]|map(attribute="a")|list }}|{{ [{"t":"x"},{"t":"y"}]|selectattr("t","equalto","y")|list|length }}`, want: `1,2,3|2|[1, 2]|1`},
		{src: `{{ x|default("d") }}|{{ ""|default("d", true) }}|{{ "ab"|length }}|{{ " a "|trim }}|{{ "a\nb"|indent(2) }}`, want: "d|d|2|a|a\n  b"},
		{src: "{% if true %}\n  x\n{% endif %}\n  {%- if true %}y{% endif %}", want: "  x\ny"},
		{src: "a\n  {% if true %}b{% endif %}\nc", want: "a\nbc"},
		{src: "a {{- ' b ' -}} c", want: "a b c"},
		{src: "{# comment #}\nx{% raw %}{{ y }}{% endraw %}\n", want: "x{{ y }}"},
		{src: `{{ '%s-%d' % ('a', 3) }}|{{ '%s' % 'a' }}|{{ "%s"|format(1) }}|{{ '%(k)s' % {'k': 'v'} }}`, want: `a-3|a|1|v`},
		{src: `{{ (1,2) }}|{{ (1,) }}|{{ {'a':1}|items|list }}|{{ {'b':1,'a':2}|dictsort }}|{{ (1,2) == [1,2] }}`, want: `(1, 2)|(1,)|[('a', 1)]|[('a', 2), ('b', 1)]|False`},
		{src: `{{ 2.5|round }}|{{ 3.5|round }}|{{ "it's a-b"|title }}|{{ "it's".title() }}`, want: `2.0|4.0|It's A-B|It'S`},
		{src: `{{ {}.items == {}.items }}|{{ x == y }}|{{ x is sameas y }}|{{ range == range }}`, want: `False|True|False|True`},
		{src: `{{ "a" + "b" + none is none }}`, err: true},
		{src: `{{ "a" + "b" + "c" ~ 1 + "d" }}|{{ [1] + [2] + [3] }}`, want: `abc1d|[1, 2, 3]`},
		{src: `{{ "a" + 1 }}`, err: true},
		{src: `{{ x.y }}`, err: true},
		{src: `{{ raise_exception("boom") }}`, err: true},
		{src: `{{ 1 in none }}`, err: true},
		{src: `{{ [].append(1) }}`, err: true},
		// Deliberate limit: Python renders this; a chat template never needs it.
		{src: `{{ "x" * 100000000 }}`, err: true},
		{src: `{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}`, err: true},
		{src: `{% for %}`, err: true},
		{src: `{{ 1 +`, err: true},
	}
	for _, tc := range tests {
		t.Run(tc.src, func(t *testing.T) {
			tmpl, err := Compile(tc.src)
			var got string
			if err == nil {
				got, err = tmpl.Render(NewDict())
			}
			if tc.err {
				if err == nil {
					t.Fatalf("want an error, got %q", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestStrftimeNow(t *testing.T) {
	tmpl, err := Compile(`{{ strftime_now("%d %b %Y %H:%M") }}`)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.Now = func() time.Time { return time.Date(2026, 7, 4, 9, 5, 0, 0, time.UTC) }
	got, err := tmpl.Render(NewDict())
	if err != nil || got != "04 Jul 2026 09:05" {
		t.Fatalf("got %q %v", got, err)
	}
}

func TestStepLimit(t *testing.T) {
	tmpl, err := Compile(`{% for i in range(99999) %}{% for j in range(99999) %}x{% endfor %}{% endfor %}`)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.MaxSteps = 10000
	if _, err := tmpl.Render(NewDict()); err == nil || !strings.Contains(err.Error(), "step limit") {
		t.Fatalf("err %v, want the step limit", err)
	}
}

// TestRenderBudget: templates that make builtins do far more work than
// they have expressions fail on the step budget (or the size limit). Each
// loop below runs a thousand times, a few thousand steps of its own: only
// the work its builtins spend exceeds the 100,000 steps.
func TestRenderBudget(t *testing.T) {
	for _, src := range []string{
		// A str or list doubling: 2^40 bytes or items without limits.
		`{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}`,
		`{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s + ns.s %}{% endfor %}{{ ns.s|length }}`,
		`{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}`,
		// Scans of a long str, one expression each.
		`{% set s = 'x' * 1000000 %}{% for i in range(1000) %}{{ s|length }}{% endfor %}`,
		`{% set s = 'x' * 1000000 %}{% for i in range(1000) %}{% if 'y' in s %}{% endif %}{% endfor %}`,
		`{% set s = 'x' * 1000000 %}{% for i in range(1000) %}{{ s.startswith('y') }}{% endfor %}`,
		`{% set s = 'x' * 1000000 %}{% for i in range(1000) %}{{ s[999999] }}{% endfor %}`,
		`{% set s = 'x' * 1000000 %}{% for i in range(1000) %}{{ s[5:6] }}{% endfor %}`,
		`{% set s = 'x' * 1000000 %}{% for i in range(1000) %}{% for c in s %}{% break %}{% endfor %}{% endfor %}`,
		// Lists: search, sort, comparison item by item.
		`{% set l = range(100000)|list %}{% for i in range(1000) %}{% if -1 in l %}{% endif %}{% endfor %}`,
		`{% set l = range(100000)|list %}{% for i in range(1000) %}{{ l.count(-1) }}{% endfor %}`,
		`{% for i in range(1000) %}{{ (range(100000)|list|sort)[0] }}{% endfor %}`,
		`{% set a = range(100000)|batch(10)|list %}{% set b = range(100000)|batch(10)|list %}{% for i in range(1000) %}{{ a == b }}{% endfor %}`,
		// Values a single call would make huge.
		`{{ range(100000)|map(attribute='x', default='y' * 1000000)|join }}`,
		`{{ range(100000)|map(attribute='x', default=range(100000)|list) }}`,
		`{{ range(100000)|map(attribute='x', default=range(100000)|list)|tojson }}`,
		`{{ ('y' * 1000000)|replace('y', 'y' * 1000000) }}`,
		`{{ ('\n' * 1000000)|indent('y' * 1000000, true, true) }}`,
		// Big ints cost by their size.
		`{% set ns = namespace(n=3) %}{% for i in range(1000) %}{% set ns.n = (ns.n * ns.n) % (10**2000) + 10**2000 %}{% endfor %}`,
	} {
		tmpl, err := Compile(src)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		tmpl.MaxSteps = 100_000
		if out, err := tmpl.Render(NewDict()); err == nil {
			t.Errorf("%.90s: rendered %d bytes within 100,000 steps", src, len(out))
		} else if !strings.Contains(err.Error(), "step limit") && !strings.Contains(err.Error(), "too large") && !strings.Contains(err.Error(), "size limit") {
			t.Errorf("%.90s: %v, want a step or size limit", src, err)
		}
	}
	// Real chats stay far below the default budget: qwen3 on 3,000
	// messages spends its loop steps, not quadratic work.
	var msgs []string
	for i := range 3000 {
		msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":"message %d %s"}`, i, strings.Repeat("text ", 100)))
	}
	mv, err := FromJSON([]byte("[" + strings.Join(msgs, ",") + "]"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join(chatData, "templates", "qwen3.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := Compile(string(src))
	if err != nil {
		t.Fatal(err)
	}
	tmpl.MaxSteps = 1_000_000 // a tenth of the default
	vars := NewDict()
	vars.Set("messages", mv)
	if _, err := tmpl.Render(vars); err != nil {
		t.Fatalf("3,000 messages within a million steps: %v", err)
	}
}
