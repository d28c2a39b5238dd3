package chat

import (
	"math"
	"strings"
	"testing"
)

// TestPythonEdges checks Python semantics (numbers mostly) the golden renders cannot
// hold (errors end a render) or do not reach. The expected values are
// Python 3.11 with jinja2 3.1.6, rendered as testdata/chat/README.md says.
func TestPythonEdges(t *testing.T) {
	vars := NewDict()
	vars.Set("inf", math.Inf(1))
	vars.Set("nan", math.NaN())
	x, err := FromJSON([]byte("12345678901234567890"))
	if err != nil {
		t.Fatal(err)
	}
	vars.Set("x", x)
	tests := []struct {
		src, want string
		err       string // a prefix of the error, when Python raises
	}{
		{src: `{{ 15|round(-1) }}|{{ 25|round(-1) }}|{{ 2.675|round(2) }}|{{ 1234.5|round(-2) }}|{{ 2.5|round(0, 'ceil') }}|{{ 5|round(-1, 'floor') }}|{{ 0.125|round(2) }}|{{ 0.375|round(2) }}|{{ -0.4|round }}`,
			want: `20|20|2.67|1200.0|3.0|0.0|0.12|0.38|-0.0`},
		{src: `{{ ['B','a']|max }}|{{ ['a','A','b']|unique|list }}|{{ [1, 1.0, true, 2]|unique|list }}|{{ [(1,2),(1.0,2)]|unique|list }}`,
			want: `B|['a', 'b']|[1, 2]|[(1, 2)]`},
		{src: `{{ [[1],[1]]|unique|list }}`, err: "TypeError"},
		{src: `{{ '%#o|%#x|%5.1d|%.3d|% d|%030d' % (8, 255, 3, 5, 5, -5) }}`, want: `0o10|0xff|    3|005| 5|-00000000000000000000000000005`},
		{src: `{{ '%f|%5.1F|%-6e|%g|%+f|%G' % (inf, -inf, nan, 1e-5, inf, nan) }}`, want: `inf| -INF|nan   |1e-05|+inf|NAN`},
		{src: `{{ x|string|length }}|{{ (x*x)|tojson }}|{{ -x // 10 }}|{{ x % -10 }}`, want: `20|152415787532388367501905199875019052100|-1234567890123456789|0`},
		{src: `{{ range(2**63 - 2, 2**63 + 1)|list }}`, want: `[9223372036854775806, 9223372036854775807, 9223372036854775808]`},
		{src: `{{ 3.0 is odd }}|{{ 3.5 is odd }}|{{ 3.0 is divisibleby 1.5 }}|{{ 7.5 // 2 }}|{{ -7.5 // 2 }}|{{ -7.5 % 2 }}|{{ 7.5 % -2 }}|{{ -0.0 // 1 }}`,
			want: `True|False|True|3.0|-4.0|0.5|-0.5|-0.0`},
		{src: `{{ '١٢٣'|int }}|{{ '١٢٣'|float }}|{{ ' 0x1F '|int(base=0) }}|{{ '010'|int(base=0) }}|{{ '000'|int(base=0) }}|{{ '0_x1'|int(base=0) }}|{{ '0x_1f'|int(base=16) }}|{{ '1__0'|float }}|{{ '_1'|float }}|{{ '1_'|float }}|{{ '.5'|float }}|{{ '5.'|float }}|{{ 'Infinity'|float }}|{{ '-nan'|float }}|{{ '1e400'|float }}`,
			want: `123|123.0|31|10|0|0|31|0.0|0.0|0.0|0.5|5.0|inf|nan|inf`},
		{src: `{{ true + true }}|{{ +true }}|{{ 'a' * true }}|{{ -true }}|{{ 2**-1 }}|{{ (-2)**-1 }}`, want: `2|1|a|-1|0.5|-0.5`},
		{src: `{{ nan|int }}|{{ inf|round }}|{{ x|float }}|{{ nan == nan }}|{{ nan < 1 }}|{{ nan != nan }}|{{ 1e308 * 10 }}|{{ x * 1e300 }}`,
			want: `0|inf|1.2345678901234567e+19|False|False|True|inf|inf`},
		{src: `{{ 10**4299 > 0 }}`, want: `True`},
		{src: `{{ [1,[2]]|tojson(indent=-1) }}|{{ {'a':[1]}|tojson(indent=0) }}`, want: "[\n1,\n[\n2\n]\n]|{\n\"a\": [\n1\n]\n}"},
		{src: `{{ '%05s|%-010s|%10.2s|%010r' % ('a','b','xyz', 'q') }}|{{ 'a b c d e f g'|truncate(5, false, '..', 0) }}`, want: `    a|b         |        xy|       'q'|a..`},
		{src: `{{ 'abc'|truncate(2) }}`, err: "AssertionError"},
		{src: `{{ inf|int }}`, err: "OverflowError"},
		{src: `{{ inf|round(0, 'ceil') }}`, err: "OverflowError"},
		{src: `{{ nan|round(1, 'floor') }}`, err: "ValueError"},
		{src: `{{ (10**400)|float }}`, err: "OverflowError"},
		{src: `{{ 'a' * 2**70 }}`, err: "OverflowError"},
		{src: `{{ 'a' * -(2**70) }}`, err: "OverflowError"},
		{src: `{{ 0 ** -1 }}`, err: "ZeroDivisionError"},
		{src: `{{ 10.0 ** 400 }}`, err: "OverflowError"},
		{src: `{{ (10**400) / 3 }}`, err: "OverflowError"},
		{src: `{{ x // 0 }}`, err: "ZeroDivisionError"},
		{src: `{{ range(3.0) }}`, err: "TypeError"},
		// Python prints neither; this renderer refuses to compute them.
		{src: `{{ 10 ** 5000 }}`, err: "ValueError"},
		{src: `{{ (10 ** 2200) * (10 ** 2200) }}`, err: "ValueError"},
		{src: `{{ 2 ** 100000000000 }}`, err: "ValueError"},
		{src: `{{ 1` + strings.Repeat("0", 4300) + ` }}`, err: "TemplateSyntaxError"},
	}
	for _, tt := range tests {
		tmpl, err := Compile(tt.src)
		if err != nil {
			if tt.err != "" && strings.HasPrefix(err.Error(), tt.err) {
				continue
			}
			t.Errorf("%.80s: compile: %v", tt.src, err)
			continue
		}
		got, err := tmpl.Render(vars)
		switch {
		case tt.err != "" && (err == nil || !strings.HasPrefix(err.Error(), tt.err)):
			t.Errorf("%.80s: got %q, %v; want a %s", tt.src, got, err, tt.err)
		case tt.err == "" && err != nil:
			t.Errorf("%.80s: %v", tt.src, err)
		case tt.err == "" && got != tt.want:
			t.Errorf("%.80s:\n got %s\nwant %s", tt.src, got, tt.want)
		}
	}
}

// TestJSONIntegers: integers keep their precision from JSON to tojson, as
// json.loads + json.dumps keep them, up to Python's 4300-digit limit.
func TestJSONIntegers(t *testing.T) {
	for _, in := range []string{
		`[9223372036854775807, -9223372036854775808, 9223372036854775808, -9223372036854775809, 12345678901234567890, 1e400, -0, -0.0]`,
		`{"a": {"default": 340282366920938463463374607431768211457}}`,
		"[" + strings.Repeat("9", 4300) + "]",
	} {
		v, err := FromJSON([]byte(in))
		if err != nil {
			t.Fatalf("%.60s: %v", in, err)
		}
		got, err := toJSON(v, nil, false)
		if err != nil {
			t.Fatal(err)
		}
		want := strings.NewReplacer("1e400", "Infinity", "-0,", "0,").Replace(in)
		if got != want {
			t.Errorf("tojson(FromJSON(%.60s)) = %.60s", in, got)
		}
	}
	if _, err := FromJSON([]byte("[" + strings.Repeat("9", 4301) + "]")); err == nil {
		t.Error("an integer of 4301 digits decoded; Python's json.loads refuses it")
	}
}
