package hub

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Errors a Download or Exists wraps; a *StatusError carries the HTTP detail.
var (
	// ErrEntryNotFound: the repository and revision exist, the file does not.
	ErrEntryNotFound = errors.New("no such file in the repository")
	// ErrRevisionNotFound: the repository exists, the revision does not.
	ErrRevisionNotFound = errors.New("no such revision")
	// ErrRepoNotFound: no such repository, or a private one the token (if
	// any) cannot see; the hub does not say which.
	ErrRepoNotFound = errors.New("repository not found, or private and HF_TOKEN cannot see it")
	// ErrGated: the repository asks users to accept its terms first.
	ErrGated = errors.New("gated repository: accept its terms on the hub with the account whose token HF_TOKEN holds")
	// ErrForbidden: the token is valid but may not read this repository.
	ErrForbidden = errors.New("HF_TOKEN may not read this repository")
	// ErrNotCached: offline (or the hub unreachable) and the cache does not
	// hold the file.
	ErrNotCached = errors.New("not in the hub cache")
	// ErrTooLarge: the file is larger than Config.MaxFileSize.
	ErrTooLarge = errors.New("file larger than the hub download cap (PREFIXROUTER_HUB_MAX_FILE_SIZE)")
	// ErrPlainHTTP: a plain http endpoint or redirect that Config.AllowHTTP
	// does not accept.
	ErrPlainHTTP = errors.New("plain http is refused")
)

// StatusError is an HTTP answer other than success.
type StatusError struct {
	Status int
	// Code and Message are the hub's X-Error-Code and X-Error-Message.
	Code, Message string
	kind          error
	retryAfter    time.Duration
}

func (e *StatusError) Error() string {
	var b strings.Builder
	if e.kind != nil {
		b.WriteString(e.kind.Error())
		b.WriteString(" (")
	}
	fmt.Fprintf(&b, "HTTP %d", e.Status)
	if e.Code != "" {
		b.WriteString(" " + e.Code)
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	if e.kind != nil {
		b.WriteString(")")
	}
	return b.String()
}

func (e *StatusError) Unwrap() error { return e.kind }

// statusError reads the hub's classification of a failed answer.
func statusError(resp *http.Response) *StatusError {
	e := &StatusError{
		Status:  resp.StatusCode,
		Code:    resp.Header.Get("X-Error-Code"),
		Message: resp.Header.Get("X-Error-Message"),
	}
	switch {
	case e.Code == "EntryNotFound":
		e.kind = ErrEntryNotFound
	case e.Code == "RevisionNotFound":
		e.kind = ErrRevisionNotFound
	case e.Code == "GatedRepo":
		e.kind = ErrGated
	case e.Code == "RepoNotFound" || e.Status == http.StatusUnauthorized:
		e.kind = ErrRepoNotFound
	case e.Status == http.StatusForbidden:
		e.kind = ErrForbidden
	case e.Status == http.StatusNotFound:
		// A mirror or proxy answering a bare 404 for a missing file.
		e.kind = ErrEntryNotFound
	}
	if s := resp.Header.Get("Retry-After"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			e.retryAfter = time.Duration(n) * time.Second
		}
	}
	return e
}

// Client fetches files into the cache. It is safe for concurrent use, and
// several processes may share one cache: every file appears by an atomic
// rename.
type Client struct {
	cfg  Config
	log  *slog.Logger
	head *http.Client // follows no redirect: a relative one by hand, a CDN's is the download location
	get  *http.Client
	// plainOK: plain http locations are accepted (AllowHTTP, or a plain
	// endpoint on loopback); the token never goes to one.
	plainOK bool
	// endpointErr refuses every request to a plain endpoint not allowed.
	endpointErr error
}

const (
	maxBackoff   = 8 * time.Second
	maxRedirects = 10
)

// errRedirect: a redirect the client does not follow; asking again would
// get the same one.
var errRedirect = errors.New("a refused redirect")

