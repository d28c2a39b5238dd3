package sim

import (
	"math"
	"testing"
	"time"
)

func TestProfiles(t *testing.T) {
	tests := []struct {
		name        string
		kvTokens    int
		peakPrefill float64 // tokens/s of full-budget steps
	}{
		{"h100-8b", 434176, 41954},
		{"h100x2-32b", 307328, 20480},
		{"tiny", 16384, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := LookupProfile(tc.name)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Validate(); err != nil {
				t.Fatal(err)
			}
			if p.KVTokens() != tc.kvTokens {
				t.Fatalf("KV tokens %d, want %d", p.KVTokens(), tc.kvTokens)
			}
			if tc.peakPrefill > 0 && math.Abs(p.PeakPrefillTokensPerSec()-tc.peakPrefill)/tc.peakPrefill > 0.01 {
				t.Fatalf("peak prefill %.0f tokens/s, want ~%.0f", p.PeakPrefillTokensPerSec(), tc.peakPrefill)
			}
		})
	}
	if _, err := LookupProfile("nope"); err == nil {
		t.Fatal("unknown profile accepted")
	}
}

// TestProfileDerivation recomputes the H100 profiles from the derivation in
// README.md, so the numbers and the text cannot drift apart again.
func TestProfileDerivation(t *testing.T) {
	const (
		params32B, params8B = 32.8e9, 8.03e9
		peakPrefill         = 20480.0 // llm-d's calibration point, tokens/s
		hbm                 = 2.5e12  // effective bytes/s per GPU
		refContext          = 1024    // tokens of KV read per decoding sequence
	)
	big, err := LookupProfile("h100x2-32b")
	if err != nil {
		t.Fatal(err)
	}
	small, err := LookupProfile("h100-8b")
	if err != nil {
		t.Fatal(err)
	}
	near := func(what string, got time.Duration, want float64) {
		t.Helper()
		if math.Abs(got.Seconds()-want) > 1e-9 {
			t.Fatalf("%s %v, derivation gives %.9f s", what, got, want)
		}
	}
	// Weights: bf16, split over the TP ranks, read once per step; plus
	// all-reduces and overhead. README rounds these to 0.1 ms.
	tenth := func(s float64) float64 { return math.Round(s*1e4) / 1e4 }
	near("32B StepFixed", big.StepFixed, tenth(params32B*2/2/hbm+128*15e-6+0.5e-3))
	near("8B StepFixed", small.StepFixed, tenth(params8B*2/hbm+0.6e-3))
	// Full-budget steps of the 32B profile prefill exactly the calibration
	// rate (to the nanosecond the Duration can hold)…
	step := float64(big.MaxNumBatchedTokens) / peakPrefill
	near("32B PrefillPerToken", big.PrefillPerToken, (step-big.StepFixed.Seconds())/float64(big.MaxNumBatchedTokens))
	if got := big.PeakPrefillTokensPerSec(); got < peakPrefill || got > peakPrefill+1 {
		t.Fatalf("32B peak prefill %.2f tokens/s, want 20,480", got)
	}
	// …which fixes the effective compute rate per GPU the 8B profile uses.
	flops := 2 * params32B / 2 / big.PrefillPerToken.Seconds()
	if math.Abs(flops-698.8e12) > 0.05e12 {
		t.Fatalf("effective rate %.1f TFLOP/s, README says 698.8", flops/1e12)
	}
	near("8B PrefillPerToken", small.PrefillPerToken, 2*params8B/flops)
	// Decode: one token of compute plus reading a reference context's KV.
	near("32B DecodePerSeq", big.DecodePerSeq, big.PrefillPerToken.Seconds()+refContext*256*1024/(2*hbm))
	near("8B DecodePerSeq", small.DecodePerSeq, small.PrefillPerToken.Seconds()+refContext*128*1024/hbm)
}

func TestConfigRejects(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"negative pods", Config{Pods: -1}},
		{"dp 0 after defaults is 1, dp 100 rejected", Config{DP: 100}},
		{"overlapping ports", Config{HTTPPort: 15000, EventsPort: 15000}},
		{"port range past 65535", Config{HTTPPort: 65535, Pods: 2}},
		{"repeated LoRA", Config{LoRAs: []string{"a", "a"}}},
		{"LoRA named like the model", Config{Model: "m", LoRAs: []string{"m"}}},
		{"bad fault", Config{Faults: Faults{DropEvents: 2}}},
		{"bad profile", Config{Profile: Profile{Name: "x", NumGPUBlocks: 1}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := CheckConfig(tc.cfg); err == nil {
				t.Fatal("accepted")
			}
		})
	}
	if err := CheckConfig(Config{}); err != nil {
		t.Fatalf("defaults rejected: %v", err)
	}
}
