package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/urfave/cli/v3"

	"github.com/prefixrouter/prefixrouter/bench/sim"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
)

func simCommand() *cli.Command {
	return &cli.Command{
		Name:  "sim",
		Usage: "run simulated vLLM pods (OpenAI API, metrics, KV events on ZMQ)",
		Description: "Starts N simulated vLLM pods and prints one line per pod: the --endpoint value\n" +
			"`prefixrouter serve` takes. Pod i serves HTTP on the --listen port + i; with D data-parallel\n" +
			"ranks, rank r of pod i publishes KV events on --events-port + 2·D·i + r and answers replay\n" +
			"on --events-port + 2·D·i + D + r. Port 0 lets the OS choose. Runs until interrupted.",
		OnUsageError: onUsageError,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "pods", Value: 1, Usage: "number of pods", Sources: envVar("pods")},
			&cli.StringFlag{Name: "profile", Value: sim.DefaultProfile, Usage: "hardware profile: " + strings.Join(sim.ProfileNames(), ", "), Sources: envVar("profile")},
			&cli.StringFlag{Name: "model", Usage: "served model name (default: the profile's)", Sources: envVar("model")},
			&cli.StringSliceFlag{Name: "lora", Usage: "LoRA adapter name served as a model (repeatable)", Sources: envVar("lora")},
			&cli.StringFlag{Name: "tokenizer", Value: "bytes", Usage: "\"bytes\" (built-in) or a model directory / tokenizer.json", Sources: envVar("tokenizer")},
			&cli.StringFlag{Name: "hash-algo", Value: "sha256", Usage: "prefix-caching hash algorithm: " + strings.Join(kvindex.HashAlgoNames(), ", "), Sources: envVar("hash-algo")},
			&cli.StringFlag{Name: "hash-seed", Value: "0", Usage: "the pods' PYTHONHASHSEED, or \"random\" for PYTHONHASHSEED unset (32 random root bytes per engine process, new at every restart)", Sources: envVar("hash-seed")},
			&cli.StringFlag{Name: "kv-spec", Value: sim.KVSpecFullAttention, Usage: "KV-cache layout reported in events: " + strings.Join(sim.KVSpecNames(), ", ") + " (hybrid: a full-attention group and a sliding-window group)", Sources: envVar("kv-spec")},
			&cli.IntFlag{Name: "sliding-window", Value: 1024, Usage: "sliding window in tokens of the hybrid spec's second group", Sources: envVar("sliding-window")},
			&cli.IntFlag{Name: "cpu-offload-blocks", Usage: "CPU offloading tier of this many blocks per rank (0: none)", Sources: envVar("cpu-offload-blocks")},
			&cli.DurationFlag{Name: "cpu-load-per-block", Value: sim.DefaultCPULoadPerBlock, Usage: "time to load one block from the CPU tier instead of recomputing it (model time)", Sources: envVar("cpu-load-per-block")},
			&cli.IntFlag{Name: "block-size", Usage: "tokens per KV block (default: the profile's)", Sources: envVar("block-size")},
			&cli.IntFlag{Name: "num-gpu-blocks", Usage: "KV-cache capacity in blocks (default: the profile's)", Sources: envVar("num-gpu-blocks")},
			&cli.IntFlag{Name: "dp", Value: 1, Usage: "data-parallel ranks per pod", Sources: envVar("dp")},
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:18000", Usage: "HOST:PORT of the first pod's HTTP server", Sources: envVar("listen")},
			&cli.IntFlag{Name: "events-port", Value: 15557, Usage: "first pod's KV-event PUB port", Sources: envVar("events-port")},
			&cli.StringFlag{Name: "topic", Usage: "KV-event topic frame (vLLM's default is empty)", Sources: envVar("topic")},
			&cli.StringFlag{Name: "event-encoding", Value: "map", Usage: "map (vLLM >= 0.26) or array (older vLLM)", Sources: envVar("event-encoding")},
			&cli.BoolFlag{Name: "legacy-replay", Usage: "replay framing before vLLM PR #45177 (no topic frame)", Sources: envVar("legacy-replay")},
			&cli.IntFlag{Name: "replay-buffer", Value: 10000, Usage: "event batches kept for replay", Sources: envVar("replay-buffer")},
			&cli.FloatFlag{Name: "time-scale", Value: 1, Usage: "model seconds per wall second", Sources: envVar("time-scale")},
			&cli.DurationFlag{Name: "event-delay", Usage: "fault: hold every event batch back (model time)", Sources: envVar("event-delay")},
			&cli.DurationFlag{Name: "event-jitter", Usage: "fault: extra random event delay up to this (model time)", Sources: envVar("event-jitter")},
			&cli.FloatFlag{Name: "drop-events", Usage: "fault: probability an event batch is not sent", Sources: envVar("drop-events")},
			&cli.FloatFlag{Name: "fail-prefill", Usage: "fault: probability a request fails during prefill", Sources: envVar("fail-prefill")},
			&cli.FloatFlag{Name: "slow", Usage: "fault: multiply step times by this factor", Sources: envVar("slow")},
			&cli.DurationFlag{Name: "restart-downtime", Usage: "how long a restarting pod answers 503 (model time)", Sources: envVar("restart-downtime")},
			&cli.IntFlag{Name: "default-max-tokens", Value: 16, Usage: "max_tokens of requests that give none", Sources: envVar("default-max-tokens")},
			&cli.BoolFlag{Name: "disable-prompt-tokens-details", Usage: "leave usage.prompt_tokens_details null", Sources: envVar("disable-prompt-tokens-details")},
			&cli.Uint64Flag{Name: "seed", Usage: "seed of random faults", Sources: envVar("seed")},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error", Sources: envVar("log-level")},
		},
		Action: runSim,
	}
}

