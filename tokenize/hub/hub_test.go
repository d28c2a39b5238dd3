package hub

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/tokenize/hub/hubtest"
)

func TestParseRef(t *testing.T) {
	tests := []struct {
		in   string
		want Ref
		err  bool
	}{
		{in: "Qwen/Qwen3-8B", want: Ref{"Qwen/Qwen3-8B", "main"}},
		{in: "Qwen/Qwen3-8B@v1.0", want: Ref{"Qwen/Qwen3-8B", "v1.0"}},
		{in: "gpt2", want: Ref{"gpt2", "main"}},
		{in: "meta-llama/Llama-3.1-8B-Instruct@refs/pr/12", want: Ref{"meta-llama/Llama-3.1-8B-Instruct", "refs/pr/12"}},
		{in: "a_b/c.d@0123456789abcdef0123456789abcdef01234567", want: Ref{"a_b/c.d", "0123456789abcdef0123456789abcdef01234567"}},
		{in: "", err: true},
		{in: "a/b/c", err: true},
		{in: "a--b/c", err: true},
		{in: "a/b..c", err: true},
		{in: "-a/b", err: true},
		{in: "a/b.", err: true},
		{in: "a/b.git", err: true},
		{in: "a b/c", err: true},
		{in: "/models/qwen3", err: true},
		{in: "./qwen3", err: true},
		{in: "a/b@", err: true},
		{in: "a/b@../../x", err: true},
		{in: "a/b@x//y", err: true},
		{in: "a/" + strings.Repeat("x", 97), err: true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseRef(tc.in)
			if tc.err {
				if err == nil {
					t.Fatalf("ParseRef(%q) = %+v, want an error", tc.in, got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseRef(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestConfigFromEnv(t *testing.T) {
	tokenDir := t.TempDir()
	tokenFile := filepath.Join(tokenDir, "token")
	if err := os.WriteFile(tokenFile, []byte("hf_file\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		env  map[string]string
		want Config
		err  string
	}{
		{name: "defaults", env: map[string]string{"HOME": "/home/u"},
			want: Config{CacheDir: "/home/u/.cache/huggingface/hub"}},
		{name: "XDG_CACHE_HOME", env: map[string]string{"HOME": "/home/u", "XDG_CACHE_HOME": "/xdg"},
			want: Config{CacheDir: "/xdg/huggingface/hub"}},
		{name: "HF_HOME", env: map[string]string{"HOME": "/home/u", "HF_HOME": "~/hf"},
			want: Config{CacheDir: "/home/u/hf/hub"}},
		{name: "HF_HUB_CACHE wins", env: map[string]string{"HF_HOME": "/hf", "HF_HUB_CACHE": "/cache", "HUGGINGFACE_HUB_CACHE": "/legacy"},
			want: Config{CacheDir: "/cache"}},
		{name: "legacy cache", env: map[string]string{"HF_HOME": "/hf", "HUGGINGFACE_HUB_CACHE": "/legacy"},
			want: Config{CacheDir: "/legacy"}},
		{name: "endpoint", env: map[string]string{"HF_HOME": "/hf", "HF_ENDPOINT": "https://hf-mirror.example/"},
			want: Config{Endpoint: "https://hf-mirror.example", CacheDir: "/hf/hub"}},
		{name: "offline 1", env: map[string]string{"HF_HOME": "/hf", "HF_HUB_OFFLINE": "1"}, want: Config{CacheDir: "/hf/hub", Offline: true}},
		{name: "offline yes", env: map[string]string{"HF_HOME": "/hf", "HF_HUB_OFFLINE": "yes"}, want: Config{CacheDir: "/hf/hub", Offline: true}},
		{name: "offline 0", env: map[string]string{"HF_HOME": "/hf", "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1"}, want: Config{CacheDir: "/hf/hub"}},
		{name: "transformers offline", env: map[string]string{"HF_HOME": "/hf", "TRANSFORMERS_OFFLINE": "TRUE"}, want: Config{CacheDir: "/hf/hub", Offline: true}},
		{name: "HF_TOKEN wins over the file", env: map[string]string{"HF_HOME": tokenDir, "HF_TOKEN": " hf_env "},
			want: Config{CacheDir: tokenDir + "/hub", Token: "hf_env"}},
		{name: "token file under HF_HOME", env: map[string]string{"HF_HOME": tokenDir},
			want: Config{CacheDir: tokenDir + "/hub", Token: "hf_file"}},
		{name: "HF_TOKEN_PATH", env: map[string]string{"HF_HOME": "/hf", "HF_TOKEN_PATH": tokenFile},
			want: Config{CacheDir: "/hf/hub", Token: "hf_file"}},
		{name: "legacy token", env: map[string]string{"HF_HOME": "/hf", "HUGGING_FACE_HUB_TOKEN": "hf_old"},
			want: Config{CacheDir: "/hf/hub", Token: "hf_old"}},
		{name: "timeouts", env: map[string]string{"HF_HOME": "/hf", "HF_HUB_ETAG_TIMEOUT": "3", "HF_HUB_DOWNLOAD_TIMEOUT": "60"},
			want: Config{CacheDir: "/hf/hub", MetadataTimeout: 3 * time.Second, ReadTimeout: time.Minute}},
		{name: "bad timeout", env: map[string]string{"HF_HOME": "/hf", "HF_HUB_ETAG_TIMEOUT": "2.5"}, err: "HF_HUB_ETAG_TIMEOUT"},
		{name: "bad endpoint", env: map[string]string{"HF_HOME": "/hf", "HF_ENDPOINT": "huggingface.co"}, err: "HF_ENDPOINT"},
		{name: "plain http refused", env: map[string]string{"HF_HOME": "/hf", "HF_ENDPOINT": "http://hf-mirror.example"}, err: "PREFIXROUTER_HUB_ALLOW_HTTP=1"},
		{name: "plain http allowed", env: map[string]string{"HF_HOME": "/hf", "HF_ENDPOINT": "http://hf-mirror.example", "PREFIXROUTER_HUB_ALLOW_HTTP": "1"},
			want: Config{Endpoint: "http://hf-mirror.example", CacheDir: "/hf/hub", AllowHTTP: true}},
		{name: "plain http on loopback", env: map[string]string{"HF_HOME": "/hf", "HF_ENDPOINT": "http://127.0.0.1:8080"},
			want: Config{Endpoint: "http://127.0.0.1:8080", CacheDir: "/hf/hub"}},
		{name: "plain http to localhost is a name", env: map[string]string{"HF_HOME": "/hf", "HF_ENDPOINT": "http://localhost:8080"}, err: "HF_ENDPOINT"},
		{name: "file size cap", env: map[string]string{"HF_HOME": "/hf", "PREFIXROUTER_HUB_MAX_FILE_SIZE": "1048576"},
			want: Config{CacheDir: "/hf/hub", MaxFileSize: 1 << 20}},
		{name: "bad file size cap", env: map[string]string{"HF_HOME": "/hf", "PREFIXROUTER_HUB_MAX_FILE_SIZE": "0"}, err: "PREFIXROUTER_HUB_MAX_FILE_SIZE"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ConfigFromEnv(func(k string) string { return tc.env[k] })
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// testFiles are a repository's files: one stored in git, one large enough
// to be stored in LFS and served by the CDN.
func testFiles() map[string][]byte {
	return map[string][]byte{
		"tokenizer_config.json": []byte(`{"add_bos_token": false}`),
		"tokenizer.json":        bytes.Repeat([]byte("0123456789abcdef"), hubtest.LFSThreshold/16+1),
		"sub/dir/file.txt":      []byte("nested"),
	}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newClient(t *testing.T, s *hubtest.Server, cfg Config) *Client {
	t.Helper()
	cfg.Endpoint = s.URL()
	if cfg.Transport == nil {
		cfg.Transport = s.Transport()
	}
	if cfg.CacheDir == "" {
		cfg.CacheDir = t.TempDir()
	}
	if cfg.Backoff == 0 {
		cfg.Backoff = time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	return New(cfg)
}

func TestDownloadWritesTheHubCacheLayout(t *testing.T) {
	s := hubtest.NewTLS(t)
	files := testFiles()
	repo := s.AddRepo("org/model", files)
	c := newClient(t, s, Config{Token: "hf_secret"})
	ref := Ref{"org/model", "main"}
	repoDir := filepath.Join(c.CacheDir(), "models--org--model")

	for _, name := range []string{"tokenizer.json", "tokenizer_config.json", "sub/dir/file.txt"} {
		f, err := c.Download(context.Background(), ref, name)
		if err != nil {
			t.Fatal(err)
		}
		want := filepath.Join(repoDir, "snapshots", repo.Commit, filepath.FromSlash(name))
		if f.Path != want || f.Commit != repo.Commit {
			t.Fatalf("%s: got %+v, want path %s commit %s", name, f, want, repo.Commit)
		}
		target, err := os.Readlink(f.Path)
		if err != nil {
			t.Fatalf("%s: the snapshot entry is not a symlink: %v", name, err)
		}
		depth := strings.Count(name, "/")
		wantTarget := strings.Repeat("../", 2+depth) + "blobs/" + hubtest.ETag(files[name])
		if target != wantTarget {
			t.Fatalf("%s: symlink -> %s, want %s", name, target, wantTarget)
		}
		got, err := os.ReadFile(f.Path)
		if err != nil || !bytes.Equal(got, files[name]) {
			t.Fatalf("%s: content differs (%v)", name, err)
		}
	}
	ref0, err := os.ReadFile(filepath.Join(repoDir, "refs", "main"))
	if err != nil || string(ref0) != repo.Commit {
		t.Fatalf("refs/main = %q, %v; want %s", ref0, err, repo.Commit)
	}
	leftovers, _ := filepath.Glob(filepath.Join(repoDir, "blobs", "*.incomplete"))
	if len(leftovers) > 0 {
		t.Fatalf("temporary files left: %v", leftovers)
	}

	// The token goes to the hub, never to the CDN.
	for _, r := range s.Requests() {
		if r.Host == "hub" && !r.Authorized || r.Host == "cdn" && r.Authorized {
			t.Errorf("%s %s %s: authorized=%v", r.Host, r.Method, r.Path, r.Authorized)
		}
	}
	if n := s.Count("cdn", http.MethodGet); n != 1 {
		t.Errorf("CDN GETs = %d, want 1 (the LFS file)", n)
	}

	// A branch is asked again (it may have moved); the bytes are not.
	gets := s.Count("hub", http.MethodGet) + s.Count("cdn", http.MethodGet)
	if _, err := c.Download(context.Background(), ref, "tokenizer.json"); err != nil {
		t.Fatal(err)
	}
	if n := s.Count("hub", http.MethodGet) + s.Count("cdn", http.MethodGet); n != gets {
		t.Errorf("a cached file was downloaded again (%d GETs, was %d)", n, gets)
	}
	// A commit never changes: no request at all.
	before := len(s.Requests())
	if _, err := c.Download(context.Background(), Ref{"org/model", repo.Commit}, "tokenizer.json"); err != nil {
		t.Fatal(err)
	}
	if n := len(s.Requests()); n != before {
		t.Errorf("a cached commit cost %d requests", n-before)
	}
}

func TestDownloadReusesAnotherToolsCache(t *testing.T) {
	s := hubtest.NewTLS(t)
	files := testFiles()
	repo := s.AddRepo("org/model", files)
	cache := t.TempDir()
	hubtest.FillCache(t, cache, "org/model", "main", repo, "tokenizer.json")
	c := newClient(t, s, Config{CacheDir: cache})
	f, err := c.Download(context.Background(), Ref{"org/model", "main"}, "tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(f.Path); !bytes.Equal(got, files["tokenizer.json"]) {
		t.Fatal("content differs")
	}
	if n := s.Count("hub", http.MethodGet) + s.Count("cdn", http.MethodGet); n != 0 {
		t.Fatalf("%d GETs for a file the cache held", n)
	}
}

func TestDownloadErrors(t *testing.T) {
	tests := []struct {
		name   string
		token  string
		ref    Ref
		file   string
		want   error
		status int
	}{
		{name: "gated without a token", ref: Ref{"org/gated", "main"}, file: "tokenizer_config.json", want: ErrGated, status: 401},
		{name: "gated with another token", token: "hf_other", ref: Ref{"org/gated", "main"}, file: "tokenizer_config.json", want: ErrGated, status: 403},
		{name: "no such repository", ref: Ref{"org/nope", "main"}, file: "tokenizer.json", want: ErrRepoNotFound, status: 401},
		{name: "no such revision", ref: Ref{"org/model", "v9"}, file: "tokenizer.json", want: ErrRevisionNotFound, status: 404},
		{name: "no such file", ref: Ref{"org/model", "main"}, file: "tokenizer.model", want: ErrEntryNotFound, status: 404},
		{name: "gated with its token", token: "hf_good", ref: Ref{"org/gated", "main"}, file: "tokenizer_config.json"},
		{name: "a tag", ref: Ref{"org/model", "v1"}, file: "tokenizer_config.json"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := hubtest.NewTLS(t)
			repo := s.AddRepo("org/model", testFiles())
			s.Tag("org/model", "v1")
			s.AddRepo("org/gated", testFiles())
			s.Gate("org/gated", "hf_good")
			c := newClient(t, s, Config{Token: tc.token})
			f, err := c.Download(context.Background(), tc.ref, tc.file)
			if tc.want == nil {
				if err != nil || f.Path == "" {
					t.Fatalf("got %+v, %v", f, err)
				}
				return
			}
			var se *StatusError
			if !errors.Is(err, tc.want) || !errors.As(err, &se) || se.Status != tc.status {
				t.Fatalf("err = %v, want %v with HTTP %d", err, tc.want, tc.status)
			}
			if !strings.Contains(err.Error(), tc.ref.String()) || !strings.Contains(err.Error(), tc.file) {
				t.Errorf("error %q does not name %s and %s", err, tc.ref, tc.file)
			}
			if tc.want == ErrEntryNotFound {
				// Remembered for offline use, with the commit the hub named.
				if f.Commit != repo.Commit {
					t.Errorf("commit %q, want %s", f.Commit, repo.Commit)
				}
				marker := filepath.Join(c.CacheDir(), "models--org--model", ".no_exist", repo.Commit, tc.file)
				if _, err := os.Stat(marker); err != nil {
					t.Errorf("no .no_exist marker: %v", err)
				}
			}
		})
	}
}

func TestDownloadFollowsARenamedRepository(t *testing.T) {
	s := hubtest.NewTLS(t)
	files := testFiles()
	s.AddRepo("org/new-name", files)
	s.Rename("org/old-name", "org/new-name")
	c := newClient(t, s, Config{Token: "hf_secret"})
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json"} {
		f, err := c.Download(context.Background(), Ref{"org/old-name", "main"}, name)
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(f.Path); !bytes.Equal(got, files[name]) {
			t.Fatalf("%s: content differs", name)
		}
		// Cached under the name asked for, as huggingface_hub does.
		if !strings.Contains(f.Path, "models--org--old-name") {
			t.Fatalf("cached at %s", f.Path)
		}
	}
}

func TestDownloadRetriesTransientFailures(t *testing.T) {
	tests := []struct {
		name     string
		failures []int
		wantErr  bool
	}{
		{name: "503 then a reset connection, then success", failures: []int{503, 0}},
		{name: "429 then success", failures: []int{429}},
		{name: "503 at every attempt", failures: []int{503, 503, 503, 503}, wantErr: true},
		{name: "400 is not retried", failures: []int{400}, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := hubtest.NewTLS(t)
			s.AddRepo("org/model", testFiles())
			s.Fail(tc.failures...)
			c := newClient(t, s, Config{})
			_, err := c.Download(context.Background(), Ref{"org/model", "main"}, "tokenizer_config.json")
			heads := s.Count("hub", http.MethodHead)
			if tc.wantErr {
				if err == nil {
					t.Fatal("want an error")
				}
				if heads != len(tc.failures) {
					t.Fatalf("%d HEADs, want %d", heads, len(tc.failures))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if heads != len(tc.failures)+1 {
				t.Fatalf("%d HEADs, want %d", heads, len(tc.failures)+1)
			}
		})
	}
}

func TestDownloadTimesOut(t *testing.T) {
	s := hubtest.NewTLS(t)
	s.AddRepo("org/model", testFiles())
	c := newClient(t, s, Config{MetadataTimeout: 50 * time.Millisecond, Attempts: 2})

	s.Stall(1) // the first HEAD never answers; the second does
	if _, err := c.Download(context.Background(), Ref{"org/model", "main"}, "tokenizer_config.json"); err != nil {
		t.Fatal(err)
	}
	s.Stall(2)
	_, err := c.Download(context.Background(), Ref{"org/model", "main"}, "tokenizer.json")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want a timeout", err)
	}
}

func TestDownloadStalledBodyIsRetried(t *testing.T) {
	s := hubtest.NewTLS(t)
	files := testFiles()
	s.AddRepo("org/model", files)
	s.StallCDN(1)
	c := newClient(t, s, Config{ReadTimeout: 100 * time.Millisecond})
	f, err := c.Download(context.Background(), Ref{"org/model", "main"}, "tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(f.Path); !bytes.Equal(got, files["tokenizer.json"]) {
		t.Fatal("content differs")
	}
	if n := s.Count("cdn", http.MethodGet); n != 2 {
		t.Fatalf("CDN GETs = %d, want 2", n)
	}
}

func TestOfflineReadsACacheLaidOutByHuggingfaceHub(t *testing.T) {
	s := hubtest.NewTLS(t)
	repo := s.AddRepo("org/model", testFiles())
	cache := t.TempDir()
	hubtest.FillCache(t, cache, "org/model", "main", repo, "tokenizer.json", "sub/dir/file.txt")
	hubtest.MarkMissing(t, cache, "org/model", repo, "chat_template.jinja")
	c := newClient(t, s, Config{CacheDir: cache, Offline: true})
	ctx := context.Background()

	for _, rev := range []string{"main", repo.Commit} {
		for _, name := range []string{"tokenizer.json", "sub/dir/file.txt"} {
			f, err := c.Download(ctx, Ref{"org/model", rev}, name)
			if err != nil || f.Commit != repo.Commit {
				t.Fatalf("%s@%s: %+v, %v", name, rev, f, err)
			}
		}
	}
	if _, err := c.Download(ctx, Ref{"org/model", "main"}, "chat_template.jinja"); !errors.Is(err, ErrEntryNotFound) {
		t.Fatalf("a file recorded as missing: err = %v", err)
	}
	_, err := c.Download(ctx, Ref{"org/model", "main"}, "tokenizer_config.json")
	if !errors.Is(err, ErrNotCached) || !strings.Contains(err.Error(), "HF_HUB_OFFLINE") {
		t.Fatalf("an uncached file: err = %v", err)
	}
	if _, err := c.Download(ctx, Ref{"org/model", "v2"}, "tokenizer.json"); !errors.Is(err, ErrNotCached) {
		t.Fatalf("an unknown revision: err = %v", err)
	}
	if ok, err := c.Exists(ctx, Ref{"org/model", "main"}, "chat_template.jinja"); ok || err != nil {
		t.Fatalf("Exists(missing) = %v, %v", ok, err)
	}
	if ok, err := c.Exists(ctx, Ref{"org/model", "main"}, "tokenizer.json"); !ok || err != nil {
		t.Fatalf("Exists(cached) = %v, %v", ok, err)
	}
	if n := len(s.Requests()); n != 0 {
		t.Fatalf("offline, yet %d requests reached the hub", n)
	}
}

func TestHubDownFallsBackToTheCache(t *testing.T) {
	s := hubtest.NewTLS(t)
	files := testFiles()
	repo := s.AddRepo("org/model", files)
	cache := t.TempDir()
	hubtest.FillCache(t, cache, "org/model", "main", repo, "tokenizer.json")
	var logs bytes.Buffer
	c := newClient(t, s, Config{CacheDir: cache, Attempts: 2, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	s.Fail(503, 503)
	f, err := c.Download(context.Background(), Ref{"org/model", "main"}, "tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(f.Path); !bytes.Equal(got, files["tokenizer.json"]) {
		t.Fatal("content differs")
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "using the cached file") {
		t.Fatalf("no warning:\n%s", logs.String())
	}
	s.Fail(503, 503)
	if _, err := c.Download(context.Background(), Ref{"org/model", "main"}, "tokenizer_config.json"); err == nil || !strings.Contains(err.Error(), "HTTP 503") {
		t.Fatalf("an uncached file with the hub down: err = %v", err)
	}
}

func TestTokenIsNeverLogged(t *testing.T) {
	s := hubtest.NewTLS(t)
	s.AddRepo("org/model", testFiles())
	var logs bytes.Buffer
	c := newClient(t, s, Config{Token: "hf_secret", Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	// A dropped connection may be retried inside the transport too: enough
	// failures to exhaust the attempts either way.
	s.Fail(503, 0, 503, 503, 503, 503)
	_, err := c.Download(context.Background(), Ref{"org/model", "main"}, "tokenizer.json")
	if err == nil {
		t.Fatal("want an error after the retries")
	}
	if logs.Len() == 0 {
		t.Fatal("retries were not logged")
	}
	if strings.Contains(logs.String(), "hf_secret") || strings.Contains(err.Error(), "hf_secret") {
		t.Fatalf("the token leaked:\n%s\n%v", logs.String(), err)
	}
}

func TestTransient(t *testing.T) {
	reset := &url.Error{Op: "Head", URL: "https://hub/x", Err: &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"503", &StatusError{Status: 503}, true},
		{"429", &StatusError{Status: 429}, true},
		{"404", &StatusError{Status: 404, kind: ErrEntryNotFound}, false},
		{"401", &StatusError{Status: 401, kind: ErrRepoNotFound}, false},
		{"connection reset", reset, true},
		{"a timeout of its own", &url.Error{Op: "Head", URL: "https://hub/x", Err: context.DeadlineExceeded}, true},
		{"stalled body", fmt.Errorf("GET x: %w", errStalled), true},
		{"short body", fmt.Errorf("GET x: %w", io.ErrUnexpectedEOF), true},
		{"no such host", &url.Error{Op: "Head", URL: "https://hub/x", Err: &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "hub", IsNotFound: true}}}, false},
		{"DNS timeout", &url.Error{Op: "Head", URL: "https://hub/x", Err: &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "i/o timeout", Name: "hub", IsTimeout: true}}}, true},
		{"unknown certificate authority", &url.Error{Op: "Head", URL: "https://hub/x", Err: &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}}, false},
		{"a file system error", &os.PathError{Op: "rename", Path: "/cache/x", Err: syscall.EACCES}, false},
	}
	c := New(Config{Logger: quiet()})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := c.transient(context.Background(), tc.err); got != tc.want {
				t.Fatalf("transient(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if c.transient(ctx, reset) {
		t.Fatal("retrying after the caller cancelled")
	}
}

// FuzzParseRef parses arbitrary ORG/NAME[@REVISION] values: an accepted
// reference prints back to itself and cannot name a path outside the cache.
func FuzzParseRef(f *testing.F) {
	for _, s := range []string{"Qwen/Qwen3-8B", "gpt2@v1", "a/b@refs/pr/1", "a/b@../x", "a--b/c", "a/b@", "./x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRef(s)
		if err != nil {
			return
		}
		again, err := ParseRef(r.String())
		if err != nil || again != r {
			t.Fatalf("ParseRef(%q) = %+v, which prints as %q and parses as %+v, %v", s, r, r.String(), again, err)
		}
		if strings.ContainsAny(RepoFolder(r.Repo), `/\`) || strings.Contains(RepoFolder(r.Repo), "..") {
			t.Fatalf("repository %q gives the folder %q", r.Repo, RepoFolder(r.Repo))
		}
		dir := t.TempDir()
		ref := filepath.Join(dir, "refs", filepath.FromSlash(r.Revision))
		if rel, err := filepath.Rel(filepath.Join(dir, "refs"), ref); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			t.Fatalf("revision %q leaves refs/: %s", r.Revision, ref)
		}
	})
}
