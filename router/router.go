package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/tokenize"
)

// Config is everything `prefixrouter serve` sets for the router. Zero values
// take the defaults of DefaultConfig.
type Config struct {
	// Listen is the OpenAI API address (flag --listen); AdminListen serves
	// /metrics and /debug (flag --admin-listen; empty disables it).
	Listen      string
	AdminListen string

	Policy Policy
	Cost   CostConfig

	// HashAlgo, HashSeed/HasHashSeed and BlockSize describe the pods' prefix
	// cache (--hash-algo, --hash-seed, --block-size). Without a seed the
	// router keys blocks by their tokens (token-derived mode); block size and
	// algorithm are learned from the pods when not given.
	HashAlgo    string
	HashSeed    string
	HasHashSeed bool
	BlockSize   int

	// Tokenization is the mode for models that have no --tokenizer entry
	// (and for entries that name no mode): local models without files are
	// routed on load alone; remote and auto ask the pod.
	Tokenization tokenize.Mode
	// TokenizeTimeout bounds a remote tokenization before routing; past it
	// the request is routed on load alone (flag --tokenize-timeout).
	TokenizeTimeout time.Duration

	// MaxBodyBytes bounds request bodies (413 beyond).
	MaxBodyBytes int
	// DebugHeaders adds X-Prefixrouter-* headers naming the chosen target.
	DebugHeaders bool

	// ConnectTimeout bounds dialing a target; FirstByteTimeout the wait for
	// the first response byte (a non-streaming request's whole generation);
	// IdleTimeout the silence between two chunks of a streamed response.
	ConnectTimeout   time.Duration
	FirstByteTimeout time.Duration
	IdleTimeout      time.Duration
	// MaxRetries is how many other targets a request may be retried on when
	// its target failed before sending any byte.
	MaxRetries int
	// RetryAfter is the Retry-After sent with 503 when no target can take
	// a request.
	RetryAfter time.Duration
	// MaxResponseBytes bounds a buffered (non-streaming) response.
	MaxResponseBytes int64

	// Health configures targets, probes, scraping and freshness.
	Health health.Config
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Listen:           "127.0.0.1:8080",
		AdminListen:      "127.0.0.1:9090",
		Policy:           PolicyPrecise,
		Cost:             DefaultCostConfig(),
		Tokenization:     tokenize.ModeAuto,
		TokenizeTimeout:  2 * time.Second,
		MaxBodyBytes:     32 << 20,
		ConnectTimeout:   3 * time.Second,
		FirstByteTimeout: 10 * time.Minute,
		IdleTimeout:      2 * time.Minute,
		MaxRetries:       2,
		RetryAfter:       time.Second,
		MaxResponseBytes: 256 << 20,
		Health:           withEventDefaults(health.DefaultConfig()),
	}
}

func (c *Config) fill() {
	d := DefaultConfig()
	if c.Policy == 0 {
		c.Policy = d.Policy
	}
	if c.Cost == (CostConfig{}) {
		c.Cost = d.Cost
	}
	if c.TokenizeTimeout <= 0 {
		c.TokenizeTimeout = d.TokenizeTimeout
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = d.MaxBodyBytes
	}
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = d.ConnectTimeout
	}
	if c.FirstByteTimeout <= 0 {
		c.FirstByteTimeout = d.FirstByteTimeout
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = d.IdleTimeout
	}
	if c.MaxRetries < 0 {
		c.MaxRetries = 0
	}
	if c.RetryAfter <= 0 {
		c.RetryAfter = d.RetryAfter
	}
	if c.MaxResponseBytes <= 0 {
		c.MaxResponseBytes = d.MaxResponseBytes
	}
}

// Deps are the router's collaborators.
type Deps struct {
	// Registry receives every metric (router, event plane with kvindex,
	// health, tokenize register on it) and is served on /metrics. Nil: a
	// new registry.
	Registry *prometheus.Registry
	// Tokenizers holds the --tokenizer models; nil: an empty registry that
	// the router fills with remote models as needed.
	Tokenizers *tokenize.Registry
	Logger     *slog.Logger
}

// Router is the front door. Create it with New, bind with Start, stop with
// Shutdown.
type Router struct {
	cfg  Config
	log  *slog.Logger
	reg  *prometheus.Registry
	mon  *health.Monitor
	tok  *tokenizers
	ev   *eventplane.Plane
	ch   *chooser
	up   *upstream
	met  *metrics
	cat  *catalog
	srv  *fasthttp.Server
	adm  *http.Server
	ln   net.Listener
	aln  net.Listener
	stop context.CancelFunc
	bg   sync.WaitGroup
	// tails counts prompts still being encoded after their responses
	// (routePlan.finishPrompt); a clean shutdown waits for them.
	tails sync.WaitGroup
	// reqCtx parents upstream requests: it outlives the servers' shutdown
	// so that draining requests finish.
	reqCtx    context.Context
	reqCancel context.CancelFunc
}

