package main

import (
	"context"
	"log/slog"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/urfave/cli/v3"

	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/internal/memlimit"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/router"
	"github.com/prefixrouter/prefixrouter/speculative"
	"github.com/prefixrouter/prefixrouter/tokenize"
	"github.com/prefixrouter/prefixrouter/tokenize/hub"
)

// serveSettings is what the serve command's flags set: the router's
// config, and what only the command itself uses.
type serveSettings struct {
	router.Config
	Tokenizers []string
	LogLevel   string
	LogFormat  string
}

func defaultServeSettings() serveSettings {
	return serveSettings{Config: router.DefaultConfig(), LogLevel: "info", LogFormat: "text"}
}

func serveCommand() *cli.Command {
	s := defaultServeSettings()
	t := newFlagTable("serve")
	return t.command(&cli.Command{
		Name:  "serve",
		Usage: "run the OpenAI-compatible router in front of vLLM pods",
		Description: "Routes /v1/completions and /v1/chat/completions to the pod whose prefix cache holds the\n" +
			"longest run of the prompt's blocks for its load, learned from the pods' KV events.\n" +
			"Each --endpoint is a pod's base URL with options in its query, e.g.\n" +
			"  http://10.0.0.7:8000?events=tcp://10.0.0.7:5557&replay=tcp://10.0.0.7:5558&dp=2&model=NAME&role=decode\n" +
			"Every flag has an environment variable PREFIXROUTER_<FLAG> (dashes as underscores).",
		Flags:  s.flags(t),
		Action: func(ctx context.Context, _ *cli.Command) error { return runServe(ctx, &s) },
	})
}

