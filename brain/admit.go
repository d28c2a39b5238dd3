package brain

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/prefixrouter/prefixrouter/flow"
	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// AdmissionConfig is flow control: when a pod takes no more work, and the
// waiting line's classes, shares and bounds.
type AdmissionConfig struct {
	// Off dispatches every request at once, onto the pods' queues, as a
	// router without flow control does.
	Off  bool
	Line flow.Config
	// Budget is how much queued prefill, in time at the pod's pace, a pod
	// may hold before it takes no more work and requests wait in the
	// router instead (0: half the tightest class objective, or 1 s when
	// no class has one). Below it every request is dispatched at once, as
	// decided.
	Budget time.Duration
}

// DefaultAdmissionConfig is flow control on, with flow.DefaultConfig's line.
func DefaultAdmissionConfig() AdmissionConfig {
	return AdmissionConfig{Line: flow.DefaultConfig()}
}

// Validate reports every fault at once.
func (c AdmissionConfig) Validate() error {
	var errs []error
	if err := c.Line.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Budget < 0 {
		errs = append(errs, fmt.Errorf("--dispatch-budget %v must not be negative", c.Budget))
	}
	return errors.Join(errs...)
}

// budget is c.Budget, or its default.
func (c AdmissionConfig) budget() time.Duration {
	if c.Budget > 0 {
		return c.Budget
	}
	tight := time.Duration(0)
	for _, cl := range c.Line.Classes {
		if cl.Objective > 0 && (tight == 0 || cl.Objective < tight) {
			tight = cl.Objective
		}
	}
	if tight == 0 {
		return time.Second
	}
	return tight / 2
}

// Verdict is what admission made of a request.
type Verdict uint8

// Verdicts.
const (
	// Admitted: the request goes now, on its decision (Waiter.Decision).
	Admitted Verdict = iota
	// Queued: it waits in the router's line until Released says it goes
	// or is shed.
	Queued
	// Shed: it is refused (Waiter.Shed says why), answered at once.
	Shed
)

// Reasons a request is shed.
const (
	// ShedDeadline: its class's objective cannot be met, or passed while
	// it waited.
	ShedDeadline = "deadline"
	// ShedQueueFull: the line holds its bound of requests or tokens.
	ShedQueueFull = "queue_full"
	// ShedNoTarget: no pod of its model is routable any more.
	ShedNoTarget = "no_target"
)

// Waiter is one request before its dispatch, from Admit to the verdict.
// The driver reads it once Admit or Released hands it back.
type Waiter struct {
	ticket  flow.Ticket
	model   string
	d       *Decision
	targets []*health.Target
	// verdict and shed are set under the admission's lock; done is
	// closed once the waiter leaves the line (released or shed).
	verdict Verdict
	shed    string
	// retryAfter is, for a shed request, when the line is expected to
	// have room again.
	retryAfter time.Duration
	queued     time.Duration
	done       chan struct{}
	// Value is the driver's.
	Value any
}

// NewWaiter is a request of d's model, decided on targets, of class (an
// index into the line's classes; flow.Config.ClassIndex) and tenant;
// output is the tokens it is expected to generate (its max_tokens, or an
// estimate), which its tenant's share is charged with its prompt.
func NewWaiter(d *Decision, targets []*health.Target, class int, tenant string, output int) *Waiter {
	return &Waiter{model: d.model, d: d, targets: targets,
		ticket: flow.Ticket{Class: class, Tenant: tenant, Tokens: int64(d.prompt.Count + max(output, 0)), Work: int64(d.prompt.Count)}}
}

// Decision is the request's decision: its first one until it is released,
// then the one made at its release, on the fleet as it stood then.
func (w *Waiter) Decision() *Decision { return w.d }

// Verdict is the last verdict; Shed why the request was shed ("" when it
// was not).
func (w *Waiter) Verdict() Verdict { return w.verdict }

// ShedReason says why the request was shed ("" when it was not).
func (w *Waiter) ShedReason() string { return w.shed }

// RetryAfter is, for a shed request, how long the client should wait
// before it tries again: the time the line ahead of it takes to drain, at
// least a second.
func (w *Waiter) RetryAfter() time.Duration { return max(w.retryAfter, time.Second) }

// QueueTime is how long the request waited in the line.
func (w *Waiter) QueueTime() time.Duration { return w.queued }

// Done is closed once a queued request was released or shed.
func (w *Waiter) Done() <-chan struct{} { return w.done }

// Class is the request's priority (an index into the line's classes).
func (w *Waiter) Class() int { return w.ticket.Class }

