package eventplane

import (
	"errors"
	"fmt"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex"
)

// Config is what the serve command's flags set for the event plane. The
// flag name is given with each field. Zero values take the defaults of
// DefaultConfig.
type Config struct {
	// BlockSize and HashAlgo describe the pods' prefix cache
	// (--block-size, --hash-algo); zero / empty: learned from the pods'
	// vllm:cache_config_info (see Plane.SetCaches).
	BlockSize int
	HashAlgo  string
	// HashSeed is the pods' PYTHONHASHSEED (--hash-seed). With HasHashSeed
	// set, block keys are vLLM's own hashes (exact mode); without it they
	// are derived from the blocks' tokens (token-derived mode).
	HashSeed    string
	HasHashSeed bool

	// StaleAfter: a target is stale when requests that filled new full KV
	// blocks were answered (first byte seen), carried at least
	// MinUncachedTokens uncached prompt tokens between them, and no KV
	// event has been received since the earliest of them was dispatched
	// this long ago. Also how long batches lost for good (the subscriber's
	// Unrecovered) keep a target stale after the last loss.
	// Flags --events-stale-after, --events-min-uncached-tokens.
	StaleAfter        time.Duration
	MinUncachedTokens int
	// MaxQueueDepth: a subscriber backlog deeper than this is stale.
	// Flag --events-max-queue-depth.
	MaxQueueDepth int
	// EvalInterval paces freshness evaluation. Flag --health-eval-interval
	// (the same flag paces health's own evaluation).
	EvalInterval time.Duration
	// RoutingWindow is the window over which recent routing volume is
	// reported. Flag --health-routing-window.
	RoutingWindow time.Duration
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		StaleAfter:        10 * time.Second,
		MinUncachedTokens: 16,
		MaxQueueDepth:     1000,
		EvalInterval:      500 * time.Millisecond,
		RoutingWindow:     time.Minute,
	}
}

// withDefaults fills zero fields from DefaultConfig and validates the rest;
// errors name the flag.
func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	var errs []error
	for _, f := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"events-stale-after", &c.StaleAfter, d.StaleAfter},
		{"health-eval-interval", &c.EvalInterval, d.EvalInterval},
		{"health-routing-window", &c.RoutingWindow, d.RoutingWindow},
	} {
		switch {
		case *f.v == 0:
			*f.v = f.def
		case *f.v < 0:
			errs = append(errs, fmt.Errorf("--%s: negative duration %s", f.name, *f.v))
		}
	}
	for _, f := range []struct {
		name string
		v    *int
		def  int
	}{
		{"events-min-uncached-tokens", &c.MinUncachedTokens, d.MinUncachedTokens},
		{"events-max-queue-depth", &c.MaxQueueDepth, d.MaxQueueDepth},
	} {
		switch {
		case *f.v == 0:
			*f.v = f.def
		case *f.v < 0:
			errs = append(errs, fmt.Errorf("--%s: negative value %d", f.name, *f.v))
		}
	}
	if c.BlockSize < 0 || c.BlockSize > kvindex.MaxBlockSize {
		errs = append(errs, fmt.Errorf("--block-size %d: want 1..%d, or 0 to learn it", c.BlockSize, kvindex.MaxBlockSize))
	}
	if c.HashAlgo != "" {
		if _, err := kvindex.ParseHashAlgo(c.HashAlgo); err != nil {
			errs = append(errs, fmt.Errorf("--hash-algo: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return c, fmt.Errorf("event plane config: %w", err)
	}
	return c, nil
}
