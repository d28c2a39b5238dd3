package workload

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Common is what every generator shares.
type Common struct {
	Seed  uint64
	Vocab Vocab
}

func (c Common) texter() texter { return texter{seed: c.Seed, vocab: c.Vocab} }

// rng is the generator's own stream: the same seed gives each workload its
// own arrivals.
func (c Common) rng(salt uint64) *rand.Rand { return rand.New(rand.NewPCG(c.Seed, salt)) }

// SharedPrefix is llm-d's shared-prefix benchmark shape: Groups × Users
// prompts, each a group's system prompt followed by the user's own
// question; every request picks a (group, user) at random, so a user's
// prompt repeats and a group's system prompt is shared by its users.
type SharedPrefix struct {
	Common
	Groups, Users                              int
	SystemTokens, QuestionTokens, OutputTokens int
	Stages                                     []Stage
	Arrival                                    Arrival
}

// Generate makes the workload.
func (p SharedPrefix) Generate() (*Workload, error) {
	if p.Groups < 1 || p.Users < 1 || p.SystemTokens < 1 || p.QuestionTokens < 1 || p.OutputTokens < 1 {
		return nil, fmt.Errorf("shared-prefix: groups, users and the system, question and output lengths must be positive")
	}
	if err := checkStages(p.Stages); err != nil {
		return nil, fmt.Errorf("shared-prefix: %w", err)
	}
	tx := p.texter()
	systems := make([]string, p.Groups)
	for g := range systems {
		systems[g] = tx.text(kindSystem, uint64(g), p.SystemTokens)
	}
	rng := p.rng(1)
	at, stage := arrivals(rng, p.Stages, p.Arrival)
	w := &Workload{Name: "shared-prefix", Stages: p.Stages, Params: map[string]any{
		"groups": p.Groups, "users_per_group": p.Users, "system_tokens": p.SystemTokens,
		"question_tokens": p.QuestionTokens, "output_tokens": p.OutputTokens,
		"arrival": string(p.Arrival), "stages": stageParams(p.Stages), "seed": p.Seed, "vocab": string(p.Vocab),
	}}
	for i, t := range at {
		g, u := rng.IntN(p.Groups), rng.IntN(p.Users)
		q := tx.text(kindQuestion, uint64(g*p.Users+u), p.QuestionTokens)
		w.Sessions = append(w.Sessions, Session{Start: t, Group: g, Turns: []Turn{{
			Parts: []string{systems[g], q}, MaxTokens: p.OutputTokens, Stage: stage[i],
		}}})
	}
	return w, nil
}

// MultiTurn is conversations that grow turn by turn: each starts with its
// own context (SystemTokens), and every turn adds a question of
// QuestionTokens after the previous answer; the next turn comes Think
// (exponential, this mean) after the answer. Conversations start at the
// ladder's rate.
type MultiTurn struct {
	Common
	Turns                                      int
	SystemTokens, QuestionTokens, OutputTokens int
	Think                                      time.Duration
	Stages                                     []Stage
	Arrival                                    Arrival
}

// Generate makes the workload.
func (p MultiTurn) Generate() (*Workload, error) {
	if p.Turns < 1 || p.SystemTokens < 0 || p.QuestionTokens < 1 || p.OutputTokens < 1 || p.Think < 0 {
		return nil, fmt.Errorf("multi-turn: turns, question and output lengths must be positive, the system length and think time not negative")
	}
	if err := checkStages(p.Stages); err != nil {
		return nil, fmt.Errorf("multi-turn: %w", err)
	}
	tx := p.texter()
	rng := p.rng(2)
	at, stage := arrivals(rng, p.Stages, p.Arrival)
	w := &Workload{Name: "multi-turn", Stages: p.Stages, Params: map[string]any{
		"turns": p.Turns, "system_tokens": p.SystemTokens, "question_tokens": p.QuestionTokens,
		"output_tokens": p.OutputTokens, "think_s": p.Think.Seconds(), "arrival": string(p.Arrival),
		"stages": stageParams(p.Stages), "seed": p.Seed, "vocab": string(p.Vocab),
	}}
	for c, t := range at {
		s := Session{Start: t, Group: c}
		for k := range p.Turns {
			turn := Turn{MaxTokens: p.OutputTokens, Stage: stage[c]}
			if k == 0 {
				turn.Parts = append(turn.Parts, tx.text(kindSystem, uint64(c)|1<<40, p.SystemTokens))
			} else {
				turn.Think = time.Duration(rng.ExpFloat64() * float64(p.Think))
			}
			turn.Parts = append(turn.Parts, tx.text(kindTurn, uint64(c)<<16|uint64(k), p.QuestionTokens))
			s.Turns = append(s.Turns, turn)
		}
		w.Sessions = append(w.Sessions, s)
	}
	return w, nil
}

