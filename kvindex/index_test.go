package kvindex

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/prefixrouter/prefixrouter/targetid"
)

func tid(i int) targetid.ID { return targetid.ID{Endpoint: fmt.Sprintf("http://10.0.0.%d:8000", i)} }

func keysN(base, n int) []Key {
	out := make([]Key, n)
	for i := range out {
		out[i] = Key(base*1_000_000 + i + 1)
	}
	return out
}

func matchesByTarget(ms []Match) map[targetid.ID]Match {
	out := map[targetid.ID]Match{}
	for _, m := range ms {
		out[m.Target] = m
	}
	return out
}

func TestLookupLongestRunFromBlockZero(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	k := keysN(1, 8)
	ix.Store(tid(1), TierGPU, k[:5])                     // run 5
	ix.Store(tid(2), TierGPU, k[1:8])                    // misses block 0: no run
	ix.Store(tid(3), TierGPU, append(k[:2:2], k[3:]...)) // hole at 2: run 2
	ix.Store(tid(4), TierGPU, k)                         // full run
	got := matchesByTarget(ix.Lookup(nil, k))
	want := map[targetid.ID]int{tid(1): 5, tid(3): 2, tid(4): 8}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for id, n := range want {
		if got[id].Blocks != n || got[id].Weighted != float64(n) {
			t.Errorf("%v: %+v, want %d blocks", id, got[id], n)
		}
	}
}

