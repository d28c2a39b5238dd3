package tokenize

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixrouter/prefixrouter/tokenize/hub"
	"github.com/prefixrouter/prefixrouter/tokenize/hub/hubtest"
)

// modelFiles reads a fetched model directory's files, as a fake hub
// repository's content.
func modelFiles(t *testing.T, model string) map[string][]byte {
	t.Helper()
	dir := fetchedModel(t, model)
	files := map[string][]byte{}
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json"} {
		raw, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		files[name] = raw
	}
	return files
}

// withTemplateFile moves tokenizer_config.json's chat_template into a
// separate chat_template.jinja, as newer repositories ship it.
func withTemplateFile(t *testing.T, files map[string][]byte) map[string][]byte {
	t.Helper()
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(files["tokenizer_config.json"], &cfg); err != nil {
		t.Fatal(err)
	}
	var template string
	if err := json.Unmarshal(cfg["chat_template"], &template); err != nil {
		t.Fatal(err)
	}
	delete(cfg, "chat_template")
	rawCfg, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]byte{
		"tokenizer.json":        files["tokenizer.json"],
		"tokenizer_config.json": rawCfg,
		"chat_template.jinja":   []byte(template),
	}
}

var qwen3Local struct {
	once sync.Once
	m    *Model
	err  error
}

// localQwen3 is the fetched qwen3 directory loaded once: the reference the
// same files from the fake hub must match.
func localQwen3(t *testing.T) *Model {
	t.Helper()
	dir := fetchedModel(t, "qwen3")
	qwen3Local.once.Do(func() {
		qwen3Local.m, qwen3Local.err = NewRegistry(Options{}).Add("local", dir, ModeLocal)
	})
	if qwen3Local.err != nil {
		t.Fatal(qwen3Local.err)
	}
	return qwen3Local.m
}

type hubEnv struct {
	srv  *hubtest.Server
	reg  *Registry
	logs *bytes.Buffer
	prom *prometheus.Registry
}

func newHubEnv(t *testing.T, cfg hub.Config) *hubEnv {
	t.Helper()
	e := &hubEnv{srv: hubtest.New(t), logs: &bytes.Buffer{}, prom: prometheus.NewRegistry()}
	log := slog.New(slog.NewTextHandler(e.logs, nil))
	cfg.Endpoint = e.srv.URL()
	if cfg.CacheDir == "" {
		cfg.CacheDir = t.TempDir()
	}
	cfg.Backoff = time.Millisecond
	cfg.Logger = log
	e.reg = NewRegistry(Options{Hub: hub.New(cfg), Logger: log, Registerer: e.prom})
	t.Cleanup(e.reg.Close)
	return e
}

func (e *hubEnv) load(t *testing.T, text string, mode Mode) (*Model, error) {
	t.Helper()
	s, err := ParseSpec(text)
	if err != nil {
		t.Fatal(err)
	}
	if !s.HasMode {
		s.Mode = mode
	}
	return e.reg.Load(context.Background(), s)
}

// sameTokenizer checks that fetched encodes the corpus and renders the
// chat cases exactly as the local model directory does.
func sameTokenizer(t *testing.T, fetched, local *Model) {
	t.Helper()
	corpus := readCorpus(t)
	for i, text := range corpus[:300] {
		for _, special := range []bool{false, true} {
			got, err1 := fetched.Encode(text, special)
			want, err2 := local.Encode(text, special)
			if err1 != nil || err2 != nil || !slices.Equal(got, want) {
				t.Fatalf("corpus[%d] special=%v: %v %v, local %v %v", i, special, got, err1, want, err2)
			}
		}
	}
	for name, c := range readChatCases(t) {
		req := ChatRequest{Messages: c["messages"], Tools: c["tools"], AddGenerationPrompt: true}
		gotPrompt, gotIDs, err1 := fetched.EncodeChat(req)
		wantPrompt, wantIDs, err2 := local.EncodeChat(req)
		if (err1 == nil) != (err2 == nil) || gotPrompt != wantPrompt || !slices.Equal(gotIDs, wantIDs) {
			t.Fatalf("chat %s: %q %v, local %q %v", name, gotPrompt, err1, wantPrompt, err2)
		}
	}
}

