// Package hub owns fetching files from Hugging Face Hub model repositories:
// the hub's own HTTP API, its environment variables and its cache layout,
// the same as huggingface_hub's, so a cache that vLLM, transformers or
// `hf download` filled is reused here and what is fetched here is theirs
// too.
//
// A file is resolved with HEAD {endpoint}/{repo}/resolve/{revision}/{file}:
// the answer names the commit the revision points at (X-Repo-Commit), the
// content's ETag (X-Linked-Etag for a large file, else ETag: its sha256 or
// git blob id) and its size; a large file answers with a redirect to a CDN,
// which is then fetched without the token. Relative redirects (a renamed
// repository) are followed with the token. Under the cache directory:
//
//	models--ORG--NAME/refs/REVISION          the commit REVISION last resolved to
//	models--ORG--NAME/blobs/ETAG             the file's bytes
//	models--ORG--NAME/snapshots/COMMIT/FILE  a relative symlink to ../../blobs/ETAG
//	models--ORG--NAME/.no_exist/COMMIT/FILE  empty: FILE does not exist at COMMIT
//
// A hub that cannot be asked (offline mode, a network failure, a 5xx after
// the retries, a refused token) leaves the cache as the answer, as
// huggingface_hub does.
//
// The hub is not trusted with the file system or the token: every name that
// becomes a path (repository, revision, file, the hub's X-Repo-Commit, which
// must be a commit hash, and its ETag) is checked segment by segment and the
// path verified to stay inside the cache before anything is written; the
// token goes over https only, so a plain http endpoint (refused unless on a
// loopback address or allowed by PREFIXROUTER_HUB_ALLOW_HTTP) and any
// redirect to plain http (refused unless plain http is accepted) never get
// it; a file is cut off past Config.MaxFileSize as its bytes arrive.
package hub

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// DefaultEndpoint is the hub's address when HF_ENDPOINT is unset.
const DefaultEndpoint = "https://huggingface.co"

// DefaultRevision is the revision of a reference that names none.
const DefaultRevision = "main"

// DefaultMaxFileSize bounds one downloaded file when Config.MaxFileSize is
// zero: the largest tokenizer.json files published are about 30 MB.
const DefaultMaxFileSize = 256 << 20

// Config is how the client reaches the hub and where it caches. The zero
// value of each field takes the default New documents.
type Config struct {
	// Endpoint is the hub's base URL (HF_ENDPOINT; DefaultEndpoint).
	Endpoint string
	// Token is sent as "Authorization: Bearer" to the endpoint's host over
	// https, never over plain http and never to a CDN; it is never logged.
	Token string
	// AllowHTTP accepts a plain http:// Endpoint, and redirects to plain
	// http (PREFIXROUTER_HUB_ALLOW_HTTP). Without it only an endpoint on a
	// loopback address may be plain http. The token is not sent over http
	// either way.
	AllowHTTP bool
	// MaxFileSize bounds one file's bytes, counted as they arrive
	// (PREFIXROUTER_HUB_MAX_FILE_SIZE; DefaultMaxFileSize).
	MaxFileSize int64
	// CacheDir is the hub cache directory (HF_HUB_CACHE).
	CacheDir string
	// Offline answers from the cache alone (HF_HUB_OFFLINE).
	Offline bool
	// MetadataTimeout bounds one HEAD request (HF_HUB_ETAG_TIMEOUT; 10 s).
	MetadataTimeout time.Duration
	// ReadTimeout is the silence allowed while waiting for or reading a
	// file's bytes (HF_HUB_DOWNLOAD_TIMEOUT; 10 s).
	ReadTimeout time.Duration
	// Attempts bounds the tries of one request that fails in a way worth
	// trying again: a connection error, a timeout, 429 or a 5xx (default 4).
	Attempts int
	// Backoff is the wait before the second try; it doubles up to 8 s
	// (default 500 ms). A Retry-After header may lengthen it up to that cap.
	Backoff time.Duration
	// Transport carries the requests (default http.DefaultTransport, which
	// honours HTTPS_PROXY).
	Transport http.RoundTripper
	// UserAgent is sent with every request.
	UserAgent string
	// Logger receives retries and cache fallbacks (default slog.Default).
	Logger *slog.Logger
}

