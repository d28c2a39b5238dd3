package bpe

import (
	"fmt"
	"os"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
)

// BenchmarkCorpus encodes every parity-corpus string on its own (as the HF
// oracle did), without a segment cache; MB/s is the encoder's throughput.
func BenchmarkCorpus(b *testing.B) {
	corpus := loadCorpus(b)
	n := totalBytes(corpus)
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

// BenchmarkLongPrompt encodes one long chat-shaped prompt (the corpus's
// longer paragraphs between qwen3-style turn markers, about 25 KB) without a
// segment cache, after one warm-up encode: the cost of a prompt the router
// has never seen, in a process whose word cache is warm. This is the cold
// case of the router's 4k-token chat goal.
func BenchmarkLongPrompt(b *testing.B) {
	prompt := chatShapedPrompt(b, 25000)
	for _, model := range []string{"qwen3", "llama3_1", "deepseek_v3"} {
		b.Run(model, func(b *testing.B) {
			tk, err := Load(modelPath(b, model))
			if err != nil {
				b.Fatal(err)
			}
			ids, err := tk.Encode(prompt, false)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(prompt)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tk.Encode(prompt, false); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(ids)), "tokens")
		})
	}
}

// chatShapedPrompt joins the corpus's longer paragraphs between qwen3-style
// turn markers until the text passes size bytes.
func chatShapedPrompt(tb testing.TB, size int) string {
	var sb strings.Builder
	n := 0
	for _, s := range loadCorpus(tb) {
		if len(s) < 400 || len(s) > 4000 || strings.Contains(s, "<|") || strings.Contains(s, "<｜") {
			continue
		}
		role := []string{"user", "assistant"}[n%2]
		fmt.Fprintf(&sb, "<|im_start|>%s\n%s<|im_end|>\n", role, s)
		if n++; sb.Len() > size {
			break
		}
	}
	return sb.String()
}

// totalBytes is what a benchmark over texts reports MB/s against.
func totalBytes(texts []string) int64 {
	var n int64
	for _, t := range texts {
		n += int64(len(t))
	}
	return n
}

// BenchmarkLoad parses each tokenizer.json as Parse does and as it did with
// encoding/json (referenceDecode), alternating within one run so that both
// see the same machine; it first checks that both read the same file.
// ns/op is the two together; ms/load and ms/load-encoding-json each alone.
func BenchmarkLoad(b *testing.B) {
	for _, model := range []string{"qwen3", "llama3_1", "deepseek_v3"} {
		b.Run(model, func(b *testing.B) {
			data, err := os.ReadFile(modelPath(b, model))
			if err != nil {
				b.Fatal(err)
			}
			got, err := decodeFile(data)
			if err != nil {
				b.Fatal(err)
			}
			want, err := referenceDecode(data)
			if err != nil {
				b.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				b.Fatal("decodeFile and encoding/json read different files")
			}
			var reader, encodingJSON time.Duration
			for b.Loop() {
				// Each from a collected heap, so that neither pays for the
				// other's garbage.
				runtime.GC()
				start := time.Now()
				if _, err := Parse(data); err != nil {
					b.Fatal(err)
				}
				runtime.GC()
				mid := time.Now()
				f, err := referenceDecode(data)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := build(f); err != nil {
					b.Fatal(err)
				}
				reader += mid.Sub(start)
				encodingJSON += time.Since(mid)
			}
			n := float64(b.N)
			b.ReportMetric(reader.Seconds()*1e3/n, "ms/load")
			b.ReportMetric(encodingJSON.Seconds()*1e3/n, "ms/load-encoding-json")
			b.ReportMetric(float64(len(data))/1e6, "MB")
		})
	}
}
