package speculative

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// InitialTTL is every target's TTL until its controller has enough
// confirmation latencies (capped by --speculative-max-stale).
const InitialTTL = 2 * time.Second

// TimerResolution is how often expiries are processed (Store.Run), and so
// the timing slack the automatic TTL adds; TTLs are rounded up to it.
const TimerResolution = 10 * time.Millisecond

// ttlSmoothing is the share of the way from the published TTL to the
// controller's new target taken at each evaluation (once a second): 90% of
// a step is covered in about ten seconds, so one burst of slow events does
// not swing every prediction's lifetime.
const ttlSmoothing = 0.2

// latencyWindow is how many recent confirmation latencies a target keeps:
// the sample its TTL quantile and its reported percentiles are taken from.
const latencyWindow = 1024

// TTLFor is the TTL arithmetic, one piece of code for the controller and
// `prefixrouter ttl-advise`: the latency quantile plus the measured backlog
// plus the timing slack, summed exactly and rounded up to TimerResolution
// once, after the arithmetic, then capped by maxStale (no cap when 0).
// p99 1.15 s + backlog 0.25 s + slack 0.10 s gives 1.50 s.
func TTLFor(quantile, backlog, timingSlack, maxStale time.Duration) time.Duration {
	t := roundUp(quantile+backlog+timingSlack, TimerResolution)
	if maxStale > 0 && t > maxStale {
		t = maxStale
	}
	return t
}

func roundUp(d, unit time.Duration) time.Duration {
	if r := d % unit; r > 0 {
		d += unit - r
	}
	return d
}

// Quantile is the nearest-rank q-quantile of sorted latencies: the
// smallest sample that at least a share q of the samples do not exceed.
// It interpolates nothing, so a TTL is always a latency that was seen.
// Zero for no samples.
func Quantile(sorted []time.Duration, q float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	// The epsilon keeps q·n = 99.00000000000001 from taking the next rank.
	i := int(math.Ceil(q*float64(n)-1e-9)) - 1
	return sorted[min(max(i, 0), n-1)]
}

// MinSamples is how many confirmation latencies a target needs before its
// TTL follows them: enough that the q-quantile is not just the largest
// sample twice over (2/(1−q): 200 at 0.99), at least 32, at most the
// latencies a target keeps.
func MinSamples(q float64) int {
	n := int(math.Ceil(2 / (1 - q)))
	return min(max(n, 32), latencyWindow)
}

// Exposure is the rough number of live failed predictions: rate (requests
// predicting per second) × failure probability × TTL, λ·p·T. 120 req/s ×
// 0.4% × 1.5 s gives 0.72.
func Exposure(rate, failure float64, ttl time.Duration) float64 {
	return rate * failure * ttl.Seconds()
}

// latencies is a target's recent route-to-confirmation latencies, in time
// and late (after the deadline, within the grace window), in arrival
// order. Confirmations of predictions whose life overlapped a stream that
// was not fresh are not kept: a replay after a broken pipe delivers stores
// late, and the TTL must not stretch to cover a broken pipe.
type latencies struct {
	d    [latencyWindow]time.Duration
	late [latencyWindow]bool
	n    int // samples ever added
}

func (l *latencies) add(d time.Duration, late bool) {
	i := l.n % latencyWindow
	l.d[i], l.late[i] = d, late
	l.n++
}

func (l *latencies) len() int { return min(l.n, latencyWindow) }

// appendTo appends the kept samples of one kind (late or in time), or of
// both when all is set.
func (l *latencies) appendTo(dst []time.Duration, all, late bool) []time.Duration {
	for i := range l.len() {
		if all || l.late[i] == late {
			dst = append(dst, l.d[i])
		}
	}
	return dst
}

// ttlController sizes one target's TTL. Guarded by its target's lock;
// the published value is also kept in targetState.ttl for lock-free reads.
type ttlController struct {
	// state is the smoothed TTL in seconds before rounding.
	state float64
	ttl   time.Duration
	why   string
	// seen is latencies.n at the last update: no new sample, no change.
	seen      int
	quantile  time.Duration
	backlog   time.Duration
	target    time.Duration
	following bool // enough samples: the TTL follows them
}

func newTTLController(cfg *Config) ttlController {
	c := ttlController{}
	if cfg.TTL > 0 {
		c.ttl = cfg.TTL
		c.why = fmt.Sprintf("fixed by --speculative-ttl %s", cfg.TTL)
		return c
	}
	c.ttl = min(InitialTTL, cfg.MaxStale)
	c.state = c.ttl.Seconds()
	c.why = fmt.Sprintf("initial %s until %d confirmation latencies are measured", c.ttl, MinSamples(cfg.TTLPercentile))
	return c
}

// update moves the TTL toward quantile(latencies) + backlog + timer
// resolution once there are enough samples: the target is recomputed when
// samples or the backlog changed, and the published TTL takes ttlSmoothing
// of the way to it at every call (once a second). scratch is reused for
// sorting.
func (c *ttlController) update(cfg *Config, lat *latencies, backlog time.Duration, scratch *[]time.Duration) {
	if cfg.TTL > 0 {
		return
	}
	need := MinSamples(cfg.TTLPercentile)
	if lat.len() < need {
		c.why = fmt.Sprintf("initial %s: %d of %d confirmation latencies measured", c.ttl, lat.len(), need)
		return
	}
	if !c.following || lat.n != c.seen || backlog != c.backlog {
		c.seen, c.following = lat.n, true
		s := lat.appendTo((*scratch)[:0], true, false)
		slices.Sort(s)
		*scratch = s
		c.quantile, c.backlog = Quantile(s, cfg.TTLPercentile), backlog
		c.target = TTLFor(c.quantile, backlog, TimerResolution, cfg.MaxStale)
	}
	c.state += ttlSmoothing * (c.target.Seconds() - c.state)
	next := roundUp(time.Duration(c.state*float64(time.Second)), TimerResolution)
	// The smoothed state approaches its target without reaching it, and
	// rounding up would leave the TTL one step above it for ever.
	if d := next - c.target; d > 0 && d <= TimerResolution {
		next = c.target
	}
	c.ttl = min(next, cfg.MaxStale)
	c.why = fmt.Sprintf("p%s of %d latencies %s + backlog %s + timer %s = %s (capped by --speculative-max-stale %s); the TTL moves %v of the way there each second",
		percentLabel(cfg.TTLPercentile), lat.len(), c.quantile, backlog, TimerResolution, c.target, cfg.MaxStale, ttlSmoothing)
}

// percentLabel writes 0.99 as "99" and 0.995 as "99.5".
func percentLabel(q float64) string {
	return fmt.Sprintf("%g", math.Round(q*1e6)/1e4)
}
