package speculative

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(c *Config)
		errs []string // substrings, one per expected problem
	}{
		{"defaults", func(*Config) {}, nil},
		{"fixed TTL", func(c *Config) { c.TTL = 1500 * time.Millisecond }, nil},
		{"holdback off", func(c *Config) { c.Holdback = 0 }, nil},
		{"holdback at its bound", func(c *Config) { c.Holdback = 0.5 }, nil},
		{"percentile 1", func(c *Config) { c.TTLPercentile = 1 }, []string{"--speculative-ttl-percentile: 1 is not a fraction"}},
		{"percentile 0", func(c *Config) { c.TTLPercentile = 0 }, []string{"--speculative-ttl-percentile: 0 is not"}},
		{"percentile NaN", func(c *Config) { c.TTLPercentile = math.NaN() }, []string{"--speculative-ttl-percentile"}},
		{"negative TTL", func(c *Config) { c.TTL = -time.Second }, []string{"--speculative-ttl -1s"}},
		{"TTL beyond max-stale", func(c *Config) { c.TTL = 6 * time.Second }, []string{"--speculative-ttl 6s exceeds --speculative-max-stale 5s"}},
		{"max-stale 0", func(c *Config) { c.MaxStale = 0 }, []string{"--speculative-max-stale must be positive"}},
		{"holdback above half", func(c *Config) { c.Holdback = 0.6 }, []string{"--holdback 0.6"}},
		{"holdback negative", func(c *Config) { c.Holdback = -0.1 }, []string{"--holdback -0.1"}},
		{"every problem at once", func(c *Config) { c.TTLPercentile, c.Holdback, c.MaxStale = 2, 1, -1 },
			[]string{"--speculative-max-stale", "--speculative-ttl-percentile", "--holdback"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.mod(&c)
			err := c.Validate()
			if len(tt.errs) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate accepted %+v", c)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tt.errs) {
				t.Fatalf("Validate: %q, want %d problems", lines, len(tt.errs))
			}
			for i, want := range tt.errs {
				if !strings.Contains(lines[i], want) {
					t.Errorf("problem %d: %q, want %q", i, lines[i], want)
				}
			}
		})
	}
}

// TestNewFillsZeros: a configuration filled in by hand takes the defaults
// where its zero means nothing; New refuses what Validate refuses.
func TestNewFillsZeros(t *testing.T) {
	s, err := New(Config{}, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if s.cfg != (Config{TTLPercentile: 0.99, MaxStale: 5 * time.Second}) {
		t.Fatalf("filled config %+v", s.cfg)
	}
	if _, err := New(Config{Holdback: 0.7}, Deps{}); err == nil || !strings.Contains(err.Error(), "speculative: --holdback") {
		t.Fatalf("New with a bad holdback: %v", err)
	}
}

func TestParseTTL(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		err  string
	}{
		{"auto", 0, ""},
		{" auto ", 0, ""},
		{"1500ms", 1500 * time.Millisecond, ""},
		{"2s", 2 * time.Second, ""},
		{"0s", 0, "must be positive"},
		{"-1s", 0, "must be positive"},
		{"soon", 0, "neither auto nor a duration"},
		{"", 0, "neither auto nor a duration"},
	}
	for _, tt := range tests {
		got, err := ParseTTL(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("ParseTTL(%q) = %s, %v; want an error %q", tt.in, got, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseTTL(%q) = %s, %v; want %s", tt.in, got, err, tt.want)
		}
		if back, err := ParseTTL(FormatTTL(got)); err != nil || back != got {
			t.Errorf("FormatTTL(%s) = %q does not parse back: %s, %v", got, FormatTTL(got), back, err)
		}
	}
}
