package bench

import (
	"time"

	"github.com/prefixrouter/prefixrouter/bench/workload"
)

// Preset is a workload's defaults and the simulated fleet they are sized
// for. Every field can be changed by its flag.
type Preset struct {
	Spec workload.Spec
	// Pods, Profile and KVBlocks (0: the profile's) make the fleet;
	// TimeScale and StreamInterval are how it runs on this machine.
	Pods           int
	Profile        string
	KVBlocks       int
	TimeScale      float64
	StreamInterval time.Duration
	// Drain bounds (wall time) the requests still running once the last
	// session has started.
	Drain time.Duration
	// EventDelay holds every pod's KV-event batches back (model time).
	EventDelay time.Duration
	// SpeculativeTTL fixes the speculative policy's TTL (model time; 0:
	// auto).
	SpeculativeTTL time.Duration
	// Engine is the engine the preset is sized for ("": live).
	Engine string
}

func init() {
	// The faults workload is the shared-prefix preset's requests: the
	// faults are the only difference.
	presets[workload.KindFaults] = presets[workload.KindSharedPrefix]
	// The published benchmarks' quick presets are their shapes and
	// fleets on short ladders.
	for kind, stage := range map[string]time.Duration{workload.KindLLMDLadder: 10 * time.Second, workload.KindSharedPrefix256: 5 * time.Second} {
		q := presets[kind]
		q.Spec.StageDuration = stage
		quickPresets[kind] = q
	}
}

// LookupPreset returns the preset of a workload kind, the quick one
// (under a minute for every policy on a 2-core machine) or the full one.
func LookupPreset(kind string, quick bool) Preset {
	p := presets[kind]
	if quick {
		p = quickPresets[kind]
	}
	p.Spec.Kind = kind
	return p
}