// New returns a client; zero Config fields take their defaults.
func New(cfg Config) *Client {
	if cfg.Endpoint == "" {
		cfg.Endpoint = DefaultEndpoint
	}
	cfg.Endpoint = strings.TrimRight(cfg.Endpoint, "/")
	if cfg.MetadataTimeout <= 0 {
		cfg.MetadataTimeout = 10 * time.Second
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = 10 * time.Second
	}
	if cfg.Attempts <= 0 {
		cfg.Attempts = 4
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = 500 * time.Millisecond
	}
	if cfg.Transport == nil {
		cfg.Transport = http.DefaultTransport
	}
	if cfg.UserAgent == "" {
		cfg.UserAgent = "prefixrouter"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxFileSize <= 0 {
		cfg.MaxFileSize = DefaultMaxFileSize
	}
	c := &Client{
		cfg: cfg,
		log: cfg.Logger.With("component", "hub"),
		head: &http.Client{Transport: cfg.Transport, CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		}},
	}
	c.get = &http.Client{Transport: cfg.Transport, CheckRedirect: c.checkRedirect}
	plain, err := checkEndpoint(cfg.Endpoint, cfg.AllowHTTP)
	c.endpointErr = err
	c.plainOK = cfg.AllowHTTP || plain && err == nil
	if plain && err == nil && cfg.Token != "" {
		c.log.Warn("the hub endpoint is plain http: HF_TOKEN is not sent to it", "endpoint", cfg.Endpoint)
	}
	return c
}

// checkRedirect is the download's redirect policy. Go's own drops the
// token on a redirect to another host but keeps it for the same host
// under another scheme or port; a redirect to plain http is refused
// unless plain http is accepted, and then goes without the token.
func (c *Client) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= maxRedirects {
		return fmt.Errorf("%w: more than %d", errRedirect, maxRedirects)
	}
	switch req.URL.Scheme {
	case "https":
	case "http":
		if !c.plainOK {
			return fmt.Errorf("%w to http://%s: %w (%s)", errRedirect, req.URL.Host, ErrPlainHTTP, EnvAllowHTTP)
		}
		req.Header.Del("Authorization")
	default:
		return fmt.Errorf("%w to scheme %q", errRedirect, req.URL.Scheme)
	}
	return nil
}

// CacheDir is the hub cache directory.
func (c *Client) CacheDir() string { return c.cfg.CacheDir }

// File is a file of a repository in the cache.
type File struct {
	// Path is snapshots/COMMIT/FILE in the repository's cache directory;
	// empty when the file does not exist.
	Path string
	// Commit is the commit the revision resolved to, when known (also for
	// a file that does not exist).
	Commit string
}

// Download returns the cached copy of file at ref, fetching it first when
// the cache does not hold that commit's file. A file the repository does
// not have is ErrEntryNotFound (with File.Commit set when the hub said
// which commit it looked at).
func (c *Client) Download(ctx context.Context, ref Ref, file string) (File, error) {
	rc, err := c.checkRef(ref, file)
	if err != nil {
		return File{}, c.fail(ref, file, err, "")
	}
	if isCommit(ref.Revision) {
		// A commit never changes: what the cache knows of it, file or
		// absence, stands without asking.
		f, err := rc.lookup(ref.Revision, file)
		if err == nil {
			return f, nil
		}
		if errors.Is(err, ErrEntryNotFound) {
			return f, c.fail(ref, file, err, "")
		}
	}
	if c.cfg.Offline {
		f, err := rc.lookup(ref.Revision, file)
		return f, c.fail(ref, file, err, " (HF_HUB_OFFLINE is set)")
	}
	if c.endpointErr != nil {
		return File{}, c.fail(ref, file, c.endpointErr, "")
	}
	m, err := c.metadata(ctx, ref, file)
	if err != nil {
		return c.withoutHub(rc, ref, file, m, err)
	}
	// The ref serves later offline use; a cache that is read-only but
	// already holds the file must still work.
	if err := rc.writeRef(ref.Revision, m.commit); err != nil {
		c.log.Warn("cannot record a revision in the hub cache", "repo", ref.Repo, "revision", ref.Revision, "err", err)
	}
	pointer, err := rc.pointer(m.commit, file)
	if err != nil {
		return File{}, c.fail(ref, file, err, "")
	}
	f := File{Path: pointer, Commit: m.commit}
	if regular(pointer) {
		return f, nil
	}
	blob, err := rc.blob(m.etag)
	if err != nil {
		return File{}, c.fail(ref, file, err, "")
	}
	if m.size > c.cfg.MaxFileSize {
		return File{}, c.fail(ref, file, fmt.Errorf("%w: the hub says %d bytes, the cap is %d", ErrTooLarge, m.size, c.cfg.MaxFileSize), "")
	}
	if !regular(blob) {
		err := c.retry(ctx, "GET "+ref.String()+" "+file, func(ctx context.Context) error {
			return c.fetch(ctx, m, blob)
		})
		if err != nil {
			return File{}, c.fail(ref, file, err, "")
		}
	}
	if err := link(blob, pointer); err != nil {
		return File{}, c.fail(ref, file, err, "")
	}
	return f, nil
}

