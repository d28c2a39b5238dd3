package router

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/valyala/fastjson"
)

func TestParseRequest(t *testing.T) {
	cases := []struct {
		name string
		ep   Endpoint
		body string
		want Request // Endpoint and Chat.Body are filled in by the test
	}{
		{"completion text", EndpointCompletions, `{"model":"m","prompt":"hello","max_tokens":3}`,
			Request{Model: "m", PromptText: "hello", BatchSize: 1, AddSpecialTokens: true}},
		{"completion ids", EndpointCompletions, `{"model":"m","prompt":[1,2,4294967295]}`,
			Request{Model: "m", PromptIDs: []uint32{1, 2, 4294967295}, HasIDs: true, BatchSize: 1, AddSpecialTokens: true}},
		{"batch of strings routes by the first", EndpointCompletions, `{"model":"m","prompt":["a","b","c"]}`,
			Request{Model: "m", PromptText: "a", BatchSize: 3, AddSpecialTokens: true}},
		{"batch of id lists", EndpointCompletions, `{"model":"m","prompt":[[5,6],[7]]}`,
			Request{Model: "m", PromptIDs: []uint32{5, 6}, HasIDs: true, BatchSize: 2, AddSpecialTokens: true}},
		{"stream, usage, salt, no special tokens", EndpointCompletions,
			`{"model":"m","prompt":"x","stream":true,"stream_options":{"include_usage":true},"cache_salt":"s1","add_special_tokens":false}`,
			Request{Model: "m", PromptText: "x", BatchSize: 1, Stream: true, IncludeUsage: true, CacheSalt: "s1"}},
		{"nulls are absent", EndpointCompletions, `{"model":"m","prompt":"x","stream":null,"stream_options":null,"cache_salt":null}`,
			Request{Model: "m", PromptText: "x", BatchSize: 1, AddSpecialTokens: true}},
		{"unicode escapes", EndpointCompletions, `{"model":"m\u00e9","prompt":"caf\u00e9 \ud83d\ude00"}`,
			Request{Model: "mé", PromptText: "café 😀", BatchSize: 1, AddSpecialTokens: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got Request
			if err := ParseRequest(c.ep, []byte(c.body), &got); err != nil {
				t.Fatal(err)
			}
			c.want.Endpoint = c.ep
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got %+v\nwant %+v", got, c.want)
			}
		})
	}
}

