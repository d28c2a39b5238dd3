package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/urfave/cli/v3"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/sim"
)

// simSettings is what the sim command's flags set: the fleet's config and
// what the command turns into it.
type simSettings struct {
	sim.Config
	ProfileName  string
	BlockSize    int // 0: the profile's
	NumGPUBlocks int // 0: the profile's
	Listen       string
	LogLevel     string
}

func defaultSimSettings() simSettings {
	return simSettings{
		Config: sim.Config{
			Pods: 1, Tokenizer: "bytes", HashAlgo: kvindex.AlgoSHA256, HashSeed: "0",
			KVSpec: sim.KVSpecFullAttention, SlidingWindow: 1024, CPULoadPerBlock: sim.DefaultCPULoadPerBlock,
			DP: 1, EventsPort: 15557, EventEncoding: events.EncodingMap, ReplayBuffer: 10000,
			TimeScale: 1, DefaultMaxTokens: 16,
		},
		ProfileName: sim.DefaultProfile, Listen: "127.0.0.1:18000", LogLevel: "info",
	}
}

func simCommand() *cli.Command {
	s := defaultSimSettings()
	t := newFlagTable("sim")
	t.rename("seed", "fault-seed")
	return t.command(&cli.Command{
		Name:  "sim",
		Usage: "run simulated vLLM pods (OpenAI API, metrics, KV events on ZMQ)",
		Description: "Starts N simulated vLLM pods and prints one line per pod: the --endpoint value\n" +
			"`prefixrouter serve` takes. Pod i serves HTTP on the --listen port + i; with D data-parallel\n" +
			"ranks, rank r of pod i publishes KV events on --events-port + 2·D·i + r and answers replay\n" +
			"on --events-port + 2·D·i + D + r. Port 0 lets the OS choose. With --events-connect the\n" +
			"publishers connect to a collector instead, each pod under the topic kv@HOST:PORT@MODEL.\n" +
			"Runs until interrupted.\n" +
			"Every flag has an environment variable PREFIXROUTER_SIM_<FLAG> (dashes as underscores).",
		Flags:  s.flags(t),
		Action: func(ctx context.Context, cmd *cli.Command) error { return runSim(ctx, cmd.Root().Writer, &s) },
	})
}