// Environment variables ConfigFromEnv reads, with the meaning
// huggingface_hub gives them.
const (
	EnvEndpoint        = "HF_ENDPOINT"
	EnvToken           = "HF_TOKEN"
	EnvTokenPath       = "HF_TOKEN_PATH"
	EnvHome            = "HF_HOME"
	EnvHubCache        = "HF_HUB_CACHE"
	EnvOffline         = "HF_HUB_OFFLINE"
	EnvEtagTimeout     = "HF_HUB_ETAG_TIMEOUT"
	EnvDownloadTimeout = "HF_HUB_DOWNLOAD_TIMEOUT"
	// The router's own: not huggingface_hub's.
	EnvAllowHTTP   = "PREFIXROUTER_HUB_ALLOW_HTTP"
	EnvMaxFileSize = "PREFIXROUTER_HUB_MAX_FILE_SIZE"
)

// ConfigFromEnv reads the hub settings from the environment as
// huggingface_hub does: HF_ENDPOINT; HF_TOKEN (or the legacy
// HUGGING_FACE_HUB_TOKEN), else the token file HF_TOKEN_PATH (default
// HF_HOME/token) that `hf auth login` writes; HF_HUB_CACHE (or the legacy
// HUGGINGFACE_HUB_CACHE), default HF_HOME/hub with HF_HOME defaulting to
// $XDG_CACHE_HOME/huggingface or ~/.cache/huggingface; HF_HUB_OFFLINE (or
// TRANSFORMERS_OFFLINE) true for 1, ON, YES or TRUE; HF_HUB_ETAG_TIMEOUT and
// HF_HUB_DOWNLOAD_TIMEOUT in whole seconds. Two are the router's own:
// PREFIXROUTER_HUB_ALLOW_HTTP (true as HF_HUB_OFFLINE is) accepts a plain
// http HF_ENDPOINT, which is refused otherwise unless it is a loopback
// address; PREFIXROUTER_HUB_MAX_FILE_SIZE is Config.MaxFileSize in bytes.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	home := expandHome(getenv, getenv(EnvHome))
	if home == "" {
		base := getenv("XDG_CACHE_HOME")
		if base == "" {
			base = filepath.Join(userHome(getenv), ".cache")
		}
		home = filepath.Join(base, "huggingface")
	}
	cfg := Config{
		Endpoint:  strings.TrimRight(firstSet(getenv, EnvEndpoint), "/"),
		CacheDir:  expandHome(getenv, firstSet(getenv, EnvHubCache, "HUGGINGFACE_HUB_CACHE")),
		Offline:   isTrue(firstSet(getenv, EnvOffline, "TRANSFORMERS_OFFLINE")),
		Token:     cleanToken(firstSet(getenv, EnvToken, "HUGGING_FACE_HUB_TOKEN")),
		AllowHTTP: isTrue(getenv(EnvAllowHTTP)),
	}
	if cfg.Endpoint != "" {
		if _, err := checkEndpoint(cfg.Endpoint, cfg.AllowHTTP); err != nil {
			return Config{}, err
		}
	}
	if v := getenv(EnvMaxFileSize); v != "" {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || n <= 0 {
			return Config{}, fmt.Errorf("%s %q: want a positive number of bytes", EnvMaxFileSize, v)
		}
		cfg.MaxFileSize = n
	}
	if cfg.CacheDir == "" {
		cfg.CacheDir = filepath.Join(home, "hub")
	}
	if cfg.Token == "" {
		path := expandHome(getenv, getenv(EnvTokenPath))
		if path == "" {
			path = filepath.Join(home, "token")
		}
		// A missing or unreadable token file means no token, as for
		// huggingface_hub: public repositories still work.
		if raw, err := os.ReadFile(path); err == nil {
			cfg.Token = cleanToken(string(raw))
		}
	}
	for _, t := range []struct {
		env string
		dst *time.Duration
	}{{EnvEtagTimeout, &cfg.MetadataTimeout}, {EnvDownloadTimeout, &cfg.ReadTimeout}} {
		v := getenv(t.env)
		if v == "" {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 {
			return Config{}, fmt.Errorf("%s %q: want whole seconds", t.env, v)
		}
		*t.dst = time.Duration(n) * time.Second
	}
	return cfg, nil
}

