package workload

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// Kinds of workload.
const (
	KindSharedPrefix = "shared-prefix"
	KindMultiTurn    = "multi-turn"
	KindRandom       = "random"
	KindBurst        = "burst"
	KindTrace        = "trace"
	KindPairedGap    = "paired-gap"
	// KindFaults is shared-prefix's requests while the benchmark injects
	// faults into the fleet (bench/faults.go owns the schedule).
	KindFaults = "faults"
	// KindLLMDLadder and KindSharedPrefix256 are shared-prefix's shape at
	// the published benchmarks' size (their presets say which).
	KindLLMDLadder      = "llmd-ladder"
	KindSharedPrefix256 = "shared-prefix-256"
	// KindOverload is flow control's: a ladder from half the fleet's
	// capacity to twice it, priority classes and tenants.
	KindOverload = "overload"
)

// Kinds lists the workloads --workload takes (a trace as trace:PATH).
func Kinds() []string {
	return []string{KindSharedPrefix, KindMultiTurn, KindRandom, KindBurst, KindPairedGap, KindFaults, KindLLMDLadder, KindSharedPrefix256, KindOverload, KindTrace + ":PATH"}
}

// ParseKind reads --workload: a kind, or trace:PATH.
func ParseKind(s string) (kind, path string, err error) {
	if p, ok := strings.CutPrefix(s, KindTrace+":"); ok {
		if p == "" {
			return "", "", fmt.Errorf("trace: want trace:PATH")
		}
		return KindTrace, p, nil
	}
	switch s {
	case KindSharedPrefix, KindMultiTurn, KindRandom, KindBurst, KindPairedGap, KindFaults, KindLLMDLadder, KindSharedPrefix256, KindOverload:
		return s, "", nil
	}
	return "", "", fmt.Errorf("unknown workload %q (want %s)", s, strings.Join(Kinds(), ", "))
}

// Spec is every generator's parameters as the command takes them. A zero
// field takes the preset's value (Fill).
type Spec struct {
	Kind      string
	TracePath string
	Seed      uint64
	Vocab     Vocab

	// The ladder: one stage per rate, each StageDuration long (model time).
	Rates         []float64
	StageDuration time.Duration
	Arrival       Arrival

	// shared-prefix (and the lengths of multi-turn, random and burst).
	Groups, Users                              int
	SystemTokens, QuestionTokens, OutputTokens int
	// PrefixFill sizes shared-prefix's groups when Groups is zero: each
	// group's distinct prompts (its system prompt and each user's own
	// question, all of which recur) take PrefixFill of the fleet's KV
	// tokens: groups × (system + users × question) = PrefixFill × KV, the
	// resident prefix demand llm-d's benchmark counts (150 groups of a
	// 6,000-token system prompt and five 1,200-token questions on 8 pods
	// of 307,328 tokens: 73%).
	PrefixFill float64

	// multi-turn.
	Turns int
	Think time.Duration

	// random.
	InputTokens int

	// burst (and paired-gap's prefix, suffix and output lengths).
	Siblings, PrefixTokens, SuffixTokens int
	Spread                               time.Duration
	// Sequential sends a burst's siblings one after another, each Gap
	// after the previous answer, instead of within Spread.
	Sequential bool
	Gap        time.Duration

	// trace.
	TraceSpeedup  float64
	TraceRequests int

	// overload: the ladder as multiples of the fleet's capacity
	// (Limits.Capacity), used when Rates is empty; the classes and the
	// tenants the requests are drawn from.
	Loads   []float64
	Classes []Class
	Tenants []Tenant
}

// Fill takes preset's value for every zero field of s.
func (s *Spec) Fill(preset Spec) {
	fillIf := func(dst *int, v int) {
		if *dst == 0 {
			*dst = v
		}
	}
	fillIf(&s.Groups, preset.Groups)
	fillIf(&s.Users, preset.Users)
	fillIf(&s.SystemTokens, preset.SystemTokens)
	fillIf(&s.QuestionTokens, preset.QuestionTokens)
	fillIf(&s.OutputTokens, preset.OutputTokens)
	fillIf(&s.Turns, preset.Turns)
	fillIf(&s.InputTokens, preset.InputTokens)
	fillIf(&s.Siblings, preset.Siblings)
	fillIf(&s.PrefixTokens, preset.PrefixTokens)
	fillIf(&s.SuffixTokens, preset.SuffixTokens)
	fillIf(&s.TraceRequests, preset.TraceRequests)
	if len(s.Rates) == 0 {
		s.Rates = preset.Rates
	}
	if s.StageDuration == 0 {
		s.StageDuration = preset.StageDuration
	}
	if s.Arrival == "" {
		s.Arrival = preset.Arrival
	}
	if s.PrefixFill == 0 {
		s.PrefixFill = preset.PrefixFill
	}
	if s.Think == 0 {
		s.Think = preset.Think
	}
	if s.Spread == 0 {
		s.Spread = preset.Spread
	}
	if s.Gap == 0 {
		s.Gap = preset.Gap
	}
	if s.TraceSpeedup == 0 {
		s.TraceSpeedup = preset.TraceSpeedup
	}
	if s.Vocab == "" {
		s.Vocab = preset.Vocab
	}
	if len(s.Loads) == 0 {
		s.Loads = preset.Loads
	}
	if len(s.Classes) == 0 {
		s.Classes = preset.Classes
	}
	if len(s.Tenants) == 0 {
		s.Tenants = preset.Tenants
	}
}

