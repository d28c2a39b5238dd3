package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v3"
	"golang.org/x/term"

	"github.com/prefixrouter/prefixrouter/bench"
	"github.com/prefixrouter/prefixrouter/bench/des"
	"github.com/prefixrouter/prefixrouter/bench/report"
	"github.com/prefixrouter/prefixrouter/bench/workload"
	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/flow"
	"github.com/prefixrouter/prefixrouter/sim"
	"github.com/prefixrouter/prefixrouter/speculative"
)

// benchSettings is what the bench command's flags set. Zero workload and
// fleet fields take the preset's value.
type benchSettings struct {
	Workload, Policies string
	Engine, Routers    string
	Delivery           des.Delivery
	SharePredictions   bool
	Quick              bool
	Seed               uint64
	Out                string
	CPUProfile         string
	MemProfile         string
	Timeout, Drain     time.Duration
	LogLevel           string

	Pods, KVBlocks int
	Profile        string
	TimeScale      float64
	StreamInterval time.Duration
	EventDelay     time.Duration
	PrefillPods    int

	SpecTTL  time.Duration
	Holdback float64
	Settle   time.Duration
	Cost     brain.CostConfig

	TargetURL, Model string

	FlowControl    string
	SLOTTFT        []string
	TenantShares   []string
	DispatchBudget time.Duration

	Text, Rates, Arrival string
	Spec                 workload.Spec
}

func defaultBenchSettings() benchSettings {
	return benchSettings{Workload: workload.KindSharedPrefix, Policies: strings.Join(bench.PolicyNames(), ","),
		Delivery: des.DefaultDelivery(),
		Seed:     1, Timeout: 30 * time.Minute, LogLevel: "error",
		Holdback: speculative.DefaultConfig().Holdback, Cost: brain.DefaultCostConfig(), Settle: 15 * time.Second}
}

func benchCommand(stderr io.Writer) *cli.Command {
	s := defaultBenchSettings()
	t := newFlagTable("bench")
	return t.command(&cli.Command{
		Name:  "bench",
		Usage: "compare routing policies on one workload over simulated pods (or any OpenAI endpoint), print a table, write a report",
		Description: "Runs the workload under each policy, one after another, each on a fresh fleet of simulated\n" +
			"vLLM pods on loopback with the router in front (the oracle routes on the pods' true state\n" +
			"instead). --target-url drives any OpenAI-compatible endpoint instead. Times are model seconds.\n" +
			"--out DIR writes results.json and report.html. Every flag has an environment variable\n" +
			"PREFIXROUTER_BENCH_<FLAG> (dashes as underscores).",
		Flags: s.flags(t),
		Action: func(ctx context.Context, cmd *cli.Command) error {
			return runBench(ctx, cmd.Root().Writer, stderr, &s, cmd.IsSet("policies"), commandLine(cmd))
		},
	})
}

