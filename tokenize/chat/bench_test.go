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