// Admission is flow control: each pool of pods (a model's) takes a request
// at once while one of its pods has room, its queued prefill within the
// budget at the pod's pace; past that requests wait in the router's line,
// leave it by priority and fair share, each decided again at its release
// on the cache and load of that moment, and are shed with a reason when
// their deadline cannot be met or the line is full. It is safe for
// concurrent use: the HTTP path admits on each request's goroutine and
// releases on its own (Run), the discrete-event engine on its one.
type Admission struct {
	cfg    AdmissionConfig
	budget time.Duration
	dec    *Decider
	now    func() time.Time

	mu    sync.Mutex
	pools map[string]*pool
	// early are the waiters an Admit let go or shed besides its own, for
	// the next Release.
	early []*Waiter
	// kick asks Run to release: a pod's queue got shorter.
	kick chan struct{}
}

// pool is one model's line and the fleet as its last decision saw it.
type pool struct {
	line *flow.Line
	// saturation is how far the least busy routable pod is into its
	// budget (PoolView.Saturation); rate the prompt tokens per second
	// the pods of known pace work off together, and queued the work they
	// hold (0: no pace known).
	saturation, rate, queued float64
}

// PoolView is a pool's line as the metrics and the debug view show it.
type PoolView struct {
	Model string `json:"model"`
	// Saturation is how far the least busy routable pod is into its
	// budget (1: every one is at or past it, and requests wait).
	Saturation float64     `json:"saturation"`
	Classes    []ClassView `json:"classes"`
}

// ClassView is one class's part of a pool's line.
type ClassView struct {
	Class     string        `json:"class"`
	Objective time.Duration `json:"objective"`
	Waiting   int           `json:"waiting"`
	Tokens    int64         `json:"tokens"`
	// OldestWait is how long the class's longest waiting request has
	// waited.
	OldestWait time.Duration `json:"oldest_wait"`
}

// NewAdmission is flow control over dc's decisions, on clock now. The
// config must be valid.
func (dc *Decider) NewAdmission(cfg AdmissionConfig, now func() time.Time) *Admission {
	a := &Admission{cfg: cfg, budget: cfg.budget(), dec: dc, now: now, pools: map[string]*pool{}, kick: make(chan struct{}, 1)}
	dc.capacity.Store(&a.kick)
	return a
}

// Budget is the queued prefill, in time, past which a pod takes no more.
func (a *Admission) Budget() time.Duration { return a.budget }

func (a *Admission) poolOf(model string) *pool {
	p := a.pools[model]
	if p == nil {
		p = &pool{line: flow.New(a.cfg.Line)}
		a.pools[model] = p
	}
	return p
}

// room reports whether candidate c can take a request now: its queued
// prefill, at its pace, within the budget (a pod whose pace is not known
// yet always has room: nothing says it is busy). A pod with no prefill
// queued always has room, whatever its pace says: nothing waits there,
// and a pace whose floor alone passed the budget (fitted on first bytes
// of a queue since gone) would otherwise keep it from every request, so
// that no first byte could ever correct it.
func (a *Admission) room(c *Candidate) bool {
	if !c.Routable || c.excluded {
		return false
	}
	p := c.Target.Pace()
	q := a.dec.ch.queuedTokens(c.Load)
	return !p.Known() || q <= 0 || p.Time(q) <= a.budget
}

// pendingWork is what one release pass let go to a target: requests on
// no ledger until their drivers book them.
type pendingWork struct{ requests, uncached int64 }

// withPending counts on c's load what this pass let go to its target.
func withPending(c *Candidate, pending map[targetid.ID]pendingWork) {
	if pw, ok := pending[c.Target.ID]; ok {
		c.Load.InFlight += pw.requests
		c.Load.Prefilling += pw.requests
		c.Load.QueuedUncachedTokens += pw.uncached
	}
}

// anyRoom reports whether one of targets has room, or none is routable
// (the reread then sheds the head at once).
func (a *Admission) anyRoom(targets []*health.Target, pending map[targetid.ID]pendingWork) bool {
	routable := false
	for _, t := range targets {
		c := a.dec.candidate(t)
		withPending(&c, pending)
		if a.room(&c) {
			return true
		}
		routable = routable || c.Routable
	}
	return !routable
}