func TestHubTokenizerEncodesLikeTheLocalOne(t *testing.T) {
	files := modelFiles(t, "qwen3")
	local := localQwen3(t)
	tests := []struct {
		name  string
		files map[string][]byte
		spec  string
	}{
		{"template in tokenizer_config.json, bare MODEL", files, "Qwen/Qwen3-8B"},
		{"template in chat_template.jinja, MODEL=hf:REPO@REVISION", withTemplateFile(t, files), "qwen3=hf:Qwen/Qwen3-8B@v1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newHubEnv(t, hub.Config{})
			e.srv.AddRepo("Qwen/Qwen3-8B", tc.files)
			e.srv.Tag("Qwen/Qwen3-8B", "v1")
			m, err := e.load(t, tc.spec, ModeLocal)
			if err != nil {
				t.Fatal(err)
			}
			if m.EffectiveMode(true) != ModeLocal || m.EffectiveMode(false) != ModeLocal {
				t.Fatalf("mode %v/%v, want local", m.EffectiveMode(true), m.EffectiveMode(false))
			}
			sameTokenizer(t, m, local)
			if !strings.Contains(e.logs.String(), "tokenizer files from the hub cache") {
				t.Errorf("no log line for the fetch:\n%s", e.logs)
			}
		})
	}
}