// Exists reports whether the repository has file at ref, asking the hub
// (HEAD only) or, offline, the cache.
func (c *Client) Exists(ctx context.Context, ref Ref, file string) (bool, error) {
	rc, err := c.checkRef(ref, file)
	if err != nil {
		return false, c.fail(ref, file, err, "")
	}
	if c.cfg.Offline {
		_, err := rc.lookup(ref.Revision, file)
		if errors.Is(err, ErrEntryNotFound) {
			return false, nil
		}
		return err == nil, err
	}
	if c.endpointErr != nil {
		return false, c.fail(ref, file, c.endpointErr, "")
	}
	_, err = c.metadata(ctx, ref, file)
	if errors.Is(err, ErrEntryNotFound) {
		return false, nil
	}
	return err == nil, err
}

// checkRef refuses a reference or file name that could not name a path in
// the cache (a Ref may be built without ParseRef), before anything is asked
// or written.
func (c *Client) checkRef(ref Ref, file string) (repoCache, error) {
	rc, err := c.cache(ref.Repo)
	if err != nil {
		return repoCache{}, err
	}
	if err := validRevision(ref.Revision); err != nil {
		return repoCache{}, err
	}
	if _, err := relPath(file); err != nil {
		return repoCache{}, err
	}
	return rc, nil
}

// withoutHub answers a Download whose HEAD failed: a missing file is
// remembered in .no_exist; otherwise the cache answers as it would offline,
// and the hub's error stands when it cannot.
func (c *Client) withoutHub(rc repoCache, ref Ref, file string, m metadata, err error) (File, error) {
	if errors.Is(err, ErrEntryNotFound) {
		if m.commit != "" {
			// Remembering is an optimisation for offline use: failing to
			// write it must not fail the download.
			if werr := rc.markMissing(m.commit, file); werr != nil {
				c.log.Warn("cannot record a missing file in the hub cache", "repo", ref.Repo, "file", file, "err", werr)
			}
			if werr := rc.writeRef(ref.Revision, m.commit); werr != nil {
				c.log.Warn("cannot record a revision in the hub cache", "repo", ref.Repo, "revision", ref.Revision, "err", werr)
			}
		}
		return File{Commit: m.commit}, c.fail(ref, file, err, "")
	}
	if errors.Is(err, ErrRevisionNotFound) {
		return File{}, c.fail(ref, file, err, "")
	}
	f, cerr := rc.lookup(ref.Revision, file)
	if cerr == nil {
		c.log.Warn("hub unreachable or its answer unusable; using the cached file", "repo", ref.Repo, "revision", ref.Revision, "file", file, "commit", f.Commit, "err", err)
		return f, nil
	}
	if errors.Is(cerr, ErrEntryNotFound) {
		return f, c.fail(ref, file, cerr, "")
	}
	return File{}, c.fail(ref, file, err, "")
}

func (c *Client) fail(ref Ref, file string, err error, why string) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, ErrNotCached) {
		return fmt.Errorf("%s: %s: %w %s%s", ref, file, err, c.cfg.CacheDir, why)
	}
	return fmt.Errorf("%s: %s: %w", ref, file, err)
}

func (c *Client) resolveURL(ref Ref, file string) string {
	return c.cfg.Endpoint + "/" + ref.Repo + "/resolve/" + url.PathEscape(ref.Revision) + "/" + (&url.URL{Path: file}).EscapedPath()
}

// metadata is what a HEAD on the resolve URL says of a file.
type metadata struct {
	commit, etag string
	size         int64 // -1: unknown
	// location is where the bytes are: the resolve URL, or a CDN.
	location string
	// sameHost: location is on the endpoint's host, so the token goes too.
	sameHost bool
}

const maxRelativeRedirects = 10

// metadata asks the hub about file at ref. On ErrEntryNotFound the commit
// it looked at is filled in when the hub said.
func (c *Client) metadata(ctx context.Context, ref Ref, file string) (metadata, error) {
	var m metadata
	err := c.retry(ctx, "HEAD "+ref.String()+" "+file, func(ctx context.Context) error {
		var err error
		m, err = c.headOnce(ctx, ref, c.resolveURL(ref, file))
		return err
	})
	return m, err
}

