package sim

import (
	"math"
	"testing"
)

func TestProfiles(t *testing.T) {
	tests := []struct {
		name        string
		kvTokens    int
		peakPrefill float64 // tokens/s of full-budget steps
	}{
		{"h100-8b", 434176, 39440},
		{"h100x2-32b", 307328, 20040},
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
