package health

import (
	"errors"
	"fmt"
	"time"

	"github.com/prefixrouter/prefixrouter/targetid"
)

// Standalone returns a routable target that no Monitor watches: its load
// ledger and circuit breaker are a monitored target's, with cfg's breaker
// settings, on the clock now. The benchmark's discrete-event engine builds
// its simulated fleet's targets with it, on its virtual clock, and hands
// each scrape of a pod's gauges to WithLoad, as a Monitor rebuilds its
// snapshot after a scrape.
func Standalone(id targetid.ID, model string, cfg Config, now func() time.Time) (*Target, error) {
	cfg.fill()
	if errs := cfg.positive().Check(); len(errs) > 0 {
		return nil, fmt.Errorf("health: %w", errors.Join(errs...))
	}
	sh := &shared{now: now, failures: int64(cfg.BreakerFailures), cooldown: cfg.BreakerCooldown,
		maxCooldown: cfg.BreakerMaxCooldown, kick: make(chan struct{}, 1)}
	return &Target{
		ID: id, Name: id.String(), Source: SourceFlag, State: StateRoutable, Since: now(),
		Spec:    TargetSpec{ID: id, DP: 1, Models: []string{model}, Role: RoleBoth},
		Models:  []string{model},
		Scraped: Load{Stale: true},
		live:    &live{sh: sh},
	}, nil
}

// WithLoad is t as of a scrape that read l: a new target sharing t's load
// ledger and breaker, as each Monitor snapshot does. t is not changed.
func (t *Target) WithLoad(l Load) *Target {
	c := *t
	c.Scraped = l
	return &c
}

// WithState is t in state s for reason r (detail says more) since at: a
// new target sharing t's load ledger and breaker, as a Monitor snapshot
// after a probe changed the target's state. t is not changed.
func (t *Target) WithState(s State, r Reason, detail string, at time.Time) *Target {
	c := *t
	if c.State != s {
		c.Since = at
	}
	c.State, c.Reason, c.Detail = s, r, detail
	return &c
}