// headOnce asks once, following relative redirects. Every header that
// will become a path (X-Repo-Commit, the ETag) is checked here, so that a
// hub's unusable answer writes nothing.
func (c *Client) headOnce(ctx context.Context, ref Ref, target string) (metadata, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.MetadataTimeout)
	defer cancel()
	u, err := url.Parse(target)
	if err != nil {
		return metadata{}, err
	}
	for range maxRelativeRedirects {
		req, err := http.NewRequestWithContext(ctx, http.MethodHead, u.String(), nil)
		if err != nil {
			return metadata{}, err
		}
		c.authorize(req)
		// The size must be the file's, not a compressed body's.
		req.Header.Set("Accept-Encoding", "identity")
		resp, err := c.head.Do(req)
		if err != nil {
			return metadata{}, err
		}
		resp.Body.Close()
		m := metadata{commit: resp.Header.Get("X-Repo-Commit")}
		if m.commit != "" && !isCommit(m.commit) {
			return metadata{}, fmt.Errorf("HEAD %s: %s: the hub answered X-Repo-Commit %q, not a commit (40 lowercase hex digits)", u, ref.Repo, m.commit)
		}
		if resp.StatusCode >= 300 && resp.StatusCode < 400 {
			raw := resp.Header.Get("Location")
			rel, err := url.Parse(raw)
			if err != nil || raw == "" {
				return metadata{}, fmt.Errorf("HEAD %s: HTTP %d without a usable Location", u, resp.StatusCode)
			}
			if rel.Scheme == "" && rel.Host == "" {
				// Relative: the repository was renamed. Ask again, token and all.
				u = u.ResolveReference(rel)
				continue
			}
			if err := c.checkLocation(rel); err != nil {
				return metadata{}, fmt.Errorf("HEAD %s: HTTP %d: %w", u, resp.StatusCode, err)
			}
			m.location = rel.String()
		} else if resp.StatusCode != http.StatusOK {
			return m, statusError(resp)
		} else {
			m.location = u.String()
		}
		if m.commit == "" {
			return metadata{}, fmt.Errorf("HEAD %s: no X-Repo-Commit header: %s does not answer like the hub (check HF_ENDPOINT and any proxy)", u, c.cfg.Endpoint)
		}
		m.etag = normalizeETag(firstHeader(resp.Header, "X-Linked-Etag", "ETag"))
		if m.etag == "" {
			return metadata{}, fmt.Errorf("HEAD %s: no ETag: the file cannot be cached reliably", u)
		}
		if err := checkSegment(m.etag); err != nil {
			return metadata{}, fmt.Errorf("HEAD %s: %s: the ETag %q cannot name a cache file: %w", u, ref.Repo, m.etag, err)
		}
		m.size = -1
		if s := firstHeader(resp.Header, "X-Linked-Size", "Content-Length"); s != "" {
			if n, err := strconv.ParseInt(s, 10, 64); err == nil && n >= 0 {
				m.size = n
			}
		}
		lu, _ := url.Parse(m.location)
		m.sameHost = lu != nil && lu.Scheme == u.Scheme && lu.Host == u.Host
		return m, nil
	}
	return metadata{}, fmt.Errorf("HEAD %s: more than %d redirects", target, maxRelativeRedirects)
}

// checkLocation accepts an absolute download location: https, or plain
// http when it is accepted.
func (c *Client) checkLocation(loc *url.URL) error {
	switch {
	case loc.Scheme == "https" && loc.Host != "":
		return nil
	case loc.Scheme == "http" && loc.Host != "":
		if c.plainOK {
			return nil
		}
		return fmt.Errorf("%w to http://%s: %w (%s)", errRedirect, loc.Host, ErrPlainHTTP, EnvAllowHTTP)
	}
	return fmt.Errorf("%w to %s://%s: not an https URL", errRedirect, loc.Scheme, loc.Host)
}

func firstHeader(h http.Header, names ...string) string {
	for _, n := range names {
		if v := h.Get(n); v != "" {
			return v
		}
	}
	return ""
}

// normalizeETag strips a weak marker and the quotes: W/"abc" and "abc" are abc.
func normalizeETag(e string) string {
	return strings.Trim(strings.TrimPrefix(e, "W/"), `"`)
}

// authorize adds the token, to an https request only: over plain http any
// host on the way could read it.
func (c *Client) authorize(req *http.Request) {
	req.Header.Set("User-Agent", c.cfg.UserAgent)
	if c.cfg.Token != "" && req.URL.Scheme == "https" {
		req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	}
}

// errStalled ends a download that has been silent for ReadTimeout.
var errStalled = errors.New("no data within the read timeout (HF_HUB_DOWNLOAD_TIMEOUT)")

