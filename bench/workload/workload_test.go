package workload

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestGeneratorsAreDeterministic(t *testing.T) {
	ladder := Ladder([]float64{20, 40}, 2*time.Second)
	gens := map[string]func(seed uint64) (*Workload, error){
		"shared-prefix": func(seed uint64) (*Workload, error) {
			return SharedPrefix{Common: Common{Seed: seed, Vocab: Bytes}, Groups: 3, Users: 2, SystemTokens: 100, QuestionTokens: 20, OutputTokens: 5, Stages: ladder, Arrival: Poisson}.Generate()
		},
		"multi-turn": func(seed uint64) (*Workload, error) {
			return MultiTurn{Common: Common{Seed: seed, Vocab: Words}, Turns: 3, SystemTokens: 50, QuestionTokens: 10, OutputTokens: 5, Think: time.Second, Stages: ladder, Arrival: Poisson}.Generate()
		},
		"random": func(seed uint64) (*Workload, error) {
			return Random{Common: Common{Seed: seed, Vocab: Bytes}, InputTokens: 100, OutputTokens: 5, Stages: ladder, Arrival: Constant}.Generate()
		},
		"overload": func(seed uint64) (*Workload, error) {
			return Overload{Common: Common{Seed: seed, Vocab: Bytes}, InputTokens: 100, OutputTokens: 5, Stages: ladder, Arrival: Poisson,
				Classes: []Class{{Name: "a", Share: 1}, {Name: "b", Objective: time.Second, Share: 3}}, Tenants: []Tenant{{Name: "t", Weight: 1}, {Name: "u", Weight: 2}}}.Generate()
		},
		"burst": func(seed uint64) (*Workload, error) {
			return Burst{Common: Common{Seed: seed, Vocab: Bytes}, Siblings: 4, PrefixTokens: 200, SuffixTokens: 10, OutputTokens: 5, Spread: 5 * time.Millisecond, Stages: ladder, Arrival: Poisson}.Generate()
		},
	}
	for name, gen := range gens {
		t.Run(name, func(t *testing.T) {
			a, err := gen(7)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := gen(7)
			c, _ := gen(8)
			if !reflect.DeepEqual(a, b) {
				t.Fatal("the same seed made two workloads")
			}
			if reflect.DeepEqual(a.Sessions, c.Sessions) {
				t.Fatal("two seeds made the same workload")
			}
			if a.Requests() == 0 || a.Name != name {
				t.Fatalf("%q with %d requests", a.Name, a.Requests())
			}
			for i := 1; i < len(a.Sessions); i++ {
				if a.Sessions[i].Start < a.Sessions[i-1].Start {
					t.Fatalf("session %d starts before session %d", i, i-1)
				}
			}
		})
	}
}

func TestLadderArrivals(t *testing.T) {
	tests := []struct {
		name    string
		arrival Arrival
		rates   []float64
		want    []int // arrivals per stage
		slack   float64
	}{
		{"constant", Constant, []float64{10, 40}, []int{100, 400}, 0},
		{"poisson", Poisson, []float64{10, 40}, []int{100, 400}, 0.2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, err := Random{Common: Common{Seed: 3, Vocab: Bytes}, InputTokens: 10, OutputTokens: 1,
				Stages: Ladder(tc.rates, 10*time.Second), Arrival: tc.arrival}.Generate()
			if err != nil {
				t.Fatal(err)
			}
			got := make([]int, len(tc.rates))
			for _, s := range w.Sessions {
				st := s.Turns[0].Stage
				got[st]++
				if lo, hi := time.Duration(st)*10*time.Second, time.Duration(st+1)*10*time.Second; s.Start < lo || s.Start >= hi {
					t.Fatalf("stage %d arrival at %v", st, s.Start)
				}
			}
			for i := range got {
				if math.Abs(float64(got[i]-tc.want[i])) > tc.slack*float64(tc.want[i]) {
					t.Fatalf("stage %d: %d arrivals, want %d ± %.0f%%", i, got[i], tc.want[i], 100*tc.slack)
				}
			}
		})
	}
}

