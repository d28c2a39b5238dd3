// Package hubtest is a fake Hugging Face Hub on loopback for tests: the
// resolve endpoint with HEAD and GET answered as the hub answers them
// (X-Repo-Commit, ETag or X-Linked-Etag and X-Linked-Size, X-Error-Code),
// large files redirected to a separate CDN host, gated and renamed
// repositories, and failures injected on demand. It also lays out a cache
// directory by hand the way huggingface_hub does, so tests of offline use do
// not depend on the client that is under test.
package hubtest

import (
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// LFSThreshold is the size from which a file is stored "in LFS": its HEAD
// answers a redirect to the CDN with X-Linked-Etag (the sha256) and
// X-Linked-Size, as the hub does for large files.
const LFSThreshold = 64 << 10

// Server is the fake hub (Hub) and its CDN (CDN), two hosts on loopback.
type Server struct {
	Hub, CDN *httptest.Server

	mu       sync.Mutex
	repos    map[string]*Repo
	renamed  map[string]string
	blobs    map[string][]byte // sha256 → content, served by the CDN
	failures []int             // statuses for the next hub requests; 0 drops the connection
	stall    int               // next hub requests that never answer
	stallCDN int               // next CDN GETs that stop halfway
	requests []Request
}

// Repo is one model repository at one commit; its fields are read-only.
type Repo struct {
	Commit string
	Files  map[string][]byte

	tags  []string // revisions other than main that name the commit
	token string   // gates the repository when set
}

// Request is one request a host received. The token itself is never kept.
type Request struct {
	Host       string // "hub" or "cdn"
	Method     string
	Path       string
	Authorized bool // carried an Authorization header
}

// New starts the hub and the CDN over plain http on loopback, which the
// client accepts without a token; they stop with the test.
func New(t testing.TB) *Server {
	return start(t, httptest.NewServer)
}

// NewTLS starts the hub and the CDN over https, as the real ones are, so
// that the client sends the token; Transport trusts their certificate.
func NewTLS(t testing.TB) *Server {
	return start(t, httptest.NewTLSServer)
}

func start(t testing.TB, serve func(http.Handler) *httptest.Server) *Server {
	s := &Server{repos: map[string]*Repo{}, renamed: map[string]string{}, blobs: map[string][]byte{}}
	s.Hub = serve(http.HandlerFunc(s.serveHub))
	s.CDN = serve(http.HandlerFunc(s.serveCDN))
	t.Cleanup(s.CDN.Close)
	t.Cleanup(s.Hub.Close)
	return s
}

// Transport reaches both hosts: for NewTLS, trusting their certificate
// (the two share it).
func (s *Server) Transport() http.RoundTripper { return s.Hub.Client().Transport }

// URL is the hub's endpoint (HF_ENDPOINT).
func (s *Server) URL() string { return s.Hub.URL }

// AddRepo publishes files as repository id at a commit derived from their
// content, and returns it for further settings.
func (s *Server) AddRepo(id string, files map[string][]byte) *Repo {
	h := sha1.New()
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(h, "%s\x00%s\x00", n, GitBlobID(files[n]))
	}
	r := &Repo{Commit: hex.EncodeToString(h.Sum(nil)), Files: files}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.repos[id] = r
	for _, c := range files {
		if len(c) >= LFSThreshold {
			s.blobs[SHA256(c)] = c
		}
	}
	return r
}

// Gate makes repository id refuse a request without "Authorization:
// Bearer token" as the hub refuses it for a gated repository: 401 without
// a token, 403 with another one.
func (s *Server) Gate(id, token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.repos[id].token = token
}

// Tag makes tag a revision naming repository id's commit.
func (s *Server) Tag(id, tag string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.repos[id].tags = append(s.repos[id].tags, tag)
}

// Rename makes requests for oldID answer with a relative redirect to
// newID, as the hub does for a renamed repository.
func (s *Server) Rename(oldID, newID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.renamed[oldID] = newID
}

