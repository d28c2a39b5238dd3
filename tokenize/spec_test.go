package tokenize

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prefixrouter/prefixrouter/tokenize/hub"
)

func TestParseSpec(t *testing.T) {
	dir := t.TempDir()
	local := filepath.Join(dir, "qwen3")
	if err := os.Mkdir(local, 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		text    string
		name    string
		path    string
		hub     *hub.Ref
		mode    Mode
		hasMode bool
		err     string
	}{
		{text: "qwen=/m/qwen", name: "qwen", path: "/m/qwen"},
		{text: "qwen:auto=/m/qwen", name: "qwen", path: "/m/qwen", mode: ModeAuto, hasMode: true},
		{text: "qwen:remote=", name: "qwen", mode: ModeRemote, hasMode: true},
		{text: "qwen=", name: "qwen"},
		{text: "llama3:8b=/m/l", name: "llama3:8b", path: "/m/l"},
		{text: "Qwen/Qwen3-8B:local=bytes", name: "Qwen/Qwen3-8B", path: "bytes", hasMode: true},
		{text: "qwen=hf:Qwen/Qwen3-8B", name: "qwen", hub: &hub.Ref{Repo: "Qwen/Qwen3-8B", Revision: "main"}},
		{text: "qwen:local=hf:Qwen/Qwen3-8B@v1", name: "qwen", hub: &hub.Ref{Repo: "Qwen/Qwen3-8B", Revision: "v1"}, hasMode: true},
		{text: "Qwen/Qwen3-8B", name: "Qwen/Qwen3-8B", hub: &hub.Ref{Repo: "Qwen/Qwen3-8B", Revision: "main"}},
		{text: "Qwen/Qwen3-8B@refs/pr/3:auto", name: "Qwen/Qwen3-8B", hub: &hub.Ref{Repo: "Qwen/Qwen3-8B", Revision: "refs/pr/3"}, mode: ModeAuto, hasMode: true},
		{text: "hf:gpt2", name: "gpt2", hub: &hub.Ref{Repo: "gpt2", Revision: "main"}},
		{text: local, name: local, path: local},
		{text: local + ":remote", name: local, path: local, mode: ModeRemote, hasMode: true},
		{text: "=x", err: "empty model name"},
		{text: ":auto=x", err: "empty model name"},
		{text: "qwen=hf:Qwen//Qwen3", err: "not a hub repository id"},
		{text: "qwen=hf:", err: "not a hub repository id"},
		{text: filepath.Join(dir, "missing"), err: "neither a local path"},
		{text: "llama3:8b", err: "neither a local path"},
		{text: "hf:a/b/c", err: "not a hub repository id"},
	}
	for _, tc := range tests {
		t.Run(tc.text, func(t *testing.T) {
			s, err := ParseSpec(tc.text)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.HasSuffix(err.Error(), SpecForms) {
					t.Fatalf("err = %v, want one saying %q and listing the forms", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Text != tc.text || s.Name != tc.name || s.Path != tc.path || s.Mode != tc.mode || s.HasMode != tc.hasMode ||
				(s.Hub == nil) != (tc.hub == nil) || s.Hub != nil && *s.Hub != *tc.hub {
				t.Fatalf("got %+v (hub %v), want name %q path %q hub %v mode %v/%v", s, s.Hub, tc.name, tc.path, tc.hub, tc.mode, tc.hasMode)
			}
		})
	}
}
