package router

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/internal/positive"
	"github.com/prefixrouter/prefixrouter/peers"
	"github.com/prefixrouter/prefixrouter/speculative"
	"github.com/prefixrouter/prefixrouter/tokenize"
)

// Config is everything `prefixrouter serve` sets for the router. Each field
// names its flag; the flag's default is the field's value in DefaultConfig
// (the serve command reads it from there) and its environment variable is
// PREFIXROUTER_ and the flag name in upper case, dashes as underscores.
//
// Start from DefaultConfig: New takes the config as given and refuses one
// that Validate refuses, so a zero field is never quietly replaced by a
// default where the zero itself means something (no retries, no admin
// listener, learn the block size).
type Config struct {
	// Listen is the OpenAI API address (--listen); AdminListen serves
	// /metrics and /debug (--admin-listen; empty: off).
	Listen      string
	AdminListen string

	// Policy picks the target (--policy); Cost weights the precise policy's
	// terms (--decode-weight, --kv-threshold, --kv-pressure).
	Policy brain.Policy
	Cost   brain.CostConfig
	// PDThreshold is, for a model served by prefill and decode pods, the
	// prompt length in tokens below which the decode pod computes the
	// whole request: a short prompt costs less to compute than to hand
	// over (--pd-threshold; 0: split every prompt).
	PDThreshold int

	// Tokenization is the mode for models that have no --tokenizer entry
	// (and for entries that name no mode) (--tokenization): local models
	// without files are routed on load alone; remote and auto ask the pod.
	Tokenization tokenize.Mode
	// TokenizeTimeout bounds a remote tokenization before routing; past it
	// the request is routed on load alone (--tokenize-timeout).
	TokenizeTimeout time.Duration

	// MaxBodyBytes bounds request bodies, 413 beyond (--max-body-bytes).
	MaxBodyBytes int

	// The front door's limits (frontdoor.go). BodyBudget is the request
	// body bytes held at once by every request in progress, beyond which
	// new requests get 503 (--max-body-bytes-in-flight; 0: an eighth of
	// the memory limit, 128 MiB without one). MemoryShedFraction is the
	// share of the runtime's memory limit past which new requests get 503
	// (--memory-shed-fraction). MaxConnections caps the client
	// connections served at once (--max-connections), and
	// MaxConnectionsPerIP those from one address (--max-connections-per-ip;
	// 0: no cap). HeaderTimeout bounds a new connection's wait for its
	// request and the reading of any request's headers
	// (--header-read-timeout); BodyIdleTimeout the silence between two
	// parts of a body (--body-idle-timeout); ClientIdleTimeout a kept-alive
	// connection's wait for its next request (--client-idle-timeout);
	// WriteTimeout how long a client may take none of its answer
	// (--write-timeout): then the answer is cut off and the pod's request
	// cancelled.
	BodyBudget          int64
	MemoryShedFraction  float64
	MaxConnections      int
	MaxConnectionsPerIP int
	HeaderTimeout       time.Duration
	BodyIdleTimeout     time.Duration
	ClientIdleTimeout   time.Duration
	WriteTimeout        time.Duration
	// DebugHeaders adds X-Prefixrouter-* headers naming the chosen target
	// (--debug-headers).
	DebugHeaders bool
	// AccessLog is where one JSON line per API request goes, once the
	// request has ended (--access-log): a file, appended to, or "-" for
	// standard output (the process log stays on standard error); empty:
	// off.
	AccessLog string

	// ConnectTimeout bounds dialing a target (--connect-timeout);
	// FirstByteTimeout the wait for the first response byte, a non-streaming
	// request's whole generation (--first-byte-timeout); IdleTimeout the
	// silence between two chunks of a streamed response (--idle-timeout).
	ConnectTimeout   time.Duration
	FirstByteTimeout time.Duration
	IdleTimeout      time.Duration
	// MaxRetries is how many other targets a request may be retried on when
	// its target failed before sending any byte; 0: none (--max-retries).
	MaxRetries int
	// RetryAfter is the Retry-After sent with 503 when no target can take
	// a request, in whole seconds, at least 1 (--retry-after).
	RetryAfter time.Duration
	// MaxResponseBytes bounds a buffered (non-streaming) response
	// (--max-response-bytes).
	MaxResponseBytes int64
	// ShutdownTimeout is how long the serve command lets in-flight requests
	// drain on SIGTERM before cancelling them; 0 cancels them at once
	// (--shutdown-timeout). Shutdown itself takes its bound as a context.
	ShutdownTimeout time.Duration

	// Who may ask, and what the router presents. APIKeyFile lists the
	// keys clients must send as "Authorization: Bearer KEY", one a line,
	// optionally with a tenant name after it (--api-key-file; empty: no
	// key asked). UpstreamAPIKeyFile holds the one key the router sends
	// as "Authorization: Bearer KEY" on every call to a pod, its own and
	// the ones it forwards (--upstream-api-key-file; empty: none).
	// AdminTokenFile holds the bearer token /debug on the admin listener
	// wants (--admin-token-file; empty: open; /metrics stays open). Each
	// file is re-read when it changes; a version that does not parse
	// keeps the previous one. TrustForwardedFor keeps a client's
	// X-Forwarded-For, Forwarded and X-Real-Ip and appends the peer's
	// address, for a router behind a proxy of the operator's
	// (--trust-forwarded-for); without it the router sends the peer's
	// address alone.
	APIKeyFile         string
	UpstreamAPIKeyFile string
	AdminTokenFile     string
	TrustForwardedFor  bool

	// Health configures targets, probes, scraping, the breaker and drain.
	Health health.Config
	// Events configures the event plane: the pods' block keys (--hash-algo,
	// --hash-seed, --block-size) and how the targets' KV-event streams are
	// judged (--events-*).
	Events eventplane.Config
	// Speculative configures the predicted placements of the speculative
	// policy (--speculative-ttl, --speculative-ttl-percentile,
	// --speculative-max-stale, --holdback); other policies ignore it.
	Speculative speculative.Config
	// Peers configures prediction sharing between router replicas
	// (--replica-id, --peer-listen, --peers, --peers-resolve-interval,
	// --peer-flights-interval); off without --peer-listen.
	Peers peers.Config
}

