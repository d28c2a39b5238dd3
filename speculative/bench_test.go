package speculative

import (
	"fmt"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// The request path's costs: a lookup per candidate of every decision, a
// prediction and an arm assignment per dispatched request. Run with
// go test ./speculative -run '^$' -bench . -benchmem.

// BenchmarkLookup: one candidate's predicted run.
func BenchmarkLookup(b *testing.B) {
	prompt := keyRange(0, 125) // a 2,000-token prompt at block size 16
	cases := []struct {
		name      string
		predicted []kvindex.Key // pending on the target
		confirmed int
		want      int
	}{
		{"no predictions on the target", nil, 0, 0},
		{"predictions elsewhere in the keyspace", keyRange(10_000, 500), 10, 0},
		{"run of 115 predicted blocks", prompt[10:], 10, 115},
		{"run of 8 predicted blocks", prompt[10:18], 10, 8},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			r := newRig(b, DefaultConfig())
			r.AddTarget(podA)
			if c.predicted != nil {
				r.Predict(dispatch(podA, "leader"), c.predicted)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if got := r.Lookup(podA, prompt, c.confirmed).Blocks; got != c.want {
					b.Fatalf("lookup %d blocks, want %d", got, c.want)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/lookup")
		})
	}
	b.Run("parallel run of 115 predicted blocks", func(b *testing.B) {
		r := newRig(b, DefaultConfig())
		r.Predict(dispatch(podA, "leader"), prompt[10:])
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if r.Lookup(podA, prompt, 10).Blocks != 115 {
					panic("lookup")
				}
			}
		})
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/lookup")
	})
}

// BenchmarkPredict: a dispatch's predictions, new or repeating pending
// ones, with expiry and cohort upkeep as Run does it. The clock moves as
// one pod at its peak prefill throughput stores new blocks (20,480 tokens
// a second, the peak the h100x2-32b profile is calibrated to in
// sim/README.md, "Hardware profiles": 1,280 blocks of 16),
// so that about 2,600 predictions are live at the initial 2 s TTL; "ten
// pods' worth" puts ten times that on one target.
func BenchmarkPredict(b *testing.B) {
	const blocksPerSecond = 20480 / 16
	for _, c := range []struct {
		name    string
		blocks  int
		load    int
		confirm bool // each request's blocks are confirmed about half a second later
	}{
		{"8 new blocks, all expire", 8, 1, false},
		{"125 new blocks, all expire", 125, 1, false},
		{"125 new blocks, ten pods' worth, all expire", 125, 10, false},
		{"125 new blocks, confirmed, with the confirmations", 125, 1, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			r := newRig(b, DefaultConfig())
			step := time.Second * time.Duration(c.blocks) / time.Duration(blocksPerSecond*c.load)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				r.Predict(dispatch(podA, "r"), keyRange(i*c.blocks, c.blocks))
				if j := i - 5; c.confirm && j >= 0 {
					r.confirm(podA, keyRange(j*c.blocks, c.blocks))
				}
				r.clock.Advance(step)
				if i%100 == 99 {
					r.tick()
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*c.blocks), "ns/block")
		})
	}
	b.Run("125 blocks already pending", func(b *testing.B) {
		r := newRig(b, DefaultConfig())
		keys := keyRange(0, 125)
		r.Predict(dispatch(podA, "leader"), keys)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			r.Predict(dispatch(podA, "r"), keys)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*125), "ns/block")
	})
}

// BenchmarkConfirm: one BlockStored batch of 16 keys, predicted or not.
func BenchmarkConfirm(b *testing.B) {
	for _, predicted := range []bool{true, false} {
		b.Run(fmt.Sprintf("predicted=%v", predicted), func(b *testing.B) {
			r := newRig(b, DefaultConfig())
			r.Predict(dispatch(podA, "other"), keyRange(1<<40, 64)) // never confirmed
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				keys := keyRange(i*16, 16)
				if predicted {
					b.StopTimer()
					r.Predict(dispatch(podA, "r"), keys)
					b.StartTimer()
				}
				r.confirm(podA, keys)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/batch")
		})
	}
}

// BenchmarkAssign: a request's arm behind a shared 40-block system
// prompt, by its prompt.
func BenchmarkAssign(b *testing.B) {
	// A 40-block system prompt, and a 170-block one (2,700 tokens of 16)
	// in front of conversations 500 blocks long: the record walks every
	// block the decision read.
	for _, tc := range []struct{ system, own int }{{40, 80}, {170, 500}} {
		b.Run(fmt.Sprintf("system=%d,own=%d", tc.system, tc.own), func(b *testing.B) {
			r := newRig(b, DefaultConfig())
			system := keyRange(1, tc.system)
			const conversations = 1000
			prompts := make([][]kvindex.Key, conversations)
			for c := range prompts {
				prompts[c] = append(append([]kvindex.Key(nil), system...), keyRange(1_000_000+c*1000, tc.own)...)
				r.Assign(Conversation{Model: "m", Keys: prompts[c]})
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if a := r.Assign(Conversation{Model: "m", Keys: prompts[i%conversations]}); a.Basis != BasisPrompt {
					b.Fatalf("basis %v", a.Basis)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/assign")
		})
	}
}

// BenchmarkTrust: a candidate's trust (the stream's state and the
// published posterior).
func BenchmarkTrust(b *testing.B) {
	r := newRig(b, DefaultConfig())
	r.AddTarget(podA)
	ids := []targetid.ID{podA, podB}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		_ = r.Trust(ids[i%2])
	}
}
