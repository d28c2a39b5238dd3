package workload

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Workload is what one benchmark run sends, the same to every policy.
type Workload struct {
	// Name is the workload's kind: shared-prefix, multi-turn, random,
	// burst or trace.
	Name string
	// Params are the parameters that made it, as results.json records
	// them.
	Params map[string]any
	// Sessions are sorted by Start.
	Sessions []Session
	// Stages are the rate ladder's steps, empty for workloads without one.
	Stages []Stage
	// Notes say what the generator changed or left out (a trace's prompts
	// cut to the context, say), for the report.
	Notes []string
	// Cells are paired-gap's cells, one per session pair (sessions 2i and
	// 2i+1); the benchmark runs them one by one instead of open-loop.
	Cells []Cell
	// Classes are the priority classes the workload's requests name
	// (Turn.Class), highest first, with their TTFT objectives; empty for
	// workloads whose requests name none (the router's default class).
	Classes []Class
}

// Class is a priority class a workload's requests carry, with the time to
// first token it is promised (0: none) and the share of the requests that
// carry it.
type Class struct {
	Name      string
	Objective time.Duration
	Share     float64
}

// Tenant is whom a workload's requests are charged to, and its weight in
// the arrivals: a tenant of weight 5 among three of weight 1 sends five
// requests for each of theirs.
type Tenant struct {
	Name   string
	Weight float64
}

// Session is one conversation: a single request for most workloads.
type Session struct {
	// Start is the first turn's arrival, model time from the run's start.
	Start time.Duration
	// Group is the session's sharing group (a shared-prefix group, a
	// burst, a conversation), for reports; -1 for none.
	Group int
	Turns []Turn
}

// Turn is one request of a session.
type Turn struct {
	// Think is the model time between the previous turn's answer and this
	// turn's arrival; zero for the first turn.
	Think time.Duration
	// Parts are appended to the conversation before this turn is sent;
	// the prompt is every earlier part and answer, then these.
	Parts []string
	// MaxTokens is the output length asked for (with ignore_eos).
	MaxTokens int
	// Stage is the ladder stage the turn arrives in, -1 outside a ladder.
	Stage int
	// Standalone makes the turn's prompt its own parts alone, not the
	// conversation so far: a sequential burst's siblings are turns only
	// in that each waits for the previous answer.
	Standalone bool
	// Class is the request's priority class (one of Workload.Classes; ""
	// the router's default) and Tenant whom it is charged to ("": none).
	Class, Tenant string
}

// Requests counts the turns of every session.
func (w *Workload) Requests() int {
	n := 0
	for _, s := range w.Sessions {
		n += len(s.Turns)
	}
	return n
}

// Prompt is the text of turn k of a session whose earlier answers are
// given (len(answers) ≥ k).
func (s *Session) Prompt(k int, answers []string) string {
	var b strings.Builder
	if s.Turns[k].Standalone {
		for _, p := range s.Turns[k].Parts {
			b.WriteString(p)
		}
		return b.String()
	}
	for i := 0; i <= k; i++ {
		for _, p := range s.Turns[i].Parts {
			b.WriteString(p)
		}
		if i < k {
			b.WriteString(answers[i])
		}
	}
	return b.String()
}

// Stage is one step of a rate ladder: arrivals at Rate requests (or
// sessions) per model second for Duration.
type Stage struct {
	Rate     float64       `json:"rate"`
	Duration time.Duration `json:"-"`
}

// Arrival is how a ladder spaces its arrivals.
type Arrival string

// Arrivals.
const (
	Poisson  Arrival = "poisson"
	Constant Arrival = "constant"
)

// ParseArrival reads poisson or constant.
func ParseArrival(s string) (Arrival, error) {
	switch a := Arrival(s); a {
	case Poisson, Constant:
		return a, nil
	}
	return "", fmt.Errorf("unknown arrival %q (want poisson or constant)", s)
}

// ParseRates reads a ladder's rates: "4" or "2,4,8" (requests per second,
// each positive).
func ParseRates(s string) ([]float64, error) {
	var out []float64
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		var r float64
		if _, err := fmt.Sscan(f, &r); err != nil || !(r > 0) || math.IsInf(r, 0) {
			return nil, fmt.Errorf("rate %q: want a positive number of requests per second", f)
		}
		out = append(out, r)
	}
	return out, nil
}

// Ladder makes one stage per rate, each lasting d.
func Ladder(rates []float64, d time.Duration) []Stage {
	out := make([]Stage, len(rates))
	for i, r := range rates {
		out[i] = Stage{Rate: r, Duration: d}
	}
	return out
}

// arrivals returns the arrival times of a ladder and the stage of each.
func arrivals(rng *rand.Rand, stages []Stage, how Arrival) (at []time.Duration, stage []int) {
	var base time.Duration
	for i, st := range stages {
		end := base + st.Duration
		gap := func() time.Duration {
			if how == Constant {
				return time.Duration(float64(time.Second) / st.Rate)
			}
			return time.Duration(rng.ExpFloat64() / st.Rate * float64(time.Second))
		}
		t := base
		if how == Poisson {
			t += gap()
		}
		for ; t < end; t += gap() {
			at = append(at, t)
			stage = append(stage, i)
		}
		base = end
	}
	return at, stage
}

// stageParams is how results.json records a ladder.
func stageParams(stages []Stage) []map[string]any {
	out := make([]map[string]any, len(stages))
	for i, s := range stages {
		out[i] = map[string]any{"rate": s.Rate, "duration_s": s.Duration.Seconds()}
	}
	return out
}

// sortSessions orders sessions by start, stably (equal starts keep their
// generation order).
func sortSessions(ss []Session) {
	slices.SortStableFunc(ss, func(a, b Session) int {
		switch {
		case a.Start < b.Start:
			return -1
		case a.Start > b.Start:
			return 1
		}
		return 0
	})
}
