package main

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/urfave/cli/v3"

	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/router"
	"github.com/prefixrouter/prefixrouter/tokenize"
)

func serveCommand() *cli.Command {
	d := router.DefaultConfig()
	h := d.Health
	str := func(name, usage, value string) cli.Flag {
		return &cli.StringFlag{Name: name, Usage: usage, Value: value, Sources: envVar(name)}
	}
	strs := func(name, usage string) cli.Flag {
		return &cli.StringSliceFlag{Name: name, Usage: usage, Sources: envVar(name)}
	}
	dur := func(name, usage string, value time.Duration) cli.Flag {
		return &cli.DurationFlag{Name: name, Usage: usage, Value: value, Sources: envVar(name)}
	}
	num := func(name, usage string, value int) cli.Flag {
		return &cli.IntFlag{Name: name, Usage: usage, Value: value, Sources: envVar(name)}
	}
	flt := func(name, usage string, value float64) cli.Flag {
		return &cli.FloatFlag{Name: name, Usage: usage, Value: value, Sources: envVar(name)}
	}
	return &cli.Command{
		Name:  "serve",
		Usage: "run the OpenAI-compatible router in front of vLLM pods",
		Description: "Routes /v1/completions and /v1/chat/completions to the pod whose prefix cache holds the\n" +
			"longest run of the prompt's blocks for its load, learned from the pods' KV events.\n" +
			"Each --endpoint is a pod's base URL with options in its query, e.g.\n" +
			"  http://10.0.0.7:8000?events=tcp://10.0.0.7:5557&replay=tcp://10.0.0.7:5558&dp=2&model=NAME&role=decode\n" +
			"Every flag has an environment variable PREFIXROUTER_<FLAG> (dashes as underscores).",
		OnUsageError: onUsageError,
		Flags: []cli.Flag{
			str("listen", "address of the OpenAI API", "0.0.0.0:8000"),
			str("admin-listen", "address of /metrics and /debug (empty: off; it exposes internal addresses)", d.AdminListen),
			strs("endpoint", "a target pod (repeatable; the environment variable takes a comma-separated list)"),
			str("endpoints-file", "YAML or JSON list of endpoint specs, re-read when it changes", ""),
			dur("endpoints-file-poll", "polling fallback for --endpoints-file", h.FilePollInterval),
			strs("discover-dns", "NAME:PORT[?options] resolved on an interval, one target per address (repeatable)"),
			dur("discover-dns-interval", "how often --discover-dns names are re-resolved", h.DNSInterval),

			str("policy", "target choice: "+strings.Join(router.PolicyNames(), ", "), d.Policy.String()),
			str("hash-algo", "the pods' --prefix-caching-hash-algo: "+strings.Join(kvindex.HashAlgoNames(), ", ")+" (default: learned from the pods)", ""),
			str("hash-seed", "the pods' PYTHONHASHSEED (absent: token-derived keys)", ""),
			num("block-size", "the pods' KV block size in tokens (0: learned from the pods)", 0),
			strs("tokenizer", "MODEL=PATH or MODEL:MODE=PATH, a tokenizer directory, tokenizer.json or \"bytes\" (repeatable)"),
			str("tokenization", "mode for models without a mode of their own: local, remote or auto", d.Tokenization.String()),

			dur("tokenize-timeout", "bound on a remote tokenization before routing (past it: route on load)", d.TokenizeTimeout),
			num("max-body-bytes", "largest accepted request body (413 beyond)", d.MaxBodyBytes),
			&cli.BoolFlag{Name: "debug-headers", Usage: "add X-Prefixrouter-* headers naming the chosen target (exposes internal addresses)", Sources: envVar("debug-headers")},
			dur("connect-timeout", "dialing a target", d.ConnectTimeout),
			dur("first-byte-timeout", "waiting for a target's first response byte (a non-streaming generation)", d.FirstByteTimeout),
			dur("idle-timeout", "silence allowed between two chunks of a streamed response", d.IdleTimeout),
			num("max-retries", "other targets tried when a target fails before its first byte", d.MaxRetries),
			dur("retry-after", "Retry-After sent with 503 when no target can take a request", d.RetryAfter),
			dur("shutdown-timeout", "how long in-flight requests may drain on SIGTERM", 30*time.Second),
			flt("decode-weight", "precise cost of one running request, in prefill tokens", d.Cost.DecodeWeight),
			flt("kv-threshold", "KV-cache usage above which the precise cost adds memory pressure", d.Cost.KVThreshold),
			flt("kv-pressure", "weight of the memory-pressure term (prompts' worth at a full cache)", d.Cost.KVPressure),

			dur("health-probe-interval", "GET /health interval per target", h.ProbeInterval),
			dur("health-probe-timeout", "GET /health timeout", h.ProbeTimeout),
			num("health-failure-threshold", "failed probes that take a target down", h.FailureThreshold),
			num("health-success-threshold", "good probes that bring a down target back", h.SuccessThreshold),
			dur("health-models-interval", "GET /v1/models interval per target", h.ModelsInterval),
			num("breaker-failures", "consecutive upstream failures that open a target's circuit breaker", h.BreakerFailures),
			dur("breaker-cooldown", "first open period of a circuit breaker", h.BreakerCooldown),
			dur("breaker-max-cooldown", "longest open period of a circuit breaker", h.BreakerMaxCooldown),
			dur("metrics-scrape-interval", "GET /metrics interval per target", h.ScrapeInterval),
			dur("metrics-scrape-timeout", "GET /metrics timeout", h.ScrapeTimeout),
			dur("metrics-stale-after", "scraped load older than this is stale", h.LoadStaleAfter),
			dur("events-stale-after", "answered requests without a KV event for this long make a target stale", h.EventsStaleAfter),
			num("events-min-uncached-tokens", "uncached tokens answered before missing events count", h.EventsMinUncachedTokens),
			num("events-max-queue-depth", "subscriber backlog beyond which a target is stale", h.EventsMaxQueueDepth),
			dur("health-eval-interval", "freshness evaluation interval", h.EvalInterval),
			dur("health-routing-window", "window of the recent routing volume", h.RoutingWindow),
			dur("drain-timeout", "how long a removed target with requests in flight stays", h.DrainTimeout),

			str("log-level", "debug, info, warn or error", "info"),
			str("log-format", "text or json", "text"),
		},
		Action: runServe,
	}
}

