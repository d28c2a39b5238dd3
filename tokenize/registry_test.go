package tokenize

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixrouter/prefixrouter/internal/poll"
)

// tinyTokenizerJSON is a byte-level BPE with one merge ("a b") and one
// special token, enough to exercise the registry without fetched files.
func tinyTokenizerJSON(t testing.TB) []byte {
	t.Helper()
	vocab := map[string]int{}
	n := 0
	for b := 0; b < 256; b++ {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		r := rune(b)
		if !printable {
			r = rune(256 + n)
			n++
		}
		vocab[string(r)] = b
	}
	vocab["ab"] = 256
	doc := map[string]any{
		"version":       "1.0",
		"added_tokens":  []any{map[string]any{"id": 257, "content": "<|s|>", "special": true, "normalized": false}},
		"normalizer":    nil,
		"pre_tokenizer": map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
		"post_processor": map[string]any{"type": "TemplateProcessing",
			"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "<|s|>"}}, map[string]any{"Sequence": map[string]any{"id": "A"}}},
			"special_tokens": map[string]any{"<|s|>": map[string]any{"id": "<|s|>", "ids": []int{257}}}},
		"decoder": map[string]any{"type": "ByteLevel"},
		"model":   map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{"a b"}},
	}
	raw, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func tinyModelDir(t testing.TB, template string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tinyTokenizerJSON(t), 0o644); err != nil {
		t.Fatal(err)
	}
	if template != "" {
		if err := os.WriteFile(filepath.Join(dir, "chat_template.jinja"), []byte(template), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// fakePod serves the render endpoints with a fixed answer and records the
// paths it saw.
type fakePod struct {
	ids      []uint32
	prompt   string
	noRender bool
	status   int
	calls    atomic.Int64
	lastAuth atomic.Value
	lastPath atomic.Value
	lastBody atomic.Value
	srv      *httptest.Server
}

func newFakePod(t *testing.T, ids []uint32) *fakePod {
	p := &fakePod{ids: ids}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		p.lastPath.Store(r.URL.Path)
		p.lastBody.Store(string(body))
		p.lastAuth.Store(r.Header.Get("Authorization"))
		if p.noRender && strings.HasSuffix(r.URL.Path, "/render") {
			http.NotFound(w, r)
			return
		}
		if p.status != 0 {
			w.WriteHeader(p.status)
			fmt.Fprint(w, `{"error":{"message":"bad"}}`)
			return
		}
		if r.URL.Path == "/tokenize" {
			json.NewEncoder(w).Encode(map[string]any{"count": len(p.ids), "tokens": p.ids})
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"prompt": p.prompt, "token_ids": p.ids})
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func TestRemoteMode(t *testing.T) {
	reg := NewRegistry(Options{CacheMaxBytes: -1})
	m, err := reg.Add("demo", "", ModeRemote)
	if err != nil {
		t.Fatal(err)
	}
	pod := newFakePod(t, []uint32{7, 8, 9})
	ctx := context.Background()
	req := ChatRequest{Messages: json.RawMessage(`[{"role":"user","content":"hi"}]`), AddGenerationPrompt: true}
	res, err := m.TokenizeChat(ctx, req, pod.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if res.Mode != ModeRemote || !slices.Equal(res.IDs, []uint32{7, 8, 9}) {
		t.Fatalf("got %+v", res)
	}
	if p := pod.lastPath.Load(); p != "/v1/chat/completions/render" {
		t.Fatalf("path %v", p)
	}
	if b := pod.lastBody.Load().(string); !strings.Contains(b, `"messages":[{"role":"user","content":"hi"}]`) || !strings.Contains(b, `"add_generation_prompt":true`) {
		t.Fatalf("body %s", b)
	}
	// A caller-supplied body goes through unchanged.
	req.Body = json.RawMessage(`{"model":"demo","messages":[],"x":1}`)
	if _, err := m.TokenizeChat(ctx, req, pod.srv.URL); err != nil {
		t.Fatal(err)
	}
	if b := pod.lastBody.Load().(string); b != string(req.Body) {
		t.Fatalf("body %s, want the original", b)
	}
	// Pods without render endpoints answer through /tokenize.
	pod.noRender = true
	res, err = m.TokenizePrompt(ctx, "hello", true, pod.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if p := pod.lastPath.Load(); p != "/tokenize" || !slices.Equal(res.IDs, []uint32{7, 8, 9}) || res.Prompt != "hello" {
		t.Fatalf("fallback: path %v res %+v", p, res)
	}
	// ... and the fallback sends only the prompt-shaping fields.
	if _, err := m.TokenizeChat(ctx, req, pod.srv.URL); err != nil {
		t.Fatal(err)
	}
	if b := pod.lastBody.Load().(string); pod.lastPath.Load() != "/tokenize" || strings.Contains(b, `"x":1`) || !strings.Contains(b, `"messages":[{"role":"user"`) {
		t.Fatalf("fallback chat body %s", b)
	}
	// Pod errors surface as RemoteError.
	pod.noRender, pod.status = false, http.StatusBadRequest
	_, err = m.TokenizeChat(ctx, ChatRequest{Messages: json.RawMessage(`[]`)}, pod.srv.URL)
	var re *RemoteError
	if !errors.As(err, &re) || re.Status != http.StatusBadRequest {
		t.Fatalf("err %v, want RemoteError 400", err)
	}
	if _, err := m.TokenizeChat(ctx, req, ""); err == nil {
		t.Fatal("remote mode without a base URL succeeded")
	}
	if _, err := m.Encode("x", false); !errors.Is(err, ErrNoLocal) {
		t.Fatalf("Encode on a remote-only model: %v", err)
	}
}

// TestRemoteAuthorization: SetAuthorization's header goes out on every
// render and /tokenize call, read at each one; without it none is sent.
func TestRemoteAuthorization(t *testing.T) {
	reg := NewRegistry(Options{CacheMaxBytes: -1})
	m, err := reg.Add("demo", "", ModeRemote)
	if err != nil {
		t.Fatal(err)
	}
	pod := newFakePod(t, []uint32{7})
	ctx := context.Background()
	if _, err := m.TokenizePrompt(ctx, "hi", true, pod.srv.URL); err != nil {
		t.Fatal(err)
	}
	if a := pod.lastAuth.Load(); a != "" {
		t.Fatalf("Authorization %q without SetAuthorization", a)
	}
	var cred atomic.Value
	cred.Store("Bearer k1")
	reg.SetAuthorization(func() string { return cred.Load().(string) })
	chat := ChatRequest{Messages: json.RawMessage(`[{"role":"user","content":"hi"}]`)}
	if _, err := m.TokenizeChat(ctx, chat, pod.srv.URL); err != nil {
		t.Fatal(err)
	}
	if a := pod.lastAuth.Load(); a != "Bearer k1" || pod.lastPath.Load() != "/v1/chat/completions/render" {
		t.Fatalf("render: Authorization %q on %v", a, pod.lastPath.Load())
	}
	cred.Store("Bearer k2")
	pod.noRender = true
	if _, err := m.TokenizePrompt(ctx, "hi", true, pod.srv.URL); err != nil {
		t.Fatal(err)
	}
	if a := pod.lastAuth.Load(); a != "Bearer k2" || pod.lastPath.Load() != "/tokenize" {
		t.Fatalf("fallback: Authorization %q on %v", a, pod.lastPath.Load())
	}
}

// waitFor waits for cond (internal/poll).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, what, cond)
}

func TestAutoMode(t *testing.T) {
	promReg := prometheus.NewRegistry()
	reg := NewRegistry(Options{Registerer: promReg, SampleRate: 1, CacheMaxBytes: -1})
	m, err := reg.Add("b", "bytes", ModeAuto)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	local, _ := m.Encode("ab", true)
	pod := newFakePod(t, local)

	res, err := m.TokenizePrompt(ctx, "ab", true, pod.srv.URL)
	if err != nil || res.Mode != ModeLocal || !slices.Equal(res.IDs, local) {
		t.Fatalf("auto local: %+v %v", res, err)
	}
	waitFor(t, "a matching comparison", func() bool {
		return testutil.ToFloat64(reg.metrics.comparisons.WithLabelValues("b", "match")) == 1
	})
	if m.Mode() != ModeAuto {
		t.Fatalf("mode %v after a match, want auto", m.Mode())
	}

	pod.ids = []uint32{1, 2, 3}
	if _, err := m.TokenizePrompt(ctx, "ab", true, pod.srv.URL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the switch to remote", func() bool { return m.Mode() == ModeRemote })
	if got := testutil.ToFloat64(reg.metrics.switches.WithLabelValues("b", "mismatch")); got != 1 {
		t.Fatalf("switch metric %v, want 1", got)
	}
	res, err = m.TokenizePrompt(ctx, "ab", true, pod.srv.URL)
	if err != nil || res.Mode != ModeRemote || !slices.Equal(res.IDs, []uint32{1, 2, 3}) {
		t.Fatalf("after switch: %+v %v", res, err)
	}
	// Every exported series is prefixed and registered on our registry.
	mfs, err := promReg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "prefixrouter_") {
			t.Errorf("metric %s lacks the prefixrouter_ prefix", mf.GetName())
		}
		for _, mm := range mf.GetMetric() {
			for _, l := range mm.GetLabel() {
				if !slices.Contains([]string{"model", "mode", "reason"}, l.GetName()) {
					t.Errorf("metric %s has unbounded label %s", mf.GetName(), l.GetName())
				}
			}
		}
	}
}

func TestTemplateCompileFailureServesRemote(t *testing.T) {
	promReg := prometheus.NewRegistry()
	reg := NewRegistry(Options{Registerer: promReg, CacheMaxBytes: -1})
	m, err := reg.Add("tiny", tinyModelDir(t, "{% if %}"), ModeLocal)
	if err != nil {
		t.Fatalf("a bad template must not drop the model: %v", err)
	}
	if got := testutil.ToFloat64(reg.metrics.switches.WithLabelValues("tiny", "template_compile")); got != 1 {
		t.Fatalf("template_compile metric %v", got)
	}
	if _, err := m.RenderChat(ChatRequest{Messages: json.RawMessage(`[]`)}); !errors.Is(err, ErrNoTemplate) {
		t.Fatalf("RenderChat: %v", err)
	}
	pod := newFakePod(t, []uint32{5})
	res, err := m.TokenizeChat(context.Background(), ChatRequest{Messages: json.RawMessage(`[]`)}, pod.srv.URL)
	if err != nil || res.Mode != ModeRemote {
		t.Fatalf("chat went %+v %v, want remote", res, err)
	}
	// Prompts still encode locally.
	res, err = m.TokenizePrompt(context.Background(), "ab", true, pod.srv.URL)
	if err != nil || res.Mode != ModeLocal || !slices.Equal(res.IDs, []uint32{257, 256}) {
		t.Fatalf("prompt: %+v %v", res, err)
	}
}

func TestAutoLocalErrorSwitches(t *testing.T) {
	reg := NewRegistry(Options{CacheMaxBytes: -1})
	m, err := reg.Add("tiny", tinyModelDir(t, `{{ raise_exception("local says no") }}`), ModeAuto)
	if err != nil {
		t.Fatal(err)
	}
	pod := newFakePod(t, []uint32{4})
	res, err := m.TokenizeChat(context.Background(), ChatRequest{Messages: json.RawMessage(`[]`)}, pod.srv.URL)
	if err != nil || res.Mode != ModeRemote || m.Mode() != ModeRemote {
		t.Fatalf("got %+v %v mode %v", res, err, m.Mode())
	}
	var te *TemplateError
	if _, err := m.RenderChat(ChatRequest{Messages: json.RawMessage(`[]`)}); !errors.As(err, &te) {
		t.Fatalf("RenderChat error %v, want TemplateError", err)
	}
}

func TestUnknownModel(t *testing.T) {
	reg := NewRegistry(Options{})
	if _, err := reg.Model("nope"); !errors.Is(err, ErrUnknownModel) {
		t.Fatalf("err %v", err)
	}
	if _, err := reg.Add("x", "/does/not/exist", ModeLocal); err == nil {
		t.Fatal("loading a missing path succeeded")
	}
	if _, err := reg.AddSpec("b=bytes"); err != nil {
		t.Fatal(err)
	}
	if got := reg.Names(); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("Names = %v", got)
	}
}

// fetchedModel returns a fetched model directory; see bpe's modelPath.
func fetchedModel(tb testing.TB, model string) string {
	tb.Helper()
	dir := filepath.Join("..", "testdata", "tokenizers", "models", model)
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("%s missing under CI: run make testdata: %v", dir, err)
		}
		tb.Skipf("%s missing; run make testdata to fetch it", dir)
	}
	return dir
}

