package kvindex

import (
	"strings"
	"testing"
)

func TestParseTopic(t *testing.T) {
	tests := []struct {
		in       string
		want     Topic
		hostPort string
		err      string
	}{
		{in: "kv@10.0.0.7:8000@Qwen/Qwen3-8B", want: Topic{Prefix: "kv", Host: "10.0.0.7", Port: 8000, Model: "Qwen/Qwen3-8B"}, hostPort: "10.0.0.7:8000"},
		{in: "kv@10.0.0.7@Qwen/Qwen3-8B", want: Topic{Prefix: "kv", Host: "10.0.0.7", Model: "Qwen/Qwen3-8B"}, hostPort: "10.0.0.7"},
		{in: "kv@Pod-A.ns.svc:8000@m@x", want: Topic{Prefix: "kv", Host: "pod-a.ns.svc", Port: 8000, Model: "m@x"}, hostPort: "pod-a.ns.svc:8000"},
		{in: "kv@[fd00::7]:8000@m", want: Topic{Prefix: "kv", Host: "fd00::7", Port: 8000, Model: "m"}, hostPort: "[fd00::7]:8000"},
		{in: "kv@[fd00::7]@m", want: Topic{Prefix: "kv", Host: "fd00::7", Model: "m"}, hostPort: "[fd00::7]"},
		{in: "kv@fd00::7@m", want: Topic{Prefix: "kv", Host: "fd00::7", Model: "m"}, hostPort: "[fd00::7]"},
		{in: "events@10.0.0.7:8000@", want: Topic{Prefix: "events", Host: "10.0.0.7", Port: 8000}, hostPort: "10.0.0.7:8000"},
		{in: "", err: "no '@'"},
		{in: "kv", err: "no '@'"},
		{in: "kv@10.0.0.7:8000", err: "one '@'"},
		{in: "@10.0.0.7:8000@m", err: "empty prefix"},
		{in: "kv@@m", err: "neither an IP"},
		{in: "kv@10.0.0.7:0@m", err: "want 1..65535"},
		{in: "kv@10.0.0.7:08000@m", err: "want 1..65535"},
		{in: "kv@10.0.0.7:http@m", err: "want 1..65535"},
		{in: "kv@bad host:80@m", err: "neither an IP"},
		{in: "kv@h:80@m\n", err: "printable"},
		{in: "kv@h:80@\xff", err: "printable"},
		{in: "kv@h@" + strings.Repeat("m", MaxTopicLen), err: "longer than"},
	}
	for _, tt := range tests {
		got, err := ParseTopic(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("ParseTopic(%q) = %+v, %v; want error containing %q", tt.in, got, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want || got.HostPort() != tt.hostPort {
			t.Errorf("ParseTopic(%q) = %+v (%s), %v; want %+v (%s)", tt.in, got, got.HostPort(), err, tt.want, tt.hostPort)
		}
	}
}

// FuzzParseTopic: any frame a publisher sends is parsed without a panic, and
// what parses renders to a topic that parses to the same value.
func FuzzParseTopic(f *testing.F) {
	for _, s := range []string{"kv@10.0.0.7:8000@Qwen/Qwen3-8B", "kv@[fd00::7]:8000@m", "kv@h@", "kv@fd00::7@m", "@@", "kv@:80@m", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tp, err := ParseTopic(s)
		if err != nil {
			return
		}
		again, err := ParseTopic(tp.String())
		if err != nil || again != tp {
			t.Fatalf("ParseTopic(%q) = %+v renders %q, which parses to %+v, %v", s, tp, tp.String(), again, err)
		}
	})
}
