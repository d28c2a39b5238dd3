package router

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/brain"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(*Config)
		wantErr []string // each must appear; none: valid
	}{
		{name: "defaults with a target", edit: func(*Config) {}},
		{name: "meaningful zeros", edit: func(c *Config) {
			c.AdminListen, c.MaxRetries, c.Events.BlockSize, c.ShutdownTimeout = "", 0, 0, 0
			c.Cost = brain.CostConfig{}
		}},
		{name: "empty seed given", edit: func(c *Config) { c.Events.HashSeed, c.Events.HasHashSeed = "", true }},
		{name: "targets from a file only", edit: func(c *Config) { c.Health.Endpoints, c.Health.EndpointsFile = nil, "endpoints.yaml" }},
		{name: "no targets", edit: func(c *Config) { c.Health.Endpoints = nil },
			wantErr: []string{"no targets: give --endpoint, --endpoints-file or --discover-dns"}},
		{name: "listen without port", edit: func(c *Config) { c.Listen = "localhost" }, wantErr: []string{`--listen "localhost": `}},
		{name: "empty listen", edit: func(c *Config) { c.Listen = "" }, wantErr: []string{`--listen "": empty address`}},
		{name: "admin listen", edit: func(c *Config) { c.AdminListen = "9090" }, wantErr: []string{`--admin-listen "9090"`}},
		{name: "zero policy", edit: func(c *Config) { c.Policy = 0 }, wantErr: []string{"--policy: unknown policy 0"}},
		{name: "negative retries", edit: func(c *Config) { c.MaxRetries = -1 }, wantErr: []string{"--max-retries must not be negative"}},
		{name: "kv threshold", edit: func(c *Config) { c.Cost.KVThreshold = 1.5 }, wantErr: []string{"--kv-threshold 1.5 must be within [0, 1]"}},
		{name: "recompute weight", edit: func(c *Config) { c.Cost.RecomputeWeight = -1 }, wantErr: []string{"--recompute-weight -1 must be a finite number, not negative"}},
		{name: "kv threshold NaN", edit: func(c *Config) { c.Cost.KVThreshold = math.NaN() }, wantErr: []string{"--kv-threshold"}},
		{name: "decode weight", edit: func(c *Config) { c.Cost.DecodeWeight = -1 }, wantErr: []string{"--decode-weight"}},
		{name: "kv pressure", edit: func(c *Config) { c.Cost.KVPressure = math.Inf(1) }, wantErr: []string{"--kv-pressure"}},
		{name: "hash algo", edit: func(c *Config) { c.Events.HashAlgo = "md5" }, wantErr: []string{"--hash-algo"}},
		{name: "seed without its flag", edit: func(c *Config) { c.Events.HashSeed = "0" }, wantErr: []string{`--hash-seed "0" is set but HasHashSeed is false`}},
		{name: "block size", edit: func(c *Config) { c.Events.BlockSize = -16 }, wantErr: []string{"--block-size -16: want 1..", "or 0 to learn it"}},
		{name: "tokenization", edit: func(c *Config) { c.Tokenization = 9 }, wantErr: []string{"--tokenization: unknown mode 9"}},
		{name: "zero timeout", edit: func(c *Config) { c.IdleTimeout = 0 }, wantErr: []string{"--idle-timeout must be positive, not 0s"}},
		{name: "negative shutdown timeout", edit: func(c *Config) { c.ShutdownTimeout = -time.Second }, wantErr: []string{"--shutdown-timeout must not be negative"}},
		{name: "body bytes", edit: func(c *Config) { c.MaxBodyBytes = 0 }, wantErr: []string{"--max-body-bytes must be positive"}},
		{name: "response bytes", edit: func(c *Config) { c.MaxResponseBytes = -1 }, wantErr: []string{"--max-response-bytes must be positive"}},
		{name: "access log on standard output", edit: func(c *Config) { c.AccessLog = "-" }},
		{name: "access log file", edit: func(c *Config) { c.AccessLog = filepath.Join(os.TempDir(), "access.jsonl") }},
		{name: "access log a directory", edit: func(c *Config) { c.AccessLog = os.TempDir() },
			wantErr: []string{`--access-log "` + os.TempDir() + `": is a directory`}},
		{name: "access log in no directory", edit: func(c *Config) { c.AccessLog = "/nonexistent-dir/access.jsonl" },
			wantErr: []string{`--access-log "/nonexistent-dir/access.jsonl": directory /nonexistent-dir does not exist`}},
		{name: "health problems come along", edit: func(c *Config) {
			c.MaxRetries = -1
			c.Health.Endpoints = []string{"10.0.0.1:8000"}
			c.Health.ProbeInterval = 0
		}, wantErr: []string{"--max-retries", `--endpoint "10.0.0.1:8000"`, "--health-probe-interval must be positive"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Health.Endpoints = []string{"http://10.0.0.1:8000"}
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

// TestNewRefusesWhatValidateRefuses: New neither fills nor forgives.
func TestNewRefusesWhatValidateRefuses(t *testing.T) {
	c := DefaultConfig()
	c.Health.Endpoints = []string{"http://10.0.0.1:8000"}
	c.ConnectTimeout = 0
	if _, err := New(c, Deps{Logger: quietLogger()}); err == nil || !strings.Contains(err.Error(), "--connect-timeout must be positive") {
		t.Fatalf("New(zero connect timeout) = %v", err)
	}
	if _, err := New(Config{}, Deps{Logger: quietLogger()}); err == nil {
		t.Fatal("New accepted the zero Config")
	}
}