// flags is the serve command's flag table: each flag is bound to the field
// it sets, and its default is that field's value in s, which starts as
// router.DefaultConfig. Help, docs/configuration.md and the config cannot
// disagree on a default.
func (s *serveSettings) flags(t *flagTable) []cli.Flag {
	h, ev := &s.Health, &s.Events
	serving := t.group("Serving")
	targets := t.group("Targets")
	routing := t.group("Routing")
	keys := t.group("Block keys and tokenization")
	upstream := t.group("Requests to the pods")
	health := t.group("Health and load")
	events := t.group("KV-event streams")
	spec := t.group("Speculative placements")
	sp := &s.Speculative
	replicas := t.group("Router replicas")
	pr := &s.Peers
	access := t.group("Credentials")
	return []cli.Flag{
		serving.str("listen", "address of the OpenAI API", &s.Listen),
		serving.str("admin-listen", "address of /metrics and /debug (empty: off; it exposes internal addresses)", &s.AdminListen),
		serving.int("max-body-bytes", "largest accepted request body (413 beyond, at once for a declared length, else as the bytes arrive)", &s.MaxBodyBytes),
		defaultText(serving.int64("max-body-bytes-in-flight", "request body bytes held at once by all requests in progress; past it new requests get 503", &s.BodyBudget), "0, an eighth of the memory limit (128 MiB without one)"),
		serving.float("memory-shed-fraction", "share of the memory limit (GOMEMLIMIT, or 90% of the container's) past which new requests get 503", &s.MemoryShedFraction),
		serving.int("max-connections", "client connections served at once; more are answered 503 and closed", &s.MaxConnections),
		defaultText(serving.int("max-connections-per-ip", "client connections served at once from one address; more are answered 429 and closed", &s.MaxConnectionsPerIP), "0, no cap"),
		serving.dur("header-read-timeout", "a new connection's wait for its first request, and the reading of any request's headers", &s.HeaderTimeout),
		serving.dur("body-idle-timeout", "silence allowed between two parts of a request body (408 beyond)", &s.BodyIdleTimeout),
		serving.dur("client-idle-timeout", "a kept-alive client connection's wait for its next request", &s.ClientIdleTimeout),
		serving.dur("write-timeout", "how long a client may take none of its answer; then it is cut off and the pod's request cancelled", &s.WriteTimeout),
		serving.bool("debug-headers", "add X-Prefixrouter-* headers naming the chosen target (exposes internal addresses)", &s.DebugHeaders),
		serving.str("access-log", "one JSON line per API request, written when it ends: a file (appended to) or - for standard output (empty: off)", &s.AccessLog),
		serving.dur("shutdown-timeout", "how long in-flight requests may drain on SIGTERM", &s.ShutdownTimeout),
		choice(serving, "log-level", "debug, info, warn or error", &s.LogLevel, identity, parseLogLevel),
		choice(serving, "log-format", "text or json", &s.LogFormat, identity, oneOf("text", "json")),

		access.str("api-key-file", "API keys clients must send as Authorization: Bearer KEY (401 otherwise), one a line with an optional tenant name after it; # comments; re-read when it changes (empty: no key asked; /health and /ready stay open)", &s.APIKeyFile),
		access.str("upstream-api-key-file", "the key (one line) sent as Authorization: Bearer KEY on every call to the pods, the router's own and forwarded ones, as vLLM's --api-key wants; re-read when it changes (empty: none)", &s.UpstreamAPIKeyFile),
		access.str("admin-token-file", "the token (one line) the admin listener's /debug paths and dry run want as Authorization: Bearer TOKEN; /metrics stays open for Prometheus; re-read when it changes (empty: open)", &s.AdminTokenFile),
		access.bool("trust-forwarded-for", "keep a client's X-Forwarded-For, Forwarded and X-Real-Ip and append the peer's address (behind a proxy of yours); otherwise the pods get the peer's address alone", &s.TrustForwardedFor),

		targets.list("endpoint", "a target pod (repeatable; the environment variable takes a comma-separated list)", &h.Endpoints),
		targets.str("endpoints-file", "YAML or JSON list of endpoint specs, re-read when it changes", &h.EndpointsFile),
		targets.dur("endpoints-file-poll", "polling fallback for --endpoints-file", &h.FilePollInterval),
		targets.list("discover-dns", "NAME:PORT[?options] resolved on an interval, one target per address (repeatable)", &h.DiscoverDNS),
		targets.dur("discover-dns-interval", "how often --discover-dns names are re-resolved", &h.DNSInterval),

		choice(routing, "policy", "target choice: "+strings.Join(brain.PolicyNames(), ", "), &s.Policy, brain.Policy.String, brain.ParsePolicy),
		routing.float("decode-weight", "precise cost of one running request, in prefill tokens", &s.Cost.DecodeWeight),
		routing.float("kv-threshold", "KV-cache usage above which the precise cost adds memory pressure", &s.Cost.KVThreshold),
		routing.float("kv-pressure", "weight of the memory-pressure term (prompts' worth at a full cache)", &s.Cost.KVPressure),
		routing.float("recompute-weight", "extra price of a prompt token a pod must compute (not cached there) once no pod has capacity to spare, in prefill tokens: work the requests queued behind it wait for (scaled down while some pod has spare capacity; 0: a token costs one)", &s.Cost.RecomputeWeight),
		routing.int("pd-threshold", "disaggregated fleets: prompts shorter than this many tokens run on the decode pod alone, without a prefill pod (0: every prompt is split)", &s.PDThreshold),
		routing.float("reuse-wait", "speculative: share of a prefix's prefill a request may wait for on the pod computing it, rather than have an idle pod compute it again (0: never; 1: always wait; under load it always waits)", &s.Cost.ReuseWait),

		defaultText(keys.checked("hash-algo", "the pods' --prefix-caching-hash-algo: "+strings.Join(kvindex.HashAlgoNames(), ", "), &ev.HashAlgo,
			learnedOr(kvindex.ParseHashAlgo)), "learned from the pods"),
		keys.optional("hash-seed", "the pods' PYTHONHASHSEED, for vLLM-exact block keys", "none, token-derived keys", &ev.HashSeed, &ev.HasHashSeed,
			refuseRandomSeed("omit --hash-seed, and the router keys blocks by their tokens (token-derived mode)")),
		defaultText(keys.int("block-size", "the pods' KV block size in tokens", &ev.BlockSize), "0, learned from the pods"),
		keys.list("tokenizer", "MODEL[:MODE]=SOURCE, SOURCE a model directory, a tokenizer.json, hf:ORG/NAME[@REVISION] or \"bytes\"; a bare MODEL is a local directory, else that hub repository (repeatable)", &s.Tokenizers),
		choice(keys, "tokenization", "mode for models without a mode of their own: local, remote or auto", &s.Tokenization, tokenize.Mode.String, tokenize.ParseMode),
		keys.dur("tokenize-timeout", "bound on a remote tokenization before routing (past it: route on load)", &s.TokenizeTimeout),

		upstream.dur("connect-timeout", "dialing a target", &s.ConnectTimeout),
		upstream.dur("first-byte-timeout", "waiting for a target's first response byte (a non-streaming generation)", &s.FirstByteTimeout),
		upstream.dur("idle-timeout", "silence allowed between two chunks of a streamed response", &s.IdleTimeout),
		upstream.int("max-retries", "other targets tried when a target fails before its first byte", &s.MaxRetries),
		upstream.dur("retry-after", "Retry-After sent with 503 when no target can take a request", &s.RetryAfter),
		upstream.int64("max-response-bytes", "largest buffered (non-streaming) response (502 beyond)", &s.MaxResponseBytes),

		health.dur("health-probe-interval", "GET /health interval per target", &h.ProbeInterval),
		health.dur("health-probe-timeout", "GET /health timeout", &h.ProbeTimeout),
		health.int("health-failure-threshold", "failed probes that take a target down", &h.FailureThreshold),
		health.int("health-success-threshold", "good probes that bring a down target back", &h.SuccessThreshold),
		health.dur("health-models-interval", "GET /v1/models interval per target", &h.ModelsInterval),
		health.int("breaker-failures", "consecutive upstream failures that open a target's circuit breaker", &h.BreakerFailures),
		health.dur("breaker-cooldown", "first open period of a circuit breaker", &h.BreakerCooldown),
		health.dur("breaker-max-cooldown", "longest open period of a circuit breaker", &h.BreakerMaxCooldown),
		health.dur("metrics-scrape-interval", "GET /metrics interval per target", &h.ScrapeInterval),
		health.dur("metrics-scrape-timeout", "GET /metrics timeout", &h.ScrapeTimeout),
		health.dur("metrics-stale-after", "scraped load older than this is stale", &h.LoadStaleAfter),
		health.dur("health-eval-interval", "how often drained targets are reaped and time-dependent states rebuilt", &h.EvalInterval),
		health.dur("drain-timeout", "how long a removed target with requests in flight stays", &h.DrainTimeout),

		events.dur("events-stale-after", "answered requests without a KV event for this long make a target stale", &ev.StaleAfter),
		events.int("events-min-uncached-tokens", "uncached tokens answered before missing events count", &ev.MinUncachedTokens),
		events.int("events-max-queue-depth", "subscriber backlog beyond which a target is stale", &ev.MaxQueueDepth),
		events.dur("events-eval-interval", "how often each target's event stream is judged", &ev.EvalInterval),
		events.dur("health-routing-window", "window of the recent routing volume shown per target", &ev.RoutingWindow),
		events.list("events-listen", "tcp://ADDR:PORT to bind, collecting the KV events of every pod whose publisher connects there (vLLM's endpoint without *), told apart by topic kv@HOST:PORT@MODEL; rank r connects to PORT + r; endpoints without events= are expected there (repeatable)", &ev.EventsListen),
		defaultText(events.int("replay-port", "the pods' replay port for targets on an --events-listen bus whose endpoint has no replay= (rank r: port + r), on the topic's host", &ev.ReplayPort), "0, none"),
		events.int("events-max-message-bytes", "largest KV-event message accepted (bus, subscription and replay); libzmq drops a larger one before allocating it", &ev.MaxMessageBytes),
		events.int("events-max-batch-events", "most events one KV-event batch may carry (beyond: refused)", &ev.MaxBatchEvents),
		events.int("events-max-event-blocks", "most blocks one KV event may carry (beyond: its batch is refused)", &ev.MaxEventBlocks),
		events.int("events-max-clears-per-minute", "AllBlocksCleared events applied per stream in any minute (beyond: refused, an events_refused fault)", &ev.ClearsPerMinute),
		events.int("events-max-resets-per-minute", "sequence resets (a lower sequence number taken for a restart health did not see) per stream in any minute (beyond: refused)", &ev.ResetsPerMinute),
		events.int("events-max-gaps-per-minute", "sequence gaps replayed per stream in any minute (beyond: the batch is refused)", &ev.GapsPerMinute),
		events.int("events-max-topics", "topics an --events-listen bus tracks besides those it follows (refused and unknown ones)", &ev.MaxTopics),
		events.dur("events-owner-idle", "on a bus, how long the connection owning a pod's topic must be silent before another may take it over (sooner only after a restart health saw)", &ev.OwnerIdle),

		choice(spec, "speculative-ttl", "lifetime of a predicted placement: auto (sized per target from measured confirmation latency) or a duration (--policy speculative)",
			&sp.TTL, speculative.FormatTTL, speculative.ParseTTL),
		bind(spec, &cli.FloatFlag{Name: "speculative-ttl-percentile", Usage: "share of confirmation latencies the automatic TTL covers, in (0, 1)", Destination: &sp.TTLPercentile},
			speculative.CheckPercentile),
		spec.dur("speculative-max-stale", "cap on every TTL: a prediction never counts longer without its KV event", &sp.MaxStale),
		spec.float("holdback", "share of conversations routed without predictions, to measure what they save (0 to 0.5; 0: off)", &sp.Holdback),

		replicas.str("peer-listen", "tcp://ADDR:PORT to bind, publishing this replica's predictions and in-flight work to the other router replicas (empty: no sharing)", &pr.Listen),
		replicas.list("peers", "the other router replicas: tcp://HOST:PORT, or dns:NAME:PORT for a headless Service, re-resolved; this replica's own address is skipped (repeatable)", &pr.Peers),
		defaultText(replicas.str("replica-id", "this replica's name to its peers (the origin label of the predictions it shares)", &pr.ID), "host name:peer port"),
		replicas.dur("peers-resolve-interval", "how often --peers names are re-resolved", &pr.ResolveInterval),
		replicas.str("peer-key-file", "file of the CURVE keypair the replicas of one deployment share (`prefixrouter peer-keygen` writes one): only processes holding it can publish to this replica or read what it publishes", &pr.KeyFile),
		replicas.bool("peer-insecure", "run the mesh without --peer-key-file: in the clear, believing any process at a --peers address", &pr.Insecure),
		replicas.dur("peer-flights-interval", "how often this replica sends all its in-flight work to its peers (a change on a target leaves at once); also the heartbeat: a peer silent for 3 intervals, at least 1s, is lost", &pr.FlightsInterval),
	}
}

