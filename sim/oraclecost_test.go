package sim

import (
	"slices"
	"testing"
)

// TestOracleCosts: an uncached token costs the oracle twice while some rank
// is idle, and 1 + the recompute weight once every rank has two prompts'
// worth of work; the queue and decoding count as they are.
func TestOracleCosts(t *testing.T) {
	const prompt = 1000
	cases := []struct {
		name   string
		states []RankState
		want   []float64
	}{
		{"an idle rank: a miss costs twice", []RankState{{CachedTokens: 1000}, {}},
			[]float64{0, 2000}},
		{"half a prompt's work on the least busy: 1 + 16 × 0.25", []RankState{{QueuedPrefillTokens: 500}, {QueuedPrefillTokens: 3000, CachedTokens: 600}},
			[]float64{500 + 5*1000, 3000 + 5*400}},
		{"no capacity to spare: 1 + 16", []RankState{{QueuedPrefillTokens: 2000}, {QueuedPrefillTokens: 2000, Running: 10, CachedTokens: 900}},
			[]float64{2000 + 17*1000, 2000 + 32*10 + 17*100}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := OracleCosts(nil, c.states, prompt, 32, 16); !slices.Equal(got, c.want) {
				t.Fatalf("costs %v, want %v", got, c.want)
			}
		})
	}
}
