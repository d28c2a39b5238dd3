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

	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/peers"
	"github.com/prefixrouter/prefixrouter/speculative"
	"github.com/prefixrouter/prefixrouter/targetid"
	"github.com/prefixrouter/prefixrouter/tokenize"
)

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
	cfg Config
	log *slog.Logger
	reg *prometheus.Registry
	mon *health.Monitor
	tok *tokenizers
	ev  *eventplane.Plane
	// spec holds the predicted placements (speculative policy; nil
	// otherwise).
	spec *speculative.Store
	dec  *brain.Decider // the routed endpoints', by --policy
	fwd  *brain.Decider // the forwarded endpoints', by least load
	up   *upstream
	met  *metrics
	cat  *catalog
	door *frontDoor
	srv  *fasthttp.Server
	adm  *http.Server
	ln   net.Listener
	aln  net.Listener
	stop context.CancelFunc
	bg   sync.WaitGroup
	// mesh shares predictions and in-flight work with the other replicas
	// (--peer-listen; nil otherwise), links composes what they say.
	mesh  *peers.Mesh
	links *peerLinks
	// tails counts prompts still being encoded after dispatch
	// (promptTail), and the outcomes waiting for them; a clean shutdown
	// waits for them.
	tails sync.WaitGroup
	// alog is the access log (--access-log); nil when off.
	alog *accessLog
	// cred holds the API keys, the upstream key and the admin token.
	cred *credentials
	// failures holds each target's last upstream failure (targetid.ID ->
	// *upstreamFailure), shown on the admin listener.
	failures sync.Map
	// reqCtx parents every request's life: it outlives the servers'
	// shutdown so that draining requests finish, and then ends with
	// errShutdown.
	reqCtx    context.Context
	reqCancel context.CancelCauseFunc
}

// New builds a router; nothing runs and nothing is bound until Start.
func New(cfg Config, deps Deps) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("router: %w", err)
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
	if r.cred, err = newCredentials(cfg, reg, log); err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	var observer kvindex.Observer
	if cfg.Policy == brain.PolicySpeculative {
		// The store reads each stream's state from the plane, made next;
		// the plane tells the store of every placement change.
		stream := func(id targetid.ID) speculative.Stream {
			return speculative.Stream{Fresh: r.ev.Trust(id).Predictions}
		}
		if r.spec, err = speculative.New(cfg.Speculative, speculative.Deps{Registerer: reg, Logger: log, Stream: stream}); err != nil {
			return nil, fmt.Errorf("router: %w", err)
		}
		observer = r.spec.Observer()
	}
	if r.ev, err = eventplane.New(cfg.Events, eventplane.Deps{Registerer: reg, Logger: log, Observer: observer}); err != nil {
		return nil, err
	}
	hcfg := cfg.Health
	hcfg.BlockSize = cfg.Events.BlockSize
	hcfg.HashAlgo = cfg.Events.HashAlgo
	if r.mon, err = health.New(hcfg, health.Deps{Registerer: reg, Logger: log, Authorization: r.cred.upstreamHeader}); err != nil {
		return nil, err
	}
	treg := deps.Tokenizers
	if treg == nil {
		treg = tokenize.NewRegistry(tokenize.Options{Registerer: reg, Logger: log})
	}
	r.cred.authorizeTokenizer(treg)
	r.tok = newTokenizers(treg, cfg.Tokenization, cfg.TokenizeTimeout)
	r.dec = brain.New(cfg.Policy, cfg.Cost, r.ev, r.spec)
	// The forwarded endpoints' bodies are no prompt the router keys:
	// embeddings, scores and the like go to the least loaded pod.
	r.fwd = brain.New(brain.PolicyLeastLoad, cfg.Cost, r.ev, nil)
	r.up = newUpstream(cfg)
	r.up.cred = r.cred
	r.met = newMetrics(reg)
	if err := reg.Register(wiringCollector{r}); err != nil {
		return nil, fmt.Errorf("router: metrics: %w", err)
	}
	r.cat = newCatalog(r.up, r.mon)
	if err := r.newPeers(cfg.Peers, reg); err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	if cfg.AccessLog != "" {
		// Opened last: nothing after it can fail and leave the file open.
		if r.alog, err = openAccessLog(cfg.AccessLog, reg, log); err != nil {
			return nil, fmt.Errorf("router: %w", err)
		}
	}
	if r.door, err = newFrontDoor(cfg, reg, log); err != nil {
		return nil, fmt.Errorf("router: metrics: %w", err)
	}
	r.reqCtx, r.reqCancel = context.WithCancelCause(context.Background())
	r.srv = &fasthttp.Server{
		Handler:               r.handle,
		ErrorHandler:          r.handleServerError,
		Name:                  "prefixrouter",
		NoDefaultServerHeader: true,
		// Bodies are read by the router as they arrive (readBody):
		// fasthttp would allocate a declared length at once.
		StreamRequestBody:  true,
		MaxRequestBodySize: cfg.MaxBodyBytes,
		// ReadTimeout bounds a new connection's first request and every
		// request's headers; the body has its own idle bound, and the
		// relay moves the write deadline on with each chunk.
		ReadTimeout:     cfg.HeaderTimeout,
		IdleTimeout:     cfg.ClientIdleTimeout,
		WriteTimeout:    cfg.WriteTimeout,
		CloseOnShutdown: true,
		Logger:          fasthttpLogger{log},
	}
	return r, nil
}