func runServe(ctx context.Context, s *serveSettings) error {
	log, err := newLogger(s.LogLevel, s.LogFormat)
	if err != nil {
		return err
	}
	cfg := s.config()
	if err := cfg.Validate(); err != nil {
		return usageError("%s", strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	// The router sizes its body budget and sheds load from the runtime's
	// memory limit: set it from the container's before the router is made.
	if mem, err := memlimit.Apply("/sys/fs/cgroup"); err != nil {
		log.Warn("cannot read the container's memory limit; the runtime has none from it", "err", err)
	} else {
		log.Info("memory limit", "source", mem.Source, "runtime_limit_bytes", mem.Limit, "container_limit_bytes", mem.Container)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	toks, err := loadTokenizers(ctx, s.Tokenizers, cfg.Tokenization, reg, log)
	if err != nil {
		return err
	}
	defer toks.Close()
	rt, err := router.New(cfg, router.Deps{Registry: reg, Tokenizers: toks, Logger: log})
	if err != nil {
		return usageError("%v", err)
	}
	if err := rt.Start(ctx); err != nil {
		return cli.Exit(err.Error(), exitFailure)
	}
	<-ctx.Done()
	log.Info("shutting down; draining in-flight requests", "timeout", cfg.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := rt.Shutdown(sctx); err != nil {
		return cli.Exit(err.Error(), exitFailure)
	}
	return nil
}

// config is the router's config as the flags set it, with the repeatable
// lists flattened.
func (s *serveSettings) config() router.Config {
	cfg := s.Config
	cfg.Health.Endpoints = splitList(cfg.Health.Endpoints)
	cfg.Health.DiscoverDNS = splitList(cfg.Health.DiscoverDNS)
	cfg.Events.EventsListen = splitList(cfg.Events.EventsListen)
	cfg.Peers.Peers = splitList(cfg.Peers.Peers)
	return cfg
}

// loadTokenizers builds the registry of the --tokenizer entries; an entry
// that names no mode takes --tokenization. The hub is configured from the
// environment (hub.ConfigFromEnv) only when an entry needs it. Errors echo
// the entry as typed.
func loadTokenizers(ctx context.Context, texts []string, mode tokenize.Mode, reg prometheus.Registerer, log *slog.Logger) (*tokenize.Registry, error) {
	specs := make([]tokenize.Spec, 0, len(texts))
	var hubFor string
	for _, text := range texts {
		spec, err := tokenize.ParseSpec(text)
		if err != nil {
			return nil, usageError("--tokenizer %q: %v", text, err)
		}
		if !spec.HasMode {
			spec.Mode = mode
		}
		if spec.Hub != nil && spec.Mode != tokenize.ModeRemote && hubFor == "" {
			hubFor = text
		}
		specs = append(specs, spec)
	}
	opts := tokenize.Options{Registerer: reg, Logger: log}
	if hubFor != "" {
		hcfg, err := hub.ConfigFromEnv(os.Getenv)
		if err != nil {
			return nil, usageError("--tokenizer %q: %v", hubFor, err)
		}
		hcfg.Logger = log
		hcfg.UserAgent = "prefixrouter/" + version
		opts.Hub = hub.New(hcfg)
	}
	toks := tokenize.NewRegistry(opts)
	for _, spec := range specs {
		if _, err := toks.Load(ctx, spec); err != nil {
			toks.Close()
			return nil, usageError("--tokenizer %q: %v", spec.Text, err)
		}
	}
	return toks, nil
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

func newLogger(level, format string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, usageError("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, usageError("--log-format %q: want text or json", format)
}
