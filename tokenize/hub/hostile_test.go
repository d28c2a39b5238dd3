package hub

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/tokenize/hub/hubtest"
)

// seen is one request a test server received.
type seen struct {
	method, path string
	authorized   bool
}

// recorder keeps what reached a test server.
type recorder struct {
	mu   sync.Mutex
	reqs []seen
}

func (r *recorder) add(req *http.Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = append(r.reqs, seen{req.Method, req.URL.Path, req.Header.Get("Authorization") != ""})
}

func (r *recorder) all() []seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]seen(nil), r.reqs...)
}

func (r *recorder) count(method string) int {
	n := 0
	for _, s := range r.all() {
		if s.method == method {
			n++
		}
	}
	return n
}

// serve starts a server, https or plain, whose answers the test writes.
func serve(t *testing.T, useTLS bool, h http.HandlerFunc) (*httptest.Server, *recorder) {
	t.Helper()
	rec := &recorder{}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		h(w, r)
	})
	var srv *httptest.Server
	if useTLS {
		srv = httptest.NewTLSServer(handler)
	} else {
		srv = httptest.NewServer(handler)
	}
	t.Cleanup(srv.Close)
	return srv, rec
}

// dialing reaches the named hosts at the servers' addresses, whatever
// their names resolve to, and trusts the test certificate (httptest's,
// valid for example.com and 127.0.0.1): a URL can then name a host that is
// not a loopback address, or another host than the hub's, and still reach
// a server of the test.
func dialing(hosts map[string]*httptest.Server) *http.Transport {
	var tlsCfg *tls.Config
	if s := httptest.NewUnstartedServer(nil); s != nil {
		s.StartTLS()
		tlsCfg = s.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
		s.Close()
	}
	return &http.Transport{
		TLSClientConfig: tlsCfg,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			if s, ok := hosts[host]; ok {
				addr = s.Listener.Addr().String()
			}
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
	}
}

const goodCommit = "0123456789abcdef0123456789abcdef01234567"

// answerFile answers the hub's HEAD and GET for content: a file stored in
// git, its ETag the blob id, at commit.
func answerFile(w http.ResponseWriter, r *http.Request, commit string, content []byte) {
	w.Header().Set("X-Repo-Commit", commit)
	w.Header().Set("ETag", `"`+hubtest.GitBlobID(content)+`"`)
	w.Header().Set("Content-Length", strconv.Itoa(len(content)))
	if r.Method == http.MethodGet {
		w.Write(content)
	}
}

// deepCache is a cache root four directories below an empty directory, so
// that a path climbing out of the cache still lands where the test sees
// it; nothing exists under base until the client writes.
func deepCache(t *testing.T) (base, root string) {
	base = t.TempDir()
	return base, filepath.Join(base, "a", "b", "c", "hub")
}