func TestRefcountsSurviveDoubleStore(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	k := keysN(1, 1)
	ix.Store(tid(1), TierGPU, k)
	ix.Store(tid(1), TierGPU, k) // vLLM can store the same hash twice
	ix.Remove(tid(1), TierGPU, k)
	if !ix.Has(tid(1), k[0]) {
		t.Fatal("placement gone after removing one of two references")
	}
	ix.Remove(tid(1), TierGPU, k)
	if ix.Has(tid(1), k[0]) {
		t.Fatal("placement still there after removing both references")
	}
	ix.Remove(tid(1), TierGPU, k)
	st := ix.Stats()[0]
	if st.Placements != 0 || st.UnknownRemovals != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestTierWeights(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	k := keysN(1, 4)
	ix.Store(tid(1), TierGPU, k[:2])
	ix.Store(tid(1), TierCPU, k[1:3]) // block 1 in both tiers counts as GPU
	ix.Store(tid(1), TierStorage, k[3:])
	m := ix.Lookup(nil, k)
	if len(m) != 1 || m[0].Blocks != 4 {
		t.Fatalf("%+v", m)
	}
	want := 2*1.0 + 0.8 + 0.5
	if m[0].Weighted != want {
		t.Fatalf("weighted %v, want %v", m[0].Weighted, want)
	}
	// Removing the GPU copy of block 1 leaves the CPU copy.
	ix.Remove(tid(1), TierGPU, k[1:2])
	m = ix.Lookup(nil, k)
	if m[0].Blocks != 4 || m[0].Weighted != 1+0.8+0.8+0.5 {
		t.Fatalf("%+v", m)
	}
}

// TestLookupAsOf: a lookup as of a mark leaves out the blocks placed
// since, and only those, and says when it cannot tell.
func TestLookupAsOf(t *testing.T) {
	k := keysN(1, 10)
	type run struct {
		blocks int
		lost   bool
	}
	for _, tc := range []struct {
		name          string
		before, after func(ix *Index)
		want          map[targetid.ID]run
	}{
		{"nothing placed since",
			func(ix *Index) { ix.Store(tid(1), TierGPU, k) },
			func(ix *Index) {},
			map[targetid.ID]run{tid(1): {10, false}}},
		{"the rest of the prompt placed since",
			func(ix *Index) { ix.Store(tid(1), TierGPU, k[:4]) },
			func(ix *Index) { ix.Store(tid(1), TierGPU, k[4:]) },
			map[targetid.ID]run{tid(1): {4, false}}},
		{"other prompts placed since",
			func(ix *Index) { ix.Store(tid(1), TierGPU, k[:6]) },
			func(ix *Index) { ix.Store(tid(1), TierGPU, keysN(2, 50)) },
			map[targetid.ID]run{tid(1): {6, false}}},
		{"a second reference since",
			func(ix *Index) { ix.Store(tid(1), TierGPU, k) },
			func(ix *Index) { ix.Store(tid(1), TierGPU, k[2:5]) },
			map[targetid.ID]run{tid(1): {10, false}}},
		{"a held block offloaded since",
			func(ix *Index) { ix.Store(tid(1), TierGPU, k) },
			func(ix *Index) { ix.Store(tid(1), TierCPU, k[3:]) },
			map[targetid.ID]run{tid(1): {10, false}}},
		{"blocks held only in a tier placed since",
			func(ix *Index) { ix.Store(tid(1), TierGPU, k[:3]) },
			func(ix *Index) { ix.Store(tid(1), TierCPU, k[3:]) },
			map[targetid.ID]run{tid(1): {3, false}}},
		{"a block removed since",
			func(ix *Index) { ix.Store(tid(1), TierGPU, k) },
			func(ix *Index) { ix.Remove(tid(1), TierGPU, k[5:6]) },
			map[targetid.ID]run{tid(1): {5, false}}},
		{"a block removed and placed again since",
			func(ix *Index) { ix.Store(tid(1), TierGPU, k) },
			func(ix *Index) {
				ix.Remove(tid(1), TierGPU, k[5:6])
				ix.Store(tid(1), TierGPU, k[5:6])
			},
			map[targetid.ID]run{tid(1): {5, false}}},
		{"only the target placing since is cut",
			func(ix *Index) {
				ix.Store(tid(1), TierGPU, k[:2])
				ix.Store(tid(2), TierGPU, k[:7])
			},
			func(ix *Index) { ix.Store(tid(1), TierGPU, k[2:]) },
			map[targetid.ID]run{tid(1): {2, false}, tid(2): {7, false}}},
		{"a target added since",
			func(ix *Index) { ix.Store(tid(1), TierGPU, k[:2]) },
			func(ix *Index) { ix.Store(tid(2), TierGPU, k) },
			map[targetid.ID]run{tid(1): {2, false}}},
		{"a target removed and added again since",
			func(ix *Index) { ix.Store(tid(1), TierGPU, k) },
			func(ix *Index) {
				ix.RemoveTarget(tid(1))
				ix.Store(tid(1), TierGPU, k)
			},
			map[targetid.ID]run{}},
		{"cleared since: lost",
			func(ix *Index) { ix.Store(tid(1), TierGPU, k[:3]) },
			func(ix *Index) {
				ix.Clear(tid(1))
				ix.Store(tid(1), TierGPU, k)
			},
			map[targetid.ID]run{tid(1): {10, true}}},
		{"compacted since: lost",
			func(ix *Index) { ix.Store(tid(1), TierGPU, k) },
			func(ix *Index) {
				churn := keysN(3, 2000)
				ix.Store(tid(1), TierGPU, churn)
				ix.Remove(tid(1), TierGPU, churn)
				ix.Store(tid(1), TierGPU, keysN(4, 1)) // compacts
			},
			map[targetid.ID]run{tid(1): {10, true}}},
		{"evictions consumed the placements since: lost",
			func(ix *Index) {
				ix.SetTargetCap(tid(1), 2)
				ix.Store(tid(1), TierGPU, k[:1])
			},
			func(ix *Index) {
				ix.Store(tid(1), TierGPU, keysN(5, 2))
				ix.Store(tid(1), TierGPU, k[:2])
			},
			map[targetid.ID]run{tid(1): {2, true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := NewIndex(IndexConfig{})
			tc.before(ix)
			mark := ix.MarkStores()
			tc.after(ix)
			got := matchesByTarget(ix.LookupAsOf(nil, k, mark))
			if len(got) != len(tc.want) {
				t.Fatalf("got %+v, want %v", got, tc.want)
			}
			for id, w := range tc.want {
				if m := got[id]; m.Blocks != w.blocks || m.Lost != w.lost {
					t.Errorf("%v: %+v, want %+v", id, m, w)
				}
			}
		})
	}
}

// TestLookupAsOfCutsAcrossGroups: cuts apply to the right slot in every
// group of 64.
func TestLookupAsOfCutsAcrossGroups(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	k := keysN(1, 8)
	for i := range 130 {
		ix.Store(tid(i), TierGPU, k[:4])
	}
	mark := ix.MarkStores()
	for i := range 130 {
		ix.Store(tid(i), TierGPU, k[4:4+i%5])
	}
	got := matchesByTarget(ix.LookupAsOf(nil, k, mark))
	if len(got) != 130 {
		t.Fatalf("%d matches", len(got))
	}
	for id, m := range got {
		if m.Blocks != 4 || m.Lost {
			t.Errorf("%v: %+v, want 4 blocks", id, m)
		}
	}
	if n := matchesByTarget(ix.Lookup(nil, k))[tid(129)].Blocks; n != 8 {
		t.Fatalf("lookup now: %d blocks, want 8", n)
	}
}

func TestClearAndRemoveTarget(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	k := keysN(1, 3)
	ix.Store(tid(1), TierGPU, k)
	ix.Store(tid(2), TierGPU, k)
	ix.Clear(tid(1))
	got := matchesByTarget(ix.Lookup(nil, k))
	if _, ok := got[tid(1)]; ok || got[tid(2)].Blocks != 3 {
		t.Fatalf("after clear: %v", got)
	}
	ix.RemoveTarget(tid(2))
	if m := ix.Lookup(nil, k); len(m) != 0 {
		t.Fatalf("after remove: %v", m)
	}
	// A freed slot is reused without inheriting placements.
	ix.Store(tid(3), TierGPU, k[:1])
	got = matchesByTarget(ix.Lookup(nil, k))
	if len(got) != 1 || got[tid(3)].Blocks != 1 {
		t.Fatalf("after reuse: %v", got)
	}
}

func TestCapEvictsOldestFirst(t *testing.T) {
	ix := NewIndex(IndexConfig{MaxPlacementsPerTarget: 4})
	k := keysN(1, 6)
	ix.Store(tid(1), TierGPU, k[:4])
	ix.Remove(tid(1), TierGPU, k[1:2]) // leaves a stale entry in the order
	ix.Store(tid(1), TierGPU, k[4:6])  // 5 placements: evict the oldest live one
	if ix.Has(tid(1), k[0]) {
		t.Error("oldest placement survived the cap")
	}
	for _, key := range []Key{k[2], k[3], k[4], k[5]} {
		if !ix.Has(tid(1), key) {
			t.Errorf("key %d evicted out of order", key)
		}
	}
	st := ix.Stats()[0]
	if st.Placements != 4 || st.Evicted != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestCapCountsAReStoredPlacementFromItsNewInsertion(t *testing.T) {
	ix := NewIndex(IndexConfig{MaxPlacementsPerTarget: 3})
	k := keysN(1, 5)
	ix.Store(tid(1), TierGPU, k[:3])   // 0 1 2
	ix.Remove(tid(1), TierGPU, k[0:1]) // 1 2
	ix.Store(tid(1), TierGPU, k[0:1])  // 1 2 0 (0 is now the newest)
	ix.Store(tid(1), TierGPU, k[3:4])  // over the cap: 1 goes, not 0
	if ix.Has(tid(1), k[1]) || !ix.Has(tid(1), k[0]) {
		t.Fatalf("re-stored placement evicted through its stale entry")
	}
	// Compaction keeps the same order.
	for i := 0; i < 3000; i++ {
		ix.Store(tid(1), TierGPU, k[4:5])
		ix.Remove(tid(1), TierGPU, k[4:5])
	}
	ix.Store(tid(1), TierGPU, k[1:2]) // 2 0 3 1: evict 2
	if ix.Has(tid(1), k[2]) || !ix.Has(tid(1), k[0]) || !ix.Has(tid(1), k[3]) || !ix.Has(tid(1), k[1]) {
		t.Fatal("eviction order wrong after compaction")
	}
}

func TestSetTargetCap(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	ix.Store(tid(1), TierGPU, keysN(1, 100))
	ix.SetTargetCap(tid(1), 10)
	st, _ := ix.StatsFor(tid(1))
	if st.Placements != 10 || st.Evicted != 90 {
		t.Fatalf("%+v", st)
	}
	if !ix.Has(tid(1), keysN(1, 100)[99]) {
		t.Fatal("newest placement evicted")
	}
}

func TestManyTargetsAcrossGroups(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	k := keysN(1, 10)
	for i := 0; i < 150; i++ {
		ix.Store(tid(i), TierGPU, k[:i%10+1])
	}
	got := matchesByTarget(ix.Lookup(nil, k))
	if len(got) != 150 {
		t.Fatalf("%d matches", len(got))
	}
	for i := 0; i < 150; i++ {
		if got[tid(i)].Blocks != i%10+1 {
			t.Errorf("target %d: %d blocks", i, got[tid(i)].Blocks)
		}
	}
}

func TestConcurrentLookupsDuringUpdates(t *testing.T) {
	ix := NewIndex(IndexConfig{MaxPlacementsPerTarget: 1000})
	k := keysN(1, 64)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var dst []Match
			for {
				select {
				case <-stop:
					return
				default:
				}
				dst = ix.Lookup(dst[:0], k)
				for _, m := range dst {
					if m.Blocks < 0 || m.Blocks > len(k) {
						t.Errorf("impossible match %+v", m)
						return
					}
				}
			}
		}()
	}
	for i := 0; i < 2000; i++ {
		id := tid(i % 8)
		ix.Store(id, TierGPU, k[:i%64+1])
		ix.Remove(id, TierGPU, k[i%64:])
		if i%500 == 0 {
			ix.Clear(id)
		}
	}
	close(stop)
	wg.Wait()
}

// lookupFixture builds 64 targets each holding a different-length prefix of
// a 512-block prompt plus unrelated placements, the shape of a busy fleet.
func lookupFixture() (*Index, []Key) {
	ix := NewIndex(IndexConfig{})
	prompt := keysN(1, 512)
	for i := 0; i < 64; i++ {
		ix.Store(tid(i), TierGPU, prompt[:i*8+1])
		ix.Store(tid(i), TierGPU, keysN(100+i, 2000))
	}
	return ix, prompt
}

func BenchmarkLookup512Keys64Targets(b *testing.B) {
	ix, prompt := lookupFixture()
	dst := make([]Match, 0, 64)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dst = ix.Lookup(dst[:0], prompt)
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/lookup")
}

func BenchmarkApplyStoredEvents(b *testing.B) {
	// Each iteration applies one event storing 16 blocks and, once the
	// target is warm, removes 16 old ones: steady-state churn.
	ix := NewIndex(IndexConfig{})
	const perEvent = 16
	keys := keysN(1, perEvent*b.N+perEvent)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		batch := keys[i*perEvent : (i+1)*perEvent]
		ix.Update(tid(1), func(w *IndexWriter) {
			w.Store(TierGPU, batch)
			if i >= 1000 {
				w.Remove(TierGPU, keys[(i-1000)*perEvent:(i-999)*perEvent])
			}
		})
	}
	events := float64(b.N) * perEvent * 2
	b.ReportMetric(events/b.Elapsed().Seconds()/1e6, "M-block-events/s")
}

