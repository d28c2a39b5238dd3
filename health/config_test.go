package health

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(*Config)
		wantErr []string // each must appear; none: valid
	}{
		{name: "defaults", edit: func(*Config) {}},
		{name: "no targets is valid for the monitor", edit: func(c *Config) { c.Endpoints = nil }},
		{name: "endpoint named with its value", edit: func(c *Config) { c.Endpoints = []string{"10.0.0.1:8000"} },
			wantErr: []string{`--endpoint "10.0.0.1:8000": `, "missing scheme"}},
		{name: "dns entry", edit: func(c *Config) { c.DiscoverDNS = []string{"vllm"} }, wantErr: []string{`--discover-dns "vllm"`}},
		{name: "zero duration", edit: func(c *Config) { c.DrainTimeout = 0 }, wantErr: []string{"--drain-timeout must be positive, not 0s"}},
		{name: "zero count", edit: func(c *Config) { c.BreakerFailures = 0 }, wantErr: []string{"--breaker-failures must be at least 1, not 0"}},
		{name: "breaker cooldowns out of order", edit: func(c *Config) { c.BreakerCooldown, c.BreakerMaxCooldown = time.Minute, time.Second },
			wantErr: []string{"--breaker-max-cooldown 1s is shorter than --breaker-cooldown 1m0s"}},
		{name: "every problem at once", edit: func(c *Config) {
			c.ProbeTimeout, c.ProbeInterval = time.Second, time.Millisecond
			c.FailureThreshold = -2
		}, wantErr: []string{"--health-probe-timeout 1s exceeds --health-probe-interval 1ms", "--health-failure-threshold must be at least 1, not -2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Endpoints = []string{"http://10.0.0.1:8000"}
			tt.edit(&c)
			err := c.Validate()
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("valid config refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted; want errors %q", tt.wantErr)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestNewFillsOnlyRefusedZeros: New takes a zero that Validate refuses as
// its default, and keeps what was given.
func TestNewFillsOnlyRefusedZeros(t *testing.T) {
	c := Config{ProbeInterval: 7 * time.Second}
	if c.Validate() == nil {
		t.Fatal("a config with zero intervals passed Validate")
	}
	c.fill()
	if err := c.Validate(); err != nil {
		t.Fatalf("filled config refused: %v", err)
	}
	want := DefaultConfig()
	want.ProbeInterval = 7 * time.Second
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("filled %+v, want %+v", c, want)
	}
}