// fetch downloads m's bytes into blob: into a temporary file beside it,
// checked against the size (and the sha256 when the ETag is one), then
// renamed into place.
func (c *Client) fetch(ctx context.Context, m metadata, blob string) (err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stall := time.AfterFunc(c.cfg.ReadTimeout, func() { cancel(errStalled) })
	defer stall.Stop()
	defer func() {
		if cause := context.Cause(ctx); err != nil && errors.Is(cause, errStalled) {
			err = fmt.Errorf("GET %s: %w", m.location, errStalled)
		}
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.location, nil)
	if err != nil {
		return err
	}
	if m.sameHost {
		c.authorize(req)
	} else {
		// A CDN URL is signed; the token stays with the hub.
		req.Header.Set("User-Agent", c.cfg.UserAgent)
	}
	resp, err := c.get.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return statusError(resp)
	}
	limit := c.cfg.MaxFileSize
	if resp.ContentLength > limit {
		return fmt.Errorf("GET %s: %w: %d bytes declared, the cap is %d", m.location, ErrTooLarge, resp.ContentLength, limit)
	}
	if err := os.MkdirAll(filepath.Dir(blob), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(blob), filepath.Base(blob)+".*.incomplete")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename there is nothing left to remove
	sum := sha256.New()
	// The cap counts the bytes that arrive, whatever was declared: one
	// more than it is enough to know.
	body := io.LimitReader(&stallReader{r: resp.Body, stall: stall, d: c.cfg.ReadTimeout}, limit+1)
	n, err := io.Copy(io.MultiWriter(tmp, sum), body)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("GET %s: %w", m.location, err)
	}
	if n > limit {
		return fmt.Errorf("GET %s: %w: more than %d bytes", m.location, ErrTooLarge, limit)
	}
	if m.size >= 0 && n != m.size {
		return fmt.Errorf("GET %s: %w: %d bytes, the hub said %d", m.location, io.ErrUnexpectedEOF, n, m.size)
	}
	if isSHA256(m.etag) {
		if got := hex.EncodeToString(sum.Sum(nil)); got != m.etag {
			return fmt.Errorf("GET %s: %w: sha256 %s, the hub said %s", m.location, errCorrupt, got, m.etag)
		}
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), blob)
}

// errCorrupt: the bytes do not hash to the ETag; another try may do better.
var errCorrupt = errors.New("content does not match its ETag")

func isSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}

// stallReader restarts the stall timer on every read that brings bytes.
type stallReader struct {
	r     io.Reader
	stall *time.Timer
	d     time.Duration
}

func (s *stallReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if n > 0 {
		s.stall.Reset(s.d)
	}
	return n, err
}

// retry runs op up to Attempts times while it fails in a way another try
// may not, waiting Backoff, then twice as long each time (at most 8 s, or
// the server's Retry-After within that bound), with some jitter.
func (c *Client) retry(ctx context.Context, what string, op func(context.Context) error) error {
	wait := c.cfg.Backoff
	for attempt := 1; ; attempt++ {
		err := op(ctx)
		if err == nil || !c.transient(ctx, err) {
			return err
		}
		if attempt >= c.cfg.Attempts {
			return fmt.Errorf("gave up after %d attempts: %w", attempt, err)
		}
		d := wait + rand.N(wait/4+1)
		var se *StatusError
		if errors.As(err, &se) && se.retryAfter > d {
			d = min(se.retryAfter, maxBackoff)
		}
		c.log.Warn("hub request failed; trying again", "request", what, "attempt", attempt, "attempts", c.cfg.Attempts, "wait", d, "err", err)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (after: %w)", ctx.Err(), err)
		}
		wait = min(2*wait, maxBackoff)
	}
}

// transient reports whether another try of a failed request may succeed:
// 429, a 5xx, a timeout of the request's own, a connection error or a cut
// or corrupt download; not the caller's cancellation, nor a certificate the
// client refuses.
func (c *Client) transient(ctx context.Context, err error) bool {
	if ctx.Err() != nil || errors.Is(err, errRedirect) || errors.Is(err, ErrTooLarge) {
		return false
	}
	var se *StatusError
	if errors.As(err, &se) {
		return se.Status == http.StatusTooManyRequests || se.Status >= 500
	}
	var certErr *tls.CertificateVerificationError
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	if errors.As(err, &certErr) || errors.As(err, &unknownAuth) || errors.As(err, &hostErr) {
		return false
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
		// The name does not exist (a typo in HF_ENDPOINT, or no DNS for the
		// outside world): asking again changes nothing.
		return false
	}
	if errors.Is(err, errStalled) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, errCorrupt) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	// Only errors of the connection itself: a file system error also
	// carries an errno, but trying the request again does not fix it.
	var urlErr *url.Error
	var opErr *net.OpError
	return errors.As(err, &urlErr) || errors.As(err, &opErr)
}