// readCorpus reads the parity corpus shared with the bpe tests.
func readCorpus(tb testing.TB) []string {
	tb.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "testdata", "tokenizers", "corpus.json"))
	if err != nil {
		tb.Fatal(err)
	}
	var corpus []string
	if err := json.Unmarshal(raw, &corpus); err != nil {
		tb.Fatal(err)
	}
	return corpus
}

// readChatCases reads the shared chat cases, by name, field by field.
func readChatCases(tb testing.TB) map[string]map[string]json.RawMessage {
	tb.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "testdata", "chat", "cases.json"))
	if err != nil {
		tb.Fatal(err)
	}
	var cases map[string]map[string]json.RawMessage
	if err := json.Unmarshal(raw, &cases); err != nil {
		tb.Fatal(err)
	}
	return cases
}

func readRef(t *testing.T, name string) [][]uint32 {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "testdata", "tokenizers", "ref", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out [][]uint32
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var ids []uint32
		if err := json.Unmarshal(sc.Bytes(), &ids); err != nil {
			t.Fatal(err)
		}
		out = append(out, ids)
	}
	return out
}

// TestTransformersBOS checks that tokenizer_config.json's add_bos_token
// decides BOS as transformers does: DeepSeek-V3 gets BOS although its
// tokenizer.json post-processor adds nothing.
func TestTransformersBOS(t *testing.T) {
	corpus := readCorpus(t)
	corpus = corpus[:200]
	tests := []struct {
		model  string
		prefix []uint32
		ref    string
	}{
		{"deepseek_v3", []uint32{0}, "deepseek_v3.add0.jsonl"},
		{"qwen3", nil, "qwen3.add0.jsonl"},
		{"llama3_1", []uint32{128000}, "llama3_1.add0.jsonl"},
	}
	reg := NewRegistry(Options{})
	// A lone tokenizer.json keeps HF tokenizers' own post-processor.
	if dir := fetchedModel(t, "deepseek_v3"); dir != "" {
		m, err := reg.Add("raw", filepath.Join(dir, "tokenizer.json"), ModeLocal)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := m.Encode(corpus[0], true)
		if want := readRef(t, "deepseek_v3.add1.jsonl")[0]; !slices.Equal(got, want) {
			t.Fatalf("tokenizer.json alone: %v, want HF's %v", got, want)
		}
		if _, err := m.RenderChat(ChatRequest{Messages: json.RawMessage(`[]`)}); !errors.Is(err, ErrNoTemplate) {
			t.Fatalf("tokenizer.json alone has a template? %v", err)
		}
	}
	for _, tc := range tests {
		t.Run(tc.model, func(t *testing.T) {
			m, err := reg.Add(tc.model, fetchedModel(t, tc.model), ModeLocal)
			if err != nil {
				t.Fatal(err)
			}
			ref := readRef(t, tc.ref)
			for i, text := range corpus {
				got, err := m.Encode(text, true)
				if err != nil {
					t.Fatal(err)
				}
				want := append(slices.Clone(tc.prefix), ref[i]...)
				if !slices.Equal(got, want) {
					t.Fatalf("line %d: got %v, want %v", i, got[:min(len(got), 10)], want[:min(len(want), 10)])
				}
			}
		})
	}
}

