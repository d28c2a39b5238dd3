package tokenize

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/prefixrouter/prefixrouter/tokenize/hub"
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

// FuzzParseSpec parses arbitrary --tokenizer values: a spec with a model
// name and at most one source, or an error listing the accepted forms.
func FuzzParseSpec(f *testing.F) {
	for _, s := range []string{"qwen=/m/qwen", "qwen:auto=hf:Qwen/Qwen3-8B@v1", "Qwen/Qwen3-8B", "hf:gpt2:remote", "=x", "a:b:c=", "x=hf:a//b", "a@b@c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		s, err := ParseSpec(text)
		if err != nil {
			if !strings.HasSuffix(err.Error(), SpecForms) {
				t.Fatalf("error %q does not list the forms", err)
			}
			return
		}
		if s.Text != text || s.Name == "" || s.Hub != nil && s.Path != "" {
			t.Fatalf("ParseSpec(%q) = %+v", text, s)
		}
		if s.Hub != nil && hub.ValidRepoID(s.Hub.Repo) != nil {
			t.Fatalf("ParseSpec(%q) accepted repository %q", text, s.Hub.Repo)
		}
	})
}