func TestHubTokenizerOffline(t *testing.T) {
	files := modelFiles(t, "qwen3")
	local := localQwen3(t)
	cache := t.TempDir()
	e := newHubEnv(t, hub.Config{CacheDir: cache, Offline: true})
	repo := e.srv.AddRepo("Qwen/Qwen3-8B", withTemplateFile(t, files))
	hubtest.FillCache(t, cache, "Qwen/Qwen3-8B", "main", repo, "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
	m, err := e.load(t, "Qwen/Qwen3-8B", ModeLocal)
	if err != nil {
		t.Fatal(err)
	}
	sameTokenizer(t, m, local)
	if n := len(e.srv.Requests()); n != 0 {
		t.Fatalf("offline, yet %d requests reached the hub", n)
	}

	// A cache without the repository: the error says where it looked.
	_, err = e.load(t, "qwen:local=hf:Qwen/Qwen3-4B", ModeLocal)
	if err == nil || !strings.Contains(err.Error(), "not in the hub cache "+cache) || !strings.Contains(err.Error(), "HF_HUB_OFFLINE") {
		t.Fatalf("err = %v", err)
	}
}

func TestHubTokenizerFailures(t *testing.T) {
	tiny := tinyTokenizerJSON(t)
	tests := []struct {
		name  string
		files map[string][]byte
		gate  bool
		spec  string
		mode  Mode
		// want is in the error (mode local) or the warning (mode auto).
		want string
	}{
		{name: "sentencepiece only, local", files: map[string][]byte{"tokenizer.model": []byte("spm"), "tokenizer_config.json": []byte(`{}`)},
			spec: "org/spm", mode: ModeLocal,
			want: "org/spm@main has no tokenizer.json, only a SentencePiece model (tokenizer.model), which the router cannot read; let the pods tokenize it with --tokenizer org/spm:remote= or --tokenization remote"},
		{name: "sentencepiece only, auto", files: map[string][]byte{"tokenizer.model": []byte("spm")},
			spec: "org/spm", mode: ModeAuto, want: "has no tokenizer.json, only a SentencePiece model"},
		{name: "gated, local", files: map[string][]byte{"tokenizer.json": tiny}, gate: true,
			spec: "org/gated", mode: ModeLocal, want: "gated repository"},
		{name: "no such repository, auto", spec: "served-name", mode: ModeAuto, want: "repository not found"},
		{name: "unsupported tokenizer.json, auto", files: map[string][]byte{"tokenizer.json": []byte(`{"model": {"type": "Unigram"}}`)},
			spec: "org/unigram", mode: ModeAuto, want: "unsupported model type"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newHubEnv(t, hub.Config{})
			if tc.files != nil {
				s, _ := ParseSpec(tc.spec)
				e.srv.AddRepo(s.Hub.Repo, tc.files)
				if tc.gate {
					e.srv.Gate(s.Hub.Repo, "hf_needed")
				}
			}
			m, err := e.load(t, tc.spec, tc.mode)
			if tc.mode == ModeLocal {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("err = %v, want %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m.EffectiveMode(true) != ModeRemote || m.EffectiveMode(false) != ModeRemote {
				t.Fatalf("mode %v/%v after a failed fetch, want remote", m.EffectiveMode(true), m.EffectiveMode(false))
			}
			logs := e.logs.String()
			if !strings.Contains(logs, "level=WARN") || !strings.Contains(logs, "render endpoints tokenize this model") || !strings.Contains(logs, tc.want) {
				t.Fatalf("warning missing or without the reason %q:\n%s", tc.want, logs)
			}
			if got := testutil.ToFloat64(e.reg.metrics.switches.WithLabelValues(m.Name(), "hub_unavailable")); got != 1 {
				t.Fatalf("hub_unavailable switches = %v, want 1", got)
			}
		})
	}
}

func TestHubTokenizerRetriesThenSucceeds(t *testing.T) {
	e := newHubEnv(t, hub.Config{})
	e.srv.AddRepo("org/tiny", map[string][]byte{"tokenizer.json": tinyTokenizerJSON(t)})
	e.srv.Fail(503)
	m, err := e.load(t, "org/tiny", ModeLocal)
	if err != nil {
		t.Fatal(err)
	}
	if ids, err := m.Encode("ab", false); err != nil || !slices.Equal(ids, []uint32{256}) {
		t.Fatalf("Encode = %v, %v", ids, err)
	}
	if !strings.Contains(e.logs.String(), "trying again") {
		t.Fatalf("the retry was not logged:\n%s", e.logs)
	}
}

func TestRemoteModeFetchesNothing(t *testing.T) {
	e := newHubEnv(t, hub.Config{})
	e.srv.AddRepo("org/tiny", map[string][]byte{"tokenizer.json": tinyTokenizerJSON(t)})
	m, err := e.load(t, "org/tiny:remote", ModeLocal)
	if err != nil {
		t.Fatal(err)
	}
	if m.EffectiveMode(false) != ModeRemote {
		t.Fatalf("mode %v", m.EffectiveMode(false))
	}
	if n := e.srv.Count("hub", http.MethodHead); n != 0 {
		t.Fatalf("%d requests for a model the pods tokenize", n)
	}
}

// TestHubTokenizerRestartAsksOnce checks what a restart costs with a warm
// cache: one HEAD to learn where the branch points; the files, and the
// absence of chat_template.jinja, are known for that commit.
func TestHubTokenizerRestartAsksOnce(t *testing.T) {
	cache := t.TempDir()
	first := newHubEnv(t, hub.Config{CacheDir: cache})
	first.srv.AddRepo("org/tiny", map[string][]byte{"tokenizer.json": tinyTokenizerJSON(t), "tokenizer_config.json": []byte(`{}`)})
	if _, err := first.load(t, "org/tiny", ModeLocal); err != nil {
		t.Fatal(err)
	}
	if n := first.srv.Count("hub", http.MethodHead); n != 3 {
		t.Fatalf("first start: %d HEADs, want 3 (two files and a missing template)", n)
	}
	heads, gets := first.srv.Count("hub", http.MethodHead), first.srv.Count("hub", http.MethodGet)
	// The same hub and cache, a new registry: a restart.
	quiet := slog.New(slog.DiscardHandler)
	reg := NewRegistry(Options{Hub: hub.New(hub.Config{Endpoint: first.srv.URL(), CacheDir: cache, Logger: quiet}), Logger: quiet})
	defer reg.Close()
	s, _ := ParseSpec("org/tiny")
	if _, err := reg.Load(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	if h, g := first.srv.Count("hub", http.MethodHead)-heads, first.srv.Count("hub", http.MethodGet)-gets; h != 1 || g != 0 {
		t.Fatalf("restart: %d HEADs and %d GETs, want 1 and 0", h, g)
	}
}
