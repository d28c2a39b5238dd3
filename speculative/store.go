package speculative

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// evalInterval paces what changes slowly: cohort maturity, trust, the TTL
// controller and the prediction-request rate.
const evalInterval = time.Second

// Stream is what the router knows of a target's KV-event stream, from the
// event plane (which this package does not import).
type Stream struct {
	// Fresh: the stream is fresh and nothing voids its keys
	// (eventplane.Trust.Predictions). While it is not, trust is 0 and
	// predictions that end unconfirmed end "unknown".
	Fresh bool
	// Backlog is how late the router is applying the target's events now
	// (subscriber queueing): the measured slack the automatic TTL adds.
	Backlog time.Duration
}

// Deps are the store's collaborators. Every field is optional.
type Deps struct {
	// Registerer receives the prefixrouter_speculative_* series; nil:
	// none.
	Registerer prometheus.Registerer
	// Logger; nil: slog.Default().
	Logger *slog.Logger
	// Now is the clock; nil: time.Now.
	Now func() time.Time
	// Stream reports a target's event stream. It is called on the request
	// path (Trust) and with a target's lock held, so it must be cheap and
	// must not call back into the store. Nil: every stream fresh, no
	// backlog.
	Stream func(targetid.ID) Stream
}

// Store owns every target's predicted placements: the blocks a routing
// decision expects a pod to store, from dispatch until the pod's KV event
// confirms them, they expire, the request is withdrawn or the target's
// cache is invalidated; and what they are measured by: cohorts, the
// per-target TTL controller, trust, exposure, the funnel of followers and
// false-warm routes, and the holdback arm. Create it with New and start Run
// once; every method is safe for concurrent use.
type Store struct {
	cfg    Config
	log    *slog.Logger
	now    func() time.Time
	stream func(targetid.ID) Stream
	// epoch anchors the store's clock: times are nanoseconds since it, read
	// through time.Time's monotonic clock.
	epoch time.Time

	// targets is copied on write so that the request path reads it
	// without a lock.
	targets atomic.Pointer[map[targetid.ID]*targetState]
	mu      sync.Mutex // serializes writers of targets

	arms *holdback

	// origins are the peer replicas whose predictions the store received
	// (PredictFrom), by name.
	originsMu sync.Mutex
	origins   map[string]*Origin

	// lastEval is when the slow evaluations last ran; Run's goroutine
	// (or a test calling tick) alone touches it.
	lastEval int64
}

// New validates cfg (taking a zero that Validate refuses as its default)
// and returns an empty store.
func New(cfg Config, deps Deps) (*Store, error) {
	cfg.fill()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("speculative: %w", err)
	}
	s := &Store{cfg: cfg, log: deps.Logger, now: deps.Now, stream: deps.Stream}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.stream == nil {
		s.stream = func(targetid.ID) Stream { return Stream{Fresh: true} }
	}
	s.epoch = s.now()
	s.origins = map[string]*Origin{}
	s.targets.Store(&map[targetid.ID]*targetState{})
	s.arms = newHoldback(cfg.Holdback)
	if deps.Registerer != nil {
		if err := deps.Registerer.Register(&collector{s: s}); err != nil {
			return nil, fmt.Errorf("speculative: metrics: %w", err)
		}
	}
	return s, nil
}

// clock is now in the store's nanoseconds.
func (s *Store) clock() int64 { return s.since(s.now()) }

func (s *Store) since(t time.Time) int64 { return int64(t.Sub(s.epoch)) }

// grace is how long after a deadline a confirmation makes the expiry
// early, and the ingestion allowance before a cohort is mature.
func (s *Store) grace() int64 { return int64(s.cfg.MaxStale) }