// Random is requests that share nothing: prompts of InputTokens ± half,
// uniformly, the no-regression check.
type Random struct {
	Common
	InputTokens, OutputTokens int
	Stages                    []Stage
	Arrival                   Arrival
}

// Generate makes the workload.
func (p Random) Generate() (*Workload, error) {
	if p.InputTokens < 2 || p.OutputTokens < 1 {
		return nil, fmt.Errorf("random: the input length must be at least 2 and the output length positive")
	}
	if err := checkStages(p.Stages); err != nil {
		return nil, fmt.Errorf("random: %w", err)
	}
	tx := p.texter()
	rng := p.rng(3)
	at, stage := arrivals(rng, p.Stages, p.Arrival)
	w := &Workload{Name: "random", Stages: p.Stages, Params: map[string]any{
		"input_tokens": p.InputTokens, "output_tokens": p.OutputTokens, "arrival": string(p.Arrival),
		"stages": stageParams(p.Stages), "seed": p.Seed, "vocab": string(p.Vocab),
	}}
	for i, t := range at {
		n := p.InputTokens/2 + rng.IntN(p.InputTokens+1)
		w.Sessions = append(w.Sessions, Session{Start: t, Group: -1, Turns: []Turn{{
			Parts: []string{tx.text(kindRandom, uint64(i), n)}, MaxTokens: p.OutputTokens, Stage: stage[i],
		}}})
	}
	return w, nil
}

// Burst is fan-out: bursts arrive at the ladder's rate, each Siblings
// requests sharing a fresh PrefixTokens prefix, with their own suffix,
// arriving within Spread of the burst (uniformly) — agents fanning out,
// n-best sampling. The speculative policy's case: the siblings arrive
// before any KV event of the first can. Sequential sends a burst's
// siblings one after another instead, each Gap after the previous answer
// (an agent's steps, a user's quick retries): with delayed KV events the
// next one may still arrive before the first's event.
type Burst struct {
	Common
	Siblings                                 int
	PrefixTokens, SuffixTokens, OutputTokens int
	Spread                                   time.Duration
	Sequential                               bool
	Gap                                      time.Duration
	Stages                                   []Stage
	Arrival                                  Arrival
}

// Generate makes the workload.
func (p Burst) Generate() (*Workload, error) {
	if p.Siblings < 1 || p.PrefixTokens < 1 || p.SuffixTokens < 1 || p.OutputTokens < 1 || p.Spread < 0 || p.Gap < 0 {
		return nil, fmt.Errorf("burst: siblings and the prefix, suffix and output lengths must be positive, the spread and gap not negative")
	}
	if err := checkStages(p.Stages); err != nil {
		return nil, fmt.Errorf("burst: %w", err)
	}
	tx := p.texter()
	rng := p.rng(4)
	at, stage := arrivals(rng, p.Stages, p.Arrival)
	w := &Workload{Name: "burst", Stages: p.Stages, Params: map[string]any{
		"siblings": p.Siblings, "prefix_tokens": p.PrefixTokens, "suffix_tokens": p.SuffixTokens,
		"output_tokens": p.OutputTokens, "spread_s": p.Spread.Seconds(), "arrival": string(p.Arrival),
		"stages": stageParams(p.Stages), "seed": p.Seed, "vocab": string(p.Vocab),
	}}
	if p.Sequential {
		w.Params["sequential"], w.Params["gap_s"] = true, p.Gap.Seconds()
		delete(w.Params, "spread_s")
	}
	for b, t := range at {
		prefix := tx.text(kindBurstPrefix, uint64(b), p.PrefixTokens)
		if p.Sequential {
			s := Session{Start: t, Group: b}
			for k := range p.Siblings {
				turn := Turn{Parts: []string{prefix, tx.text(kindBurstSuffix, uint64(b)<<16|uint64(k), p.SuffixTokens)},
					MaxTokens: p.OutputTokens, Stage: stage[b], Standalone: true}
				if k > 0 {
					turn.Think = p.Gap
				}
				s.Turns = append(s.Turns, turn)
			}
			w.Sessions = append(w.Sessions, s)
			continue
		}
		for k := range p.Siblings {
			var off time.Duration
			if p.Spread > 0 {
				off = time.Duration(rng.Int64N(int64(p.Spread)))
			}
			w.Sessions = append(w.Sessions, Session{Start: t + off, Group: b, Turns: []Turn{{
				Parts:     []string{prefix, tx.text(kindBurstSuffix, uint64(b)<<16|uint64(k), p.SuffixTokens)},
				MaxTokens: p.OutputTokens, Stage: stage[b],
			}}})
		}
	}
	sortSessions(w.Sessions)
	return w, nil
}

