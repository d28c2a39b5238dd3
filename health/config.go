package health

import (
	"errors"
	"fmt"
	"time"
)

// Config holds everything the serve command's flags set for this package.
// The flag name is given with each field; its environment variable is
// PREFIXROUTER_ followed by the flag name in upper case with dashes turned
// into underscores (--health-probe-interval: PREFIXROUTER_HEALTH_PROBE_INTERVAL).
// Zero values take the defaults of DefaultConfig.
type Config struct {
	// Endpoints are endpoint specs (see Spec). Flag --endpoint, repeatable;
	// PREFIXROUTER_ENDPOINT holds a comma-separated list.
	Endpoints []string
	// EndpointsFile is a YAML or JSON file with a list of endpoint specs,
	// re-read when it changes. Flag --endpoints-file.
	EndpointsFile string
	// FilePollInterval is the polling fallback for EndpointsFile (fsnotify
	// triggers a reload at once; the poll catches what it misses).
	// Flag --endpoints-file-poll.
	FilePollInterval time.Duration
	// DiscoverDNS are NAME:PORT[?options] entries resolved on an interval,
	// one target per address (see ParseDNSSpec). Flag --discover-dns,
	// repeatable; PREFIXROUTER_DISCOVER_DNS holds a comma-separated list.
	DiscoverDNS []string
	// DNSInterval is how often DiscoverDNS names are re-resolved.
	// Flag --discover-dns-interval.
	DNSInterval time.Duration

	// ProbeInterval and ProbeTimeout pace GET /health.
	// Flags --health-probe-interval, --health-probe-timeout.
	ProbeInterval time.Duration
	ProbeTimeout  time.Duration
	// FailureThreshold consecutive failed probes take an up target down;
	// SuccessThreshold consecutive good probes bring a down target back (a
	// target never seen up becomes routable on its first good probe).
	// Flags --health-failure-threshold, --health-success-threshold.
	FailureThreshold int
	SuccessThreshold int
	// ModelsInterval is how often GET /v1/models is re-read from an up
	// target. Flag --health-models-interval.
	ModelsInterval time.Duration

	// BreakerFailures consecutive upstream failures reported by the router
	// open a target's circuit breaker for BreakerCooldown, doubling on each
	// failed half-open trial up to BreakerMaxCooldown.
	// Flags --breaker-failures, --breaker-cooldown, --breaker-max-cooldown.
	BreakerFailures    int
	BreakerCooldown    time.Duration
	BreakerMaxCooldown time.Duration

	// ScrapeInterval and ScrapeTimeout pace GET /metrics; scraped load older
	// than LoadStaleAfter is marked stale and the target degraded.
	// Flags --metrics-scrape-interval, --metrics-scrape-timeout,
	// --metrics-stale-after.
	ScrapeInterval time.Duration
	ScrapeTimeout  time.Duration
	LoadStaleAfter time.Duration

	// EvalInterval paces drain reaping and the rebuild of time-dependent
	// states (load staleness, breaker cooldowns). Flag
	// --health-eval-interval (which paces the event plane's freshness
	// evaluation too).
	EvalInterval time.Duration

	// EventsStaleAfter, EventsMinUncachedTokens, EventsMaxQueueDepth and
	// RoutingWindow are not health's: they configure the event plane
	// (eventplane.Config StaleAfter, MinUncachedTokens, MaxQueueDepth,
	// RoutingWindow; flags --events-stale-after,
	// --events-min-uncached-tokens, --events-max-queue-depth,
	// --health-routing-window), which validates them. They ride here
	// because the router's configuration carries the serve command's
	// health and event flags in one section; health ignores them.
	EventsStaleAfter        time.Duration
	EventsMinUncachedTokens int
	EventsMaxQueueDepth     int
	RoutingWindow           time.Duration

	// DrainTimeout bounds how long a removed target with requests in flight
	// stays in the snapshot (draining). Flag --drain-timeout.
	DrainTimeout time.Duration

	// BlockSize and HashAlgo are the values configured on the router
	// (--block-size, --hash-algo, owned by the router); when set, pods whose
	// vllm:cache_config_info disagrees are in conflict. Zero / empty: learn.
	BlockSize int
	HashAlgo  string
}