// DefaultConfig returns the defaults, which are also the serve command's.
func DefaultConfig() Config {
	return Config{
		Listen:          "0.0.0.0:8000",
		AdminListen:     "127.0.0.1:9090",
		Policy:          brain.PolicySpeculative,
		Cost:            brain.DefaultCostConfig(),
		Tokenization:    tokenize.ModeAuto,
		TokenizeTimeout: 2 * time.Second,
		MaxBodyBytes:    32 << 20,

		MemoryShedFraction: 0.9,
		MaxConnections:     4096,
		HeaderTimeout:      10 * time.Second,
		BodyIdleTimeout:    10 * time.Second,
		ClientIdleTimeout:  90 * time.Second,
		WriteTimeout:       30 * time.Second,

		ConnectTimeout:   3 * time.Second,
		FirstByteTimeout: 10 * time.Minute,
		IdleTimeout:      2 * time.Minute,
		MaxRetries:       2,
		RetryAfter:       time.Second,
		MaxResponseBytes: 256 << 20,
		ShutdownTimeout:  30 * time.Second,
		Health:           health.DefaultConfig(),
		Events:           eventplane.DefaultConfig(),
		Speculative:      speculative.DefaultConfig(),
		Peers:            peers.DefaultConfig(),
	}
}

// Validate reports every problem in c at once (joined), each naming the
// serve flag that sets the field, and checks c.Health and c.Events too. It changes
// nothing.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if err := checkAddr(c.Listen); err != nil {
		bad("--listen %q: %v", c.Listen, err)
	}
	if c.AdminListen != "" {
		if err := checkAddr(c.AdminListen); err != nil {
			bad("--admin-listen %q: %v", c.AdminListen, err)
		}
	}
	if c.Policy.String() == "" {
		bad("--policy: unknown policy %d", c.Policy)
	}
	if err := c.Cost.Validate(); err != nil {
		errs = append(errs, err)
	}

	switch c.Tokenization {
	case tokenize.ModeLocal, tokenize.ModeRemote, tokenize.ModeAuto:
	default:
		bad("--tokenization: unknown mode %d", c.Tokenization)
	}

	errs = append(errs, positive.Fields{Durations: []positive.Duration{
		{Flag: "tokenize-timeout", V: &c.TokenizeTimeout},
		{Flag: "connect-timeout", V: &c.ConnectTimeout},
		{Flag: "first-byte-timeout", V: &c.FirstByteTimeout},
		{Flag: "idle-timeout", V: &c.IdleTimeout},
		{Flag: "retry-after", V: &c.RetryAfter},
		{Flag: "header-read-timeout", V: &c.HeaderTimeout},
		{Flag: "body-idle-timeout", V: &c.BodyIdleTimeout},
		{Flag: "client-idle-timeout", V: &c.ClientIdleTimeout},
		{Flag: "write-timeout", V: &c.WriteTimeout},
	}, Ints: []positive.Int{
		{Flag: "max-connections", V: &c.MaxConnections},
	}}.Check()...)
	if c.BodyBudget < 0 {
		bad("--max-body-bytes-in-flight must not be negative")
	}
	if c.BodyBudget > 0 && c.BodyBudget < int64(c.MaxBodyBytes) {
		bad("--max-body-bytes-in-flight (%d) must hold at least one body of --max-body-bytes (%d)", c.BodyBudget, c.MaxBodyBytes)
	}
	if !(c.MemoryShedFraction > 0 && c.MemoryShedFraction <= 1) {
		bad("--memory-shed-fraction must be in (0, 1], not %g", c.MemoryShedFraction)
	}
	if c.MaxConnectionsPerIP < 0 {
		bad("--max-connections-per-ip must not be negative")
	}
	if c.ShutdownTimeout < 0 {
		bad("--shutdown-timeout must not be negative")
	}
	if c.MaxBodyBytes <= 0 {
		bad("--max-body-bytes must be positive")
	}
	if c.AccessLog != "" && c.AccessLog != "-" {
		if err := checkLogPath(c.AccessLog); err != nil {
			bad("--access-log %q: %v", c.AccessLog, err)
		}
	}
	for _, f := range []struct{ flag, path string }{
		{fileAPIKeys, c.APIKeyFile}, {fileUpstreamKey, c.UpstreamAPIKeyFile}, {fileAdminToken, c.AdminTokenFile},
	} {
		if f.path != "" {
			if err := checkCredentialPath(f.path); err != nil {
				bad("--%s %q: %v", f.flag, f.path, err)
			}
		}
	}
	if c.AdminTokenFile != "" && c.AdminListen == "" {
		bad("--admin-token-file without --admin-listen: there is no admin listener to guard")
	}
	if c.MaxResponseBytes <= 0 {
		bad("--max-response-bytes must be positive")
	}
	if c.PDThreshold < 0 {
		bad("--pd-threshold must not be negative")
	}
	if c.MaxRetries < 0 {
		bad("--max-retries must not be negative")
	}

	if err := c.Health.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Events.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Speculative.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Peers.Validate(); err != nil {
		errs = append(errs, err)
	}
	if h := c.Health; len(h.Endpoints) == 0 && h.EndpointsFile == "" && len(h.DiscoverDNS) == 0 {
		bad("no targets: give --endpoint, --endpoints-file or --discover-dns")
	}
	return errors.Join(errs...)
}

// checkAddr refuses what net.Listen("tcp", addr) would not take as HOST:PORT
// (an empty HOST means every interface).
func checkAddr(addr string) error {
	if addr == "" {
		return errors.New("empty address (want HOST:PORT)")
	}
	_, _, err := net.SplitHostPort(addr)
	return err
}

// checkLogPath refuses a log path that cannot be a file: a directory, or
// one in a directory that does not exist. It only looks.
func checkLogPath(path string) error {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return errors.New("is a directory (want a file path, or - for standard output)")
	}
	dir := filepath.Dir(path)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("directory %s does not exist", dir)
	}
	return nil
}