// flags is the bench command's flag table, bound to s.
func (s *benchSettings) flags(t *flagTable) []cli.Flag {
	run := t.group("Run")
	fleet := t.group("Simulated fleet (live engine)")
	dg := t.group("Discrete-event engine (model time)")
	spec := t.group("Speculative policy")
	cost := t.group("Cost model (the routers' precise and speculative policies, as serve's flags)")
	fc := t.group("Flow control (des engine)")
	target := t.group("Target endpoint")
	wl := t.group("Workload (0: the preset's)")
	preset := "the preset's"
	return []cli.Flag{
		run.checked("workload", "what to send: "+strings.Join(workload.Kinds(), ", "), &s.Workload,
			func(v string) error { _, _, err := workload.ParseKind(v); return err }),
		run.checked("policies", "policies to compare, comma-separated, in order: "+strings.Join(bench.PolicyNames(), ", "), &s.Policies,
			func(v string) error { _, err := bench.ParsePolicies(v); return err }),
		defaultText(run.checked("engine", "live (simulated pods on loopback, real HTTP and ZeroMQ) or des (the same pods and routing code in virtual time, one goroutine: fleets and loads beyond this machine)", &s.Engine,
			func(v string) error { _, err := bench.ParseEngine(v); return err }), "the preset's: des for llmd-ladder, shared-prefix-256, overload and the full shared-prefix and faults, else live"),
		defaultText(run.checked("routers", "des engine: router replicas, each with its own index, predictions and load ledger; clients spread over them per connection; a list (1,2,4) runs each policy with each count", &s.Routers,
			func(v string) error {
				if v == "" {
					return nil
				}
				_, err := bench.ParseRouters(v)
				return err
			}), "1"),
		run.bool("quick", "the workload's quick preset: under a minute for every policy on a 2-core machine", &s.Quick),
		run.uint64("seed", "seed of the workload (prompts, arrivals) and of the oracle's ties", &s.Seed),
		defaultText(run.str("out", "directory for results.json and report.html", &s.Out), "none"),
		defaultText(run.str("cpu-profile", "write a Go CPU profile of the whole run to this file (go tool pprof reads it)", &s.CPUProfile), "none"),
		defaultText(run.str("mem-profile", "write a Go heap profile to this file at the run's largest live heap, sampled every second, and at its end if larger (go tool pprof reads it)", &s.MemProfile), "none"),
		run.dur("timeout", "bound on the whole run", &s.Timeout),
		defaultText(run.dur("drain", "once the last request is sent, how long (wall time) the ones still running may take before they are cancelled and counted as unfinished", &s.Drain), preset),
		choice(run, "log-level", "the pods' and the router's log on stderr: debug, info, warn or error", &s.LogLevel, identity, parseLogLevel),

		defaultText(fleet.int("pods", "simulated pods", &s.Pods), preset),
		defaultText(choice(fleet, "profile", "hardware profile: "+strings.Join(sim.ProfileNames(), ", "), &s.Profile, identity,
			func(v string) (string, error) {
				if v == "" {
					return v, nil
				}
				return checkedBy(sim.LookupProfile)(v)
			}), preset),
		defaultText(fleet.int("kv-blocks", "KV-cache blocks per pod", &s.KVBlocks), "the preset's, else the profile's"),
		defaultText(fleet.float("time-scale", "model seconds per wall second", &s.TimeScale), preset),
		defaultText(fleet.dur("stream-interval", "least model time between two chunks of a stream after its first", &s.StreamInterval), preset),
		fleet.int("prefill-pods", "live engine: the first N pods compute prompts (role=prefill) and the others decode, vLLM's NIXL prefill/decode disaggregation; the router splits each request between them (0: every pod serves whole requests)", &s.PrefillPods),
		defaultText(fleet.dur("event-delay", "every pod holds each KV-event batch back this long (model time) before publishing it, as a batching publisher or a slow network does", &s.EventDelay), preset),

		dg.dur("request-delay", "from a client's send to its request's arrival at the pod: the HTTP hops and the router's own work", &s.Delivery.Request),
		dg.dur("request-jitter", "mean of an exponential extra request delay, drawn per request", &s.Delivery.RequestJitter),
		dg.dur("event-transport", "from a KV-event batch's publication to its arrival at a router", &s.Delivery.Transport),
		dg.dur("event-jitter", "up to this much more transport, drawn per batch and router (batches stay in order)", &s.Delivery.Jitter),
		dg.dur("event-apply", "a router's time to apply one batch: faster batches queue behind it (the subscriber's backlog)", &s.Delivery.ApplyPerBatch),
		dg.bool("share-predictions", "the router replicas share their predictions and in-flight work as serve's --peers do, each reaching the others --peer-delay later (with --routers above 1)", &s.SharePredictions),
		dg.dur("peer-delay", "from a router replica's prediction or change of in-flight work to its peers' seeing it (--share-predictions)", &s.Delivery.PeerDelay),

		choice(spec, "speculative-ttl", "lifetime of a predicted placement: auto (sized per pod from measured confirmation latency) or a duration in model time",
			&s.SpecTTL, speculative.FormatTTL, speculative.ParseTTL),
		spec.float("holdback", "share of conversations the speculative policy routes without predictions, to measure what they save (0 to 0.5; 0: off)", &s.Holdback),
		spec.dur("settle", "after the speculative policy's last answer, how long (wall time) to wait for its predictions to mature so that the confirmation rates cover the whole run", &s.Settle),

		cost.float("decode-weight", "cost of one running request, in prefill tokens", &s.Cost.DecodeWeight),
		cost.float("kv-threshold", "KV-cache usage above which the cost adds memory pressure", &s.Cost.KVThreshold),
		cost.float("kv-pressure", "weight of the memory-pressure term (prompts' worth at a full cache)", &s.Cost.KVPressure),
		cost.float("recompute-weight", "extra price of a prompt token a pod must compute (not cached there) once no pod has capacity to spare, in prefill tokens: work the requests queued behind it wait for (scaled down while some pod has spare capacity; 0: a token costs one)", &s.Cost.RecomputeWeight),
		cost.float("reuse-wait", "speculative: share of a prefix's prefill a request may wait for on the pod computing it rather than have an idle pod compute it again (0 to 1)", &s.Cost.ReuseWait),

		defaultText(fc.checked("flow-control", "on: the routers admit each request through flow control (a pod past --dispatch-budget takes no more; requests wait in the router's line by class and tenant, or are shed with a 429); off: every request dispatched at once; on,off runs each policy both ways (rows POLICY/fc-on, POLICY/fc-off)", &s.FlowControl,
			func(v string) error {
				if v == "" {
					return nil
				}
				_, err := bench.ParseFlowControl(v)
				return err
			}), "on (des engine; the live engine runs without)"),
		defaultText(fc.list("slo-ttft", "CLASS=DURATION, a priority class and its TTFT objective, highest first (repeatable); the requests' classes must be among them", &s.SLOTTFT),
			"the workload's classes, else interactive=2s, batch=1m"),
		defaultText(fc.list("tenant-share", "TENANT=WEIGHT, a tenant's weight in its class's fair share (repeatable; a tenant not named weighs 1)", &s.TenantShares), "every tenant 1"),
		defaultText(fc.dur("dispatch-budget", "queued prefill, in time at a pod's pace, past which it takes no more work and requests wait in the router", &s.DispatchBudget),
			"half the tightest objective"),

		defaultText(target.str("target-url", "drive this OpenAI-compatible endpoint (http://HOST:PORT) instead of simulated pods", &s.TargetURL), "none"),
		defaultText(target.str("model", "model to ask the target for", &s.Model), "the target's first in /v1/models"),

		defaultText(choice(wl, "text", "how prompts are made: bytes (one token per character, the simulated pods' model) or words (about one token per word for real tokenizers)", &s.Text, identity,
			func(v string) (string, error) {
				if v == "" {
					return v, nil
				}
				_, err := workload.ParseVocab(v)
				return v, err
			}), "bytes, words with --target-url"),
		defaultText(wl.checked("rates", "rate ladder: arrivals per model second, comma-separated", &s.Rates,
			func(v string) error {
				if v == "" {
					return nil
				}
				_, err := workload.ParseRates(v)
				return err
			}), preset),
		defaultText(wl.dur("stage-duration", "model time of each step of the ladder", &s.Spec.StageDuration), preset),
		defaultText(choice(wl, "arrival", "poisson or constant", &s.Arrival, identity,
			func(v string) (string, error) {
				if v == "" {
					return v, nil
				}
				a, err := workload.ParseArrival(v)
				return string(a), err
			}), preset),
		defaultText(wl.int("groups", "shared-prefix: groups sharing one system prompt", &s.Spec.Groups), "sized by --prefix-fill"),
		defaultText(wl.int("users", "shared-prefix: users per group, each with a question of their own", &s.Spec.Users), preset),
		defaultText(wl.float("prefix-fill", "shared-prefix: the groups' distinct prompts (each system prompt and every user's own question) as a fraction of the fleet's KV tokens", &s.Spec.PrefixFill), preset),
		defaultText(wl.int("system-tokens", "shared-prefix: system prompt; multi-turn: each conversation's opening context", &s.Spec.SystemTokens), preset),
		defaultText(wl.int("question-tokens", "shared-prefix: each user's question; multi-turn: each turn's message", &s.Spec.QuestionTokens), preset),
		defaultText(wl.int("output-tokens", "output tokens per request", &s.Spec.OutputTokens), preset),
		defaultText(wl.int("turns", "multi-turn: turns per conversation", &s.Spec.Turns), preset),
		defaultText(wl.dur("think-time", "multi-turn: mean model time between an answer and the next turn (exponential)", &s.Spec.Think), preset),
		defaultText(wl.int("input-tokens", "random: mean prompt length (uniform within ±50%)", &s.Spec.InputTokens), preset),
		defaultText(wl.int("siblings", "burst: requests per burst", &s.Spec.Siblings), preset),
		defaultText(wl.int("prefix-tokens", "burst: the prefix a burst's siblings share", &s.Spec.PrefixTokens), preset),
		defaultText(wl.int("suffix-tokens", "burst: each sibling's own suffix", &s.Spec.SuffixTokens), preset),
		defaultText(wl.dur("spread", "burst: model time within which a burst's siblings arrive", &s.Spec.Spread), preset),
		wl.bool("sequential", "burst: send a burst's siblings one after another, each --gap after the previous answer", &s.Spec.Sequential),
		defaultText(wl.dur("gap", "burst with --sequential: model time between an answer and the next sibling", &s.Spec.Gap), "0"),
		defaultText(wl.float("trace-speedup", "trace: divide the trace's timestamps by this", &s.Spec.TraceSpeedup), preset),
		defaultText(wl.int("trace-requests", "trace: replay the first N requests", &s.Spec.TraceRequests), "the preset's; 0 in the full preset: all"),
	}
}