func BenchmarkMemoryPerPlacement(b *testing.B) {
	for i := 0; i < b.N; i++ {
		const n = 1 << 20
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		ix := NewIndex(IndexConfig{})
		keys := keysN(1, n)
		for j := 0; j < n; j += 4096 {
			ix.Store(tid(1), TierGPU, keys[j:j+4096])
		}
		keys = nil
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "bytes/placement")
		runtime.KeepAlive(ix)
	}
}

// TestStaleEntriesTrackedOnlyAtTheCap checks that a target whose removals
// keep it below its cap keeps no record of its removed placements, and
// that one at its cap still evicts by each placement's latest insertion.
func TestStaleEntriesTrackedOnlyAtTheCap(t *testing.T) {
	ix := NewIndex(IndexConfig{MaxPlacementsPerTarget: 4})
	k := keysN(1, 8)
	stale := func() int {
		ix.mu.RLock()
		defer ix.mu.RUnlock()
		return ix.targets[ix.slots[tid(1)]].stale.len()
	}
	for range 100 { // a pod churning its cache below the cap
		ix.Store(tid(1), TierGPU, k[:4])
		ix.Remove(tid(1), TierGPU, k[:4])
	}
	ix.Store(tid(1), TierGPU, k[:4])   // 0 1 2 3
	ix.Remove(tid(1), TierGPU, k[1:2]) // 0 2 3
	if n := stale(); n != 0 {
		t.Fatalf("below the cap: %d stale entries recorded", n)
	}
	ix.Store(tid(1), TierGPU, k[1:2]) // 0 2 3 1
	ix.Store(tid(1), TierGPU, k[4:5]) // over the cap: 0 goes
	ix.Remove(tid(1), TierGPU, k[2:3])
	ix.Store(tid(1), TierGPU, k[2:3]) // 3 1 4 2
	if n := stale(); n != 1 {
		t.Fatalf("at the cap: %d stale entries recorded, want 1", n)
	}
	ix.Store(tid(1), TierGPU, k[5:7]) // 4 2 5 6: 3 and 1 go, 2 stays by its new entry
	for i, want := range []bool{false, false, true, false, true, true, true, false} {
		if ix.Has(tid(1), k[i]) != want {
			t.Errorf("key %d held %v, want %v", i, !want, want)
		}
	}
	ix.Clear(tid(1))
	if n := stale(); n != 0 {
		t.Fatalf("after a clear: %d stale entries", n)
	}
}

