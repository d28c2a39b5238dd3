package tokenize

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixrouter/prefixrouter/tokenize/chat"
)

// TestValueCacheDecodesLikeFromJSON checks that decoding through the message
// cache, first on a miss and then on a hit, gives FromJSON's value and, for
// bad input, FromJSON's error (offsets included).
func TestValueCacheDecodesLikeFromJSON(t *testing.T) {
	long := strings.Repeat("x", 64)
	inputs := []string{
		``, ` `, `null`, `[]`, ` [ ] `, `{"a":1}`, `"s"`, `[1, 2.5, "x", null, true]`,
		`[{"role":"user","content":"` + long + `"},{"role":"assistant","content":"` + long + `","tool_calls":[{"function":{"name":"f","arguments":{"b":1,"a":[1.5,null]}}}]}]`,
		"\t[\n{\"role\": \"user\", \"content\": \"q\\\"uo\\\\\\\"te" + long + "\"}\r\n] \f",
		`[{"content":"` + long + `"},]`, `[,{"content":"` + long + `"}]`, `[{"content":"` + long + `"} {"a":1}]`,
		`[{"content":"` + long + `"}`, `[{"content":"` + long + `}]`, `[{"content":"` + long + `"]}]`,
		`[{"content":"` + long + `","n":01}]`, `[{"content":"` + long + `"}]x`, `[1 2]`, `[tru]`, `[-]`,
		`[{"content":"` + long + "\x01" + `"}]`, `[{"content":"\ud800` + long + `"}]`, `[{"c":"` + long + `"}, 1e400]`,
		`[` + strings.Repeat(`[`, 10001) + strings.Repeat(`]`, 10001) + `]`,
		`[` + strings.Repeat(`[`, 9998) + `"` + long + `"` + strings.Repeat(`]`, 9998) + `]`,
	}
	v := newValueCache(1<<20, newMetrics(nil))
	defer v.close()
	for _, in := range inputs {
		want, wantErr := (*valueCache)(nil).decode([]byte(in))
		for pass := 0; pass < 2; pass++ {
			got, err := v.decode([]byte(in))
			if fmt.Sprint(err) != fmt.Sprint(wantErr) {
				t.Fatalf("%.60q pass %d: err %v, want %v", in, pass, err, wantErr)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%.60q pass %d: value %#v, want %#v", in, pass, got, want)
			}
			v.c.Wait()
		}
	}
	if testutil.ToFloat64(v.metrics.msgHits) == 0 {
		t.Fatal("the second passes never hit the cache")
	}
}

// keyTemplate reads a message field it only finds when present, every
// message through loop state, and one message via a namespace copy that it
// then changes: renders that share cached messages must still differ
// wherever the requests do, and no render may change a cached message.
const keyTemplate = `{%- set ns = namespace(first=messages[0]) -%}
{%- for m in messages -%}
<{{ m.role }}|{{ m.content }}|{{ m.name if m.name is defined else "-" }}|{{ m.tool_calls | tojson if m.tool_calls is defined else "" }}|{{ loop.last }}>
{%- endfor -%}
{%- set ns.first = "changed" -%}
{%- set copy = dict(messages[0], role="changed") -%}
[{{ messages | length }}|{{ tools | tojson }}|{{ add_generation_prompt }}|{{ flag | default("none") }}]`

