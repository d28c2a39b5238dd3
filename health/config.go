package health

import (
	"errors"
	"fmt"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/positive"
)

// Config holds everything the serve command's flags set for this package.
// The flag name is given with each field; its environment variable is
// PREFIXROUTER_ followed by the flag name in upper case with dashes turned
// into underscores (--health-probe-interval: PREFIXROUTER_HEALTH_PROBE_INTERVAL);
// the flag's default is the field's value in DefaultConfig. Every duration
// and count must be positive; New takes a zero one as its default.
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
	// states (load staleness, breaker cooldowns).
	// Flag --health-eval-interval.
	EvalInterval time.Duration

	// DrainTimeout bounds how long a removed target with requests in flight
	// stays in the snapshot (draining). Flag --drain-timeout.
	DrainTimeout time.Duration

	// BlockSize and HashAlgo are the values configured on the router
	// (--block-size, --hash-algo, owned by the router); when set, pods whose
	// vllm:cache_config_info disagrees are in conflict. Zero / empty: learn.
	BlockSize int
	HashAlgo  string
}

// DefaultConfig returns the defaults.
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

// fill replaces the zero fields whose zero Validate refuses with the
// defaults, so that a test or an embedder can set a few fields; no field
// whose zero is meaningful is touched, and the serve command, which starts
// from DefaultConfig, has no zero left to fill.
func (c *Config) fill() {
	d := DefaultConfig()
	c.positive().Fill(d.positive())
}

// positive lists the durations and counts that must be positive.
func (c *Config) positive() positive.Fields {
	return positive.Fields{
		Durations: []positive.Duration{
			{Flag: "endpoints-file-poll", V: &c.FilePollInterval},
			{Flag: "discover-dns-interval", V: &c.DNSInterval},
			{Flag: "health-probe-interval", V: &c.ProbeInterval},
			{Flag: "health-probe-timeout", V: &c.ProbeTimeout},
			{Flag: "health-models-interval", V: &c.ModelsInterval},
			{Flag: "breaker-cooldown", V: &c.BreakerCooldown},
			{Flag: "breaker-max-cooldown", V: &c.BreakerMaxCooldown},
			{Flag: "metrics-scrape-interval", V: &c.ScrapeInterval},
			{Flag: "metrics-scrape-timeout", V: &c.ScrapeTimeout},
			{Flag: "metrics-stale-after", V: &c.LoadStaleAfter},
			{Flag: "health-eval-interval", V: &c.EvalInterval},
			{Flag: "drain-timeout", V: &c.DrainTimeout},
		},
		Ints: []positive.Int{
			{Flag: "health-failure-threshold", V: &c.FailureThreshold},
			{Flag: "health-success-threshold", V: &c.SuccessThreshold},
			{Flag: "breaker-failures", V: &c.BreakerFailures},
		},
	}
}

// Validate reports every problem in c at once (joined), each naming the
// serve flag that sets the field. It changes nothing; it does not require a
// target (a monitor may start empty and learn targets from a file or DNS).
func (c Config) Validate() error {
	_, _, err := c.check()
	return err
}

// check is Validate, also returning the parsed static endpoints and DNS
// names for New.
func (c Config) check() (map[string]Spec, []DNSSpec, error) {
	static, dns, err := c.targets()
	errs := []error{err}
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	errs = append(errs, c.positive().Check()...)
	if c.BlockSize < 0 {
		bad("--block-size: negative value %d", c.BlockSize)
	}
	if c.ProbeTimeout > c.ProbeInterval {
		bad("--health-probe-timeout %s exceeds --health-probe-interval %s", c.ProbeTimeout, c.ProbeInterval)
	}
	if c.ScrapeTimeout > c.ScrapeInterval {
		bad("--metrics-scrape-timeout %s exceeds --metrics-scrape-interval %s", c.ScrapeTimeout, c.ScrapeInterval)
	}
	if c.LoadStaleAfter < c.ScrapeInterval {
		bad("--metrics-stale-after %s is shorter than --metrics-scrape-interval %s", c.LoadStaleAfter, c.ScrapeInterval)
	}
	if c.BreakerMaxCooldown < c.BreakerCooldown {
		bad("--breaker-max-cooldown %s is shorter than --breaker-cooldown %s", c.BreakerMaxCooldown, c.BreakerCooldown)
	}
	return static, dns, errors.Join(errs...)
}

// targets parses the static endpoints and the DNS names.
func (c Config) targets() (map[string]Spec, []DNSSpec, error) {
	var errs []error
	static := make(map[string]Spec, len(c.Endpoints))
	for _, s := range c.Endpoints {
		spec, err := ParseSpec(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("--endpoint %q: %w", s, err))
			continue
		}
		if _, dup := static[spec.Endpoint]; dup {
			errs = append(errs, fmt.Errorf("--endpoint: %s given twice", spec.Endpoint))
			continue
		}
		static[spec.Endpoint] = spec
	}
	var dns []DNSSpec
	for _, s := range c.DiscoverDNS {
		d, err := ParseDNSSpec(s) // its errors name --discover-dns
		if err != nil {
			errs = append(errs, err)
			continue
		}
		dns = append(dns, d)
	}
	return static, dns, errors.Join(errs...)
}