// flags is the sim command's flag table, bound to s.
func (s *simSettings) flags(t *flagTable) []cli.Flag {
	pods := t.group("Pods")
	keys := t.group("Block keys and KV cache")
	kvEvents := t.group("KV events")
	faults := t.group("Faults")
	return []cli.Flag{
		pods.int("pods", "number of pods", &s.Pods),
		choice(pods, "profile", "hardware profile: "+strings.Join(sim.ProfileNames(), ", "), &s.ProfileName, identity, checkedBy(sim.LookupProfile)),
		defaultText(pods.str("model", "served model name", &s.Model), "the profile's"),
		pods.list("lora", "LoRA adapter name served as a model (repeatable)", &s.LoRAs),
		pods.str("tokenizer", "\"bytes\" (built-in) or a model directory / tokenizer.json", &s.Tokenizer),
		pods.int("dp", "data-parallel ranks per pod", &s.DP),
		defaultText(pods.int("prefill-pods", "prefill/decode disaggregation: announce the first N pods with role=prefill, the rest with role=decode (every pod serves both, as vLLM with a kv_both NixlConnector)", &s.PrefillPods), "0, no roles"),
		defaultText(pods.dur("kv-transfer-per-block", "time a decode pod takes to pull one KV block from a prefill pod instead of computing it (model time)", &s.KVTransferPerBlock), "block size × 5.243µs (8B model, ~25 GB/s RDMA)"),
		pods.str("listen", "HOST:PORT of the first pod's HTTP server", &s.Listen),
		pods.int("events-port", "first pod's KV-event PUB port", &s.EventsPort),
		pods.float("time-scale", "model seconds per wall second", &s.TimeScale),
		pods.int("default-max-tokens", "max_tokens of requests that give none", &s.DefaultMaxTokens),
		defaultText(pods.dur("stream-interval", "least model time between two chunks of a stream after its first (coalesces later tokens)", &s.StreamInterval), "0, every step"),
		pods.bool("disable-prompt-tokens-details", "leave usage.prompt_tokens_details null", &s.DisablePromptTokensDetails),
		defaultText(pods.str("api-key", "as vLLM's --api-key: every path under /v1 wants Authorization: Bearer KEY (401 otherwise); /health, /metrics and /tokenize stay open", &s.APIKey), "none, open"),
		choice(pods, "log-level", "debug, info, warn or error", &s.LogLevel, identity, parseLogLevel),

		choice(keys, "hash-algo", "the pods' --prefix-caching-hash-algo: "+strings.Join(kvindex.HashAlgoNames(), ", "), &s.HashAlgo, kvindex.HashAlgo.String, kvindex.ParseHashAlgo),
		keys.str("hash-seed", "the pods' PYTHONHASHSEED, or \"random\" for PYTHONHASHSEED unset (32 random root bytes per engine process, new at every restart)", &s.HashSeed),
		defaultText(keys.int("block-size", "tokens per KV block", &s.BlockSize), "the profile's"),
		defaultText(keys.int("num-gpu-blocks", "KV-cache capacity in blocks", &s.NumGPUBlocks), "the profile's"),
		choice(keys, "kv-spec", "KV-cache layout reported in events: "+strings.Join(sim.KVSpecNames(), ", ")+" (hybrid: a full-attention group and a sliding-window group)", &s.KVSpec, identity, oneOf(sim.KVSpecNames()...)),
		keys.int("sliding-window", "sliding window in tokens of the hybrid spec's second group", &s.SlidingWindow),
		defaultText(keys.int("cpu-offload-blocks", "CPU offloading tier of this many blocks per rank", &s.CPUOffloadBlocks), "0, none"),
		keys.dur("cpu-load-per-block", "time to load one block from the CPU tier instead of recomputing it (model time)", &s.CPULoadPerBlock),

		defaultText(kvEvents.str("topic", "KV-event topic frame (vLLM's is empty unless configured)", &s.Topic), "empty; kv@HOST:PORT@MODEL with --events-connect"),
		kvEvents.str("events-connect", "tcp://HOST:PORT of a collector (serve --events-listen) the pods' publishers connect to instead of binding; rank r connects to PORT + r", &s.EventsConnect),
		choice(kvEvents, "event-encoding", "map (vLLM >= 0.26) or array (older vLLM)", &s.EventEncoding, encodingName, events.ParseEncoding),
		kvEvents.bool("legacy-replay", "replay framing before vLLM PR #45177 (no topic frame)", &s.LegacyReplay),
		kvEvents.int("replay-buffer", "event batches kept for replay", &s.ReplayBuffer),

		defaultText(faults.dur("event-delay", "hold every event batch back (model time)", &s.Faults.EventDelay), "0, none"),
		defaultText(faults.dur("event-jitter", "extra random event delay up to this (model time)", &s.Faults.EventJitter), "0, none"),
		faults.float("drop-events", "probability an event batch is not sent", &s.Faults.DropEvents),
		faults.float("fail-prefill", "probability a request fails during prefill", &s.Faults.FailPrefill),
		defaultText(faults.float("slow", "multiply step times by this factor", &s.Faults.Slow), "0, none"),
		defaultText(faults.dur("restart-downtime", "how long a restarting pod answers 503 (model time)", &s.RestartDowntime), "0, none"),
		faults.uint64("fault-seed", "seed of the random faults (drops, failures, jitter)", &s.Seed),
	}
}

// checkedBy makes a choice's parse from a lookup that must succeed.
func checkedBy[T any](lookup func(string) (T, error)) func(string) (string, error) {
	return func(v string) (string, error) {
		if _, err := lookup(v); err != nil {
			return "", err
		}
		return v, nil
	}
}

func encodingName(e events.Encoding) string {
	if e == events.EncodingArray {
		return "array"
	}
	return "map"
}

