package router

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/prefixrouter/prefixrouter/tokenize"
)

// The router's credentials, each read from a file and re-read when the
// file changes: the API keys clients present (--api-key-file), the key the
// router presents to the pods (--upstream-api-key-file) and the admin
// listener's token (--admin-token-file). A key is held only as its
// SHA-256 digest, except the upstream key, which the router must send; no
// key ever reaches a log line, a metric or an error message.

// Credential files are small; anything larger is refused before it is read.
const maxCredentialFile = 1 << 20

// Limits on one key file line's fields: a key as long as a request header
// can carry, a tenant short enough for an access-log field.
const (
	maxKeyBytes    = 4096
	maxTenantBytes = 64
)

// credentialPoll re-reads the files in case fsnotify misses an event (a
// network file system); credentialDebounce gathers the burst of events of
// one rename or Kubernetes Secret symlink swap into one reload.
const (
	credentialPoll     = 5 * time.Second
	credentialDebounce = 100 * time.Millisecond
)

// Labels of the file label: the flags that name the files.
const (
	fileAPIKeys     = "api-key-file"
	fileUpstreamKey = "upstream-api-key-file"
	fileAdminToken  = "admin-token-file"
)

// keyEntry is what an accepted key says: the tenant it names.
type keyEntry struct {
	tenant string
}

// keySet is the accepted API keys by digest. The lookup is by the digest
// of what the client presented, so how long it takes tells nothing of any
// key's bytes: no compare of the key itself is ever made.
type keySet struct {
	byDigest map[[sha256.Size]byte]keyEntry
}

func (ks *keySet) len() int { return len(ks.byDigest) }

// authResult is what a presented credential turned out to be.
type authResult int

const (
	authOK authResult = iota
	authMissing
	authWrong
)

// check reads an Authorization header value. It allocates nothing.
func (ks *keySet) check(header []byte) (tenant string, res authResult) {
	token, ok := bearerToken(header)
	if !ok {
		return "", authMissing
	}
	e, found := ks.byDigest[sha256.Sum256(token)]
	if !found {
		return "", authWrong
	}
	return e.tenant, authOK
}

var bearerScheme = []byte("Bearer")

// bearerToken is the token of "Bearer TOKEN" (the scheme in any case, as
// RFC 9110 has it; spaces around the token ignored); false when the header
// is absent, of another scheme, or carries no token.
func bearerToken(h []byte) ([]byte, bool) {
	h = bytes.TrimLeft(h, " \t")
	if len(h) <= len(bearerScheme) || !bytes.EqualFold(h[:len(bearerScheme)], bearerScheme) || (h[len(bearerScheme)] != ' ' && h[len(bearerScheme)] != '\t') {
		return nil, false
	}
	tok := bytes.Trim(h[len(bearerScheme):], " \t")
	return tok, len(tok) > 0
}

// parseKeyFile reads --api-key-file: one key a line, optionally a tenant
// name after it, separated by spaces or tabs; blank lines and comments (a
// field starting with #, to the end of its line) skipped. A key is
// visible ASCII; a tenant letters, digits, '.', '_' and '-'. Errors name
// the line, never its key.
func parseKeyFile(data []byte) (*keySet, error) {
	ks := &keySet{byDigest: map[[sha256.Size]byte]keyEntry{}}
	lineOf := map[[sha256.Size]byte]int{}
	for n, line := range bytes.Split(data, []byte("\n")) {
		fields := lineFields(line)
		if len(fields) == 0 {
			continue
		}
		at := n + 1
		if len(fields) > 2 {
			return nil, fmt.Errorf("line %d: %d fields, want a key and at most a tenant", at, len(fields))
		}
		if err := checkKey(fields[0]); err != nil {
			return nil, fmt.Errorf("line %d: %w", at, err)
		}
		digest, e := sha256.Sum256(fields[0]), keyEntry{}
		if len(fields) == 2 {
			if err := checkTenant(fields[1]); err != nil {
				return nil, fmt.Errorf("line %d: %w", at, err)
			}
			e.tenant = string(fields[1])
		}
		if prev, dup := lineOf[digest]; dup {
			return nil, fmt.Errorf("line %d: the key of line %d again", at, prev)
		}
		lineOf[digest] = at
		ks.byDigest[digest] = e
	}
	if ks.len() == 0 {
		return nil, errors.New("no keys (every client would be refused)")
	}
	return ks, nil
}