// DefaultConfig returns the defaults. The event plane's fields stay zero:
// router.DefaultConfig fills them from eventplane.DefaultConfig.
func DefaultConfig() Config {
	return Config{
		FilePollInterval:   5 * time.Second,
		DNSInterval:        10 * time.Second,
		ProbeInterval:      2 * time.Second,
		ProbeTimeout:       1 * time.Second,
		FailureThreshold:   3,
		SuccessThreshold:   2,
		ModelsInterval:     30 * time.Second,
		BreakerFailures:    5,
		BreakerCooldown:    5 * time.Second,
		BreakerMaxCooldown: 2 * time.Minute,
		ScrapeInterval:     500 * time.Millisecond,
		ScrapeTimeout:      400 * time.Millisecond,
		LoadStaleAfter:     3 * time.Second,
		EvalInterval:       500 * time.Millisecond,
		DrainTimeout:       5 * time.Minute,
	}
}

// withDefaults fills zero fields from DefaultConfig and validates the rest.
func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	durs := []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"endpoints-file-poll", &c.FilePollInterval, d.FilePollInterval},
		{"discover-dns-interval", &c.DNSInterval, d.DNSInterval},
		{"health-probe-interval", &c.ProbeInterval, d.ProbeInterval},
		{"health-probe-timeout", &c.ProbeTimeout, d.ProbeTimeout},
		{"health-models-interval", &c.ModelsInterval, d.ModelsInterval},
		{"breaker-cooldown", &c.BreakerCooldown, d.BreakerCooldown},
		{"breaker-max-cooldown", &c.BreakerMaxCooldown, d.BreakerMaxCooldown},
		{"metrics-scrape-interval", &c.ScrapeInterval, d.ScrapeInterval},
		{"metrics-scrape-timeout", &c.ScrapeTimeout, d.ScrapeTimeout},
		{"metrics-stale-after", &c.LoadStaleAfter, d.LoadStaleAfter},
		{"health-eval-interval", &c.EvalInterval, d.EvalInterval},
		{"drain-timeout", &c.DrainTimeout, d.DrainTimeout},
	}
	var errs []error
	for _, f := range durs {
		switch {
		case *f.v == 0:
			*f.v = f.def
		case *f.v < 0:
			errs = append(errs, fmt.Errorf("--%s: negative duration %s", f.name, *f.v))
		}
	}
	ints := []struct {
		name string
		v    *int
		def  int
	}{
		{"health-failure-threshold", &c.FailureThreshold, d.FailureThreshold},
		{"health-success-threshold", &c.SuccessThreshold, d.SuccessThreshold},
		{"breaker-failures", &c.BreakerFailures, d.BreakerFailures},
	}
	for _, f := range ints {
		switch {
		case *f.v == 0:
			*f.v = f.def
		case *f.v < 0:
			errs = append(errs, fmt.Errorf("--%s: negative value %d", f.name, *f.v))
		}
	}
	if c.BlockSize < 0 {
		errs = append(errs, fmt.Errorf("--block-size: negative value %d", c.BlockSize))
	}
	if c.ProbeTimeout > c.ProbeInterval {
		errs = append(errs, fmt.Errorf("--health-probe-timeout %s exceeds --health-probe-interval %s", c.ProbeTimeout, c.ProbeInterval))
	}
	if c.ScrapeTimeout > c.ScrapeInterval {
		errs = append(errs, fmt.Errorf("--metrics-scrape-timeout %s exceeds --metrics-scrape-interval %s", c.ScrapeTimeout, c.ScrapeInterval))
	}
	if c.LoadStaleAfter < c.ScrapeInterval {
		errs = append(errs, fmt.Errorf("--metrics-stale-after %s is shorter than --metrics-scrape-interval %s", c.LoadStaleAfter, c.ScrapeInterval))
	}
	if c.BreakerMaxCooldown < c.BreakerCooldown {
		c.BreakerMaxCooldown = c.BreakerCooldown
	}
	if err := errors.Join(errs...); err != nil {
		return c, fmt.Errorf("health config: %w", err)
	}
	return c, nil
}
