package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTokenizeCommand(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		stdin    string
		want     string
		code     int
		errMatch string
	}{
		{name: "plain", args: []string{"--tokenizer", "bytes"}, stdin: "\"hi\"\n\"\"\n", want: "[104,105]\n[]\n"},
		{name: "special", args: []string{"--tokenizer", "bytes", "--add-special-tokens"}, stdin: `"a"`, want: "[256,97]\n"},
		{name: "bad json", args: []string{"--tokenizer", "bytes"}, stdin: "\"a\"\n{oops\n\"b\"\n", want: "[97]\n", code: 2, errMatch: "line 2"},
		{name: "not a string", args: []string{"--tokenizer", "bytes"}, stdin: "3\n", code: 2, errMatch: "line 1"},
		{
			name:  "chat",
			args:  []string{"--tokenizer", "bytes", "--chat"},
			stdin: `{"messages":[{"role":"user","content":"<b>"}]}` + "\n" + `{"messages":[{"role":"user","content":"x"}],"add_generation_prompt":false}` + "\n",
			want: `{"prompt":"<|im_start|>user\n<b><|im_end|>\n<|im_start|>assistant\n","token_ids":[258,117,115,101,114,10,60,98,62,259,10,258,97,115,115,105,115,116,97,110,116,10]}` + "\n" +
				`{"prompt":"<|im_start|>user\nx<|im_end|>\n","token_ids":[258,117,115,101,114,10,120,259,10]}` + "\n",
		},
		{name: "chat without messages", args: []string{"--tokenizer", "bytes", "--chat"}, stdin: `{"tools":[]}`, code: 2, errMatch: "line 1"},
		{name: "chat bad json", args: []string{"--tokenizer", "bytes", "--chat"}, stdin: `{"messages":[]}` + "\n[", want: "{\"prompt\":\"<|im_start|>assistant\\n\",\"token_ids\":[258,97,115,115,105,115,116,97,110,116,10]}\n", code: 2, errMatch: "line 2"},
		{name: "no tokenizer", args: nil, stdin: "", code: 2, errMatch: "--tokenizer"},
		{name: "missing path", args: []string{"--tokenizer", "/nonexistent"}, stdin: "", code: 2, errMatch: "/nonexistent\": no such file or directory, and not a hub repository"},
		{name: "serve's forms", args: []string{"--tokenizer", "m=bytes"}, stdin: "", code: 2, errMatch: "want a model directory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := runCLI(t, tc.stdin, append([]string{"tokenize"}, tc.args...)...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d (stderr %q)", code, tc.code, errOut)
			}
			if out != tc.want {
				t.Fatalf("stdout %q\nwant %q", out, tc.want)
			}
			if tc.errMatch != "" {
				if !strings.Contains(errOut, tc.errMatch) || strings.Count(errOut, "\n") != 1 {
					t.Fatalf("stderr %q, want one line naming %q", errOut, tc.errMatch)
				}
			}
		})
	}
}

// TestTokenizeCommandChatError checks that a template that raises gives an
// {"error"} line and the run goes on.
func TestTokenizeCommandChatError(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "tokenizers", "models", "qwen3")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s missing under CI: run make testdata", dir)
		}
		t.Skip("qwen3 tokenizer not fetched; run make testdata")
	}
	out, errOut, code := runCLI(t, `{"messages":[]}`+"\n"+`{"messages":[{"role":"user","content":"hi"}]}`+"\n", "tokenize", "--tokenizer", dir, "--chat")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines: %q", len(lines), out)
	}
	var first map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil || first["error"] == nil {
		t.Fatalf("line 1 %q, want an error object", lines[0])
	}
	var second struct {
		Prompt   string   `json:"prompt"`
		TokenIDs []uint32 `json:"token_ids"`
	}
	if err := json.Unmarshal([]byte(lines[1]), &second); err != nil || second.Prompt != "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" || len(second.TokenIDs) == 0 {
		t.Fatalf("line 2 %q", lines[1])
	}
}
