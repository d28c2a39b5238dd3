package bpe

import "testing"

// BenchmarkCorpus encodes every parity-corpus string on its own (as the HF
// oracle did), without a segment cache; MB/s is the encoder's throughput.
func BenchmarkCorpus(b *testing.B) {
	corpus := loadCorpus(b)
	var n int64
	for _, s := range corpus {
		n += int64(len(s))
	}
	for _, model := range []string{"qwen3", "llama3_1", "deepseek_v3"} {
		b.Run(model, func(b *testing.B) {
			tk, err := Load(modelPath(b, model))
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(n)
			b.ResetTimer()
			for b.Loop() {
				for _, s := range corpus {
					if _, err := tk.Encode(s, false); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