// fits is d as it can go now: itself when its choice has room, the
// choice among the candidates with room otherwise, nil when none has.
func (a *Admission) fits(d *Decision) *Decision {
	if a.room(d.target()) {
		return d
	}
	c := *d
	c.cands = slices.Clone(d.cands)
	roomy := false
	for i := range c.cands {
		if a.room(&c.cands[i]) {
			roomy = true
		} else {
			c.cands[i].excluded = true
		}
	}
	if !roomy {
		return nil
	}
	ch := a.dec.ch.choose(c.cands, c.prompt.Count, c.blockSize, false)
	if ch.idx < 0 {
		return nil
	}
	c.chosen, c.reason = ch.idx, ch.reason+"; the pods with a shorter queue only (flow control)"
	// The candidates left out for their queue are candidates again for a
	// retry.
	for i := range c.cands {
		c.cands[i].excluded = d.cands[i].excluded
	}
	return &c
}

// Admit decides what happens to w now: Admitted (w.Decision is where it
// goes), Queued (wait for Done, then read the verdict) or Shed.
func (a *Admission) Admit(w *Waiter) Verdict {
	if a.cfg.Off {
		w.verdict = Admitted
		return Admitted
	}
	now := a.now()
	w.ticket.Arrived = now
	if obj := a.objective(w.ticket.Class); obj > 0 {
		w.ticket.Deadline = now.Add(obj)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.poolOf(w.model)
	a.observe(p, w.d)
	if p.line.Len() == 0 {
		if d := a.fits(w.d); d != nil {
			w.d, w.verdict = d, Admitted
			return Admitted
		}
	}
	if est, ok := a.estimate(p, w); ok && !w.ticket.Deadline.IsZero() && now.Add(est).After(w.ticket.Deadline) {
		a.shedNow(p, w, ShedDeadline)
		return Shed
	}
	if !p.line.Fits(w.ticket.Tokens) {
		a.shedNow(p, w, ShedQueueFull)
		return Shed
	}
	w.ticket.Value = w
	w.done = make(chan struct{})
	if err := p.line.Push(&w.ticket); err != nil {
		a.shedNow(p, w, ShedQueueFull)
		return Shed
	}
	w.verdict = Queued
	// Waiting, the decision is read again at the release from its
	// prompt's keys: its candidates, most of what it holds with
	// hundreds of pods, can go.
	w.d = w.d.withoutCandidates()
	// A newcomer of a higher class than every one waiting may go at once;
	// the others it let go (and those it found past their deadline) learn
	// so from their Done, and the next Release hands them to its caller,
	// who may wait on no channel (the discrete-event engine).
	n := len(a.early)
	a.early = a.releasePool(p, now, a.early)
	a.early = append(a.early[:n], slices.DeleteFunc(a.early[n:], func(o *Waiter) bool { return o == w })...)
	return w.verdict
}

// withoutCandidates is a copy of d without its candidates, for a reread.
func (d *Decision) withoutCandidates() *Decision {
	c := *d
	c.cands, c.chosen = nil, -1
	return &c
}

func (a *Admission) objective(class int) time.Duration {
	if cl := a.cfg.Line.Classes; class >= 0 && class < len(cl) {
		return cl[class].Objective
	}
	return 0
}

func (a *Admission) shedNow(p *pool, w *Waiter, reason string) {
	w.verdict, w.shed = Shed, reason
	w.retryAfter = time.Second
	if p.rate > 0 {
		// When the line and the pods' queues will have drained.
		w.retryAfter = time.Duration((float64(p.line.Sum().Work) + p.queued) / p.rate * float64(time.Second))
	}
}

// observe reads the pool's fleet from decision d: the saturation, the
// rate at which the routable pods of known pace work off prompt tokens
// together, and the work they hold.
func (a *Admission) observe(p *pool, d *Decision) {
	p.rate, p.queued = 0, 0
	least, unknown := math.Inf(1), false
	for i := range d.cands {
		c := &d.cands[i]
		if !c.Routable {
			continue
		}
		pc := c.Target.Pace()
		if !pc.Known() {
			unknown = true
			continue
		}
		q := a.dec.ch.queuedTokens(c.Load)
		p.rate += 1 / pc.PerToken
		p.queued += q
		least = math.Min(least, pc.Time(q).Seconds()/a.budget.Seconds())
	}
	switch {
	case unknown:
		p.saturation = 0 // a pod of unknown pace has room
	case math.IsInf(least, 1):
		p.saturation = 1 // no routable pod
	default:
		p.saturation = math.Min(least, 1)
	}
}

// estimate is when w's first token would come if it joined the line now:
// the work ahead of it in the line and on the pods, at the fleet's rate,
// then its own prefill at the best pace (false: no pace is known).
func (a *Admission) estimate(p *pool, w *Waiter) (time.Duration, bool) {
	rate, queued := p.rate, p.queued
	if rate <= 0 {
		return 0, false
	}
	ahead := float64(p.line.Ahead(w.ticket.Class, w.ticket.Tenant, w.ticket.Tokens).Work)
	own := math.Inf(1)
	for i := range w.d.cands {
		c := &w.d.cands[i]
		if pc := c.Target.Pace(); c.Routable && pc.Known() {
			own = math.Min(own, pc.Time(float64(w.d.prompt.Count)).Seconds())
		}
	}
	return time.Duration(((ahead+queued)/rate + own) * float64(time.Second)), true
}

// Leave takes w out of the line: its client gave up. It reports false
// when w was released or shed meanwhile (the caller then owns its
// decision and must end it as a dispatch that never left).
func (a *Admission) Leave(w *Waiter) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !w.ticket.Queued() {
		return false
	}
	a.poolOf(w.model).line.Remove(&w.ticket)
	w.queued = a.now().Sub(w.ticket.Arrived)
	return true
}

