package health

import (
	"sync"
	"sync/atomic"
	"time"
)

// Outcome classifies how a proxied request ended, for the circuit breaker.
type Outcome uint8

// Outcomes. Only OutcomeUpstreamError counts against the target.
const (
	// OutcomeSuccess: the target answered (any 2xx, or a streamed response
	// that completed).
	OutcomeSuccess Outcome = iota
	// OutcomeUpstreamError: connect failure, reset, timeout, or a 5xx from
	// the target.
	OutcomeUpstreamError
	// OutcomeClientError: the target rejected the request (4xx); says
	// nothing about the target's health.
	OutcomeClientError
	// OutcomeCanceled: the client went away; says nothing about the target.
	OutcomeCanceled
)

// Breaker states, stored in live.breaker.
const (
	breakerClosed uint32 = iota
	breakerOpen
	breakerHalfOpen
)

// shared is what every target's live counters need from the monitor.
type shared struct {
	now         func() time.Time
	failures    int64         // consecutive upstream failures that open the breaker
	cooldown    time.Duration // first open period
	maxCooldown time.Duration
	kick        chan struct{} // non-blocking: ask the monitor to rebuild
}

func (s *shared) notify() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// live holds a target's hot-path counters. Everything is atomic: the
// router updates them on every request without locks.
type live struct {
	sh *shared

	inflight       atomic.Int64
	prefilling     atomic.Int64
	queuedPrompt   atomic.Int64
	queuedUncached atomic.Int64

	// peers is what the other router replicas last reported of the
	// target (SetPeerFlights); nil: nothing.
	peers atomic.Pointer[Flights]

	dispatched atomic.Uint64
	answered   atomic.Uint64 // first bytes
	upstream   atomic.Uint64 // upstream failures
	lastRoute  atomic.Int64  // unix nanos of the last dispatch

	consecFail    atomic.Int64
	breaker       atomic.Uint32
	breakerUntil  atomic.Int64 // unix nanos when an open breaker may half-open
	breakerOpens  atomic.Uint64
	openStreak    atomic.Int64 // consecutive opens without a success, for backoff
	trialInFlight atomic.Bool

	probeFailures  atomic.Uint64
	scrapeFailures atomic.Uint64
	transitions    atomic.Uint64

	// pace is fitted at each first byte of a flight whose queue ahead
	// was given (Flight.Ahead).
	pace paceFit
}

// Flight is one dispatched request's accounting: call FirstByte (optional)
// then Finish; repeated calls are ignored. It owns its lock, so that the
// request's goroutines (the attempt, and a router's prompt tail revising
// it until the first byte) may call it at once. A nil Flight is a no-op.
type Flight struct {
	mu       sync.Mutex
	l        *live
	prompt   int64
	uncached int64
	trial    bool
	answered bool
	done     bool
	// at is when the flight was dispatched; ahead the uncached tokens
	// queued before it there as the router counts them (-1: not given,
	// and its first byte says nothing of the pace).
	at    time.Time
	ahead float64
}

func (l *live) dispatch(prompt, uncached int) *Flight {
	prompt = max(prompt, 0)
	uncached = min(max(uncached, 0), prompt)
	f := &Flight{l: l, prompt: int64(prompt), uncached: int64(uncached), at: l.sh.now(), ahead: -1}
	if l.breaker.Load() == breakerHalfOpen && l.trialInFlight.CompareAndSwap(false, true) {
		f.trial = true
	}
	l.inflight.Add(1)
	l.prefilling.Add(1)
	l.queuedPrompt.Add(f.prompt)
	l.queuedUncached.Add(f.uncached)
	l.dispatched.Add(1)
	l.lastRoute.Store(l.sh.now().UnixNano())
	return f
}

// Revise corrects the request's prompt and uncached tokens before its
// first byte, for a router that learned more about the prompt after
// dispatch: the pod's queue follows the corrected counts, and so does what
// Tokens reports.
func (f *Flight) Revise(prompt, uncached int) {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.l == nil || f.answered || f.done {
		return
	}
	prompt = max(prompt, 0)
	uncached = min(max(uncached, 0), prompt)
	l := f.l
	l.queuedPrompt.Add(int64(prompt) - f.prompt)
	l.queuedUncached.Add(int64(uncached) - f.uncached)
	f.prompt, f.uncached = int64(prompt), int64(uncached)
}

