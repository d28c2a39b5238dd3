package tokenize

import (
	"encoding/json"
	"testing"
	"unicode/utf8"
)

// FuzzParseRenderResponse feeds arbitrary pod answers to the remote
// response parser: an error or ids, never a panic.
func FuzzParseRenderResponse(f *testing.F) {
	for _, s := range []string{`{"token_ids":[1,2]}`, `[{"prompt_token_ids":[3],"prompt":"x"}]`, `{"count":1,"tokens":[5]}`, `[]`, `{"tokens":[-1]}`, `null`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		_, ids, err := parseRenderResponse(raw)
		if err == nil && !json.Valid(raw) {
			t.Fatalf("accepted invalid JSON %q as ids %v", raw, ids)
		}
	})
}

// FuzzBytesChat renders arbitrary message JSON with the bytes model.
func FuzzBytesChat(f *testing.F) {
	f.Add([]byte(`[{"role":"user","content":"hi"}]`), []byte(`[{"type":"function"}]`), true)
	f.Add([]byte(`[{"role":"assistant","content":[{"text":"a"}],"tool_calls":[{}]}]`), []byte(``), false)
	m := Bytes()
	f.Fuzz(func(t *testing.T, msgs, tools []byte, gen bool) {
		prompt, ids, err := m.EncodeChat(ChatRequest{Messages: msgs, Tools: tools, AddGenerationPrompt: gen})
		if err != nil {
			return
		}
		back, err := m.Decode(ids, false)
		if err != nil {
			t.Fatal(err)
		}
		if utf8.ValidString(prompt) && back != prompt {
			t.Fatalf("decode(encode(prompt)) = %q, want %q", back, prompt)
		}
	})
}