// targetState is one target's predictions and their accounting.
type targetState struct {
	id   targetid.ID
	name string
	log  *slog.Logger

	// Read without the lock on the request path and the event path.
	live       atomic.Int64  // pending predictions
	lateable   atomic.Int64  // ended predictions a late confirmation may still find
	ttl        atomic.Int64  // the published TTL, ns
	posterior  atomic.Uint64 // float64 bits: the mature confirmation rate with the prior
	referenced atomic.Uint64 // predictions referenced by a later lookup

	mu      sync.RWMutex
	removed bool
	// gen counts invalidations: a placement made before one never adds to
	// the target again.
	gen     uint64
	model   string
	pending map[kvindex.Key]*prediction
	queue   deadlineQueue
	// ended holds predictions that ended unconfirmed (expired, withdrawn)
	// for the grace window, by key, so that a late confirmation can make
	// an expiry early and a follower can find what it was routed on;
	// endedFIFO drops them in the order they ended.
	ended     map[kvindex.Key]*prediction
	endedFIFO []*prediction
	endedHead int

	// The stream as last polled: unfreshAt is the last time it was seen
	// not fresh (math.MinInt64: never).
	fresh     bool
	unfreshAt int64
	backlog   time.Duration

	ctl     ttlController
	lat     latencies
	scratch []time.Duration
	cohorts cohortBook
	rate    rateMeter
	funnel  funnel
	// peers are the peer replicas' predictions on the target, counted
	// apart from the local ones (cohorts, funnel).
	peers map[*Origin]*peerLedger
	// invalidations counts invalidations by reason.
	invalidations [numReasons]uint64
	latHist       [2]histogram // in time, late
}

func (s *Store) newTargetState(id targetid.ID) *targetState {
	t := &targetState{
		id: id, name: id.String(), log: s.log,
		pending:   make(map[kvindex.Key]*prediction),
		ended:     make(map[kvindex.Key]*prediction),
		unfreshAt: math.MinInt64,
		ctl:       newTTLController(&s.cfg),
		latHist:   [2]histogram{newHistogram(latencyBuckets), newHistogram(latencyBuckets)},
	}
	t.ttl.Store(int64(t.ctl.ttl))
	t.posterior.Store(math.Float64bits(priorMean))
	now := s.clock()
	t.rate.at = now
	t.observeStream(s.stream(id), now)
	return t
}

// target is id's state, nil when unknown. Lock-free.
func (s *Store) target(id targetid.ID) *targetState { return (*s.targets.Load())[id] }

// targetOrAdd is id's state, created when unknown.
func (s *Store) targetOrAdd(id targetid.ID) *targetState {
	if t := s.target(id); t != nil {
		return t
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.targets.Load()
	if t := old[id]; t != nil {
		return t
	}
	t := s.newTargetState(id)
	m := make(map[targetid.ID]*targetState, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[id] = t
	s.targets.Store(&m)
	return t
}

func (s *Store) forget(id targetid.ID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.targets.Load()
	if _, ok := old[id]; !ok {
		return
	}
	m := make(map[targetid.ID]*targetState, len(old))
	for k, v := range old {
		if k != id {
			m[k] = v
		}
	}
	s.targets.Store(&m)
}

// AddTarget makes a target known, so that the debug view and the metrics
// show it before its first prediction. The router calls it when health
// reports a target added; Predict adds unknown targets too.
func (s *Store) AddTarget(id targetid.ID) { s.targetOrAdd(id) }

// TTL is the target's current prediction lifetime (the initial one for a
// target it does not know). Lock-free. The router's dry run shows it
// beside each candidate's predicted run.
func (s *Store) TTL(id targetid.ID) time.Duration {
	if t := s.target(id); t != nil {
		return time.Duration(t.ttl.Load())
	}
	if s.cfg.TTL > 0 {
		return s.cfg.TTL
	}
	return min(InitialTTL, s.cfg.MaxStale)
}

// Reason says why a target's predictions were invalidated.
type Reason uint8

// Invalidation reasons.
const (
	// ReasonCleared: the pod announced AllBlocksCleared, or the event
	// plane reset the target's placements (kvindex.Observer.Cleared).
	ReasonCleared Reason = iota
	// ReasonRestarted: the pod's process restarted; its new process never
	// confirms what was predicted of the old one.
	ReasonRestarted
	// ReasonRemoved: the target left the fleet; the store forgets it.
	ReasonRemoved
	numReasons
)

var reasonNames = [numReasons]string{"cleared", "restarted", "removed"}

func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// Invalidate ends every pending prediction of a target as invalidated and
// starts a new generation: placements made before it add nothing more,
// and no later event confirms or makes early what ended before it. The
// router calls it when the target's pod restarted (ReasonRestarted) or was
// removed (ReasonRemoved: the store forgets the target); the event path
// calls it on AllBlocksCleared and placement resets (Observer,
// ReasonCleared). Followers of invalidated predictions are not false-warm:
// the cache was lost, not mispredicted.
func (s *Store) Invalidate(id targetid.ID, reason Reason) {
	t := s.target(id)
	if t == nil {
		return
	}
	now := s.clock()
	t.mu.Lock()
	t.gen++
	if reason < numReasons {
		t.invalidations[reason]++
	}
	for _, p := range t.pending {
		s.endLocked(t, p, stateInvalidated, now)
	}
	clear(t.queue)
	t.queue = t.queue[:0]
	clear(t.ended)
	t.endedFIFO, t.endedHead = nil, 0
	t.publishCounts()
	if reason == ReasonRemoved {
		t.removed = true
	}
	t.mu.Unlock()
	if reason == ReasonRemoved {
		s.forget(id)
	}
}

// Observer is the event path's seam (kvindex.Observer, given to the
// ingestor): every BlockStored on a target, in any tier, confirms its
// predictions at the time the router applies it; AllBlocksCleared and
// placement resets invalidate them.
func (s *Store) Observer() kvindex.Observer {
	return kvindex.Observer{
		Stored:  func(id targetid.ID, _ kvindex.Tier, keys []kvindex.Key) { s.Confirm(id, keys, s.now()) },
		Cleared: func(id targetid.ID) { s.Invalidate(id, ReasonCleared) },
	}
}

// Run processes expiries every TimerResolution and, once a second, matures
// cohorts and updates each target's trust, TTL and prediction-request
// rate, until ctx is done. The router starts it once.
func (s *Store) Run(ctx context.Context) error {
	tk := time.NewTicker(TimerResolution)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tk.C:
			s.tick()
		}
	}
}

