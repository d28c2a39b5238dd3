package flatmap

import (
	"maps"
	"math/rand/v2"
	"testing"
)

// TestMatchesAGoMap drives a Map and a Go map with the same random puts,
// upserts and deletes and checks every key after each step: on keys that
// share a home slot (deletion must shift entries back across the wrap), on
// consecutive integers and on spread hashes, through growth and Clear.
func TestMatchesAGoMap(t *testing.T) {
	tests := []struct {
		name  string
		hint  int
		space int
		key   func(i int) uint64
	}{
		{"sequential", 0, 24, func(i int) uint64 { return uint64(i) }},
		{"spread", 4, 64, func(i int) uint64 { return uint64(i) * 0x9E3779B97F4A7C15 }},
		{"one home", 8, 12, func(i int) uint64 { return uint64(i) << 60 }},
		{"zero key", 0, 3, func(i int) uint64 { return uint64(i) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := New[int](tc.hint)
			want := map[uint64]int{}
			rng := rand.New(rand.NewPCG(1, 2))
			for step := range 20000 {
				k := tc.key(rng.IntN(tc.space))
				switch op := rng.IntN(100); {
				case op < 40:
					m.Put(k, step)
					want[k] = step
				case op < 60:
					p, existed := m.Upsert(k)
					_, had := want[k]
					if existed != had {
						t.Fatalf("step %d: Upsert(%d) existed %v, want %v", step, k, existed, had)
					}
					*p += 1
					want[k]++
				case op < 99:
					_, had := want[k]
					if got := m.Delete(k); got != had {
						t.Fatalf("step %d: Delete(%d) = %v, want %v", step, k, got, had)
					}
					delete(want, k)
				default:
					m.Clear()
					clear(want)
				}
				got := map[uint64]int{}
				for k, v := range m.All() {
					got[k] = v
				}
				if !maps.Equal(got, want) {
					t.Fatalf("step %d: All yields %v, want %v", step, got, want)
				}
				if m.Len() != len(want) {
					t.Fatalf("step %d: Len %d, want %d", step, m.Len(), len(want))
				}
				for i := range tc.space {
					k := tc.key(i)
					v, ok := m.Get(k)
					w, had := want[k]
					if ok != had || v != w {
						t.Fatalf("step %d: Get(%d) = %d, %v; want %d, %v", step, k, v, ok, w, had)
					}
					if p := m.Ptr(k); (p != nil) != had || (p != nil && *p != w) {
						t.Fatalf("step %d: Ptr(%d) disagrees with Get", step, k)
					}
				}
			}
		})
	}
}

func TestZeroValueIsEmpty(t *testing.T) {
	var m Map[string]
	if _, ok := m.Get(1); ok || m.Ptr(1) != nil || m.Delete(1) || m.Len() != 0 {
		t.Fatal("zero map not empty")
	}
	m.Put(1, "a")
	if v, ok := m.Get(1); !ok || v != "a" {
		t.Fatalf("Get after Put = %q, %v", v, ok)
	}
}

// BenchmarkGetLarge looks up random present keys of a map far larger than
// the CPU caches, next to a Go map of the same keys: the access pattern of
// the simulator's block tables and the index's engine-hash map.
func BenchmarkGetLarge(b *testing.B) {
	const n = 1 << 20
	keys := make([]uint64, n)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range keys {
		keys[i] = rng.Uint64()
	}
	order := make([]uint64, 1<<16)
	for i := range order {
		order[i] = keys[rng.IntN(n)]
	}
	b.Run("flatmap", func(b *testing.B) {
		m := New[uint64](n)
		for _, k := range keys {
			m.Put(k, k)
		}
		b.ResetTimer()
		var sum uint64
		for i := 0; i < b.N; i++ {
			v, _ := m.Get(order[i&(len(order)-1)])
			sum += v
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/get")
		sink = sum
	})
	b.Run("gomap", func(b *testing.B) {
		m := make(map[uint64]uint64, n)
		for _, k := range keys {
			m[k] = k
		}
		b.ResetTimer()
		var sum uint64
		for i := 0; i < b.N; i++ {
			sum += m[order[i&(len(order)-1)]]
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/get")
		sink = sum
	})
}

var sink uint64