// Fail makes the next hub requests answer these statuses in turn; 0 drops
// the connection without an answer.
func (s *Server) Fail(statuses ...int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures = append(s.failures, statuses...)
}

// Stall makes the next n hub requests wait until the client gives up.
func (s *Server) Stall(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stall += n
}

// StallCDN makes the next n CDN downloads send half the file and then
// nothing until the client gives up.
func (s *Server) StallCDN(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stallCDN += n
}

// Requests returns the requests received so far, hub and CDN, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// Count is the number of requests received with this host and method.
func (s *Server) Count(host, method string) int {
	n := 0
	for _, r := range s.Requests() {
		if r.Host == host && r.Method == method {
			n++
		}
	}
	return n
}

func (s *Server) record(host string, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = append(s.requests, Request{Host: host, Method: r.Method, Path: r.URL.EscapedPath(), Authorized: r.Header.Get("Authorization") != ""})
}

func (s *Server) serveHub(w http.ResponseWriter, r *http.Request) {
	s.record("hub", r)
	s.mu.Lock()
	stall := s.stall > 0
	if stall {
		s.stall--
	}
	fail := -1
	if !stall && len(s.failures) > 0 {
		fail, s.failures = s.failures[0], s.failures[1:]
	}
	s.mu.Unlock()
	switch {
	case stall:
		<-r.Context().Done()
		return
	case fail == 0:
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				conn.Close()
				return
			}
		}
		w.WriteHeader(http.StatusInternalServerError)
		return
	case fail > 0:
		w.WriteHeader(fail)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	id, rev, file, ok := splitResolve(r.URL.EscapedPath())
	if !ok {
		hubError(w, http.StatusNotFound, "", "Not Found")
		return
	}
	s.mu.Lock()
	newID, renamed := s.renamed[id]
	repo := s.repos[id]
	var token string
	var tags []string
	if repo != nil {
		token, tags = repo.token, slices.Clone(repo.tags)
	}
	s.mu.Unlock()
	if renamed {
		w.Header().Set("Location", "/"+newID+"/resolve/"+url.PathEscape(rev)+"/"+file)
		w.WriteHeader(http.StatusTemporaryRedirect)
		return
	}
	if repo == nil {
		hubError(w, http.StatusUnauthorized, "RepoNotFound", "Repository not found")
		return
	}
	if token != "" {
		switch got := r.Header.Get("Authorization"); {
		case got == "":
			hubError(w, http.StatusUnauthorized, "GatedRepo", "Access to model "+id+" is restricted. You must have access to it and be authenticated to access it. Please log in.")
			return
		case got != "Bearer "+token:
			hubError(w, http.StatusForbidden, "GatedRepo", "Access to model "+id+" is restricted and you are not in the authorized list.")
			return
		}
	}
	if rev != "main" && rev != repo.Commit && !slices.Contains(tags, rev) {
		hubError(w, http.StatusNotFound, "RevisionNotFound", "Invalid rev id: "+rev)
		return
	}
	w.Header().Set("X-Repo-Commit", repo.Commit)
	name, err := url.PathUnescape(file)
	content, found := repo.Files[name]
	if err != nil || !found {
		hubError(w, http.StatusNotFound, "EntryNotFound", "Entry not found")
		return
	}
	if len(content) >= LFSThreshold {
		sum := SHA256(content)
		w.Header().Set("ETag", `"`+GitBlobID([]byte("version https://git-lfs.github.com/spec/v1\noid sha256:"+sum+"\n"))+`"`)
		w.Header().Set("X-Linked-Etag", `"`+sum+`"`)
		w.Header().Set("X-Linked-Size", strconv.Itoa(len(content)))
		w.Header().Set("Location", s.CDN.URL+"/blobs/"+sum+"?X-Amz-Signature=fake")
		w.WriteHeader(http.StatusFound)
		return
	}
	w.Header().Set("ETag", `"`+GitBlobID(content)+`"`)
	w.Header().Set("Content-Length", strconv.Itoa(len(content)))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodGet {
		w.Write(content)
	}
}