func runServe(ctx context.Context, cmd *cli.Command) error {
	log, err := newLogger(cmd)
	if err != nil {
		return err
	}
	cfg, err := serveConfig(cmd)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	toks := tokenize.NewRegistry(tokenize.Options{Registerer: reg, Logger: log})
	defer toks.Close()
	for _, spec := range cmd.StringSlice("tokenizer") {
		if !specHasMode(spec) {
			// The flag's mode applies where the entry names none.
			name, path, _ := strings.Cut(spec, "=")
			spec = name + ":" + cfg.Tokenization.String() + "=" + path
		}
		if _, err := toks.AddSpec(spec); err != nil {
			return usageError("--tokenizer %q: %v", spec, err)
		}
	}
	rt, err := router.New(cfg, router.Deps{Registry: reg, Tokenizers: toks, Logger: log})
	if err != nil {
		return usageError("%v", err)
	}
	if err := rt.Start(ctx); err != nil {
		return cli.Exit(err.Error(), exitFailure)
	}
	<-ctx.Done()
	log.Info("shutting down; draining in-flight requests", "timeout", cmd.Duration("shutdown-timeout"))
	sctx, cancel := context.WithTimeout(context.Background(), cmd.Duration("shutdown-timeout"))
	defer cancel()
	if err := rt.Shutdown(sctx); err != nil {
		return cli.Exit(err.Error(), exitFailure)
	}
	return nil
}

// specHasMode reports whether a --tokenizer value names its mode
// (NAME:MODE=PATH).
func specHasMode(spec string) bool {
	name, _, ok := strings.Cut(spec, "=")
	return ok && strings.Contains(name, ":")
}