// parseSecretFile reads a file of one secret (the upstream key, the admin
// token): one line of one field, comments and blank lines aside.
func parseSecretFile(data []byte) (string, error) {
	var secret []byte
	for n, line := range bytes.Split(data, []byte("\n")) {
		fields := lineFields(line)
		switch {
		case len(fields) == 0:
			continue
		case len(fields) > 1:
			return "", fmt.Errorf("line %d: %d fields, want the key alone", n+1, len(fields))
		case secret != nil:
			return "", fmt.Errorf("line %d: a second key, want one", n+1)
		}
		if err := checkKey(fields[0]); err != nil {
			return "", fmt.Errorf("line %d: %w", n+1, err)
		}
		secret = fields[0]
	}
	if secret == nil {
		return "", errors.New("no key")
	}
	return string(secret), nil
}

// lineFields splits a line at spaces and tabs (a carriage return at its end
// dropped), up to a field starting with #.
func lineFields(line []byte) [][]byte {
	line = bytes.TrimSuffix(line, []byte("\r"))
	fields := bytes.FieldsFunc(line, func(r rune) bool { return r == ' ' || r == '\t' })
	for i, f := range fields {
		if f[0] == '#' {
			return fields[:i]
		}
	}
	return fields
}

func checkKey(k []byte) error {
	if len(k) > maxKeyBytes {
		return fmt.Errorf("key longer than %d bytes", maxKeyBytes)
	}
	for _, c := range k {
		if c <= ' ' || c > '~' {
			return errors.New("key holds a byte that is not visible ASCII")
		}
	}
	return nil
}

func checkTenant(t []byte) error {
	if len(t) > maxTenantBytes {
		return fmt.Errorf("tenant longer than %d bytes", maxTenantBytes)
	}
	for _, c := range t {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("tenant %q: want letters, digits, '.', '_' or '-'", t)
		}
	}
	return nil
}

// credFile is one credential file: where it is, the digest of the bytes
// last applied, and how its contents are applied.
type credFile struct {
	flag  string
	path  string
	sum   [sha256.Size]byte
	apply func([]byte) error
	// lastErr is the failure last logged and counted: a file that stays
	// broken is reported once, not at every poll.
	lastErr string
}

// credentials owns the credential files and what they say. The request
// path reads the atomics; run re-reads the files.
type credentials struct {
	log   *slog.Logger
	files []*credFile
	// keys are the API keys clients present; nil: --api-key-file unset,
	// nobody asked.
	keys atomic.Pointer[keySet]
	// keysOn is whether --api-key-file is set: the client's Authorization
	// is then the router's, never the pod's.
	keysOn bool
	// upstream is the Authorization header value the router sends to the
	// pods ("Bearer KEY"); nil: none.
	upstream atomic.Pointer[string]
	// admin is the digest of the admin token; nil: the admin listener is
	// open.
	admin atomic.Pointer[[sha256.Size]byte]

	reloads      *prometheus.CounterVec // file, result
	failing      *prometheus.GaugeVec   // file
	keyCount     prometheus.Gauge
	adminRefused *prometheus.CounterVec // reason
}