// New builds a router; nothing runs and nothing is bound until Start.
func New(cfg Config, deps Deps) (*Router, error) {
	cfg.fill()
	if _, ok := policyNames[cfg.Policy]; !ok {
		return nil, fmt.Errorf("router: unknown policy %d", cfg.Policy)
	}
	log := deps.Logger
	if log == nil {
		log = slog.Default()
	}
	reg := deps.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	r := &Router{cfg: cfg, log: log, reg: reg}
	var err error
	if r.ev, err = eventplane.New(planeConfig(&cfg), eventplane.Deps{Registerer: reg, Logger: log}); err != nil {
		return nil, err
	}
	hcfg := cfg.Health
	hcfg.BlockSize = cfg.BlockSize
	hcfg.HashAlgo = cfg.HashAlgo
	if r.mon, err = health.New(hcfg, health.Deps{Registerer: reg, Logger: log}); err != nil {
		return nil, err
	}
	treg := deps.Tokenizers
	if treg == nil {
		treg = tokenize.NewRegistry(tokenize.Options{Registerer: reg, Logger: log})
	}
	r.tok = newTokenizers(treg, cfg.Tokenization)
	r.ch = newChooser(cfg.Policy, cfg.Cost)
	r.up = newUpstream(cfg)
	r.met = newMetrics(reg)
	r.cat = newCatalog(r.up, r.mon)
	r.reqCtx, r.reqCancel = context.WithCancel(context.Background())
	r.srv = &fasthttp.Server{
		Handler:               r.handle,
		ErrorHandler:          r.handleServerError,
		Name:                  "prefixrouter",
		NoDefaultServerHeader: true,
		MaxRequestBodySize:    cfg.MaxBodyBytes,
		ReadTimeout:           time.Minute,
		IdleTimeout:           5 * time.Minute,
		CloseOnShutdown:       true,
		Logger:                fasthttpLogger{log},
	}
	return r, nil
}

// Monitor exposes the health monitor (the serve command logs from it).
func (r *Router) Monitor() *health.Monitor { return r.mon }

// EventPlane exposes the event plane (verdicts on the targets' KV-event
// streams, the placement index).
func (r *Router) EventPlane() *eventplane.Plane { return r.ev }

// Start binds the listeners and starts health, the event plane and the
// servers. The servers run until Shutdown; ctx bounds the background work.
func (r *Router) Start(ctx context.Context) error {
	ln, err := net.Listen("tcp", r.cfg.Listen)
	if err != nil {
		return fmt.Errorf("router: listen %s: %w", r.cfg.Listen, err)
	}
	var aln net.Listener
	if r.cfg.AdminListen != "" {
		if aln, err = net.Listen("tcp", r.cfg.AdminListen); err != nil {
			ln.Close()
			return fmt.Errorf("router: admin listen %s: %w", r.cfg.AdminListen, err)
		}
	}
	r.ln, r.aln = ln, aln
	bctx, stop := context.WithCancel(ctx)
	r.stop = stop
	// The plane's Run owns its subscribers: they stop when it returns.
	r.goBG(func() {
		if err := r.ev.Run(bctx); err != nil && !errors.Is(err, context.Canceled) {
			r.log.Error("event plane stopped", "err", err)
		}
	})
	cancelSub := r.mon.Subscribe(r.onChange)
	r.goBG(func() { <-bctx.Done(); cancelSub() })
	r.goBG(func() {
		if err := r.mon.Run(bctx); err != nil && !errors.Is(err, context.Canceled) {
			r.log.Error("health monitor stopped", "err", err)
		}
	})
	r.goBG(func() { r.feedCaches(bctx) })
	r.goBG(func() { r.cat.run(bctx) })
	r.goBG(func() {
		if err := r.srv.Serve(ln); err != nil {
			r.log.Error("server stopped", "err", err)
		}
	})
	if aln != nil {
		r.adm = &http.Server{Handler: r.adminHandler(), ReadHeaderTimeout: 10 * time.Second}
		r.goBG(func() {
			if err := r.adm.Serve(aln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				r.log.Error("admin server stopped", "err", err)
			}
		})
	}
	r.log.Info("router listening", "addr", ln.Addr().String(), "admin", r.AdminAddr(), "policy", r.cfg.Policy.String())
	return nil
}

func (r *Router) goBG(fn func()) {
	r.bg.Add(1)
	go func() { defer r.bg.Done(); fn() }()
}

func (r *Router) onChange(c health.Change) {
	r.followTarget(c)
	if c.Kind == health.Removed && r.ch.approx != nil {
		r.ch.approx.forget(c.Target.ID)
	}
}

// Addr is the bound API address (after Start).
func (r *Router) Addr() string {
	if r.ln == nil {
		return ""
	}
	return r.ln.Addr().String()
}

// AdminAddr is the bound admin address, or "".
func (r *Router) AdminAddr() string {
	if r.aln == nil {
		return ""
	}
	return r.aln.Addr().String()
}

// Shutdown stops accepting requests, lets in-flight ones finish until ctx
// ends (then cancels them), and stops the background work.
func (r *Router) Shutdown(ctx context.Context) error {
	var errs []error
	drained := true
	if err := r.srv.ShutdownWithContext(ctx); err != nil {
		errs = append(errs, fmt.Errorf("router: drain: %w", err))
		drained = false
	}
	r.reqCancel()
	if r.adm != nil {
		actx, cancel := context.WithTimeout(context.Background(), time.Second)
		if r.adm.Shutdown(actx) != nil {
			drained = false
		}
		cancel()
	}
	if r.stop != nil {
		r.stop()
	}
	// Prompt tails are waited for only once no handler can start another:
	// after a drain cut short, a late one would race the wait.
	if drained {
		r.tails.Wait()
	}
	r.bg.Wait()
	r.up.close()
	return errors.Join(errs...)
}

// fasthttpLogger routes fasthttp's own messages to slog.
type fasthttpLogger struct{ log *slog.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	l.log.Debug(fmt.Sprintf(format, args...), "component", "fasthttp")
}

// KeysReady reports whether block keys are configured (block size and
// algorithm known, given or learned), i.e. whether the precise policy can
// see cache hits yet.
func (r *Router) KeysReady() bool { return r.ev.Keys() != nil }
