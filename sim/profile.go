package sim

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Profile is the hardware and model a simulated pod stands for: its KV-cache
// capacity, its scheduler limits and the coefficients of the step-time model
//
//	step = StepFixed + PrefillPerToken × uncached tokens + DecodePerSeq × decoding sequences.
//
// All durations are model time; Config.TimeScale maps them to wall time.
type Profile struct {
	Name        string
	Description string
	// Model is the served model name reported by /v1/models.
	Model string
	// MaxModelLen bounds prompt + output tokens per request (vLLM's max_model_len).
	MaxModelLen int
	// BlockSize is tokens per KV-cache block (vLLM's --block-size).
	BlockSize int
	// NumGPUBlocks is the KV-cache capacity in blocks.
	NumGPUBlocks int
	// MaxNumBatchedTokens is the per-step token budget (chunked prefill).
	MaxNumBatchedTokens int
	// MaxNumSeqs bounds the running batch.
	MaxNumSeqs int
	// StepFixed is the cost of a step regardless of its content (weights read,
	// launch and scheduling overhead).
	StepFixed time.Duration
	// PrefillPerToken is the cost of one uncached prompt token.
	PrefillPerToken time.Duration
	// DecodePerSeq is the cost of one decoding sequence in a step.
	DecodePerSeq time.Duration
}

// KVTokens is the KV-cache capacity in tokens.
func (p Profile) KVTokens() int { return p.NumGPUBlocks * p.BlockSize }

// StepTime is the model time of one step.
func (p Profile) StepTime(prefillTokens, decodeSeqs int) time.Duration {
	return p.StepFixed + time.Duration(prefillTokens)*p.PrefillPerToken + time.Duration(decodeSeqs)*p.DecodePerSeq
}

// PeakPrefillTokensPerSec is the prefill throughput of full-budget steps.
func (p Profile) PeakPrefillTokensPerSec() float64 {
	st := p.StepTime(p.MaxNumBatchedTokens, 0)
	return float64(p.MaxNumBatchedTokens) / st.Seconds()
}

// Validate reports a profile that cannot run.
func (p Profile) Validate() error {
	switch {
	case p.BlockSize <= 0 || p.BlockSize > 4096:
		return fmt.Errorf("profile %q: block size %d out of range 1..4096", p.Name, p.BlockSize)
	case p.NumGPUBlocks <= 0:
		return fmt.Errorf("profile %q: num_gpu_blocks must be positive", p.Name)
	case p.MaxNumBatchedTokens <= 0:
		return fmt.Errorf("profile %q: max_num_batched_tokens must be positive", p.Name)
	case p.MaxNumSeqs <= 0:
		return fmt.Errorf("profile %q: max_num_seqs must be positive", p.Name)
	case p.MaxModelLen <= 1:
		return fmt.Errorf("profile %q: max_model_len must exceed 1", p.Name)
	case p.StepFixed < 0 || p.PrefillPerToken < 0 || p.DecodePerSeq < 0:
		return fmt.Errorf("profile %q: negative step cost", p.Name)
	case p.Model == "":
		return fmt.Errorf("profile %q: no model name", p.Name)
	}
	return nil
}

// Profiles derived in README.md ("Hardware profiles"); profile_test.go
// recomputes every number from the derivation. The calibration point is
// llm-d's peak prefill of 20,480 tokens/s for Qwen3-32B on TP2 H100: a full
// 8,192-token step must then take 8,192 / 20,480 = 400 ms, so with the 15.5
// ms fixed cost the marginal prefill cost is (400 − 15.5) ms / 8,192 =
// 46.936 µs per token. That is 2 × 32.8e9 FLOP / 2 GPUs / 46.936 µs = 698.8
// TFLOP/s per GPU (71% of the bf16 dense peak), the effective rate used for
// the 8B model too. Effective HBM bandwidth is 75% of 3.35 TB/s = 2.5 TB/s.
var profiles = map[string]Profile{
	"h100-8b": {
		Name:        "h100-8b",
		Description: "one H100 80GB serving a Llama-3.1-8B-class model (bf16, 128 KiB KV per token)",
		Model:       "meta-llama/Llama-3.1-8B-Instruct",
		MaxModelLen: 131072,
		BlockSize:   16,
		// 0.9 × 80 GiB − 15 GiB weights − 4 GiB activations/graphs = 53 GiB
		// = 434,176 tokens at 128 KiB = 27,136 blocks.
		NumGPUBlocks:        27136,
		MaxNumBatchedTokens: 8192,
		MaxNumSeqs:          1024,
		// 16.06 GB of weights read per step at 2.5 TB/s = 6.4 ms, + ~0.6 ms overhead.
		StepFixed: 7 * time.Millisecond,
		// 2 × 8.03e9 FLOP / 698.8 TFLOP/s = 22.981 µs.
		PrefillPerToken: 22981 * time.Nanosecond,
		// 22.981 µs of compute + KV read of a 1,024-token context
		// (1,024 × 128 KiB / 2.5 TB/s = 53.687 µs) = 76.668 µs.
		DecodePerSeq: 76668 * time.Nanosecond,
	},
	"h100x2-32b": {
		Name:        "h100x2-32b",
		Description: "two H100 80GB (TP2) serving Qwen3-32B (bf16, 256 KiB KV per token, 307,328 KV tokens per pod)",
		Model:       "Qwen/Qwen3-32B",
		MaxModelLen: 40960,
		BlockSize:   16,
		// 307,328 KV tokens (llm-d's published figure) / 16 = 19,208 blocks.
		NumGPUBlocks:        19208,
		MaxNumBatchedTokens: 8192,
		MaxNumSeqs:          1024,
		// 65.6 GB of bf16 weights, 32.8 GB per GPU, read at 2.5 TB/s =
		// 13.1 ms, + 128 all-reduces × ~15 µs = 1.9 ms, + ~0.5 ms
		// overhead = 15.5 ms.
		StepFixed: 15500 * time.Microsecond,
		// (8,192 / 20,480 s − 15.5 ms) / 8,192 = 46.936 µs, so full
		// 8,192-token steps prefill 20,480 tokens/s.
		PrefillPerToken: 46936 * time.Nanosecond,
		// 46.936 µs of compute + KV read of a 1,024-token context
		// (1,024 × 256 KiB / (2 × 2.5 TB/s) = 53.687 µs) = 100.623 µs.
		DecodePerSeq: 100623 * time.Nanosecond,
	},
	"tiny": {
		Name:                "tiny",
		Description:         "a small, fast pod for tests and demos: 1,024 blocks of 16 tokens, 1 ms steps",
		Model:               "sim-tiny",
		MaxModelLen:         8192,
		BlockSize:           16,
		NumGPUBlocks:        1024,
		MaxNumBatchedTokens: 2048,
		MaxNumSeqs:          64,
		StepFixed:           time.Millisecond,
		PrefillPerToken:     10 * time.Microsecond,
		DecodePerSeq:        20 * time.Microsecond,
	},
}

// DefaultProfile is the profile `prefixrouter sim` uses without --profile.
const DefaultProfile = "h100-8b"

// LookupProfile returns a named profile.
func LookupProfile(name string) (Profile, error) {
	p, ok := profiles[name]
	if !ok {
		return Profile{}, fmt.Errorf("unknown profile %q (want one of %s)", name, strings.Join(ProfileNames(), ", "))
	}
	return p, nil
}

// ProfileNames lists the named profiles, sorted.
func ProfileNames() []string {
	names := make([]string, 0, len(profiles))
	for n := range profiles {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
