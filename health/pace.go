package health

import (
	"math"
	"sync"
	"time"
)

// Pace is how fast a target works off the prefill queued on it, as its
// first bytes showed: a request's time from dispatch to first byte
// against the uncached prompt tokens it found queued ahead of it plus its
// own, fitted as Floor + PerToken × tokens. It is what lets the router
// say how long a pod's queue is in time, which admission compares with
// the classes' objectives. The zero Pace knows nothing (Samples 0).
type Pace struct {
	// PerToken is seconds per uncached prompt token; Floor the seconds
	// even an empty queue and a cached prompt take (a scheduling step).
	PerToken, Floor float64
	Samples         int
}

// Known reports whether enough first bytes were seen to trust the fit.
func (p Pace) Known() bool { return p.Samples >= paceMinSamples && p.PerToken > 0 }

// Time is how long tokens of queued prefill take at this pace.
func (p Pace) Time(tokens float64) time.Duration {
	return time.Duration((p.Floor + p.PerToken*max(tokens, 0)) * float64(time.Second))
}

// paceMinSamples is the first bytes a pace needs before it is trusted;
// paceAlpha the weight of each new one in the fit's moving averages.
const (
	paceMinSamples = 8
	paceAlpha      = 0.05
)

// paceFit is an exponentially weighted least-squares fit of seconds on
// tokens. With little spread in tokens (every request alike, queues
// empty) the slope is the ratio of the means and the floor zero.
type paceFit struct {
	mu                 sync.Mutex
	n                  int
	mx, my, mxx, mxy   float64
	perToken, floorSec float64
}

func (f *paceFit) observe(tokens float64, elapsed time.Duration) {
	y := elapsed.Seconds()
	if tokens < 0 || y <= 0 || math.IsNaN(tokens) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	a := paceAlpha
	if f.n < int(1/paceAlpha) {
		a = 1 / float64(f.n+1) // a plain mean until the window fills
	}
	f.n++
	f.mx += a * (tokens - f.mx)
	f.my += a * (y - f.my)
	f.mxx += a * (tokens*tokens - f.mxx)
	f.mxy += a * (tokens*y - f.mxy)
	vx := f.mxx - f.mx*f.mx
	slope, floor := 0.0, 0.0
	if vx > 0.01*f.mx*f.mx && vx > 1 {
		slope = (f.mxy - f.mx*f.my) / vx
		floor = f.my - slope*f.mx
	}
	if slope <= 0 || floor < 0 {
		// A fit that says more tokens take less time, or that the floor
		// is negative, is noise on too narrow a spread: the ratio holds.
		slope, floor = 0, 0
		if f.mx > 0 {
			slope = f.my / f.mx
		}
	}
	f.perToken, f.floorSec = slope, floor
}

func (f *paceFit) pace() Pace {
	f.mu.Lock()
	defer f.mu.Unlock()
	return Pace{PerToken: f.perToken, Floor: f.floorSec, Samples: f.n}
}
