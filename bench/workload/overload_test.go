package workload

import (
	"math"
	"strings"
	"testing"
	"time"
)

// testOverloadSpec is a small overload workload: 200 requests a second for
// 20 s on a ladder of loads given as multiples of a capacity of 100.
func testOverloadSpec() Spec {
	return Spec{Kind: KindOverload, Seed: 5, Vocab: Bytes, InputTokens: 40, OutputTokens: 3, Loads: []float64{0.5, 2}, StageDuration: 10 * time.Second,
		Arrival: Poisson,
		Classes: []Class{{Name: "interactive", Objective: 2 * time.Second, Share: 0.25}, {Name: "batch", Objective: 30 * time.Second, Share: 0.75}},
		Tenants: []Tenant{{Name: "heavy", Weight: 5}, {Name: "b", Weight: 1}, {Name: "c", Weight: 1}, {Name: "d", Weight: 1}}}
}

func TestOverloadShape(t *testing.T) {
	w, err := Build(testOverloadSpec(), Limits{Capacity: 100})
	if err != nil {
		t.Fatal(err)
	}
	if w.Name != KindOverload || len(w.Stages) != 2 || w.Stages[0].Rate != 50 || w.Stages[1].Rate != 200 {
		t.Fatalf("%q, stages %+v: want the loads times the capacity", w.Name, w.Stages)
	}
	if len(w.Classes) != 2 || w.Classes[0].Name != "interactive" || w.Params["capacity_per_s"] != 100.0 {
		t.Fatalf("classes %+v, params %v", w.Classes, w.Params)
	}
	classes, tenants := map[string]int{}, map[string]int{}
	n := 0
	for _, s := range w.Sessions {
		for _, turn := range s.Turns {
			n++
			classes[turn.Class]++
			tenants[turn.Tenant]++
			if l := len(s.Prompt(0, nil)); l < 20 || l > 60 || turn.MaxTokens != 3 {
				t.Fatalf("a prompt of %d tokens and %d output tokens: want 40 ± 20 and 3", l, turn.MaxTokens)
			}
		}
	}
	if want := 10*50 + 10*200; math.Abs(float64(n-want)) > 0.1*float64(want) {
		t.Fatalf("%d requests, want about %d", n, want)
	}
	frac := func(k, of int) float64 { return float64(k) / float64(of) }
	tests := []struct {
		what      string
		got, want float64
	}{
		{"interactive share", frac(classes["interactive"], n), 0.25},
		{"batch share", frac(classes["batch"], n), 0.75},
		{"heavy tenant's share", frac(tenants["heavy"], n), 5.0 / 8},
		{"each other tenant's", frac(tenants["b"], n), 1.0 / 8},
		{"each other tenant's", frac(tenants["d"], n), 1.0 / 8},
	}
	for _, tc := range tests {
		if math.Abs(tc.got-tc.want) > 0.03 {
			t.Errorf("%s: %.3f, want %.3f", tc.what, tc.got, tc.want)
		}
	}
	// Rates given replace the loads.
	spec := testOverloadSpec()
	spec.Rates = []float64{7}
	w, err = Build(spec, Limits{Capacity: 100})
	if err != nil || len(w.Stages) != 1 || w.Stages[0].Rate != 7 {
		t.Fatalf("stages %+v, %v: want the rate given", w.Stages, err)
	}
}

func TestOverloadRejects(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Spec, *Limits)
		want   string
	}{
		{"no capacity and no rates", func(s *Spec, l *Limits) { l.Capacity = 0 }, "capacity is unknown"},
		{"no class", func(s *Spec, l *Limits) { s.Classes = nil }, "at least one class"},
		{"no tenant", func(s *Spec, l *Limits) { s.Tenants = nil }, "at least one class and one tenant"},
		{"class twice", func(s *Spec, l *Limits) { s.Classes[1].Name = "interactive" }, "given twice"},
		{"zero share", func(s *Spec, l *Limits) { s.Classes[0].Share = 0 }, "positive share"},
		{"negative objective", func(s *Spec, l *Limits) { s.Classes[0].Objective = -time.Second }, "not negative"},
		{"tenant twice", func(s *Spec, l *Limits) { s.Tenants[2].Name = "b" }, "given twice"},
		{"zero weight", func(s *Spec, l *Limits) { s.Tenants[0].Weight = 0 }, "positive weight"},
		{"one-token prompts", func(s *Spec, l *Limits) { s.InputTokens = 1 }, "input length"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec, lim := testOverloadSpec(), Limits{Capacity: 100}
			tc.change(&spec, &lim)
			if _, err := Build(spec, lim); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

func TestPick(t *testing.T) {
	for _, tc := range []struct {
		u       float64
		weights []float64
		want    int
	}{
		{0, []float64{1, 1}, 0},
		{0.49, []float64{1, 1}, 0},
		{0.5, []float64{1, 1}, 1},
		{0.62, []float64{5, 1, 1, 1}, 0},
		{0.63, []float64{5, 1, 1, 1}, 1},
		{0.999999, []float64{5, 1, 1, 1}, 3},
	} {
		if got := pick(tc.u, tc.weights); got != tc.want {
			t.Errorf("pick(%v, %v) = %d, want %d", tc.u, tc.weights, got, tc.want)
		}
	}
}