// Tokens reports the request's prompt and uncached tokens as dispatched or
// last revised: at the first byte, what the pod had to compute as far as
// the router knows.
func (f *Flight) Tokens() (prompt, uncached int) {
	if f == nil {
		return 0, 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return int(f.prompt), int(f.uncached)
}

// FirstByte records that the target's first response byte arrived: its
// prefill is done, so its prompt tokens leave the queue.
func (f *Flight) FirstByte() {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.l == nil || f.answered || f.done {
		return
	}
	f.answered = true
	l := f.l
	l.prefilling.Add(-1)
	l.queuedPrompt.Add(-f.prompt)
	l.queuedUncached.Add(-f.uncached)
	l.answered.Add(1)
	if f.ahead >= 0 {
		l.pace.observe(f.ahead+float64(f.uncached), l.sh.now().Sub(f.at))
	}
}

// Ahead gives the uncached prompt tokens queued on the target before the
// flight, as the router's cost model counts them: its first byte then
// feeds the target's pace (Target.Pace).
func (f *Flight) Ahead(tokens float64) {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ahead = max(tokens, 0)
}

// Finish records the end of the request and its outcome.
func (f *Flight) Finish(o Outcome) {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.l == nil || f.done {
		return
	}
	f.done = true
	l := f.l
	if !f.answered {
		l.prefilling.Add(-1)
		l.queuedPrompt.Add(-f.prompt)
		l.queuedUncached.Add(-f.uncached)
	}
	l.inflight.Add(-1)
	switch o {
	case OutcomeSuccess:
		l.succeeded()
	case OutcomeUpstreamError:
		l.upstream.Add(1)
		l.failed()
	}
	if f.trial {
		l.trialInFlight.Store(false)
	}
}

func (l *live) succeeded() {
	l.consecFail.Store(0)
	l.openStreak.Store(0)
	if l.breaker.CompareAndSwap(breakerHalfOpen, breakerClosed) {
		l.sh.notify()
	}
}

func (l *live) failed() {
	n := l.consecFail.Add(1)
	switch l.breaker.Load() {
	case breakerHalfOpen:
		l.open()
	case breakerClosed:
		if n >= l.sh.failures {
			l.open()
		}
	}
}

// open moves the breaker to open with exponential backoff.
func (l *live) open() {
	st := l.breaker.Load()
	if st == breakerOpen || !l.breaker.CompareAndSwap(st, breakerOpen) {
		return
	}
	streak := l.openStreak.Add(1)
	d := l.sh.cooldown
	for i := int64(1); i < streak && d < l.sh.maxCooldown; i++ {
		d *= 2
	}
	d = min(d, l.sh.maxCooldown)
	l.breakerUntil.Store(l.sh.now().Add(d).UnixNano())
	l.breakerOpens.Add(1)
	l.sh.notify()
}

// breakerAllows reports whether the breaker lets a new request through,
// moving an open breaker whose cooldown passed to half-open. In half-open
// one trial request at a time is let through.
func (l *live) breakerAllows() bool {
	switch l.breaker.Load() {
	case breakerClosed:
		return true
	case breakerOpen:
		if l.sh.now().UnixNano() < l.breakerUntil.Load() {
			return false
		}
		if l.breaker.CompareAndSwap(breakerOpen, breakerHalfOpen) {
			l.sh.notify()
		}
		return !l.trialInFlight.Load()
	default:
		return !l.trialInFlight.Load()
	}
}

// breakerState names the breaker state for the debug view.
func (l *live) breakerState() string {
	switch l.breaker.Load() {
	case breakerOpen:
		if l.sh.now().UnixNano() >= l.breakerUntil.Load() {
			return "half_open"
		}
		return "open"
	case breakerHalfOpen:
		return "half_open"
	default:
		return "closed"
	}
}