// Tick is one round of Run: a caller on a virtual clock that does not
// run Run calls it every TimerResolution of its own time.
func (s *Store) Tick() { s.tick() }

// tick is one round of Run.
func (s *Store) tick() {
	now := s.clock()
	eval := now-s.lastEval >= int64(evalInterval)
	if eval {
		s.lastEval = now
	}
	for _, t := range *s.targets.Load() {
		st := s.stream(t.id)
		t.mu.Lock()
		t.observeStream(st, now)
		s.expireLocked(t, now)
		if eval {
			s.evaluateLocked(t, now)
		}
		t.mu.Unlock()
	}
}

// observeStream records the stream's state as polled at now.
func (t *targetState) observeStream(st Stream, now int64) {
	t.fresh, t.backlog = st.Fresh, st.Backlog
	if !st.Fresh {
		t.unfreshAt = now
	}
}

// pollLocked polls the target's stream.
func (s *Store) pollLocked(t *targetState, now int64) { t.observeStream(s.stream(t.id), now) }

// unfreshSince reports whether the stream was seen not fresh at any time
// since from (as polled).
func (t *targetState) unfreshSince(from int64) bool { return !t.fresh || t.unfreshAt >= from }

// evaluateLocked does the slow work for one target.
func (s *Store) evaluateLocked(t *targetState, now int64) {
	t.cohorts.mature(now, s.grace())
	for _, l := range t.peers {
		l.cohorts.mature(now, s.grace())
	}
	recent := t.cohorts.recentSum()
	t.posterior.Store(math.Float64bits(recent.posterior()))
	t.ctl.update(&s.cfg, &t.lat, t.backlog, &t.scratch)
	t.ttl.Store(int64(t.ctl.ttl))
	t.rate.update(now)
}

// publishCounts refreshes the lock-free counts after a change.
func (t *targetState) publishCounts() {
	t.live.Store(int64(len(t.pending)))
	t.lateable.Store(int64(len(t.ended)))
}

// rateTau is the time constant of the prediction-request rate (λ).
const rateTau = 30 * time.Second

// rateMeter is a target's recent rate of requests that inserted
// predictions, an exponentially weighted average over rateTau.
type rateMeter struct {
	requests uint64 // ever
	seen     uint64 // at the last update
	at       int64  // the last update, or the target's creation
	perSec   float64
}

func (m *rateMeter) update(now int64) {
	dt := float64(now-m.at) / float64(time.Second)
	if dt <= 0 {
		return
	}
	inst := float64(m.requests-m.seen) / dt
	alpha := 1 - math.Exp(-dt/rateTau.Seconds())
	m.perSec += alpha * (inst - m.perSec)
	m.seen, m.at = m.requests, now
}