// newCredentials reads every configured file once; a file that cannot be
// read or parsed fails the start, naming its flag.
func newCredentials(cfg Config, reg prometheus.Registerer, log *slog.Logger) (*credentials, error) {
	c := &credentials{
		log:    log.With("component", "credentials"),
		keysOn: cfg.APIKeyFile != "",
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixrouter_credential_reloads_total",
			Help: "Re-reads of a credential file (--api-key-file, --upstream-api-key-file, --admin-token-file) that changed, by result: ok, or error (the previous credential is kept).",
		}, []string{"file", "result"}),
		failing: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prefixrouter_credential_file_error",
			Help: "1 while a credential file's last read failed and the router keeps the credential it read before.",
		}, []string{"file"}),
		keyCount: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "prefixrouter_api_keys",
			Help: "API keys accepted from clients (--api-key-file); 0 when no key is asked for.",
		}),
		adminRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixrouter_admin_rejected_total",
			Help: "Requests to the admin listener's /debug paths refused, by reason (unauthorized: no or a wrong --admin-token-file token).",
		}, []string{"reason"}),
	}
	add := func(flag, path string, apply func([]byte) error) {
		if path != "" {
			c.files = append(c.files, &credFile{flag: flag, path: path, apply: apply})
			c.failing.WithLabelValues(flag).Set(0)
			for _, res := range []string{"ok", "error"} {
				c.reloads.WithLabelValues(flag, res)
			}
		}
	}
	add(fileAPIKeys, cfg.APIKeyFile, func(b []byte) error {
		ks, err := parseKeyFile(b)
		if err != nil {
			return err
		}
		c.keys.Store(ks)
		c.keyCount.Set(float64(ks.len()))
		return nil
	})
	add(fileUpstreamKey, cfg.UpstreamAPIKeyFile, func(b []byte) error {
		k, err := parseSecretFile(b)
		if err != nil {
			return err
		}
		v := "Bearer " + k
		c.upstream.Store(&v)
		return nil
	})
	add(fileAdminToken, cfg.AdminTokenFile, func(b []byte) error {
		k, err := parseSecretFile(b)
		if err != nil {
			return err
		}
		d := sha256.Sum256([]byte(k))
		c.admin.Store(&d)
		return nil
	})
	c.adminRefused.WithLabelValues("unauthorized")
	for _, f := range c.files {
		if _, err := c.load(f); err != nil {
			return nil, fmt.Errorf("--%s %s: %w", f.flag, f.path, err)
		}
	}
	if reg != nil {
		for _, col := range []prometheus.Collector{c.reloads, c.failing, c.keyCount, c.adminRefused} {
			if err := reg.Register(col); err != nil {
				return nil, fmt.Errorf("credentials: metrics: %w", err)
			}
		}
	}
	return c, nil
}

// load reads f and applies it when its bytes changed; changed says whether
// they had.
func (c *credentials) load(f *credFile) (changed bool, err error) {
	data, err := readCredential(f.path)
	if err != nil {
		return false, err
	}
	sum := sha256.Sum256(data)
	if sum == f.sum {
		return false, nil
	}
	if err := f.apply(data); err != nil {
		return false, err
	}
	f.sum = sum
	return true, nil
}

func readCredential(path string) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, maxCredentialFile+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxCredentialFile {
		return nil, fmt.Errorf("larger than %d bytes", maxCredentialFile)
	}
	return data, nil
}

// reload re-reads every file: a changed one is applied, one that fails
// keeps what was read before, logged and counted.
func (c *credentials) reload() {
	for _, f := range c.files {
		changed, err := c.load(f)
		if err != nil {
			c.failing.WithLabelValues(f.flag).Set(1)
			if err.Error() != f.lastErr {
				f.lastErr = err.Error()
				c.reloads.WithLabelValues(f.flag, "error").Inc()
				c.log.Error("credential file not applied; keeping the previous credential", "flag", "--"+f.flag, "path", f.path, "err", err)
			}
			continue
		}
		f.lastErr = ""
		c.failing.WithLabelValues(f.flag).Set(0)
		if changed {
			c.reloads.WithLabelValues(f.flag, "ok").Inc()
			c.log.Info("credential file reloaded", "flag", "--"+f.flag, "path", f.path)
		}
	}
}