// written lists every file and symlink under base.
func written(t *testing.T, base string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func hostileClient(t *testing.T, srv *httptest.Server, cfg Config) *Client {
	t.Helper()
	if cfg.Endpoint == "" {
		cfg.Endpoint = srv.URL
	}
	if cfg.Transport == nil {
		cfg.Transport = srv.Client().Transport
	}
	cfg.Backoff = time.Millisecond
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	return New(cfg)
}

// TestDownloadRefusesAnUnusableCommit: the commit a hub names becomes a
// directory, so anything but a commit hash is refused, with the
// repository named, before anything is written: a found file and a
// missing one (which .no_exist would remember) alike.
func TestDownloadRefusesAnUnusableCommit(t *testing.T) {
	commits := []string{
		"../../../../escape",
		"abc",
		strings.ToUpper(goodCommit[:39]) + "A",
		goodCommit[:39] + "g",
		"0123456789abcdef0123/456789abcdef01234567",
	}
	for _, missing := range []bool{false, true} {
		for _, commit := range commits {
			t.Run(strconv.FormatBool(missing)+"/"+commit, func(t *testing.T) {
				srv, _ := serve(t, true, func(w http.ResponseWriter, r *http.Request) {
					if missing {
						w.Header().Set("X-Repo-Commit", commit)
						w.Header().Set("X-Error-Code", "EntryNotFound")
						w.WriteHeader(http.StatusNotFound)
						return
					}
					answerFile(w, r, commit, []byte(`{"model": {}}`))
				})
				base, root := deepCache(t)
				c := hostileClient(t, srv, Config{CacheDir: root, Token: "hf_secret"})
				_, err := c.Download(context.Background(), Ref{"org/model", "main"}, "tokenizer.json")
				if err == nil || !strings.Contains(err.Error(), "org/model") || !strings.Contains(err.Error(), "X-Repo-Commit") {
					t.Fatalf("err = %v, want one naming org/model and X-Repo-Commit", err)
				}
				if errors.Is(err, ErrEntryNotFound) {
					t.Fatalf("err = %v: an unusable answer taken as a missing file", err)
				}
				if files := written(t, base); len(files) > 0 {
					t.Fatalf("written: %v", files)
				}
			})
		}
	}
}

// TestDownloadKeepsPathsInsideTheCache: a reference built without
// ParseRef, a file name and a hub's ETag each become part of a path, and
// none may leave the cache; a refused name costs no request.
func TestDownloadKeepsPathsInsideTheCache(t *testing.T) {
	tests := []struct {
		name     string
		ref      Ref
		file     string
		etag     string
		requests int
	}{
		{name: "revision climbing out", ref: Ref{"org/model", "../../../../x"}, file: "tokenizer.json"},
		{name: "revision climbing out after a branch", ref: Ref{"org/model", "refs/../../../../../x"}, file: "tokenizer.json"},
		{name: "absolute revision", ref: Ref{"org/model", "/tmp/x"}, file: "tokenizer.json"},
		{name: "revision with a NUL", ref: Ref{"org/model", "a\x00b"}, file: "tokenizer.json"},
		{name: "revision with a backslash", ref: Ref{"org/model", `..\..\x`}, file: "tokenizer.json"},
		{name: "repository climbing out", ref: Ref{"../../x", "main"}, file: "tokenizer.json"},
		{name: "absolute repository", ref: Ref{"/x", "main"}, file: "tokenizer.json"},
		{name: "file climbing out", ref: Ref{"org/model", "main"}, file: "a/../../../../../x"},
		{name: "absolute file", ref: Ref{"org/model", "main"}, file: "/etc/x"},
		{name: "file with a control character", ref: Ref{"org/model", "main"}, file: "a\nb"},
		{name: "ETag climbing out", ref: Ref{"org/model", "main"}, file: "tokenizer.json", etag: "../../../../x", requests: 1},
		{name: "ETag with a separator", ref: Ref{"org/model", "main"}, file: "tokenizer.json", etag: "a/b", requests: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			content := []byte(`{"model": {}}`)
			srv, rec := serve(t, true, func(w http.ResponseWriter, r *http.Request) {
				answerFile(w, r, goodCommit, content)
				if tc.etag != "" {
					w.Header().Set("ETag", `"`+tc.etag+`"`)
				}
			})
			base, root := deepCache(t)
			c := hostileClient(t, srv, Config{CacheDir: root})
			if _, err := c.Download(context.Background(), tc.ref, tc.file); err == nil {
				t.Fatal("want an error")
			}
			if ok, err := c.Exists(context.Background(), tc.ref, tc.file); ok || err == nil {
				t.Fatalf("Exists = %v, %v; want an error", ok, err)
			}
			if files := written(t, base); len(files) > 0 {
				t.Fatalf("written: %v", files)
			}
			if n := rec.count(http.MethodHead) + rec.count(http.MethodGet); n != 2*tc.requests {
				t.Fatalf("%d requests reached the hub, want %d", n, 2*tc.requests)
			}
		})
	}
}