func runSim(ctx context.Context, cmd *cli.Command) error {
	cfg, err := simConfig(cmd)
	if err != nil {
		return err
	}
	fleet, err := sim.StartFleet(ctx, cfg)
	if err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	w := cmd.Root().Writer
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

// hashSeedRandom is the --hash-seed value that models PYTHONHASHSEED unset.
// (vLLM itself would hash a PYTHONHASHSEED of "random" as that string; the
// in-process Config keeps that meaning and has RandomHashSeed instead.)
const hashSeedRandom = "random"

func simConfig(cmd *cli.Command) (sim.Config, error) {
	var cfg sim.Config
	prof, err := sim.LookupProfile(cmd.String("profile"))
	if err != nil {
		return cfg, usageError("--profile: %v", err)
	}
	if cmd.IsSet("block-size") {
		prof.BlockSize = cmd.Int("block-size")
	}
	if cmd.IsSet("num-gpu-blocks") {
		prof.NumGPUBlocks = cmd.Int("num-gpu-blocks")
	}
	algo, err := kvindex.ParseHashAlgo(cmd.String("hash-algo"))
	if err != nil {
		return cfg, usageError("--hash-algo: %v", err)
	}
	enc, err := events.ParseEncoding(cmd.String("event-encoding"))
	if err != nil {
		return cfg, usageError("--event-encoding: %v", err)
	}
	host, portStr, err := net.SplitHostPort(cmd.String("listen"))
	if err != nil {
		return cfg, usageError("--listen %q: want HOST:PORT", cmd.String("listen"))
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return cfg, usageError("--listen %q: bad port", cmd.String("listen"))
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cmd.String("log-level"))); err != nil {
		return cfg, usageError("--log-level %q: want debug, info, warn or error", cmd.String("log-level"))
	}
	cfg = sim.Config{
		Pods:      cmd.Int("pods"),
		Profile:   prof,
		Model:     cmd.String("model"),
		LoRAs:     cmd.StringSlice("lora"),
		Tokenizer: cmd.String("tokenizer"),
		HashAlgo:  algo, HashSeed: cmd.String("hash-seed"),
		KVSpec:           cmd.String("kv-spec"),
		CPUOffloadBlocks: cmd.Int("cpu-offload-blocks"),
		CPULoadPerBlock:  cmd.Duration("cpu-load-per-block"),
		DP:               cmd.Int("dp"),
		Host:             host, HTTPPort: port, EventsPort: cmd.Int("events-port"),
		Topic: cmd.String("topic"), EventEncoding: enc, LegacyReplay: cmd.Bool("legacy-replay"),
		ReplayBuffer: cmd.Int("replay-buffer"),
		TimeScale:    cmd.Float("time-scale"),
		Faults: sim.Faults{
			EventDelay: cmd.Duration("event-delay"), EventJitter: cmd.Duration("event-jitter"),
			DropEvents: cmd.Float("drop-events"), FailPrefill: cmd.Float("fail-prefill"), Slow: cmd.Float("slow"),
		},
		RestartDowntime:            cmd.Duration("restart-downtime"),
		DefaultMaxTokens:           cmd.Int("default-max-tokens"),
		DisablePromptTokensDetails: cmd.Bool("disable-prompt-tokens-details"),
		Seed:                       cmd.Uint64("seed"),
		Logger:                     slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
	}
	switch {
	case cfg.Pods < 1:
		return cfg, usageError("--pods must be at least 1, got %d", cfg.Pods)
	case cfg.DP < 1:
		return cfg, usageError("--dp must be at least 1, got %d", cfg.DP)
	case cfg.TimeScale <= 0:
		return cfg, usageError("--time-scale must be positive, got %v", cfg.TimeScale)
	case cfg.HashSeed == "":
		return cfg, usageError("--hash-seed must not be empty (say \"random\" for PYTHONHASHSEED unset)")
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
		if cfg.SlidingWindow = cmd.Int("sliding-window"); cfg.SlidingWindow < 1 {
			return cfg, usageError("--sliding-window must be at least 1, got %d", cfg.SlidingWindow)
		}
	}
	if err := sim.CheckConfig(cfg); err != nil {
		return cfg, usageError("%v", err)
	}
	return cfg, nil
}