// checkEndpoint refuses an endpoint that is not an http or https URL, and
// a plain http one unless allowed or on a loopback address (a hub in the
// same pod or a test's): elsewhere the files could be changed on the way.
// plain reports an http endpoint, to which the token is never sent.
func checkEndpoint(endpoint string, allowHTTP bool) (plain bool, err error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return false, fmt.Errorf("%s %q: want an http or https URL", EnvEndpoint, endpoint)
	}
	if u.Scheme == "https" {
		return false, nil
	}
	if !allowHTTP && !loopback(u.Hostname()) {
		return true, fmt.Errorf("%s %q: %w: the files would arrive without transport security; use https, or set %s=1 to fetch over http (HF_TOKEN is then not sent)",
			EnvEndpoint, endpoint, ErrPlainHTTP, EnvAllowHTTP)
	}
	return true, nil
}

// loopback reports whether host is a loopback IP address; a name is not,
// whatever it resolves to.
func loopback(host string) bool {
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

// firstSet is the value of the first of names that is set and not empty.
func firstSet(getenv func(string) string, names ...string) string {
	for _, n := range names {
		if v := getenv(n); v != "" {
			return v
		}
	}
	return ""
}

func isTrue(v string) bool {
	switch strings.ToUpper(strings.TrimSpace(v)) {
	case "1", "ON", "YES", "TRUE":
		return true
	}
	return false
}

func cleanToken(t string) string {
	return strings.TrimSpace(strings.NewReplacer("\r", "", "\n", "").Replace(t))
}

func userHome(getenv func(string) string) string {
	if h := getenv("HOME"); h != "" {
		return h
	}
	h, _ := os.UserHomeDir()
	return h
}

// expandHome expands a leading ~ as Python's os.path.expanduser does.
func expandHome(getenv func(string) string, p string) string {
	if p == "~" || strings.HasPrefix(p, "~/") {
		return filepath.Join(userHome(getenv), p[1:])
	}
	return p
}

// Ref names a repository and a revision: a branch, a tag or a commit.
type Ref struct {
	Repo     string
	Revision string
}

func (r Ref) String() string { return r.Repo + "@" + r.Revision }

// ParseRef parses ORG/NAME[@REVISION] (or NAME[@REVISION] for a repository
// without an owner); the revision defaults to main.
func ParseRef(s string) (Ref, error) {
	repo, rev, hasRev := strings.Cut(s, "@")
	if err := ValidRepoID(repo); err != nil {
		return Ref{}, err
	}
	if !hasRev {
		rev = DefaultRevision
	}
	if err := validRevision(rev); err != nil {
		return Ref{}, err
	}
	return Ref{Repo: repo, Revision: rev}, nil
}

// ValidRepoID checks a repository id as the hub does: NAME or ORG/NAME,
// each part of letters, digits, '_', '-' and '.', starting and ending with
// a letter, digit or '_', the name at most 96 characters, without "--" or
// ".." and not ending in ".git".
func ValidRepoID(id string) error {
	parts := strings.Split(id, "/")
	bad := func(why string) error { return fmt.Errorf("%q is not a hub repository id (ORG/NAME): %s", id, why) }
	if len(parts) > 2 {
		return bad("more than one '/'")
	}
	if strings.Contains(id, "--") || strings.Contains(id, "..") {
		return bad(`"--" and ".." are not allowed`)
	}
	if strings.HasSuffix(id, ".git") {
		return bad(`it ends in ".git"`)
	}
	for i, p := range parts {
		if p == "" {
			return bad("an empty part")
		}
		if i == len(parts)-1 && len(p) > 96 {
			return bad("the name is longer than 96 characters")
		}
		for j := 0; j < len(p); j++ {
			c := p[j]
			word := c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
			if !word && (c != '-' && c != '.' || j == 0 || j == len(p)-1) {
				return bad(fmt.Sprintf("character %q at %d", c, j))
			}
		}
	}
	return nil
}

// validRevision refuses a revision that could leave the refs directory
// (huggingface_hub writes refs/REVISION, and a branch may contain '/').
func validRevision(rev string) error {
	if rev == "" {
		return errors.New("empty revision after '@'")
	}
	for seg := range strings.SplitSeq(rev, "/") {
		if err := checkSegment(seg); err != nil {
			return fmt.Errorf("revision %q: not a branch, tag or commit: %w", rev, err)
		}
	}
	return nil
}

// isCommit reports whether rev is a full commit hash, which names content
// that never changes.
func isCommit(rev string) bool {
	if len(rev) != 40 {
		return false
	}
	for i := 0; i < len(rev); i++ {
		if c := rev[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