func checkStages(stages []Stage) error {
	if len(stages) == 0 {
		return fmt.Errorf("no rate given")
	}
	for _, s := range stages {
		if !(s.Rate > 0) || s.Duration <= 0 {
			return fmt.Errorf("every stage needs a positive rate and duration")
		}
	}
	return nil
}

// Paired-gap's conditions: what happens to the first request of a pair
// (or its pod, or its events) before the second is sent.
const (
	CondNone          = "none"
	CondCancel        = "cancel"
	CondFailPrefill   = "fail-prefill"
	CondRestart       = "restart"
	CondDelayedEvents = "delayed-events"
)

// Paired-gap's gaps, named by where they fall against the route-to-
// confirmation latency and the prediction TTL; the benchmark sizes them
// from the fleet's known event delay and the TTL.
const (
	GapBelowP50  = "below-p50"
	GapNearP95   = "near-p95"
	GapNearTTL   = "near-ttl"
	GapBeyondTTL = "beyond-ttl"
)

// PairConditions and PairGaps are the matrix's rows and columns in order.
var (
	PairConditions = []string{CondNone, CondCancel, CondFailPrefill, CondRestart, CondDelayedEvents}
	PairGaps       = []string{GapBelowP50, GapNearP95, GapNearTTL, GapBeyondTTL}
)

// Cell is one pair: its condition and gap.
type Cell struct {
	Condition, Gap string
}

// PairedGap is pairs of requests sharing a fresh PrefixTokens prefix, each
// with its own suffix: one cell per condition and gap, the second request
// sent the gap after the first. It is the matrix of docs/benchmark.md
// ("The paired-gap matrix"): whether the second request is routed on a
// prediction, a confirmed run or nothing.
type PairedGap struct {
	Common
	PrefixTokens, SuffixTokens, OutputTokens int
}

// Generate makes the workload: sessions 2i and 2i+1 are cell i's pair.
func (p PairedGap) Generate() (*Workload, error) {
	if p.PrefixTokens < 1 || p.SuffixTokens < 1 || p.OutputTokens < 1 {
		return nil, fmt.Errorf("paired-gap: the prefix, suffix and output lengths must be positive")
	}
	tx := p.texter()
	w := &Workload{Name: KindPairedGap, Params: map[string]any{
		"prefix_tokens": p.PrefixTokens, "suffix_tokens": p.SuffixTokens, "output_tokens": p.OutputTokens,
		"conditions": PairConditions, "gaps": PairGaps, "seed": p.Seed, "vocab": string(p.Vocab),
	}}
	for _, cond := range PairConditions {
		for _, gap := range PairGaps {
			i := len(w.Cells)
			w.Cells = append(w.Cells, Cell{Condition: cond, Gap: gap})
			prefix := tx.text(kindPairPrefix, uint64(i), p.PrefixTokens)
			for k := range 2 {
				w.Sessions = append(w.Sessions, Session{Group: i, Turns: []Turn{{
					Parts:     []string{prefix, tx.text(kindPairSuffix, uint64(i)<<1|uint64(k), p.SuffixTokens)},
					MaxTokens: p.OutputTokens, Stage: -1,
				}}})
			}
		}
	}
	return w, nil
}