// The full presets model the pods' hardware at its own scale: the
// h100x2-32b and h100-8b profiles (sim/README.md, "Hardware profiles"),
// whose KV capacity and prefill peak are llm-d's.
var presets = map[string]Preset{
	// llm-d's shape and regime on half its fleet: 6,000-token system
	// prompts shared by 5 users per group, 1,200-token questions, 1,000
	// output tokens; groups sized so that their distinct prompts take 73%
	// of four TP2 H100 pods' KV cache (75 groups, as llm-d's 150 on
	// eight); Poisson arrivals on llm-d's ladder per pod (3 → 60 per
	// second on eight pods: 1.5 → 30 on four), 4 minutes each (28 minutes
	// of model time, about 25,600 requests). Sized for the des engine.
	workload.KindSharedPrefix: {
		Spec: workload.Spec{Users: 5, SystemTokens: 6000, QuestionTokens: 1200, OutputTokens: 1000, PrefixFill: 0.73,
			Rates: []float64{1.5, 5, 10, 15, 20, 25, 30}, StageDuration: 4 * time.Minute, Arrival: workload.Poisson},
		Pods: 4, Profile: "h100x2-32b", TimeScale: 5, StreamInterval: time.Second, Drain: 10 * time.Minute, Engine: EngineDES,
	},
	// llm-d's published shared-prefix ladder at its own size: 8 TP2 H100
	// pods serving Qwen3-32B (307,328 KV tokens each), 150 groups × 5
	// users, 6,000-token system prompts, 1,200-token questions, 1,000
	// output tokens, Poisson arrivals stepping from 3 to 60 per second, 4
	// minutes each (28 minutes of model time, about 51,000 requests).
	// Sized for the des engine; the drain is model time 10 min × 5.
	workload.KindLLMDLadder: {
		Spec: workload.Spec{Groups: 150, Users: 5, SystemTokens: 6000, QuestionTokens: 1200, OutputTokens: 1000,
			Rates: []float64{3, 10, 20, 30, 40, 50, 60}, StageDuration: 4 * time.Minute, Arrival: workload.Poisson},
		Pods: 8, Profile: "h100x2-32b", TimeScale: 5, StreamInterval: time.Second, Drain: 10 * time.Minute, Engine: EngineDES,
	},
	// 256 H100 pods serving an 8B model at 5,000 requests/s for 60 model
	// seconds (300,000 requests): shared-prefix's shape with 2,000-token
	// system prompts and 200-token questions whose distinct prompts take
	// 73% of the fleet's KV cache when partitioned, 100 output tokens.
	// Sized for the des engine.
	workload.KindSharedPrefix256: {
		Spec: workload.Spec{Users: 5, SystemTokens: 2000, QuestionTokens: 200, OutputTokens: 100, PrefixFill: 0.73,
			Rates: []float64{5000}, StageDuration: time.Minute, Arrival: workload.Poisson},
		Pods: 256, Profile: "h100-8b", TimeScale: 5, StreamInterval: time.Second, Drain: time.Minute, Engine: EngineDES,
	},
	workload.KindMultiTurn: {
		Spec: workload.Spec{Turns: 8, SystemTokens: 2000, QuestionTokens: 300, OutputTokens: 300, Think: 10 * time.Second,
			Rates: []float64{1, 2}, StageDuration: 60 * time.Second, Arrival: workload.Poisson},
		Pods: 4, Profile: "h100x2-32b", TimeScale: 5, StreamInterval: time.Second, Drain: 5 * time.Minute,
	},
	workload.KindRandom: {
		Spec: workload.Spec{InputTokens: 2000, OutputTokens: 300,
			Rates: []float64{4, 8, 12}, StageDuration: 60 * time.Second, Arrival: workload.Poisson},
		Pods: 4, Profile: "h100x2-32b", TimeScale: 5, StreamInterval: time.Second, Drain: 5 * time.Minute,
	},
	workload.KindBurst: {
		Spec: workload.Spec{Siblings: 8, PrefixTokens: 8000, SuffixTokens: 200, OutputTokens: 200, Spread: 10 * time.Millisecond,
			Rates: []float64{0.5, 1}, StageDuration: 60 * time.Second, Arrival: workload.Poisson},
		Pods: 4, Profile: "h100x2-32b", TimeScale: 5, StreamInterval: time.Second, Drain: 5 * time.Minute,
	},
	// Pairs sharing a 2,000-token prefix on three pods whose KV events
	// arrive 500 ms late: the confirmation latency is known, and every
	// gap is placed against it and the TTL.
	workload.KindPairedGap: {
		Spec: workload.Spec{PrefixTokens: 2000, SuffixTokens: 50, OutputTokens: 4},
		Pods: 3, Profile: "h100x2-32b", TimeScale: 2, StreamInterval: 100 * time.Millisecond, Drain: time.Minute,
		EventDelay: 500 * time.Millisecond,
	},
	// Flow control's ladder at a larger size: eight pods, four minutes a
	// step.
	workload.KindOverload: {
		Spec: overloadSpec(4 * time.Minute),
		Pods: 8, Profile: "h100x2-32b", TimeScale: 5, StreamInterval: time.Second, Drain: 10 * time.Minute, Engine: EngineDES,
	},
	workload.KindTrace: {
		Spec: workload.Spec{TraceSpeedup: 1},
		Pods: 4, Profile: "h100-8b", TimeScale: 5, StreamInterval: time.Second, Drain: 5 * time.Minute,
	},
}

