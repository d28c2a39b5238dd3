package chat

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// BenchmarkRender renders the qwen3 and deepseek_v3 templates for a 40-message
// chat (the shape of BenchmarkChatTurn in package tokenize) with the
// messages already decoded: the template engine's own cost.
func BenchmarkRender(b *testing.B) {
	var msgs []map[string]string
	para := strings.Repeat("Some prose, with code <b>x</b> and numbers 1.5e3. ", 12)
	msgs = append(msgs, map[string]string{"role": "system", "content": "You are a careful assistant. " + para})
	for i := 1; i < 20; i++ {
		msgs = append(msgs,
			map[string]string{"role": "user", "content": fmt.Sprint(i, " ", para)},
			map[string]string{"role": "assistant", "content": fmt.Sprint(para, " ", i)})
	}
	msgs = append(msgs, map[string]string{"role": "user", "content": "What would you change first?"})
	raw, _ := json.Marshal(msgs)
	mv, err := FromJSON(raw)
	if err != nil {
		b.Fatal(err)
	}
	for _, name := range []string{"qwen3", "deepseek_v3"} {
		b.Run(name, func(b *testing.B) {
			src, err := os.ReadFile(filepath.Join(chatData, "templates", name+".jinja"))
			if err != nil {
				b.Fatal(err)
			}
			tmpl, err := Compile(string(src))
			if err != nil {
				b.Fatal(err)
			}
			vars := NewDict()
			vars.Set("messages", mv)
			vars.Set("tools", nil)
			vars.Set("add_generation_prompt", true)
			vars.Set("bos_token", "<s>")
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if _, err := tmpl.Render(vars); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkArrayElems splits a ~17 KB messages array (the shape of
// BenchmarkRender's chat, with escapes and a tool call) into elements.
func BenchmarkArrayElems(b *testing.B) {
	para := strings.Repeat("Some prose, with \"quotes\", code <b>x</b>\n and numbers 1.5e3. ", 12)
	var msgs []any
	for i := range 40 {
		msgs = append(msgs, map[string]any{"role": "user", "content": fmt.Sprint(i, " ", para)})
	}
	msgs = append(msgs, map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{
		map[string]any{"function": map[string]any{"name": "f", "arguments": map[string]any{"a": []any{1, 2.5, "x"}}}}}})
	raw, err := json.Marshal(msgs)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := ArrayElems(raw); !ok {
			b.Fatal("did not split")
		}
	}
}