// Release lets go every waiting request that can go now, decided again on
// the fleet as it stands, and sheds those whose deadline passed; it
// appends them to out, each with its verdict, and closes their Done. Out
// also gets, first, those an Admit let go or shed since the last call.
func (a *Admission) Release(out []*Waiter) []*Waiter {
	if a.cfg.Off {
		return out
	}
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	out = append(out, a.early...)
	clear(a.early)
	a.early = a.early[:0]
	for _, p := range a.pools {
		out = a.releasePool(p, now, out)
	}
	return out
}

func (a *Admission) releasePool(p *pool, now time.Time, out []*Waiter) []*Waiter {
	if p.line.Len() == 0 {
		return out
	}
	var overdue []*flow.Ticket
	for _, t := range p.line.Overdue(now, overdue) {
		w := t.Value.(*Waiter)
		a.shedNow(p, w, ShedDeadline)
		out = a.leave(w, now, out)
	}
	// pending is what this pass let go, by target: the drivers book it
	// after the pass (the virtual router as Release returns, the API's
	// handlers on their goroutines), so the targets' ledgers do not show
	// it yet, and without it every head would find the room the first
	// one took and the whole line would go at once.
	var pending map[targetid.ID]pendingWork
	for t := p.line.Head(); t != nil; t = p.line.Head() {
		w := t.Value.(*Waiter)
		if !a.anyRoom(w.targets, pending) {
			// Most kicks under saturation: no pod has room yet, and the
			// head's decision need not be read again to know it.
			break
		}
		d, ok := a.dec.reread(w.d, w.targets, nil)
		if !ok {
			p.line.Remove(t)
			a.shedNow(p, w, ShedNoTarget)
			out = a.leave(w, now, out)
			continue
		}
		if len(pending) > 0 {
			for i := range d.cands {
				withPending(&d.cands[i], pending)
			}
			// Chosen again on the loads with what went before it.
			if ch := a.dec.ch.choose(d.cands, d.prompt.Count, d.blockSize, false); ch.idx >= 0 {
				d.chosen, d.reason = ch.idx, ch.reason
			}
		}
		a.observe(p, d)
		if d = a.fits(d); d == nil {
			break
		}
		p.line.Remove(t)
		w.d, w.verdict = d, Admitted
		out = a.leave(w, now, out)
		if pending == nil {
			pending = map[targetid.ID]pendingWork{}
		}
		v := d.view(nil, d.chosen)
		pw := pending[d.target().Target.ID]
		pw.requests++
		pw.uncached += int64(max(v.Prompt.Count-v.Predicted, 0))
		pending[d.target().Target.ID] = pw
	}
	return out
}

func (a *Admission) leave(w *Waiter, now time.Time, out []*Waiter) []*Waiter {
	w.queued = now.Sub(w.ticket.Arrived)
	w.ticket.Value = nil
	close(w.done)
	return append(out, w)
}

// Kicked is a channel that receives when a pod's queue got shorter (a
// first byte, an end), for a driver that releases on its own goroutine.
func (a *Admission) Kicked() <-chan struct{} { return a.kick }

// View is every pool's line as it stands.
func (a *Admission) View() []PoolView {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]PoolView, 0, len(a.pools))
	for model, p := range a.pools {
		v := PoolView{Model: model, Saturation: p.saturation}
		for c, cl := range a.cfg.Line.Classes {
			n, tokens := p.line.ClassLen(c)
			cv := ClassView{Class: cl.Name, Objective: cl.Objective, Waiting: n, Tokens: tokens}
			if t := p.line.OldestOf(c); t != nil {
				cv.OldestWait = now.Sub(t.Arrived)
			}
			v.Classes = append(v.Classes, cv)
		}
		out = append(out, v)
	}
	return out
}