// TestModelChatRenders renders the shared chat cases through the model
// directories (template and special tokens from tokenizer_config.json).
func TestModelChatRenders(t *testing.T) {
	cases := readChatCases(t)
	reg := NewRegistry(Options{})
	for _, model := range []string{"qwen3", "deepseek_v3"} {
		m, err := reg.Add(model, fetchedModel(t, model), ModeLocal)
		if err != nil {
			t.Fatal(err)
		}
		refRaw, err := os.ReadFile(filepath.Join("..", "testdata", "chat", "ref", model+".json"))
		if err != nil {
			t.Fatal(err)
		}
		var ref map[string]map[string]string
		if err := json.Unmarshal(refRaw, &ref); err != nil {
			t.Fatal(err)
		}
		for name, c := range cases {
			t.Run(model+"/"+name, func(t *testing.T) {
				req := ChatRequest{Messages: c["messages"], Tools: c["tools"]}
				if agp, ok := c["add_generation_prompt"]; ok {
					req.AddGenerationPrompt = string(agp) == "true"
				}
				if et, ok := c["enable_thinking"]; ok {
					req.ChatTemplateKwargs = json.RawMessage(`{"enable_thinking":` + string(et) + `}`)
				}
				prompt, ids, err := m.EncodeChat(req)
				if want, isErr := ref[name]["err"]; isErr {
					var te *TemplateError
					if !errors.As(err, &te) {
						t.Fatalf("err %v, want a TemplateError like %s", err, want)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if prompt != ref[name]["ok"] {
					t.Fatalf("prompt %q\nwant %q", prompt, ref[name]["ok"])
				}
				want, _ := m.Encode(prompt, false)
				if !slices.Equal(ids, want) {
					t.Fatal("EncodeChat ids differ from Encode(prompt, false)")
				}
			})
		}
	}
}

func TestSharedRegisterer(t *testing.T) {
	promReg := prometheus.NewRegistry()
	a := NewRegistry(Options{Registerer: promReg, CacheMaxBytes: -1})
	b := NewRegistry(Options{Registerer: promReg, CacheMaxBytes: -1})
	ma, _ := a.Add("x", "bytes", ModeLocal)
	mb, _ := b.Add("y", "bytes", ModeLocal)
	ctx := context.Background()
	ma.TokenizePrompt(ctx, "a", false, "")
	mb.TokenizePrompt(ctx, "b", false, "")
	if got := testutil.ToFloat64(a.metrics.requests.WithLabelValues("y", "local")); got != 1 {
		t.Fatalf("second registry's requests not on the shared collector: %v", got)
	}
}

func TestNeedsBaseURL(t *testing.T) {
	reg := NewRegistry(Options{CacheMaxBytes: -1})
	local, _ := reg.Add("l", "bytes", ModeLocal)
	auto, _ := reg.Add("a", "bytes", ModeAuto)
	broken, _ := reg.Add("b", tinyModelDir(t, "{% if %}"), ModeLocal)
	for _, tc := range []struct {
		m          *Model
		chat, want bool
	}{
		{local, true, false}, {local, false, false}, {auto, true, true}, {auto, false, true},
		{broken, true, true}, {broken, false, false}, {Bytes(), true, false},
	} {
		if got := tc.m.NeedsBaseURL(tc.chat); got != tc.want {
			t.Errorf("%s chat=%v: %v, want %v", tc.m.Name(), tc.chat, got, tc.want)
		}
	}
}

// TestSegmentCacheExact checks that cached encodings equal uncached ones,
// including text that starts with a special token.
func TestSegmentCacheExact(t *testing.T) {
	dir := fetchedModel(t, "qwen3")
	corpus := readCorpus(t)
	cold := NewRegistry(Options{CacheMaxBytes: -1})
	warm := NewRegistry(Options{})
	defer warm.Close()
	mc, _ := cold.Add("q", dir, ModeLocal)
	mw, _ := warm.Add("q", dir, ModeLocal)
	for pass := 0; pass < 2; pass++ {
		for i, s := range corpus[:300] {
			want, _ := mc.Encode(s, true)
			got, err := mw.Encode(s, true)
			if err != nil || !slices.Equal(got, want) {
				t.Fatalf("pass %d line %d: cached %v, uncached %v (%v)", pass, i, got, want, err)
			}
		}
		warm.cache.c.Wait()
	}
	if testutil.ToFloat64(warm.metrics.cacheHits) == 0 {
		t.Fatal("the second pass never hit the cache")
	}
}