// Monitor exposes the health monitor (the serve command logs from it).
func (r *Router) Monitor() *health.Monitor { return r.mon }

// EventPlane exposes the event plane (verdicts on the targets' KV-event
// streams, the placement index).
func (r *Router) EventPlane() *eventplane.Plane { return r.ev }

// SpeculativeView is the predicted placements' view, as GET
// /debug/speculative serves it; false when the policy is not speculative.
func (r *Router) SpeculativeView() (speculative.View, bool) {
	if r.spec == nil {
		return speculative.View{}, false
	}
	return r.spec.View(), true
}

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
	bctx, stop := context.WithCancel(ctx)
	// bind binds what others connect to (the event buses, the peer
	// socket); a failure undoes everything bound so far.
	bind := func(listen func(context.Context) error) error {
		if err := listen(bctx); err != nil {
			stop()
			r.ev.Wait()
			ln.Close()
			if aln != nil {
				aln.Close()
			}
			return fmt.Errorf("router: %w", err)
		}
		return nil
	}
	if err := bind(r.ev.Listen); err != nil {
		return err
	}
	if r.mesh != nil {
		if err := bind(r.mesh.Listen); err != nil {
			return err
		}
		r.goBG(func() {
			if err := r.mesh.Run(bctx); err != nil {
				r.log.Error("peer replicas' sharing stopped", "err", err)
			}
		})
	}
	r.ln, r.aln = ln, aln
	r.stop = stop
	// The plane's Run owns its subscribers: they stop when it returns.
	r.goBG(func() {
		if err := r.ev.Run(bctx); err != nil && !errors.Is(err, context.Canceled) {
			r.log.Error("event plane stopped", "err", err)
		}
	})
	if r.spec != nil {
		r.goBG(func() {
			if err := r.spec.Run(bctx); err != nil && !errors.Is(err, context.Canceled) {
				r.log.Error("speculative placements stopped", "err", err)
			}
		})
	}
	cancelSub := r.mon.Subscribe(r.onChange)
	r.goBG(func() { <-bctx.Done(); cancelSub() })
	r.goBG(func() {
		if err := r.mon.Run(bctx); err != nil && !errors.Is(err, context.Canceled) {
			r.log.Error("health monitor stopped", "err", err)
		}
	})
	r.goBG(func() { r.feedCaches(bctx) })
	r.goBG(func() { r.cat.run(bctx) })
	r.goBG(func() { r.door.watchMemory(bctx, 100*time.Millisecond) })
	r.goBG(func() { r.cred.run(bctx) })
	r.goBG(func() {
		if err := r.srv.Serve(&limitListener{Listener: ln, f: r.door}); err != nil {
			r.log.Error("server stopped", "err", err)
		}
	})
	if aln != nil {
		r.adm = &http.Server{Handler: r.adminHandler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: adminReadTimeout, WriteTimeout: adminWriteTimeout, IdleTimeout: adminIdleTimeout}
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
	switch c.Kind {
	case health.Added:
		r.met.addTarget(c.Target.ID.String())
		if r.spec != nil {
			r.spec.AddTarget(c.Target.ID)
		}
	case health.Restarted:
		if r.spec != nil {
			// A new process generation never confirms the old one's
			// predictions, even before its events say it restarted.
			r.spec.Invalidate(c.Target.ID, speculative.ReasonRestarted)
		}
	case health.Removed:
		r.met.forgetTarget(c.Target.ID.String())
		r.failures.Delete(c.Target.ID)
		r.forgetEndpoint(c.Target.ID.Endpoint)
		if r.spec != nil {
			r.spec.Invalidate(c.Target.ID, speculative.ReasonRemoved)
		}
	}
	if c.Kind == health.Removed {
		r.dec.Forget(c.Target.ID)
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
	r.reqCancel(errShutdown)
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
	if r.alog != nil {
		r.alog.close()
	}
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