// Limits are what the fleet allows, for sizing and cutting; zero is
// unknown.
type Limits struct {
	// KVTokens is the whole fleet's KV-cache capacity.
	KVTokens int
	// MaxContext bounds one request's prompt and output.
	MaxContext int
	// Capacity is the requests per second the fleet serves at saturation
	// for the spec's shape (overload's ladder is sized by it).
	Capacity float64
}

// Build makes the workload s describes.
func Build(s Spec, lim Limits) (*Workload, error) {
	common := Common{Seed: s.Seed, Vocab: s.Vocab}
	stages := Ladder(s.Rates, s.StageDuration)
	switch s.Kind {
	case KindSharedPrefix, KindFaults, KindLLMDLadder, KindSharedPrefix256:
		groups := s.Groups
		// A group's distinct prompts: its system prompt, and each user's
		// own question after it.
		demand := s.SystemTokens + max(s.Users, 1)*max(s.QuestionTokens, 0)
		if groups == 0 {
			if lim.KVTokens == 0 || !(s.PrefixFill > 0) || s.SystemTokens < 1 {
				return nil, fmt.Errorf("%s: give --groups (the fleet's KV capacity is unknown)", s.Kind)
			}
			groups = max(1, int(math.Round(s.PrefixFill*float64(lim.KVTokens)/float64(demand))))
		}
		w, err := SharedPrefix{Common: common, Groups: groups, Users: s.Users, SystemTokens: s.SystemTokens,
			QuestionTokens: s.QuestionTokens, OutputTokens: s.OutputTokens, Stages: stages, Arrival: s.Arrival}.Generate()
		if err != nil {
			return nil, err
		}
		w.Name = s.Kind
		if lim.KVTokens > 0 {
			fill := float64(groups*demand) / float64(lim.KVTokens)
			w.Params["prefix_fill"] = math.Round(fill*1000) / 1000
		}
		return w, nil
	case KindMultiTurn:
		return MultiTurn{Common: common, Turns: s.Turns, SystemTokens: s.SystemTokens, QuestionTokens: s.QuestionTokens,
			OutputTokens: s.OutputTokens, Think: s.Think, Stages: stages, Arrival: s.Arrival}.Generate()
	case KindRandom:
		return Random{Common: common, InputTokens: s.InputTokens, OutputTokens: s.OutputTokens, Stages: stages, Arrival: s.Arrival}.Generate()
	case KindBurst:
		return Burst{Common: common, Siblings: s.Siblings, PrefixTokens: s.PrefixTokens, SuffixTokens: s.SuffixTokens,
			OutputTokens: s.OutputTokens, Spread: s.Spread, Sequential: s.Sequential, Gap: s.Gap, Stages: stages, Arrival: s.Arrival}.Generate()
	case KindOverload:
		if len(s.Rates) == 0 {
			if !(lim.Capacity > 0) || len(s.Loads) == 0 {
				return nil, fmt.Errorf("overload: give --rates (the fleet's capacity is unknown)")
			}
			rates := make([]float64, len(s.Loads))
			for i, l := range s.Loads {
				// A tenth of a request a second: the figures read as
				// they were meant, the ladder's steps in the charts.
				rates[i] = math.Round(l*lim.Capacity*10) / 10
			}
			stages = Ladder(rates, s.StageDuration)
		}
		return Overload{Common: common, InputTokens: s.InputTokens, OutputTokens: s.OutputTokens, Stages: stages, Arrival: s.Arrival,
			Classes: s.Classes, Tenants: s.Tenants, Capacity: lim.Capacity}.Generate()
	case KindPairedGap:
		return PairedGap{Common: common, PrefixTokens: s.PrefixTokens, SuffixTokens: s.SuffixTokens, OutputTokens: s.OutputTokens}.Generate()
	case KindTrace:
		return Trace{Common: common, Path: s.TracePath, Speedup: s.TraceSpeedup, MaxRequests: s.TraceRequests,
			MaxContext: lim.MaxContext}.Generate()
	}
	return nil, fmt.Errorf("unknown workload %q", s.Kind)
}