func TestParseChat(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}],` +
		`"tools":[{"type":"function","function":{"name":"f","parameters":{"b":1,"a":2}}}],"chat_template_kwargs":{"enable_thinking":false},"stream":true}`
	var r Request
	if err := ParseRequest(EndpointChat, []byte(body), &r); err != nil {
		t.Fatal(err)
	}
	if r.Model != "m" || !r.Stream || r.AddSpecialTokens || !r.Chat.AddGenerationPrompt || r.Chat.ContinueFinalMessage {
		t.Fatalf("flags: %+v", r)
	}
	// Key order must survive: tools | tojson depends on it.
	if string(r.Chat.Tools) != `[{"type":"function","function":{"name":"f","parameters":{"b":1,"a":2}}}]` {
		t.Fatalf("tools %s", r.Chat.Tools)
	}
	var msgs []map[string]any
	if err := json.Unmarshal(r.Chat.Messages, &msgs); err != nil || len(msgs) != 2 {
		t.Fatalf("messages %s: %v", r.Chat.Messages, err)
	}
	if string(r.Chat.ChatTemplateKwargs) != `{"enable_thinking":false}` || string(r.Chat.Body) != body {
		t.Fatalf("kwargs %s / body kept %v", r.Chat.ChatTemplateKwargs, string(r.Chat.Body) == body)
	}

	// continue_final_message alone turns the implicit generation prompt off.
	if err := ParseRequest(EndpointChat, []byte(`{"model":"m","messages":[{"role":"assistant","content":"x"}],"continue_final_message":true}`), &r); err != nil {
		t.Fatal(err)
	}
	if r.Chat.AddGenerationPrompt || !r.Chat.ContinueFinalMessage {
		t.Fatalf("continue_final_message: %+v", r.Chat)
	}
	if err := ParseRequest(EndpointChat, []byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"chat_template":"{{x}}"}`), &r); err != nil || !r.CustomTemplate {
		t.Fatalf("custom template: %v %v", err, r.CustomTemplate)
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		ep         Endpoint
		body       string
		param, msg string
	}{
		{EndpointCompletions, `{"model":"m","prompt":"x"`, "", "not valid JSON"},
		{EndpointCompletions, `null`, "", "JSON object"},
		{EndpointCompletions, `{"model":"","prompt":"x"}`, "model", "empty"},
		{EndpointCompletions, `{"model":["m"],"prompt":"x"}`, "model", "string"},
		{EndpointCompletions, `{"model":"m","prompt":""}`, "prompt", "empty"},
		{EndpointCompletions, `{"model":"m","prompt":true}`, "prompt", "must be"},
		{EndpointCompletions, `{"model":"m","prompt":[null]}`, "prompt[0]", "must be"},
		{EndpointCompletions, `{"model":"m","prompt":[1,"a"]}`, "prompt[1]", "integers"},
		{EndpointCompletions, `{"model":"m","prompt":[4294967296]}`, "prompt[0]", "below 2^32"},
		{EndpointCompletions, `{"model":"m","prompt":[1e400]}`, "prompt[0]", "below 2^32"},
		{EndpointCompletions, `{"model":"m","prompt":["a",""]}`, "prompt[1]", "empty"},
		{EndpointCompletions, `{"model":"m","prompt":[[1],[]]}`, "prompt[1]", "empty"},
		{EndpointCompletions, `{"model":"m","prompt":[[1],[-1]]}`, "prompt[1][0]", "non-negative"},
		{EndpointCompletions, `{"model":"m","prompt":"x","stream_options":{"include_usage":1}}`, "stream_options.include_usage", "boolean"},
		{EndpointCompletions, `{"model":"m","prompt":"x","stream_options":[]}`, "stream_options", "object"},
		{EndpointCompletions, `{"model":"m","prompt":"x","cache_salt":""}`, "cache_salt", "non-empty"},
		{EndpointCompletions, `{"model":"m","prompt":"x","add_special_tokens":"no"}`, "add_special_tokens", "boolean"},
		{EndpointChat, `{"model":"m","messages":[]}`, "messages", "empty"},
		{EndpointChat, `{"model":"m","messages":[1]}`, "messages[0]", "object"},
		{EndpointChat, `{"model":"m","messages":[{"role":1}]}`, "messages[0].role", "string"},
		{EndpointChat, `{"model":"m","messages":[{"role":"user"}],"chat_template_kwargs":[]}`, "chat_template_kwargs", "object"},
		{EndpointChat, `{"model":"m","messages":[{"role":"user"}],"add_generation_prompt":0}`, "add_generation_prompt", "boolean"},
		{EndpointChat, `{"model":"m","messages":[{"role":"user"}],"chat_template":5}`, "chat_template", "string"},
	}
	for i, c := range cases {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			var r Request
			err := ParseRequest(c.ep, []byte(c.body), &r)
			var br *BadRequest
			if !errors.As(err, &br) {
				t.Fatalf("%s: error %v, want a BadRequest", c.body, err)
			}
			if br.Param != c.param || !strings.Contains(br.Message, c.msg) {
				t.Fatalf("%s: got (%q, %q), want param %q and a message containing %q", c.body, br.Param, br.Message, c.param, c.msg)
			}
		})
	}
}

func TestUsageScannerAcrossChunkBoundaries(t *testing.T) {
	stream := "data: {\"choices\":[{\"text\":\"a\"}],\"usage\":null}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":64}}}\r\n\r\n" +
		"data: [DONE]\n\n"
	for split := 1; split < len(stream); split += 7 {
		var sc usageScanner
		for i := 0; i < len(stream); i += split {
			sc.Write([]byte(stream[i:min(i+split, len(stream))]))
		}
		u := sc.usage()
		if !u.known || !u.cachedKnown || u.cachedTokens != 64 || u.promptTokens != 100 {
			t.Fatalf("split %d: %+v", split, u)
		}
	}
	if u := usageFromBody([]byte(`{"usage":{"prompt_tokens":5,"prompt_tokens_details":null}}`)); !u.known || u.cachedKnown {
		t.Fatalf("null details: %+v", u)
	}
}