func (s *Server) serveCDN(w http.ResponseWriter, r *http.Request) {
	s.record("cdn", r)
	s.mu.Lock()
	content, ok := s.blobs[strings.TrimPrefix(r.URL.Path, "/blobs/")]
	stall := ok && r.Method == http.MethodGet && s.stallCDN > 0
	if stall {
		s.stallCDN--
	}
	s.mu.Unlock()
	if !ok {
		w.WriteHeader(http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(content)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodGet {
		return
	}
	if stall {
		w.Write(content[:len(content)/2])
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		<-r.Context().Done()
		return
	}
	w.Write(content)
}

// splitResolve splits /ORG/NAME/resolve/REV/FILE (REV path-escaped, so a
// branch with '/' is one segment).
func splitResolve(p string) (id, rev, file string, ok bool) {
	before, after, found := strings.Cut(strings.TrimPrefix(p, "/"), "/resolve/")
	if !found {
		return "", "", "", false
	}
	escRev, file, found := strings.Cut(after, "/")
	if !found || file == "" {
		return "", "", "", false
	}
	rev, err := url.PathUnescape(escRev)
	if err != nil {
		return "", "", "", false
	}
	return before, rev, file, true
}

func hubError(w http.ResponseWriter, status int, code, msg string) {
	if code != "" {
		w.Header().Set("X-Error-Code", code)
	}
	w.Header().Set("X-Error-Message", msg)
	w.WriteHeader(status)
}

// GitBlobID is git's object id of a blob with this content: the ETag the
// hub gives a file stored in git.
func GitBlobID(content []byte) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(content))
	h.Write(content)
	return hex.EncodeToString(h.Sum(nil))
}

// SHA256 is the hex sha256 of content: the ETag of a file stored in LFS.
func SHA256(content []byte) string {
	s := sha256.Sum256(content)
	return hex.EncodeToString(s[:])
}

// ETag is the name huggingface_hub gives content's blob in the cache.
func ETag(content []byte) string {
	if len(content) >= LFSThreshold {
		return SHA256(content)
	}
	return GitBlobID(content)
}

// FillCache lays repo's files out under cacheDir as huggingface_hub does
// after downloading them at revision: blobs named by ETag, snapshot
// symlinks to them, and refs/REVISION holding the commit.
func FillCache(t testing.TB, cacheDir, id, revision string, repo *Repo, files ...string) {
	t.Helper()
	dir := filepath.Join(cacheDir, "models--"+strings.ReplaceAll(id, "/", "--"))
	for _, name := range files {
		content, ok := repo.Files[name]
		if !ok {
			t.Fatalf("hubtest: %s has no %s", id, name)
		}
		blob := filepath.Join(dir, "blobs", ETag(content))
		pointer := filepath.Join(dir, "snapshots", repo.Commit, filepath.FromSlash(name))
		for _, d := range []string{filepath.Dir(blob), filepath.Dir(pointer)} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(blob, content, 0o644); err != nil {
			t.Fatal(err)
		}
		rel, err := filepath.Rel(filepath.Dir(pointer), blob)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(rel, pointer); err != nil {
			t.Fatal(err)
		}
	}
	if revision != repo.Commit {
		ref := filepath.Join(dir, "refs", filepath.FromSlash(revision))
		if err := os.MkdirAll(filepath.Dir(ref), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(ref, []byte(repo.Commit), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// MarkMissing records in cacheDir, as huggingface_hub does after a 404,
// that repo's commit has no such file.
func MarkMissing(t testing.TB, cacheDir, id string, repo *Repo, file string) {
	t.Helper()
	p := filepath.Join(cacheDir, "models--"+strings.ReplaceAll(id, "/", "--"), ".no_exist", repo.Commit, filepath.FromSlash(file))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}
