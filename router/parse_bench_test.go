package router

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkParseBodies is ParseRequest alone on the bodies the router
// overhead benchmark sends: a 4,096-token-id completion and a ~16 KB chat.
func BenchmarkParseBodies(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"model":"m","max_tokens":1,"prompt":[0`)
	for j := 1; j < 4096; j++ {
		fmt.Fprintf(&sb, ",%d", 1000+j)
	}
	sb.WriteString("]}")
	for _, c := range []struct {
		name string
		ep   Endpoint
		body []byte
	}{
		{"completion-4k-ids", EndpointCompletions, []byte(sb.String())},
		{"chat-16k", EndpointChat, bigChatBody()},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			b.ReportAllocs()
			r := acquireRequest()
			for b.Loop() {
				if err := ParseRequest(c.ep, c.body, r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkParseSpans is ParseRequest on bodies whose routing fields are
// read back from their spans after the strict pass (the value skipper's
// work): a batch of 64 string prompts with escapes, a batch of 16
// token-id arrays, and a chat with stream_options and tools.
func BenchmarkParseSpans(b *testing.B) {
	var strs, idArrays []string
	for j := range 64 {
		strs = append(strs, fmt.Sprintf("%q", strings.Repeat(fmt.Sprintf("prompt %d says \"hi\"\\n and more. ", j), 8)))
	}
	for j := range 16 {
		ids := make([]string, 256)
		for k := range ids {
			ids[k] = fmt.Sprint(1000 + j*256 + k)
		}
		idArrays = append(idArrays, "["+strings.Join(ids, ", ")+"]")
	}
	chat := bigChatBody()
	chat = append([]byte(`{"stream_options":{"continuous_usage_stats":false,"include_usage":true},"tools":[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object","properties":{"a":{"type":"string","enum":["x","y"]}}}}}],`), chat[1:]...)
	for _, c := range []struct {
		name string
		ep   Endpoint
		body []byte
	}{
		{"completion-64-strings", EndpointCompletions, []byte(`{"model":"m","prompt":[` + strings.Join(strs, ",") + `]}`)},
		{"completion-16-id-arrays", EndpointCompletions, []byte(`{"model":"m","prompt":[` + strings.Join(idArrays, ",") + `]}`)},
		{"chat-16k-options", EndpointChat, chat},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			b.ReportAllocs()
			r := acquireRequest()
			for b.Loop() {
				if err := ParseRequest(c.ep, c.body, r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