// FuzzParseRequest: any body parses or is rejected as a client error; the
// parser never panics and never returns an internal error.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hello"}`,
		`{"model":"m","prompt":[1,2,3],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","prompt":[[1],[2]]}`,
		`{"model":"m","prompt":["a","b"],"cache_salt":"x"}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[],"chat_template_kwargs":{}}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"continue_final_message":true,"add_generation_prompt":false}`,
		`{"model":1}`, `[]`, `{`, `{"model":"m","prompt":[1e99]}`, `{"model":"m","prompt":[ 01, 2 ]}`,
		`{"model":"m","prompt":[4294967295,0],"prompt":[1]}`, `{"prompt":[1 ,2],"model":"m"}`,
		`{"model":"m","prompt":"\u00e9\n\"x\"","n":-0.5e+3,"b":[true,false,null]}`, "{\"model\":\"m\",\"prompt\":\"a\u0001\"}",
	} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		ep := EndpointCompletions
		if chat {
			ep = EndpointChat
		}
		if json.Valid(body) {
			if err := strictJSON(body); err != nil {
				t.Fatalf("strict check rejects valid JSON %q: %v", body, err)
			}
		}
		r := acquireRequest()
		defer releaseRequest(r)
		err := ParseRequest(ep, body, r)
		if err != nil {
			var br *BadRequest
			if !errors.As(err, &br) {
				t.Fatalf("non-client error %v", err)
			}
			return
		}
		if !json.Valid(body) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
		if r.Model == "" || r.BatchSize < 1 {
			t.Fatalf("accepted without model or prompt: %+v", r)
		}
		if ep == EndpointCompletions && r.PromptText == "" && !r.HasIDs {
			t.Fatalf("accepted completion without prompt")
		}
		if ep == EndpointChat && !json.Valid(r.Chat.Messages) {
			t.Fatalf("accepted chat with messages span %q", r.Chat.Messages)
		}
		if r.HasIDs {
			// The fast id scanner must agree with the checked path.
			var slow []uint32
			var p fastjson.Parser
			v, _ := p.ParseBytes(body)
			pv := member(v.GetObject(), "prompt")
			if a, _ := pv.Array(); len(a) > 0 && a[0].Type() == fastjson.TypeArray {
				a, _ = a[0].Array()
				slow, _ = appendIDs(nil, a, "prompt")
			} else {
				slow, _ = appendIDs(nil, a, "prompt")
			}
			if !slices.Equal(slow, r.PromptIDs) {
				t.Fatalf("ids %v, checked path %v", r.PromptIDs, slow)
			}
		}
	})
}

// FuzzUsageScanner: arbitrary streams never panic the scanner.
func FuzzUsageScanner(f *testing.F) {
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":1}}}\n\n"), 3)
	f.Add([]byte("data: {\"usage\": {\n"), 1)
	f.Fuzz(func(t *testing.T, stream []byte, split int) {
		if split <= 0 {
			split = 1
		}
		var sc usageScanner
		for i := 0; i < len(stream); i += split {
			sc.Write(stream[i:min(i+split, len(stream))])
		}
		_ = sc.usage()
		_ = usageFromBody(stream)
	})
}

// A chat body of about 4k tokens, the size the overhead goal names.
func bigChatBody() []byte {
	var msgs []string
	for i := 0; i < 20; i++ {
		msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":%q}`, strings.Repeat(fmt.Sprintf("turn %d says something about caching. ", i), 20)))
	}
	return []byte(`{"model":"m","stream":true,"messages":[` + strings.Join(msgs, ",") + `],"max_tokens":16}`)
}

// BenchmarkParse compares the single-pass parser against encoding/json
// decoding only the routing fields, on a ~16 KB chat body.
func BenchmarkParse(b *testing.B) {
	body := bigChatBody()
	b.Run("single-pass", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		r := acquireRequest()
		for b.Loop() {
			if err := ParseRequest(EndpointChat, body, r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		type fields struct {
			Model               string          `json:"model"`
			Messages            json.RawMessage `json:"messages"`
			Tools               json.RawMessage `json:"tools"`
			ChatTemplateKwargs  json.RawMessage `json:"chat_template_kwargs"`
			AddGenerationPrompt *bool           `json:"add_generation_prompt"`
			Stream              *bool           `json:"stream"`
			CacheSalt           *string         `json:"cache_salt"`
		}
		for b.Loop() {
			var f fields
			if err := json.Unmarshal(body, &f); err != nil {
				b.Fatal(err)
			}
		}
	})
}