func TestMessageCacheKeepsRendersExact(t *testing.T) {
	long := strings.Repeat("long content ", 8)
	msg := func(role, extra string) string {
		return `{"role":"` + role + `","content":"` + long + `"` + extra + `}`
	}
	reqs := []ChatRequest{
		{Messages: json.RawMessage(`[` + msg("user", "") + `]`)},
		// The same message with one more field, and with the field changed.
		{Messages: json.RawMessage(`[` + msg("user", `,"name":"a"`) + `]`)},
		{Messages: json.RawMessage(`[` + msg("user", `,"name":"b"`) + `]`)},
		// Key order and whitespace are part of what the template sees
		// (tojson keeps order), so they must not share a decoded value.
		{Messages: json.RawMessage(`[` + msg("assistant", `,"tool_calls":[{"b":1,"a":2}]`) + `]`)},
		{Messages: json.RawMessage(`[` + msg("assistant", `,"tool_calls":[{"a":2,"b":1}]`) + `]`)},
		// Same messages, different position, tools, generation prompt and
		// kwargs: everything outside the messages still reaches the render.
		{Messages: json.RawMessage(`[` + msg("user", "") + `,` + msg("user", `,"name":"a"`) + `]`)},
		{Messages: json.RawMessage(`[` + msg("user", `,"name":"a"`) + `,` + msg("user", "") + `]`)},
		{Messages: json.RawMessage(`[` + msg("user", "") + `]`), Tools: json.RawMessage(`[{"type":"function","function":{"name":"` + long + `"}}]`)},
		{Messages: json.RawMessage(`[` + msg("user", "") + `]`), AddGenerationPrompt: true},
		{Messages: json.RawMessage(`[` + msg("user", "") + `]`), ChatTemplateKwargs: json.RawMessage(`{"flag":"` + long + `"}`)},
	}
	dir := tinyModelDir(t, keyTemplate)
	cold := NewRegistry(Options{CacheMaxBytes: -1, MessageCacheMaxBytes: -1})
	warm := NewRegistry(Options{})
	defer warm.Close()
	mc, err := cold.Add("m", dir, ModeLocal)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := warm.Add("m", dir, ModeLocal)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for pass := 0; pass < 3; pass++ {
		for i, req := range reqs {
			want, err := mc.RenderChat(req)
			if err != nil {
				t.Fatal(err)
			}
			got, err := mw.RenderChat(req)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("pass %d request %d: cached render %q, want %q", pass, i, got, want)
			}
			if j, dup := seen[got]; dup && j != i {
				t.Fatalf("requests %d and %d differ but render the same %q", j, i, got)
			}
			seen[got] = i
		}
		warm.values.c.Wait()
	}
	if testutil.ToFloat64(warm.metrics.msgHits) == 0 {
		t.Fatal("later passes never hit the message cache")
	}
}

// TestMessageCacheValuesImmutable renders templates that try to change the
// values they are given; the cached value must stay as decoded.
func TestMessageCacheValuesImmutable(t *testing.T) {
	raw := []byte(`[{"role":"user","content":"` + strings.Repeat("c", 64) + `","list":[1,2],"d":{"k":"v"}}]`)
	v := newValueCache(1<<20, newMetrics(nil))
	defer v.close()
	first, err := v.decode(raw)
	if err != nil {
		t.Fatal(err)
	}
	v.c.Wait()
	fresh, _ := chat.FromJSON(raw)
	for _, src := range []string{
		`{% set ns = namespace(x=messages[0]) %}{% set ns.x = 1 %}{{ messages[0].list.append(3) }}`,
		`{% set d = dict(messages[0], role="other") %}{{ messages[0].d.update({"k": 2}) }}`,
		`{% for m in messages %}{% set m = 1 %}{% endfor %}{% set messages = [] %}{{ messages[0].list.pop() }}`,
		`{{ (messages[0].list + [3]) | length }}{{ messages[0].list | reverse | list }}{{ messages[0].list | sort(reverse=true) }}{{ messages[0].items() | list }}`,
	} {
		tmpl, err := chat.Compile(src)
		if err != nil {
			t.Fatal(err)
		}
		cached, err := v.decode(raw)
		if err != nil {
			t.Fatal(err)
		}
		vars := chat.NewDict()
		vars.Set("messages", cached)
		_, _ = tmpl.Render(vars)
		if !reflect.DeepEqual(first, fresh) {
			t.Fatalf("after %q the cached message is %#v, want %#v", src, first, fresh)
		}
	}
}
