package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixrouter/prefixrouter/tokenize"
	"github.com/prefixrouter/prefixrouter/tokenize/hub/hubtest"
)

// fakeHubEnv points the hub's environment variables at a fake hub and a
// fresh HF_HOME, and clears the others.
func fakeHubEnv(t *testing.T) *hubtest.Server {
	t.Helper()
	s := hubtest.New(t)
	for _, k := range []string{"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE",
		"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT", "XDG_CACHE_HOME"} {
		t.Setenv(k, "")
	}
	t.Setenv("HF_ENDPOINT", s.URL())
	t.Setenv("HF_HOME", t.TempDir())
	return s
}

// qwen3Files are the fetched qwen3 tokenizer files, as a repository's.
func qwen3Files(t *testing.T) map[string][]byte {
	t.Helper()
	dir := filepath.Join("..", "..", "testdata", "tokenizers", "models", "qwen3")
	files := map[string][]byte{}
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json"} {
		raw, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s missing under CI: run make testdata", dir)
			}
			t.Skipf("%s missing; run make testdata to fetch it", dir)
		}
		files[name] = raw
	}
	return files
}

func TestServeTokenizerErrorsEchoTheFlag(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		typed string // the --tokenizer value, echoed in the message
		want  string
	}{
		{name: "bare repository the hub does not have", args: []string{"--tokenization", "local"}, typed: "Qwen/Qwen3-8B",
			want: "Qwen/Qwen3-8B@main: tokenizer.json: repository not found"},
		{name: "sentencepiece only", typed: "spm:local=hf:org/spm",
			want: "org/spm@main has no tokenizer.json, only a SentencePiece model (tokenizer.model), which the router cannot read; let the pods tokenize it with --tokenizer spm:remote= or --tokenization remote"},
		{name: "gated", args: []string{"--tokenization", "local"}, typed: "org/gated@v1", want: "org/gated@v1: tokenizer.json: gated repository"},
		{name: "no model name", typed: "=qwen", want: "empty model name; accepted forms: " + tokenize.SpecForms},
		{name: "neither path nor repository", typed: "./models/missing", want: `"./models/missing" is neither a local path (none exists) nor a hub repository`},
		{name: "no source in mode auto", typed: "qwen=", want: "no tokenizer files for mode auto"},
		{name: "bad hub setting", typed: "Qwen/Qwen3-8B", env: map[string]string{"HF_HUB_ETAG_TIMEOUT": "soon"}, want: `HF_HUB_ETAG_TIMEOUT "soon": want whole seconds`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := fakeHubEnv(t)
			s.AddRepo("org/spm", map[string][]byte{"tokenizer.model": []byte("spm"), "tokenizer_config.json": []byte("{}")})
			s.AddRepo("org/gated", map[string][]byte{"tokenizer.json": []byte("{}")})
			s.Tag("org/gated", "v1")
			s.Gate("org/gated", "hf_needed")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			args := append([]string{"serve", "--endpoint", "http://127.0.0.1:1", "--tokenizer", tc.typed}, tc.args...)
			_, errOut, code := runCLI(t, "", args...)
			prefix := "prefixrouter: --tokenizer " + strconv.Quote(tc.typed) + ": "
			if code != exitUsage || strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, prefix) || !strings.Contains(errOut, tc.want) {
				t.Fatalf("exit %d, stderr %q\nwant exit 2 and one line starting %q containing %q", code, errOut, prefix, tc.want)
			}
		})
	}
}

// qwen3Ref reads the reference ids of the first n corpus strings.
func qwen3Ref(t *testing.T, n int) (texts []string, ids [][]uint32) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "testdata", "tokenizers", "corpus.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &texts); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join("..", "..", "testdata", "tokenizers", "ref", "qwen3.add0.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 64<<20)
	for len(ids) < n && sc.Scan() {
		var line []uint32
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, line)
	}
	return texts[:n], ids
}