// The quick presets keep each shape on a fleet small enough for a 2-core
// machine to simulate faster than real time.
var quickPresets = map[string]Preset{
	// llm-d's regime on a small cache: 4,000-token system prompts and
	// 200-token questions whose distinct prompts take 73% of four pods of
	// 1,027 blocks (16,432 tokens) when partitioned, i.e. 10 groups of 5
	// users, 100 output tokens,
	// Poisson arrivals stepping 8, 16, 24 per second: a miss costs a
	// whole 4,200-token prefill, so a policy that spreads a group over the
	// pods runs out of prefill throughput where one that keeps it together
	// does not.
	workload.KindSharedPrefix: {
		Spec: workload.Spec{Users: 5, SystemTokens: 4000, QuestionTokens: 200, OutputTokens: 100, PrefixFill: 0.73,
			Rates: []float64{8, 16, 24}, StageDuration: 8 * time.Second, Arrival: workload.Poisson},
		Pods: 4, Profile: "h100x2-32b", KVBlocks: 1027, TimeScale: 5, StreamInterval: time.Second, Drain: 30 * time.Second,
	},
	workload.KindMultiTurn: {
		Spec: workload.Spec{Turns: 5, SystemTokens: 1000, QuestionTokens: 100, OutputTokens: 100, Think: 2 * time.Second,
			Rates: []float64{4}, StageDuration: 10 * time.Second, Arrival: workload.Poisson},
		Pods: 4, Profile: "h100x2-32b", KVBlocks: 1200, TimeScale: 5, StreamInterval: time.Second, Drain: 30 * time.Second,
	},
	workload.KindRandom: {
		Spec: workload.Spec{InputTokens: 1000, OutputTokens: 100,
			Rates: []float64{10, 20}, StageDuration: 10 * time.Second, Arrival: workload.Poisson},
		Pods: 4, Profile: "h100x2-32b", KVBlocks: 1200, TimeScale: 5, StreamInterval: time.Second, Drain: 30 * time.Second,
	},
	workload.KindBurst: {
		Spec: workload.Spec{Siblings: 8, PrefixTokens: 3000, SuffixTokens: 100, OutputTokens: 50, Spread: 10 * time.Millisecond,
			Rates: []float64{2}, StageDuration: 10 * time.Second, Arrival: workload.Poisson},
		Pods: 4, Profile: "h100x2-32b", KVBlocks: 1200, TimeScale: 5, StreamInterval: time.Second, Drain: 30 * time.Second,
	},
	workload.KindPairedGap: {
		Spec: workload.Spec{PrefixTokens: 2000, SuffixTokens: 50, OutputTokens: 4},
		Pods: 3, Profile: "h100x2-32b", KVBlocks: 1200, TimeScale: 4, StreamInterval: 100 * time.Millisecond, Drain: 30 * time.Second,
		EventDelay: 500 * time.Millisecond,
	},
	// shared-prefix's groups, prompts and fleet on a gentler ladder (8 then
	// 12 requests/s, 10 s each): the faults, not the load, should be what
	// fails requests, and every policy's run fits the minute.
	workload.KindFaults: {
		Spec: workload.Spec{Users: 5, SystemTokens: 4000, QuestionTokens: 200, OutputTokens: 100, PrefixFill: 0.73,
			Rates: []float64{8, 12}, StageDuration: 10 * time.Second, Arrival: workload.Poisson},
		Pods: 4, Profile: "h100x2-32b", KVBlocks: 1027, TimeScale: 5, StreamInterval: time.Second, Drain: 30 * time.Second,
	},
	// Flow control's workload on four pods: half, once, one and a half and
	// twice their capacity, a minute each (twice the batch class's
	// objective, so that a fleet without flow control has time to fall
	// past every objective); the drain (× the time scale: 150 model
	// seconds) outlasts the queue such a fleet builds.
	workload.KindOverload: {
		Spec: overloadSpec(time.Minute),
		Pods: 4, Profile: "h100x2-32b", TimeScale: 5, StreamInterval: time.Second, Drain: 30 * time.Second, Engine: EngineDES,
	},
	workload.KindTrace: {
		Spec: workload.Spec{TraceSpeedup: 4, TraceRequests: 200},
		Pods: 4, Profile: "h100-8b", TimeScale: 5, StreamInterval: time.Second, Drain: 30 * time.Second,
	},
}

// overloadSpec is the overload workload's shape with steps of stage:
// prompts of 2,000 tokens ± half that share nothing and 30 output tokens
// (on h100x2-32b a prefill-bound shape: a saturated pod's steps fill their
// 8,192-token budget before its KV cache or sequence limit binds), on a
// ladder of half, once, one and a half and twice the fleet's capacity
// (Capacity); one request in four interactive (2 s to first token), the
// others batch (30 s); four tenants, one of which sends five times as
// many requests as each of the others.
func overloadSpec(stage time.Duration) workload.Spec {
	return workload.Spec{InputTokens: 2000, OutputTokens: 30, Loads: []float64{0.5, 1, 1.5, 2}, StageDuration: stage, Arrival: workload.Poisson,
		Classes: []workload.Class{{Name: "interactive", Objective: 2 * time.Second, Share: 0.25}, {Name: "batch", Objective: 30 * time.Second, Share: 0.75}},
		Tenants: []workload.Tenant{{Name: "tenant-a", Weight: 5}, {Name: "tenant-b", Weight: 1}, {Name: "tenant-c", Weight: 1}, {Name: "tenant-d", Weight: 1}}}
}
