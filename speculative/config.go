package speculative

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/positive"
)

// Config is what the serve command's flags set for speculative placements.
// The flag name is given with each field; the flag's default is the
// field's value in DefaultConfig. New takes a zero TTLPercentile or
// MaxStale as its default; a zero TTL means auto and a zero Holdback means
// no holdback, both meaningful.
type Config struct {
	// TTL fixes every target's prediction lifetime; 0 lets each target's
	// controller size it from measured confirmation latency.
	// Flag --speculative-ttl: auto or a duration (see ParseTTL).
	TTL time.Duration
	// TTLPercentile is the quantile of route-to-confirmation latency the
	// automatic TTL covers, in (0, 1). Flag --speculative-ttl-percentile.
	TTLPercentile float64
	// MaxStale caps every TTL, fixed or automatic: a prediction never
	// counts longer than this without its event. It is also the grace
	// window after a deadline in which a late confirmation makes the
	// expiry early rather than stale, and the ingestion allowance after a
	// cohort's last deadline before the cohort is mature.
	// Flag --speculative-max-stale.
	MaxStale time.Duration
	// Holdback is the fraction of conversations routed without
	// predictions, 0 to 0.5; 0 turns the holdback off. Flag --holdback.
	Holdback float64
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{TTLPercentile: 0.99, MaxStale: 5 * time.Second, Holdback: 0.05}
}

// MaxHoldback bounds --holdback: beyond half, the holdback would be the
// main arm and speculation the experiment.
const MaxHoldback = 0.5

// fill replaces the zero fields whose zero Validate refuses with the
// defaults, so that a test or an embedder can set a few fields; the serve
// command, which starts from DefaultConfig, has no zero left to fill.
func (c *Config) fill() {
	d := DefaultConfig()
	c.positive().Fill(d.positive())
	if c.TTLPercentile == 0 {
		c.TTLPercentile = d.TTLPercentile
	}
}

// positive lists the durations that must be positive.
func (c *Config) positive() positive.Fields {
	return positive.Fields{Durations: []positive.Duration{{Flag: "speculative-max-stale", V: &c.MaxStale}}}
}

// Validate reports every problem in c at once (joined), each naming the
// serve flag that sets the field. It changes nothing.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	errs = append(errs, c.positive().Check()...)
	if err := CheckPercentile(c.TTLPercentile); err != nil {
		bad("--speculative-ttl-percentile: %w", err)
	}
	switch {
	case c.TTL < 0:
		bad("--speculative-ttl %s: want auto or a positive duration", c.TTL)
	case c.TTL > 0 && c.MaxStale > 0 && c.TTL > c.MaxStale:
		bad("--speculative-ttl %s exceeds --speculative-max-stale %s: a prediction may not count longer than the stale window", c.TTL, c.MaxStale)
	}
	if math.IsNaN(c.Holdback) || c.Holdback < 0 || c.Holdback > MaxHoldback {
		bad("--holdback %v: want a fraction from 0 (off) to %v", c.Holdback, MaxHoldback)
	}
	return errors.Join(errs...)
}

// CheckPercentile refuses a quantile outside (0, 1): the TTL covers a
// share of confirmations, neither none nor all of them (the slowest
// confirmation is unbounded).
func CheckPercentile(q float64) error {
	if !(q > 0 && q < 1) {
		return fmt.Errorf("%v is not a fraction strictly between 0 and 1 (0.99 covers 99%% of confirmations)", q)
	}
	return nil
}

// ttlAuto is the --speculative-ttl value for a TTL sized per target.
const ttlAuto = "auto"

// ParseTTL reads --speculative-ttl: "auto" (0) or a positive duration.
func ParseTTL(s string) (time.Duration, error) {
	if strings.TrimSpace(s) == ttlAuto {
		return 0, nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("%q is neither auto nor a duration (like 1500ms or 2s)", s)
	}
	if d <= 0 {
		return 0, fmt.Errorf("%q: a fixed TTL must be positive (or auto)", s)
	}
	return d, nil
}

// FormatTTL writes a TTL as ParseTTL reads it.
func FormatTTL(d time.Duration) string {
	if d == 0 {
		return ttlAuto
	}
	return d.String()
}