// TestServeTokenizersFromTheHub loads the serve command's --tokenizer
// entries against a fake hub: a repository's files tokenize like
// HuggingFace's reference, a model the hub does not have falls back to the
// pods with a warning in mode auto, and the cache then serves offline.
func TestServeTokenizersFromTheHub(t *testing.T) {
	s := fakeHubEnv(t)
	repo := s.AddRepo("Qwen/Qwen3-8B", qwen3Files(t))
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	texts, want := qwen3Ref(t, 50)
	check := func(toks *tokenize.Registry, name string) {
		t.Helper()
		m, err := toks.Model(name)
		if err != nil {
			t.Fatal(err)
		}
		if m.EffectiveMode(false) == tokenize.ModeRemote || m.EffectiveMode(true) == tokenize.ModeRemote {
			t.Fatalf("%s: the pods tokenize it, not its files", name)
		}
		for i, text := range texts {
			if got, err := m.Encode(text, false); err != nil || !slices.Equal(got, want[i]) {
				t.Fatalf("%s: corpus[%d]: %v %v, want HF's %v", name, i, got, err, want[i])
			}
		}
	}

	toks, err := loadTokenizers(context.Background(), []string{"Qwen/Qwen3-8B", "served-name"}, tokenize.ModeAuto, prometheus.NewRegistry(), log)
	if err != nil {
		t.Fatal(err)
	}
	check(toks, "Qwen/Qwen3-8B")
	m, err := toks.Model("served-name")
	if err != nil || m.EffectiveMode(true) != tokenize.ModeRemote {
		t.Fatalf("served-name: %v, %v; want a remote model", m, err)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "repository not found") {
		t.Fatalf("no warning naming the reason:\n%s", logs.String())
	}
	toks.Close()
	refFile := filepath.Join(os.Getenv("HF_HOME"), "hub", "models--Qwen--Qwen3-8B", "refs", "main")
	if got, err := os.ReadFile(refFile); err != nil || string(got) != repo.Commit {
		t.Fatalf("%s = %q, %v; want %s", refFile, got, err, repo.Commit)
	}

	// Offline, with the hub gone: the cache answers.
	t.Setenv("HF_HUB_OFFLINE", "1")
	t.Setenv("HF_ENDPOINT", "http://127.0.0.1:1")
	requests := len(s.Requests())
	toks, err = loadTokenizers(context.Background(), []string{"qwen3:local=hf:Qwen/Qwen3-8B"}, tokenize.ModeAuto, prometheus.NewRegistry(), log)
	if err != nil {
		t.Fatal(err)
	}
	defer toks.Close()
	check(toks, "qwen3")
	if n := len(s.Requests()); n != requests {
		t.Fatalf("offline, yet %d more requests", n-requests)
	}
}

// TestTokenizeFromTheHub: the tokenize command takes a hub repository as
// serve does, so that an operator can compare its ids with a pod's before
// starting the router.
func TestTokenizeFromTheHub(t *testing.T) {
	s := fakeHubEnv(t)
	s.AddRepo("Qwen/Qwen3-8B", qwen3Files(t))
	texts, want := qwen3Ref(t, 40)
	var stdin strings.Builder
	for _, text := range texts {
		b, _ := json.Marshal(text)
		stdin.Write(append(b, '\n'))
	}
	out, errOut, code := runCLI(t, stdin.String(), "tokenize", "--tokenizer", "Qwen/Qwen3-8B")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != len(want) {
		t.Fatalf("%d lines out, want %d", len(lines), len(want))
	}
	for i, line := range lines {
		var got []uint32
		if err := json.Unmarshal([]byte(line), &got); err != nil || !slices.Equal(got, want[i]) {
			t.Fatalf("line %d (%q): ids %s, want %v", i+1, texts[i], line, want[i])
		}
	}
	_, errOut, code = runCLI(t, "", "tokenize", "--tokenizer", "Qwen/NoSuchModel")
	if code != 2 || !strings.Contains(errOut, "Qwen/NoSuchModel") || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("a repository the hub lacks: exit %d, stderr %q; want 2 and one line naming it", code, errOut)
	}
}