// commandLine is the command with the flags that were set (on the command
// line or by their variables), for the results.
func commandLine(cmd *cli.Command) string {
	args := []string{"prefixrouter", cmd.Name}
	for _, f := range cmd.FlagNames() {
		if !cmd.IsSet(f) {
			continue
		}
		if v, ok := cmd.Value(f).(bool); ok {
			if v {
				args = append(args, "--"+f)
			}
			continue
		}
		args = append(args, "--"+f, fmt.Sprint(cmd.Value(f)))
	}
	return strings.Join(args, " ")
}

// options turns the settings into a run: the preset, the flags over it,
// the workload built for the fleet.
func (s *benchSettings) options(policiesSet bool) (bench.Options, error) {
	var o bench.Options
	kind, path, err := workload.ParseKind(s.Workload)
	if err != nil {
		return o, usageError("--workload: %v", err)
	}
	p := bench.LookupPreset(kind, s.Quick)
	spec := s.Spec
	spec.Kind, spec.TracePath, spec.Seed = kind, path, s.Seed
	if s.Rates != "" {
		if spec.Rates, err = workload.ParseRates(s.Rates); err != nil {
			return o, usageError("--rates: %v", err)
		}
	}
	spec.Arrival = workload.Arrival(s.Arrival)
	spec.Vocab = workload.Vocab(s.Text)
	if spec.Vocab == "" {
		spec.Vocab = workload.Bytes
		if s.TargetURL != "" {
			spec.Vocab = workload.Words
		}
	}
	spec.Fill(p.Spec)
	for name, v := range map[string]int{"pods": s.Pods, "kv-blocks": s.KVBlocks, "groups": spec.Groups, "users": spec.Users,
		"system-tokens": spec.SystemTokens, "question-tokens": spec.QuestionTokens, "output-tokens": spec.OutputTokens,
		"turns": spec.Turns, "input-tokens": spec.InputTokens, "siblings": spec.Siblings, "prefix-tokens": spec.PrefixTokens,
		"suffix-tokens": spec.SuffixTokens, "trace-requests": spec.TraceRequests} {
		if v < 0 {
			return o, usageError("--%s must not be negative, got %d", name, v)
		}
	}
	for name, v := range map[string]time.Duration{"drain": s.Drain, "stage-duration": spec.StageDuration, "think-time": spec.Think,
		"spread": spec.Spread, "stream-interval": s.StreamInterval, "event-delay": s.EventDelay, "gap": spec.Gap} {
		if v < 0 {
			return o, usageError("--%s must not be negative, got %v", name, v)
		}
	}
	switch {
	case s.Timeout <= 0:
		return o, usageError("--timeout must be positive, got %v", s.Timeout)
	case s.TimeScale < 0:
		return o, usageError("--time-scale must be positive, got %v", s.TimeScale)
	case spec.PrefixFill < 0:
		return o, usageError("--prefix-fill must be positive, got %v", spec.PrefixFill)
	case spec.TraceSpeedup < 0:
		return o, usageError("--trace-speedup must be positive, got %v", spec.TraceSpeedup)
	}
	o.Drain = p.Drain
	if s.Drain > 0 {
		o.Drain = s.Drain
	}
	o.Seed = s.Seed
	if s.Holdback < 0 || s.Holdback > speculative.MaxHoldback {
		return o, usageError("--holdback %v: want a fraction from 0 (off) to %v", s.Holdback, speculative.MaxHoldback)
	}
	if s.Settle < 0 {
		return o, usageError("--settle must not be negative, got %v", s.Settle)
	}
	if err := s.Cost.Validate(); err != nil {
		return o, usageError("%s", strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	holdback, cost := s.Holdback, s.Cost
	o.Speculative = bench.SpeculativeOptions{TTL: p.SpeculativeTTL, Holdback: &holdback}
	o.Cost = &cost
	if s.SpecTTL > 0 {
		o.Speculative.TTL = s.SpecTTL
	}
	o.Settle = s.Settle
	engine := s.Engine
	if engine == "" {
		engine = p.Engine
	}
	if o.Engine, err = bench.ParseEngine(engine); err != nil {
		return o, usageError("--engine: %v", err)
	}
	for name, v := range map[string]time.Duration{"request-delay": s.Delivery.Request, "request-jitter": s.Delivery.RequestJitter, "event-transport": s.Delivery.Transport,
		"event-jitter": s.Delivery.Jitter, "event-apply": s.Delivery.ApplyPerBatch, "peer-delay": s.Delivery.PeerDelay} {
		if v < 0 {
			return o, usageError("--%s must not be negative, got %v", name, v)
		}
	}
	o.Delivery = &s.Delivery
	if s.Routers != "" {
		if o.Engine != bench.EngineDES {
			return o, usageError("--routers: router replicas run on the des engine only (--engine des)")
		}
		if o.Routers, err = bench.ParseRouters(s.Routers); err != nil {
			return o, usageError("--routers: %v", err)
		}
	}
	if s.SharePredictions && o.Engine != bench.EngineDES {
		return o, usageError("--share-predictions: router replicas run on the des engine only (--engine des)")
	}
	o.SharePredictions = s.SharePredictions

	var lim workload.Limits
	if s.TargetURL != "" {
		if policiesSet {
			return o, usageError("--policies: with --target-url the one policy is whatever serves the URL")
		}
		if o.Engine == bench.EngineDES {
			return o, usageError("--engine des simulates the pods: it cannot run with --target-url")
		}
		if kind == workload.KindFaults {
			return o, usageError("--workload faults injects its faults into the simulated pods: it cannot run with --target-url")
		}
		if !strings.HasPrefix(s.TargetURL, "http://") && !strings.HasPrefix(s.TargetURL, "https://") {
			return o, usageError("--target-url %q: want http://HOST:PORT or https://…", s.TargetURL)
		}
		o.TargetURL, o.Model = s.TargetURL, s.Model
	} else {
		policies := s.Policies
		if kind == workload.KindPairedGap && !policiesSet {
			// The matrix compares what a decision counts on: the
			// policies that read the index.
			policies = "precise,speculative"
		}
		if o.Policies, err = bench.ParsePolicies(policies); err != nil {
			return o, usageError("--policies: %v", err)
		}
		if s.Model != "" {
			return o, usageError("--model: the simulated pods serve the profile's model; --model goes with --target-url")
		}
		cfg, err := s.fleet(p)
		if err != nil {
			return o, err
		}
		o.Fleet = cfg
		if cfg.PrefillPods > 0 {
			switch {
			case o.Engine == bench.EngineDES:
				return o, usageError("--prefill-pods: the des engine does not model prefill/decode disaggregation; give --engine live")
			case slices.Contains(o.Policies, bench.Oracle) && policiesSet:
				return o, usageError("--prefill-pods: the oracle routes whole requests to one pod; leave it out of --policies")
			case kind == workload.KindPairedGap || kind == workload.KindFaults:
				return o, usageError("--prefill-pods: the %s workload runs on pods that serve whole requests", kind)
			}
			o.Policies = slices.DeleteFunc(o.Policies, func(p string) bool { return p == bench.Oracle })
		}
		lim = workload.Limits{KVTokens: cfg.Pods * cfg.Profile.KVTokens(), MaxContext: min(cfg.Profile.MaxModelLen, cfg.Profile.KVTokens()),
			Capacity: bench.Capacity(cfg.Profile, cfg.Pods, spec.InputTokens, spec.OutputTokens)}
	}
	w, err := workload.Build(spec, lim)
	if err != nil {
		return o, usageError("%v", err)
	}
	if w.Requests() == 0 {
		return o, usageError("the workload has no requests: raise --rates or --stage-duration")
	}
	o.Workload = w
	if err := s.flowControl(&o); err != nil {
		return o, err
	}
	return o, nil
}

// flowControl sets the run's flow control: on and off arms, classes,
// shares and budget (des engine only: the live engine's router runs
// without).
func (s *benchSettings) flowControl(o *bench.Options) error {
	if o.Engine != bench.EngineDES || o.TargetURL != "" {
		switch {
		case strings.Contains(s.FlowControl, "on"):
			return usageError("--flow-control: the live engine's router runs without flow control; give --engine des")
		case len(s.SLOTTFT) > 0 || len(s.TenantShares) > 0 || s.DispatchBudget != 0:
			return usageError("--slo-ttft, --tenant-share and --dispatch-budget are flow control's, which runs on the des engine (--engine des)")
		}
		return nil
	}
	arms := []bool{true}
	if s.FlowControl != "" {
		var err error
		if arms, err = bench.ParseFlowControl(s.FlowControl); err != nil {
			return usageError("--flow-control: %v", err)
		}
	}
	var classes []flow.Class
	for _, v := range s.SLOTTFT {
		c, err := flow.ParseClass(v)
		if err != nil {
			return usageError("%v", err)
		}
		classes = append(classes, c)
	}
	var shares map[string]float64
	for _, v := range s.TenantShares {
		name, w, err := flow.ParseShare(v)
		if err != nil {
			return usageError("%v", err)
		}
		if shares == nil {
			shares = map[string]float64{}
		}
		shares[name] = w
	}
	line, err := bench.FlowConfig(o.Workload, classes, shares)
	if err != nil {
		return usageError("%s", strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	o.Admission = brain.AdmissionConfig{Line: line, Budget: s.DispatchBudget}
	if err := o.Admission.Validate(); err != nil {
		return usageError("%s", strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	o.FlowControl = arms
	return nil
}

// fleet is the simulated pods' configuration: the preset's, changed by the
// flags.
func (s *benchSettings) fleet(p bench.Preset) (sim.Config, error) {
	name := p.Profile
	if s.Profile != "" {
		name = s.Profile
	}
	prof, err := sim.LookupProfile(name)
	if err != nil {
		return sim.Config{}, usageError("--profile: %v", err)
	}
	if p.KVBlocks > 0 {
		prof.NumGPUBlocks = p.KVBlocks
	}
	if s.KVBlocks > 0 {
		prof.NumGPUBlocks = s.KVBlocks
	}
	cfg := sim.Config{Pods: p.Pods, Profile: prof, Tokenizer: "bytes", TimeScale: p.TimeScale, StreamInterval: p.StreamInterval,
		Host: "127.0.0.1"}
	if s.Pods > 0 {
		cfg.Pods = s.Pods
	}
	if s.TimeScale > 0 {
		cfg.TimeScale = s.TimeScale
	}
	if s.StreamInterval > 0 {
		cfg.StreamInterval = s.StreamInterval
	}
	cfg.Faults.EventDelay = p.EventDelay
	if s.EventDelay > 0 {
		cfg.Faults.EventDelay = s.EventDelay
	}
	cfg.PrefillPods = s.PrefillPods
	if err := sim.CheckConfig(cfg); err != nil {
		return cfg, usageError("%v", err)
	}
	cfg.Model = prof.Model
	return cfg, nil
}

func runBench(ctx context.Context, stdout, stderr io.Writer, s *benchSettings, policiesSet bool, command string) error {
	o, err := s.options(policiesSet)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(s.LogLevel)); err != nil {
		return usageError("--log-level %q: want debug, info, warn or error", s.LogLevel)
	}
	o.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	o.Progress, o.Command = stderr, command
	if f, ok := stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		o.Terminal = true
	}
	if o.TargetURL != "" && o.Model == "" {
		if o.Model, err = bench.FirstModel(ctx, o.TargetURL); err != nil {
			return cli.Exit(fmt.Sprintf("bench: %v (give --model)", err), exitFailure)
		}
	}
	if s.CPUProfile != "" {
		stop, err := startCPUProfile(s.CPUProfile)
		if err != nil {
			return cli.Exit(fmt.Sprintf("bench: --cpu-profile: %v", err), exitFailure)
		}
		defer stop()
	}
	if s.MemProfile != "" {
		stop, err := startHeapProfile(s.MemProfile, time.Second)
		if err != nil {
			return cli.Exit(fmt.Sprintf("bench: --mem-profile: %v", err), exitFailure)
		}
		defer func() {
			if err := stop(); err != nil {
				fmt.Fprintf(stderr, "bench: --mem-profile: %v\n", err)
			}
		}()
	}
	ctx, cancel := context.WithTimeout(ctx, s.Timeout)
	defer cancel()
	fmt.Fprintln(stdout, describeRun(&o))
	res, runErr := bench.Run(ctx, o)
	if runErr != nil && (res == nil || len(res.Order) == 0) {
		return cli.Exit(fmt.Sprintf("bench: %v", runErr), exitFailure)
	}
	if runErr != nil {
		// Keep what the finished policies measured.
		res.Notes = append(res.Notes, fmt.Sprintf("the run stopped before its other policies: %v", runErr))
	}
	if err := writeBenchResults(stdout, res, s.Out); err != nil {
		return err
	}
	if runErr != nil {
		return cli.Exit(fmt.Sprintf("bench: %v", runErr), exitFailure)
	}
	return nil
}

// writeBenchResults prints the results' tables and notes and, with an out
// directory, writes results.json and the report there.
func writeBenchResults(stdout io.Writer, res *report.Results, out string) error {
	if err := report.Table(stdout, res); err != nil {
		return err
	}
	if err := report.PairsTable(stdout, res); err != nil {
		return err
	}
	if err := report.FaultsTable(stdout, res); err != nil {
		return err
	}
	for _, n := range res.Notes {
		fmt.Fprintf(stdout, "note: %s\n", n)
	}
	if out != "" {
		path, err := res.Write(out)
		if err != nil {
			return cli.Exit(fmt.Sprintf("bench: %v", err), exitFailure)
		}
		fmt.Fprintf(stdout, "report: %s\n", path)
	}
	return nil
}

// describeRun is the line printed before the run starts.
func describeRun(o *bench.Options) string {
	w := o.Workload
	if o.TargetURL != "" {
		return fmt.Sprintf("bench: %s, %d requests, against %s (model %s)", w.Name, w.Requests(), o.TargetURL, o.Model)
	}
	f := o.Fleet
	if o.Engine == bench.EngineDES {
		fc := "off"
		if len(o.FlowControl) > 0 {
			var arms []string
			for _, on := range o.FlowControl {
				arms = append(arms, map[bool]string{true: "on", false: "off"}[on])
			}
			fc = strings.Join(arms, " and ")
		}
		return fmt.Sprintf("bench: %s, %d requests, on %d simulated pods (%s, %d KV tokens each) in virtual time (des engine), policies %s, flow control %s",
			w.Name, w.Requests(), f.Pods, f.Profile.Name, f.Profile.KVTokens(), strings.Join(o.Policies, ", "), fc)
	}
	return fmt.Sprintf("bench: %s, %d requests, on %d simulated pods (%s, %d KV tokens each), time scale %g, policies %s",
		w.Name, w.Requests(), f.Pods, f.Profile.Name, f.Profile.KVTokens(), f.TimeScale, strings.Join(o.Policies, ", "))
}

// startCPUProfile profiles the process into path until the returned
// function runs.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// startHeapProfile samples the live heap every interval until the returned
// function runs, and writes a heap profile to path whenever the sample is
// the largest yet (and once more at the end if it is), so that the file
// shows what held the memory at the run's peak rather than at its end.
func startHeapProfile(path string, interval time.Duration) (stop func() error, err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	hp := &heapPeak{write: func() error { return writeHeapProfile(f) }}
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				hp.observe(liveHeap())
			}
		}
	}()
	return func() error {
		close(done)
		<-finished
		runtime.GC()
		hp.observe(liveHeap())
		if err := f.Close(); err != nil && hp.err == nil {
			hp.err = err
		}
		return hp.err
	}, nil
}

// heapPeak writes a profile whenever it observes a live heap larger than
// any before; after a failed write it stops.
type heapPeak struct {
	peak  uint64
	write func() error
	err   error
}

func (h *heapPeak) observe(live uint64) {
	if live <= h.peak || h.err != nil {
		return
	}
	h.peak = live
	h.err = h.write()
}

// liveHeap is the heap the last garbage collection found live, the figure
// a heap profile describes.
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// writeHeapProfile replaces f's content with a heap profile.
func writeHeapProfile(f *os.File) error {
	if err := f.Truncate(0); err != nil {
		return fmt.Errorf("truncate: %w", err)
	}
	if _, err := f.Seek(0, 0); err != nil {
		return fmt.Errorf("seek: %w", err)
	}
	if err := pprof.WriteHeapProfile(f); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}