// TestPlainHTTPEndpoint: a plain http hub elsewhere than on loopback is
// refused unless allowed; allowed, or on loopback, it never gets the token,
// and the log says so.
func TestPlainHTTPEndpoint(t *testing.T) {
	tests := []struct {
		name     string
		endpoint func(s *hubtest.Server) string
		allow    bool
		refused  bool
	}{
		{name: "elsewhere, not allowed", endpoint: mirrorURL, refused: true},
		{name: "elsewhere, allowed", endpoint: mirrorURL, allow: true},
		{name: "on loopback", endpoint: func(s *hubtest.Server) string { return s.URL() }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := hubtest.New(t)
			files := testFiles()
			s.AddRepo("org/model", files)
			var logs bytes.Buffer
			c := New(Config{
				Endpoint:  tc.endpoint(s),
				AllowHTTP: tc.allow,
				Token:     "hf_secret",
				CacheDir:  t.TempDir(),
				Transport: dialing(map[string]*httptest.Server{"hf-mirror.example": s.Hub}),
				Backoff:   time.Millisecond,
				Logger:    slog.New(slog.NewTextHandler(&logs, nil)),
			})
			ctx := context.Background()
			f, err := c.Download(ctx, Ref{"org/model", "main"}, "tokenizer.json")
			if tc.refused {
				if !errors.Is(err, ErrPlainHTTP) || !strings.Contains(err.Error(), EnvAllowHTTP) {
					t.Fatalf("err = %v, want plain http refused, naming %s", err, EnvAllowHTTP)
				}
				if _, err := c.Exists(ctx, Ref{"org/model", "main"}, "tokenizer.json"); !errors.Is(err, ErrPlainHTTP) {
					t.Fatalf("Exists: err = %v", err)
				}
				if n := len(s.Requests()); n != 0 {
					t.Fatalf("%d requests reached the hub", n)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := os.ReadFile(f.Path); !bytes.Equal(got, files["tokenizer.json"]) {
				t.Fatal("content differs")
			}
			if _, err := c.Download(ctx, Ref{"org/model", "main"}, "tokenizer_config.json"); err != nil {
				t.Fatal(err)
			}
			if len(s.Requests()) < 4 {
				t.Fatalf("only %d requests", len(s.Requests()))
			}
			for _, r := range s.Requests() {
				if r.Authorized {
					t.Errorf("the token went over plain http: %s %s %s", r.Host, r.Method, r.Path)
				}
			}
			if !strings.Contains(logs.String(), "HF_TOKEN is not sent") || strings.Contains(logs.String(), "hf_secret") {
				t.Fatalf("log:\n%s", logs.String())
			}
		})
	}
}

func mirrorURL(s *hubtest.Server) string {
	_, port, _ := net.SplitHostPort(s.Hub.Listener.Addr().String())
	return "http://hf-mirror.example:" + port
}

// TestRedirects: the hub (https, with a token) sends the client elsewhere,
// at HEAD (a CDN location) or at GET. Plain http is refused unless allowed,
// and never gets the token; Go's own rule for https stands (the token
// follows to the same host name, not to another).
func TestRedirects(t *testing.T) {
	content := []byte(`{"model": {}}`)
	tests := []struct {
		name  string
		atGet bool   // the GET redirects, not the HEAD
		to    string // "plain", "https-same-host", "https-other-host"
		allow bool
		// refused: the download fails with ErrPlainHTTP and nothing reaches
		// the target; else token says whether the target got it.
		refused, token bool
	}{
		{name: "HEAD to plain http", to: "plain", refused: true},
		{name: "HEAD to plain http, allowed", to: "plain", allow: true},
		{name: "GET to plain http on the same host", atGet: true, to: "plain", refused: true},
		{name: "GET to plain http on the same host, allowed", atGet: true, to: "plain", allow: true},
		{name: "GET to https on the same host", atGet: true, to: "https-same-host", token: true},
		{name: "GET to https on another host", atGet: true, to: "https-other-host"},
		{name: "HEAD to https on another host", to: "https-other-host"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			answer := func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("ETag", `"`+hubtest.GitBlobID(content)+`"`)
				w.Header().Set("Content-Length", strconv.Itoa(len(content)))
				if r.Method == http.MethodGet {
					w.Write(content)
				}
			}
			target, got := serve(t, tc.to != "plain", answer)
			_, port, _ := net.SplitHostPort(target.Listener.Addr().String())
			var location string
			switch tc.to {
			case "plain":
				location = "http://127.0.0.1:" + port + "/blob"
			case "https-same-host":
				location = "https://127.0.0.1:" + port + "/blob"
			case "https-other-host":
				location = "https://example.com:" + port + "/blob"
			}
			hub, hubSeen := serve(t, true, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Repo-Commit", goodCommit)
				if r.Method == http.MethodHead && !tc.atGet || r.Method == http.MethodGet && tc.atGet {
					w.Header().Set("X-Linked-Etag", `"`+hubtest.GitBlobID(content)+`"`)
					w.Header().Set("Location", location)
					w.WriteHeader(http.StatusFound)
					return
				}
				answer(w, r)
			})
			_, root := deepCache(t)
			c := hostileClient(t, hub, Config{
				CacheDir: root, Token: "hf_secret", AllowHTTP: tc.allow,
				Transport: dialing(map[string]*httptest.Server{"example.com": target}),
			})
			f, err := c.Download(context.Background(), Ref{"org/model", "main"}, "tokenizer.json")
			for _, r := range hubSeen.all() {
				if !r.authorized {
					t.Errorf("the hub itself did not get the token: %s %s", r.method, r.path)
				}
			}
			if tc.refused {
				if !errors.Is(err, ErrPlainHTTP) {
					t.Fatalf("err = %v, want plain http refused", err)
				}
				if n := len(got.all()); n != 0 {
					t.Fatalf("%d requests reached the plain http target", n)
				}
				if n := hubSeen.count(http.MethodGet); n > 1 {
					t.Fatalf("a refused redirect was tried %d times", n)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if b, _ := os.ReadFile(f.Path); !bytes.Equal(b, content) {
				t.Fatal("content differs")
			}
			reqs := got.all()
			if len(reqs) != 1 || reqs[0].method != http.MethodGet || reqs[0].authorized != tc.token {
				t.Fatalf("the target saw %+v, want one GET with authorized=%v", reqs, tc.token)
			}
		})
	}
}