// TestCapEvictionMatchesAReferenceModel drives the index with random stores,
// removals and cap changes on a few keys (many compactions and stale
// entries) and checks after every step that it holds exactly what a plain
// model holds: placements ordered by their last new insertion, with
// reference counts, the oldest evicted first when over the cap.
func TestCapEvictionMatchesAReferenceModel(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 7))
			ix := NewIndex(IndexConfig{})
			ix.SetTargetCap(tid(1), 24)
			var order []Key // oldest first
			refs := map[Key]int{}
			keys := keysN(1, 40)
			capN := 24
			for step := range 6000 { // about 120 cap changes
				k := keys[rng.IntN(len(keys))]
				switch op := rng.IntN(100); {
				case op < 50:
					ix.Store(tid(1), TierGPU, []Key{k})
					if refs[k] == 0 {
						order = append(order, k)
					}
					refs[k]++
				case op < 98:
					ix.Remove(tid(1), TierGPU, []Key{k})
					if refs[k] > 0 {
						if refs[k]--; refs[k] == 0 {
							order = slices.DeleteFunc(order, func(x Key) bool { return x == k })
						}
					}
				default:
					capN = 8 + rng.IntN(24)
					ix.SetTargetCap(tid(1), capN)
				}
				for len(order) > capN {
					delete(refs, order[0])
					order = order[1:]
				}
				for _, k := range keys {
					if got, want := ix.Has(tid(1), k), refs[k] > 0; got != want {
						t.Fatalf("step %d: key %d held %v, want %v", step, k, got, want)
					}
				}
			}
		})
	}
}
