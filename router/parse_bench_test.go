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
