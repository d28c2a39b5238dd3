package sim

import (
	"math/rand/v2"
	"testing"

	"github.com/prefixrouter/prefixrouter/kvindex"
)

// BenchmarkBlockPoolRequests drives one pod's block pool the way the llm-d
// ladder does, without the scheduler: a pool of an h100x2-32b pod (19,208
// blocks), prompts of 450 blocks whose first 375 are one of 150 shared
// prefixes, each looked up, its missing blocks allocated (evicting the
// least recently freed), registered and freed again. It reports the cost
// per prompt block, the unit of the simulator's cache work.
func BenchmarkBlockPoolRequests(b *testing.B) {
	const (
		blocks   = 19208
		prefixes = 150
		shared   = 375
		perReq   = 450
	)
	prefix := make([][]kvindex.Digest, prefixes)
	rng := rand.New(rand.NewPCG(5, 6))
	randomDigest := func() kvindex.Digest {
		var raw [32]byte
		for i := 0; i < 32; i += 8 {
			v := rng.Uint64()
			for j := range 8 {
				raw[i+j] = byte(v >> (8 * j))
			}
		}
		d, err := kvindex.DigestFromBytes(raw[:])
		if err != nil {
			b.Fatal(err)
		}
		return d
	}
	for i := range prefix {
		prefix[i] = make([]kvindex.Digest, shared)
		for j := range prefix[i] {
			prefix[i][j] = randomDigest()
		}
	}
	// Unique tails come from a pool made up front, far larger than the
	// cache, so that digest making stays out of the measurement.
	tails := make([]kvindex.Digest, 1<<18)
	for i := range tails {
		tails[i] = randomDigest()
	}
	next := 0
	p := newBlockPool(blocks)
	hashes := make([]kvindex.Digest, perReq)
	var hits, ids []int32
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		copy(hashes, prefix[rng.IntN(prefixes)])
		for j := shared; j < perReq; j++ {
			hashes[j] = tails[next%len(tails)]
			next++
		}
		hits = p.lookup(hits[:0], hashes, perReq)
		p.touch(hits)
		ids = p.allocate(append(ids[:0], hits...), perReq-len(hits))
		for j := len(hits); j < perReq; j++ {
			p.cache(ids[j], hashes[j])
		}
		for l, r := 0, len(ids)-1; l < r; l, r = l+1, r-1 {
			ids[l], ids[r] = ids[r], ids[l]
		}
		p.free(ids)
		p.pending = p.pending[:0]
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perReq), "ns/block")
}
