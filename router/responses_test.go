package router

import (
	"encoding/json"
	"errors"
	"testing"
)

// TestResponsesMessages: the chat messages the router derives from a
// Responses body are the ones vLLM renders; what it cannot derive leaves
// the prompt unknown.
func TestResponsesMessages(t *testing.T) {
	for _, c := range []struct {
		name, body string
		want       string // the messages; "" when the prompt is unknown
	}{
		{"string input", `{"model":"m","input":"hi"}`, `[{"role":"user","content":"hi"}]`},
		{"instructions", `{"model":"m","instructions":"be brief","input":"hi"}`,
			`[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]`},
		{"empty instructions are skipped", `{"model":"m","instructions":"","input":"hi"}`, `[{"role":"user","content":"hi"}]`},
		{"null instructions", `{"model":"m","instructions":null,"input":"hi"}`, `[{"role":"user","content":"hi"}]`},
		{"escapes kept", `{"model":"m","input":"a\"b\u00e9\n"}`, `[{"role":"user","content":"a\"b\u00e9\n"}]`},
		{"message items", `{"model":"m","input":[{"role":"developer","content":"rules"},{"type":"message","role":"user","content":"q","id":"msg_1"},{"role":"assistant","content":[{"type":"output_text","text":"a","annotations":[]}]}]}`,
			`[{"role":"developer","content":"rules"},{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"text","text":"a"}]}]`},
		{"text parts", `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"x"},{"type":"text","text":"y"}]}]}`,
			`[{"role":"user","content":[{"type":"text","text":"x"},{"type":"text","text":"y"}]}]`},
		{"empty tools are no tools", `{"model":"m","input":"hi","tools":[]}`, `[{"role":"user","content":"hi"}]`},
		{"tools", `{"model":"m","input":"hi","tools":[{"type":"function","name":"f"}]}`, ""},
		{"previous response", `{"model":"m","input":"hi","previous_response_id":"resp_1"}`, ""},
		{"prompt template", `{"model":"m","input":"hi","prompt":{"id":"pmpt_1"}}`, ""},
		{"function call output", `{"model":"m","input":[{"type":"function_call_output","call_id":"c","output":"1"}]}`, ""},
		{"image part", `{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"data:,"}]}]}`, ""},
		{"item without role", `{"model":"m","input":[{"content":"x"}]}`, ""},
		{"empty input array", `{"model":"m","input":[]}`, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			var r Request
			if err := ParseRequest(EndpointResponses, []byte(c.body), &r); err != nil {
				t.Fatal(err)
			}
			if c.want == "" {
				if !r.PromptUnknown || r.Chat.Messages != nil || r.TextBytes == 0 {
					t.Fatalf("prompt unknown %v, messages %s, text bytes %d", r.PromptUnknown, r.Chat.Messages, r.TextBytes)
				}
				return
			}
			if r.PromptUnknown || string(r.Chat.Messages) != c.want || !r.Chat.AddGenerationPrompt || r.Chat.Body != nil {
				t.Fatalf("messages %s (unknown %v, generation prompt %v), want %s", r.Chat.Messages, r.PromptUnknown, r.Chat.AddGenerationPrompt, c.want)
			}
		})
	}
}

func FuzzParseResponses(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","input":"hi","instructions":"x","stream":true}`,
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"x"}]},{"type":"message","role":"assistant","content":"y"}]}`,
		`{"model":"m","input":[{"type":"function_call","name":"f","arguments":"{}"}],"tools":[{}]}`,
		`{"input":"x"}`, `{"model":"m","input":[1,null,{}]}`, `{"model":"m","input":[{"role":1,"content":[{"type":"input_text"}]}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var r Request
		err := ParseRequest(EndpointResponses, body, &r)
		if err != nil {
			var br *BadRequest
			if !errors.As(err, &br) {
				t.Fatalf("non-client error %v", err)
			}
			return
		}
		if r.PromptUnknown {
			return
		}
		var msgs []struct {
			Role    *string         `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if err := json.Unmarshal(r.Chat.Messages, &msgs); err != nil || len(msgs) == 0 {
			t.Fatalf("messages %q from %q: %v", r.Chat.Messages, body, err)
		}
		for _, m := range msgs {
			if m.Role == nil || len(m.Content) == 0 {
				t.Fatalf("message without role or content in %q from %q", r.Chat.Messages, body)
			}
		}
	})
}