func serveConfig(cmd *cli.Command) (router.Config, error) {
	cfg := router.DefaultConfig()
	cfg.Listen = cmd.String("listen")
	cfg.AdminListen = cmd.String("admin-listen")
	p, err := router.ParsePolicy(cmd.String("policy"))
	if err != nil {
		return cfg, usageError("--policy: %v", err)
	}
	cfg.Policy = p
	if a := cmd.String("hash-algo"); a != "" {
		if _, err := kvindex.ParseHashAlgo(a); err != nil {
			return cfg, usageError("--hash-algo: %v", err)
		}
		cfg.HashAlgo = a
	}
	if cmd.IsSet("hash-seed") {
		cfg.HashSeed, cfg.HasHashSeed = cmd.String("hash-seed"), true
	}
	if bs := cmd.Int("block-size"); bs < 0 || bs > kvindex.MaxBlockSize {
		return cfg, usageError("--block-size %d: want 1..%d, or 0 to learn it", bs, kvindex.MaxBlockSize)
	} else {
		cfg.BlockSize = bs
	}
	if cfg.Tokenization, err = tokenize.ParseMode(cmd.String("tokenization")); err != nil {
		return cfg, usageError("--tokenization: %v", err)
	}
	cfg.TokenizeTimeout = cmd.Duration("tokenize-timeout")
	if cfg.MaxBodyBytes = cmd.Int("max-body-bytes"); cfg.MaxBodyBytes <= 0 {
		return cfg, usageError("--max-body-bytes must be positive")
	}
	cfg.DebugHeaders = cmd.Bool("debug-headers")
	cfg.ConnectTimeout = cmd.Duration("connect-timeout")
	cfg.FirstByteTimeout = cmd.Duration("first-byte-timeout")
	cfg.IdleTimeout = cmd.Duration("idle-timeout")
	if cfg.MaxRetries = cmd.Int("max-retries"); cfg.MaxRetries < 0 {
		return cfg, usageError("--max-retries must not be negative")
	}
	cfg.RetryAfter = cmd.Duration("retry-after")
	cfg.Cost = router.CostConfig{
		DecodeWeight: cmd.Float("decode-weight"),
		KVThreshold:  cmd.Float("kv-threshold"),
		KVPressure:   cmd.Float("kv-pressure"),
	}
	if cfg.Cost.KVThreshold < 0 || cfg.Cost.KVThreshold > 1 {
		return cfg, usageError("--kv-threshold must be within [0, 1]")
	}

	h := &cfg.Health
	h.Endpoints = splitList(cmd.StringSlice("endpoint"))
	h.EndpointsFile = cmd.String("endpoints-file")
	h.FilePollInterval = cmd.Duration("endpoints-file-poll")
	h.DiscoverDNS = splitList(cmd.StringSlice("discover-dns"))
	h.DNSInterval = cmd.Duration("discover-dns-interval")
	h.ProbeInterval = cmd.Duration("health-probe-interval")
	h.ProbeTimeout = cmd.Duration("health-probe-timeout")
	h.FailureThreshold = cmd.Int("health-failure-threshold")
	h.SuccessThreshold = cmd.Int("health-success-threshold")
	h.ModelsInterval = cmd.Duration("health-models-interval")
	h.BreakerFailures = cmd.Int("breaker-failures")
	h.BreakerCooldown = cmd.Duration("breaker-cooldown")
	h.BreakerMaxCooldown = cmd.Duration("breaker-max-cooldown")
	h.ScrapeInterval = cmd.Duration("metrics-scrape-interval")
	h.ScrapeTimeout = cmd.Duration("metrics-scrape-timeout")
	h.LoadStaleAfter = cmd.Duration("metrics-stale-after")
	h.EventsStaleAfter = cmd.Duration("events-stale-after")
	h.EventsMinUncachedTokens = cmd.Int("events-min-uncached-tokens")
	h.EventsMaxQueueDepth = cmd.Int("events-max-queue-depth")
	h.EvalInterval = cmd.Duration("health-eval-interval")
	h.RoutingWindow = cmd.Duration("health-routing-window")
	h.DrainTimeout = cmd.Duration("drain-timeout")
	for _, e := range h.Endpoints {
		if _, err := health.ParseSpec(e); err != nil {
			return cfg, usageError("--endpoint %q: %v", e, err)
		}
	}
	for _, e := range h.DiscoverDNS {
		if _, err := health.ParseDNSSpec(e); err != nil {
			return cfg, usageError("--discover-dns %q: %v", e, err)
		}
	}
	if len(h.Endpoints) == 0 && h.EndpointsFile == "" && len(h.DiscoverDNS) == 0 {
		return cfg, usageError("no targets: give --endpoint, --endpoints-file or --discover-dns")
	}
	return cfg, nil
}

// splitList flattens comma-separated values (the environment form of a
// repeatable flag); endpoint URLs never contain a bare comma.
func splitList(vs []string) []string {
	var out []string
	for _, v := range vs {
		for p := range strings.SplitSeq(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

func newLogger(cmd *cli.Command) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(cmd.String("log-level"))); err != nil {
		return nil, usageError("--log-level %q: want debug, info, warn or error", cmd.String("log-level"))
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch cmd.String("log-format") {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, usageError("--log-format %q: want text or json", cmd.String("log-format"))
}