func TestSharedPrefixShape(t *testing.T) {
	w, err := SharedPrefix{Common: Common{Seed: 1, Vocab: Bytes}, Groups: 4, Users: 3, SystemTokens: 300, QuestionTokens: 40,
		OutputTokens: 7, Stages: Ladder([]float64{100}, 2*time.Second), Arrival: Poisson}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	systems := map[int]string{}
	prompts := map[string]bool{}
	for _, s := range w.Sessions {
		p := s.Prompt(0, nil)
		if len(p) != 340 || s.Turns[0].MaxTokens != 7 {
			t.Fatalf("prompt of %d bytes, %d output tokens", len(p), s.Turns[0].MaxTokens)
		}
		if sys, ok := systems[s.Group]; ok && sys != p[:300] {
			t.Fatalf("group %d has two system prompts", s.Group)
		}
		systems[s.Group] = p[:300]
		prompts[p] = true
	}
	if len(systems) != 4 || len(prompts) > 12 {
		t.Fatalf("%d groups and %d distinct prompts, want 4 and at most 12", len(systems), len(prompts))
	}
	for g, a := range systems {
		for h, b := range systems {
			if g != h && a[:16] == b[:16] {
				t.Fatalf("groups %d and %d share their first block", g, h)
			}
		}
	}
}

func TestMultiTurnPromptGrows(t *testing.T) {
	w, err := MultiTurn{Common: Common{Seed: 1, Vocab: Bytes}, Turns: 3, SystemTokens: 100, QuestionTokens: 10, OutputTokens: 5,
		Think: time.Second, Stages: Ladder([]float64{1}, 3*time.Second), Arrival: Constant}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	s := w.Sessions[0]
	answers := []string{"first answer", "second answer"}
	p0, p1, p2 := s.Prompt(0, nil), s.Prompt(1, answers), s.Prompt(2, answers)
	if len(p0) != 110 || !strings.HasPrefix(p1, p0+answers[0]) || !strings.HasPrefix(p2, p1+answers[1]) || len(p2) != len(p1)+len(answers[1])+10 {
		t.Fatalf("prompts do not grow turn by turn: %d, %d, %d bytes", len(p0), len(p1), len(p2))
	}
	if s.Turns[0].Think != 0 || s.Turns[1].Think <= 0 {
		t.Fatalf("think times %v, %v", s.Turns[0].Think, s.Turns[1].Think)
	}
}

func TestBurstSiblingsShareTheirPrefix(t *testing.T) {
	w, err := Burst{Common: Common{Seed: 1, Vocab: Bytes}, Siblings: 5, PrefixTokens: 500, SuffixTokens: 20, OutputTokens: 3,
		Spread: 4 * time.Millisecond, Stages: Ladder([]float64{0.5}, 10*time.Second), Arrival: Constant}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	byBurst := map[int][]Session{}
	for _, s := range w.Sessions {
		byBurst[s.Group] = append(byBurst[s.Group], s)
	}
	if len(byBurst) != 5 {
		t.Fatalf("%d bursts, want 5", len(byBurst))
	}
	for b, sib := range byBurst {
		if len(sib) != 5 {
			t.Fatalf("burst %d has %d siblings", b, len(sib))
		}
		first := sib[0].Prompt(0, nil)
		for _, s := range sib {
			if p := s.Prompt(0, nil); p[:500] != first[:500] || s.Start-sib[0].Start >= 4*time.Millisecond || s.Start < sib[0].Start-4*time.Millisecond {
				t.Fatalf("burst %d: siblings differ in their prefix or arrive %v apart", b, s.Start-sib[0].Start)
			}
		}
	}
}