// TestDownloadCapsTheFileSize: a file larger than MaxFileSize is refused,
// whether the hub says so at HEAD, at GET or not at all, counted as the
// bytes arrive, with no partial file left, no second try, and memory that
// does not grow with what the hub sends.
func TestDownloadCapsTheFileSize(t *testing.T) {
	const limit = 1 << 20
	tests := []struct {
		name     string
		headSize int   // Content-Length at HEAD; 0: none
		getSize  int   // Content-Length at GET; 0: none (chunked)
		send     int64 // bytes the GET sends, at most
		gets     int
	}{
		{name: "HEAD says too large", headSize: 2 * limit, send: 2 * limit, gets: 0},
		{name: "GET says too large", getSize: 2 * limit, send: 2 * limit, gets: 1},
		{name: "sent beyond what HEAD said", headSize: 1000, send: 64 << 20, gets: 1},
		{name: "no size said", send: 8 << 20, gets: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var sent atomic.Int64
			done := make(chan struct{}, 8) // a handler per try never blocks
			srv, rec := serve(t, true, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Repo-Commit", goodCommit)
				w.Header().Set("ETag", `"`+goodCommit+`"`)
				if r.Method == http.MethodHead {
					if tc.headSize > 0 {
						w.Header().Set("Content-Length", strconv.Itoa(tc.headSize))
					}
					return
				}
				defer func() { done <- struct{}{} }()
				if tc.getSize > 0 {
					w.Header().Set("Content-Length", strconv.Itoa(tc.getSize))
				}
				chunk := bytes.Repeat([]byte("x"), 32<<10)
				for sent.Load() < tc.send {
					n, err := w.Write(chunk)
					sent.Add(int64(n))
					if err != nil {
						return
					}
					if tc.getSize == 0 {
						w.(http.Flusher).Flush()
					}
				}
			})
			base, root := deepCache(t)
			c := hostileClient(t, srv, Config{CacheDir: root, MaxFileSize: limit})
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			_, err := c.Download(context.Background(), Ref{"org/model", "main"}, "tokenizer.json")
			runtime.ReadMemStats(&after)
			if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), EnvMaxFileSize) {
				t.Fatalf("err = %v, want the file refused as too large, naming %s", err, EnvMaxFileSize)
			}
			if n := rec.count(http.MethodGet); n != tc.gets {
				t.Fatalf("%d GETs, want %d", n, tc.gets)
			}
			if tc.gets > 0 {
				select {
				case <-done:
				case <-time.After(time.Minute):
					t.Fatal("the hub is still sending")
				}
			}
			if s := sent.Load(); tc.send > 16<<20 && s >= tc.send {
				t.Fatalf("the client read all %d bytes the hub sent", s)
			}
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
				t.Fatalf("%d bytes allocated while refusing the file", grew)
			}
			for _, f := range written(t, base) {
				if !strings.Contains(f, string(filepath.Separator)+"refs"+string(filepath.Separator)) {
					t.Fatalf("left behind: %s", f)
				}
			}
		})
	}
}

// FuzzCachePaths builds every cache path from arbitrary names: what is
// accepted stays inside the repository's directory, a commit accepted is
// a commit hash, and nothing panics.
func FuzzCachePaths(f *testing.F) {
	f.Add("main", "tokenizer.json", goodCommit, "abc")
	f.Add("refs/pr/1", "sub/dir/file.txt", goodCommit, goodCommit)
	f.Add("../../x", "../x", "../../../../escape", "../x")
	f.Add("a\x00b", "/etc/x", strings.ToUpper(goodCommit), "a/b")
	f.Add(`..\x`, "a//b", "", ".")
	f.Fuzz(func(t *testing.T, rev, file, commit, etag string) {
		rc := repoCache{dir: filepath.Join("/cache", "models--org--model")}
		check := func(what, p string, err error) {
			if err != nil {
				return
			}
			if !strings.HasPrefix(p, rc.dir+string(filepath.Separator)) {
				t.Fatalf("%s: %q is not under %s", what, p, rc.dir)
			}
			if ierr := inside(rc.dir, p); ierr != nil {
				t.Fatalf("%s: %v", what, ierr)
			}
		}
		p, err := rc.refPath(rev)
		check("refs/"+rev, p, err)
		if err == nil && validRevision(rev) != nil {
			t.Fatalf("refPath accepted the revision %q that validRevision refuses", rev)
		}
		p, err = rc.commitPath("snapshots", commit, file)
		check("snapshots/"+commit+"/"+file, p, err)
		if err == nil && !isCommit(commit) {
			t.Fatalf("commit %q accepted", commit)
		}
		p, err = rc.blob(etag)
		check("blobs/"+etag, p, err)
		if err == nil && (strings.ContainsAny(etag, "/\\\x00") || etag == ".." || etag == ".") {
			t.Fatalf("ETag %q accepted", etag)
		}
	})
}
