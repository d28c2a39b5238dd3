package kvindex

import (
	"crypto/sha256"
	"testing"
	"time"
)

// BenchmarkKeys8192 measures block keys for an 8,192-token prompt (512
// blocks of 16) per algorithm, and in the same run the cost of plain
// SHA-256 over the exact bytes each algorithm hashes. The reported ratio is
// (serialize + hash + chain) / (SHA-256 of pre-serialized bytes): the price
// of doing vLLM's serialization on the fly.
func BenchmarkKeys8192(b *testing.B) {
	tokens := seqTokens(8192)
	for _, algo := range []HashAlgo{AlgoSHA256, AlgoSHA256CBOR, AlgoXXHash, AlgoXXHashCBOR} {
		b.Run(algo.String(), func(b *testing.B) {
			h, err := NewHasher(algo, "0", 16)
			if err != nil {
				b.Fatal(err)
			}
			// The exact serialized blocks, for the baseline.
			digests, _ := h.Digests(nil, tokens, RequestExtras{})
			blocks := make([][]byte, len(digests))
			parent := h.Root()
			for i := range digests {
				blocks[i], _ = h.Serialize(nil, parent, tokens[i*16:(i+1)*16], nil)
				parent = digests[i]
			}
			// Interleave the two measurements prompt by prompt so that load
			// from other processes hits both alike.
			keys := make([]Key, 0, 512)
			var keysTime, baseTime time.Duration
			var sink byte
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				keys, _ = h.Keys(keys[:0], tokens, RequestExtras{})
				t1 := time.Now()
				for _, blk := range blocks {
					s := sha256.Sum256(blk)
					sink ^= s[0]
				}
				t2 := time.Now()
				keysTime += t1.Sub(t0)
				baseTime += t2.Sub(t1)
			}
			_ = sink
			perPrompt := float64(keysTime.Nanoseconds()) / float64(b.N)
			baseline := float64(baseTime.Nanoseconds()) / float64(b.N)
			b.ReportMetric(perPrompt/1e3, "µs/prompt")
			b.ReportMetric(baseline/1e3, "µs/plain-sha256")
			b.ReportMetric(perPrompt/baseline, "ratio-to-sha256")
		})
	}
}