func TestTraceReplay(t *testing.T) {
	trace := strings.Join([]string{
		`{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 3]}`,
		`{"timestamp": 500, "input_length": 700, "output_length": 9, "hash_ids": [1, 4]}`,
		`{"timestamp": 2000, "input_length": 2000, "output_length": 3, "hash_ids": [5, 6, 7, 8]}`,
	}, "\n")
	path := filepath.Join(t.TempDir(), "t.jsonl")
	if err := os.WriteFile(path, []byte(trace), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, vocab := range []Vocab{Bytes, Words} {
		t.Run(string(vocab), func(t *testing.T) {
			w, err := Trace{Common: Common{Seed: 1, Vocab: vocab}, Path: path, Speedup: 2, MaxContext: 1500}.Generate()
			if err != nil {
				t.Fatal(err)
			}
			if len(w.Sessions) != 3 || w.Sessions[1].Start != 250*time.Millisecond || w.Sessions[2].Start != time.Second {
				t.Fatalf("arrivals %v %v", w.Sessions[1].Start, w.Sessions[2].Start)
			}
			p0, p1, p2 := w.Sessions[0].Prompt(0, nil), w.Sessions[1].Prompt(0, nil), w.Sessions[2].Prompt(0, nil)
			tokens := func(s string) int {
				if vocab == Words {
					return strings.Count(s, " ")
				}
				return len(s)
			}
			// Equal ids, equal text: both start with block 1.
			b1 := w.Sessions[0].Turns[0].Parts[0]
			if tokens(b1) != 512 || !strings.HasPrefix(p1, b1) || strings.HasPrefix(p2, b1[:64]) {
				t.Fatal("block 1 is not shared by requests 0 and 1 alone")
			}
			// The last block is cut to the input length; the third prompt to
			// the context less its output and the margin.
			if tokens(p0) != 1100 || tokens(p1) != 700 || tokens(p2) != 1500-3-contextMargin {
				t.Fatalf("prompt lengths %d, %d, %d", tokens(p0), tokens(p1), tokens(p2))
			}
			if len(w.Notes) != 1 || w.Sessions[1].Turns[0].MaxTokens != 9 {
				t.Fatalf("notes %q", w.Notes)
			}
		})
	}
}

func TestReadTraceRejects(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"not JSON", `{"timestamp": 0,`, "line 1"},
		{"ids do not match the length", `{"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [1]}`, "want one per 512-token block"},
		{"time goes back", "{\"timestamp\": 5, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n{\"timestamp\": 4, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}", "line 2: timestamp 4"},
		{"no output", `{"timestamp": 0, "input_length": 1, "output_length": 0, "hash_ids": [1]}`, "must be positive"},
		{"empty", "", "no requests"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadTrace(strings.NewReader(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

func TestReadsTheCommittedMooncakeTrace(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "..", "testdata", "traces", "synthetic_trace.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := ReadTrace(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3993 || recs[len(recs)-1].Timestamp != 1022025 {
		t.Fatalf("%d records ending at %d ms, want 3,993 ending at 1,022,025 (testdata/traces/README.md)", len(recs), recs[len(recs)-1].Timestamp)
	}
}

func FuzzReadTrace(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]}`))
	f.Add([]byte("{\"timestamp\": 1}\n\n{}"))
	f.Fuzz(func(t *testing.T, in []byte) {
		recs, err := ReadTrace(strings.NewReader(string(in)))
		if err != nil {
			return
		}
		w := Trace{Common: Common{Seed: 1, Vocab: Bytes}, Speedup: 1, MaxContext: 4096}.fromRecords(recs)
		for _, s := range w.Sessions {
			if n := len(s.Prompt(0, nil)); n < 1 || n > 4096 {
				t.Fatalf("prompt of %d tokens", n)
			}
		}
	})
}

func TestPairedGapCells(t *testing.T) {
	w, err := PairedGap{Common: Common{Seed: 3, Vocab: Bytes}, PrefixTokens: 300, SuffixTokens: 20, OutputTokens: 4}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Cells) != len(PairConditions)*len(PairGaps) || len(w.Sessions) != 2*len(w.Cells) {
		t.Fatalf("%d cells, %d sessions", len(w.Cells), len(w.Sessions))
	}
	prefixes := map[string]bool{}
	for i := range w.Cells {
		a, b := w.Sessions[2*i].Prompt(0, nil), w.Sessions[2*i+1].Prompt(0, nil)
		if len(a) != 320 || a[:300] != b[:300] || a == b {
			t.Fatalf("cell %d: a pair shares its 300-token prefix and differs after it", i)
		}
		prefixes[a[:300]] = true
	}
	if len(prefixes) != len(w.Cells) {
		t.Fatal("two cells share a prefix: one cell's blocks would be another's hits")
	}
	if _, err := (PairedGap{PrefixTokens: 0, SuffixTokens: 1, OutputTokens: 1}).Generate(); err == nil {
		t.Fatal("an empty prefix accepted")
	}
}

func TestSequentialBurst(t *testing.T) {
	w, err := Burst{Common: Common{Seed: 1, Vocab: Bytes}, Siblings: 4, PrefixTokens: 100, SuffixTokens: 10, OutputTokens: 2,
		Sequential: true, Gap: 1500 * time.Millisecond, Stages: Ladder([]float64{1}, 2*time.Second), Arrival: Constant}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Sessions) != 2 || w.Requests() != 8 {
		t.Fatalf("%d sessions, %d requests: want one session of 4 turns per burst", len(w.Sessions), w.Requests())
	}
	s := w.Sessions[0]
	answers := []string{"A", "B", "C"}
	for k := range s.Turns {
		p := s.Prompt(k, answers)
		if len(p) != 110 || p[:100] != s.Prompt(0, nil)[:100] {
			t.Fatalf("turn %d: %q is not the shared prefix and its own suffix alone", k, p)
		}
		if want := time.Duration(0); k > 0 {
			want = 1500 * time.Millisecond
			if s.Turns[k].Think != want {
				t.Fatalf("turn %d waits %v after the previous answer, want %v", k, s.Turns[k].Think, want)
			}
		}
	}
}

func TestFaultsSendsTheSharedPrefixRequests(t *testing.T) {
	kind, _, err := ParseKind("faults")
	if err != nil || kind != KindFaults {
		t.Fatalf("ParseKind(faults) = %q, %v", kind, err)
	}
	spec := Spec{Seed: 3, Vocab: Bytes, Users: 2, SystemTokens: 200, QuestionTokens: 20, OutputTokens: 5, PrefixFill: 0.48,
		Rates: []float64{50}, StageDuration: time.Second, Arrival: Poisson}
	lim := Limits{KVTokens: 2000}
	spec.Kind = KindSharedPrefix
	shared, err := Build(spec, lim)
	if err != nil {
		t.Fatal(err)
	}
	spec.Kind = KindFaults
	faults, err := Build(spec, lim)
	if err != nil {
		t.Fatal(err)
	}
	if faults.Name != KindFaults || shared.Name != KindSharedPrefix || faults.Params["prefix_fill"] != 0.48 {
		t.Fatalf("names %q, %q; params %v", faults.Name, shared.Name, faults.Params)
	}
	if len(faults.Sessions) == 0 || len(faults.Sessions) != len(shared.Sessions) {
		t.Fatalf("%d sessions, shared-prefix %d", len(faults.Sessions), len(shared.Sessions))
	}
	for i := range faults.Sessions {
		a, b := &faults.Sessions[i], &shared.Sessions[i]
		if a.Start != b.Start || a.Group != b.Group || a.Prompt(0, nil) != b.Prompt(0, nil) {
			t.Fatalf("session %d differs from shared-prefix's", i)
		}
	}
}