func runSim(ctx context.Context, w io.Writer, s *simSettings) error {
	cfg, err := s.config()
	if err != nil {
		return err
	}
	fleet, err := sim.StartFleet(ctx, cfg)
	if err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	for _, ep := range fleet.Endpoints() {
		if _, err := fmt.Fprintln(w, ep); err != nil {
			fleet.Close()
			return err
		}
	}
	if f, ok := w.(*os.File); ok {
		_ = f.Sync()
	}
	<-ctx.Done()
	cfg.Logger.Info("shutting down", "pods", len(fleet.Pods))
	if err := fleet.Close(); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	return nil
}

// config is the fleet's config as the flags set it, checked.
func (s *simSettings) config() (sim.Config, error) {
	cfg := s.Config
	prof, err := sim.LookupProfile(s.ProfileName)
	if err != nil {
		return cfg, usageError("--profile: %v", err)
	}
	if s.BlockSize != 0 {
		prof.BlockSize = s.BlockSize
	}
	if s.NumGPUBlocks != 0 {
		prof.NumGPUBlocks = s.NumGPUBlocks
	}
	cfg.Profile = prof
	host, portStr, err := net.SplitHostPort(s.Listen)
	if err != nil {
		return cfg, usageError("--listen %q: want HOST:PORT", s.Listen)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return cfg, usageError("--listen %q: bad port", s.Listen)
	}
	cfg.Host, cfg.HTTPPort = host, port
	var level slog.Level
	if err := level.UnmarshalText([]byte(s.LogLevel)); err != nil {
		return cfg, usageError("--log-level %q: want debug, info, warn or error", s.LogLevel)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	switch {
	case cfg.Pods < 1:
		return cfg, usageError("--pods must be at least 1, got %d", cfg.Pods)
	case cfg.DP < 1:
		return cfg, usageError("--dp must be at least 1, got %d", cfg.DP)
	case cfg.PrefillPods < 0 || cfg.PrefillPods >= cfg.Pods:
		return cfg, usageError("--prefill-pods must be 0 up to --pods - 1 = %d (leaving a decode pod), got %d", cfg.Pods-1, cfg.PrefillPods)
	case cfg.KVTransferPerBlock < 0:
		return cfg, usageError("--kv-transfer-per-block must not be negative, got %v", cfg.KVTransferPerBlock)
	case cfg.TimeScale <= 0:
		return cfg, usageError("--time-scale must be positive, got %v", cfg.TimeScale)
	case cfg.HashSeed == "":
		return cfg, usageError("--hash-seed must not be empty (say \"random\" for PYTHONHASHSEED unset)")
	case s.BlockSize < 0:
		return cfg, usageError("--block-size must not be negative, got %d", s.BlockSize)
	case s.NumGPUBlocks < 0:
		return cfg, usageError("--num-gpu-blocks must not be negative, got %d", s.NumGPUBlocks)
	case cfg.CPUOffloadBlocks < 0:
		return cfg, usageError("--cpu-offload-blocks must not be negative, got %d", cfg.CPUOffloadBlocks)
	case cfg.CPULoadPerBlock <= 0:
		return cfg, usageError("--cpu-load-per-block must be positive, got %v", cfg.CPULoadPerBlock)
	case cfg.ReplayBuffer < 1:
		return cfg, usageError("--replay-buffer must be at least 1, got %d", cfg.ReplayBuffer)
	}
	if cfg.HashSeed == hashSeedRandom {
		cfg.HashSeed, cfg.RandomHashSeed = "", true
	}
	if cfg.KVSpec == sim.KVSpecHybrid {
		if cfg.SlidingWindow < 1 {
			return cfg, usageError("--sliding-window must be at least 1, got %d", cfg.SlidingWindow)
		}
	} else {
		cfg.SlidingWindow = 0 // only the hybrid spec has a sliding-window group
	}
	if err := sim.CheckConfig(cfg); err != nil {
		return cfg, usageError("%v", err)
	}
	return cfg, nil
}