// run re-reads the files on fsnotify events in their directories (which
// catches atomic renames and Kubernetes Secret symlink swaps), debounced,
// and every credentialPoll as a fallback, until ctx ends.
func (c *credentials) run(ctx context.Context) {
	if c == nil || len(c.files) == 0 {
		return
	}
	var events <-chan fsnotify.Event
	var errs <-chan error
	w, err := fsnotify.NewWatcher()
	if err == nil {
		dirs := map[string]bool{}
		for _, f := range c.files {
			dir := filepath.Dir(f.path)
			if dirs[dir] {
				continue
			}
			dirs[dir] = true
			if err = w.Add(dir); err != nil {
				w.Close()
				break
			}
		}
	}
	if err != nil {
		c.log.Warn("credential files: watching unavailable, polling only", "every", credentialPoll, "err", err)
	} else {
		defer w.Close()
		events, errs = w.Events, w.Errors
	}
	poll := time.NewTicker(credentialPoll)
	defer poll.Stop()
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
			c.reload()
		case <-debounce.C:
			c.reload()
		case _, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			debounce.Reset(credentialDebounce)
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			c.log.Warn("credential files watcher", "err", err)
		}
	}
}

// upstreamHeader is the Authorization header value of every call to a
// pod, or "" when --upstream-api-key-file is unset.
func (c *credentials) upstreamHeader() string {
	if c == nil {
		return ""
	}
	if v := c.upstream.Load(); v != nil {
		return *v
	}
	return ""
}

// forwardClientAuthorization reports whether a client's Authorization
// header goes to the pod: only when the router neither checks keys of its
// own nor presents one.
func (c *credentials) forwardClientAuthorization() bool {
	return c == nil || (!c.keysOn && c.upstream.Load() == nil)
}

// authorizeTokenizer gives the render calls the upstream credential.
func (c *credentials) authorizeTokenizer(reg *tokenize.Registry) {
	if c != nil && c.upstream.Load() != nil {
		reg.SetAuthorization(c.upstreamHeader)
	}
}

// adminAllowed reports whether an admin request may pass: no token
// configured, or the bearer token's digest matches, compared in constant
// time.
func (c *credentials) adminAllowed(header string) bool {
	if c == nil {
		return true
	}
	want := c.admin.Load()
	if want == nil {
		return true
	}
	tok, ok := bearerToken([]byte(header))
	if !ok {
		return false
	}
	d := sha256.Sum256(tok)
	return subtle.ConstantTimeCompare(d[:], want[:]) == 1
}

// authorize checks the client's API key when --api-key-file is set,
// keeping the key's tenant on the exchange, and answers 401 itself
// otherwise. On success it allocates nothing.
func (r *Router) authorize(x *exchange, path []byte) bool {
	if r.cred == nil {
		return true
	}
	ks := r.cred.keys.Load()
	if ks == nil {
		return true
	}
	tenant, res := ks.check(x.in.Request.Header.Peek(fasthttp.HeaderAuthorization))
	if res == authOK {
		x.tenant = tenant
		return true
	}
	if x.path == "" {
		x.path = string(path)
	}
	challenge := "Bearer"
	if res == authWrong {
		challenge = `Bearer error="invalid_token"`
	}
	x.in.Response.Header.Set(fasthttp.HeaderWWWAuthenticate, challenge)
	// The body, if any, is never read: the connection closes rather
	// than drain it.
	x.in.SetConnectionClose()
	r.refuse(x, errUnauthorized(res), "unauthorized")
	return false
}

// errUnauthorized is the 401 of a missing or wrong API key, as OpenAI's
// API words it (type invalid_request_error, code invalid_api_key); it never
// echoes what the client sent.
func errUnauthorized(res authResult) *apiError {
	msg := "Incorrect API key provided."
	if res == authMissing {
		msg = "You didn't provide an API key. Send it in an Authorization header using Bearer auth (Authorization: Bearer YOUR_KEY)."
	}
	return &apiError{Status: fasthttp.StatusUnauthorized, Message: msg, Type: typeInvalidRequest, Code: "invalid_api_key"}
}

// checkCredentialPath refuses a credential path that cannot be a readable
// file. It only looks.
func checkCredentialPath(path string) error {
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return err
	case fi.IsDir():
		return errors.New("is a directory (want a file)")
	case fi.Size() > maxCredentialFile:
		return errors.New("larger than " + strconv.Itoa(maxCredentialFile) + " bytes")
	}
	return nil
}
