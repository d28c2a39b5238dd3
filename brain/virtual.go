package brain

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/speculative"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// VirtualConfig is a Virtual router: the serve command's policy, cost,
// event-plane, speculative and breaker settings, a fixed fleet of targets
// and the clock everything runs on.
type VirtualConfig struct {
	Policy      Policy
	Cost        CostConfig
	Events      eventplane.Config
	Speculative speculative.Config
	// Health gives the breaker's settings; nothing is probed or scraped.
	Health health.Config
	// Model is what every target serves.
	Model string
	// Targets are the fleet, fixed for the router's life; NumGPUBlocks is
	// each one's KV cache (vllm:cache_config_info), which bounds its
	// placements in the index.
	Targets      []targetid.ID
	NumGPUBlocks int
	// Now is the clock of the plane, the predictions and the load ledger.
	Now func() time.Time
	// Replay reads a target's replay buffer, from which its stream
	// recovers a gap, a restart and a reconnection (nil: it cannot).
	Replay func(targetid.ID) kvindex.ReplayBuffer
	// TieSeed seeds the draws that break cost ties, so that a run
	// repeats (the API's routers draw from the process's generator).
	TieSeed uint64
	// MaxRetries is how many other targets a request that failed before
	// its first byte is tried on (Retry), as the API's --max-retries.
	MaxRetries int
	// Admission is flow control (nil: none, every request dispatched at
	// once); Submit routes through it.
	Admission *AdmissionConfig
	Logger    *slog.Logger
}

// Virtual is the router's decision and bookkeeping without HTTP, sockets
// or goroutines, for the benchmark's discrete-event engine: the same
// decider, chooser, event plane (index, ingestion, freshness), predicted
// placements and load ledger that decide for the API and the dry run, on
// a clock the caller owns. The caller routes prompts of token ids (Route),
// reports each request's first byte and end, hands over each target's
// KV-event batches (Deliver) and scraped gauges (Scrape), and paces the
// periodic work (Evaluate every Events.EvalInterval, Tick every
// speculative.TimerResolution). Methods must not be called concurrently.
type Virtual struct {
	dec   *Decider
	plane *eventplane.Plane
	spec  *speculative.Store
	model string
	// targets are the fleet's as of their last scrape; slot maps an id to
	// its place.
	targets []*health.Target
	slot    map[targetid.ID]int
	now     func() time.Time
	nextID  uint64
	// started is each target's process start as its last scrape read it
	// (by slot).
	started    []time.Time
	maxRetries int
	health     health.Config
	caches     map[targetid.ID]eventplane.Cache
	// probes are each target's probe outcomes in a row (Probe); unlisted
	// marks the targets out of the fleet (Unlist), which no request goes
	// to, and nUnlisted counts them.
	probes    []health.ProbeRun
	unlisted  []bool
	nUnlisted int
	// origins are the peer replicas whose predictions PredictFrom
	// recorded, by name.
	origins map[string]*speculative.Origin
	// adm is flow control (nil: none); released Release's buffer.
	adm      *Admission
	released []*Waiter
}

// NewVirtual builds a virtual router with an empty index.
func NewVirtual(cfg VirtualConfig) (*Virtual, error) {
	if cfg.Now == nil {
		return nil, errors.New("virtual router: no clock")
	}
	if cfg.Events.BlockSize <= 0 {
		return nil, errors.New("virtual router: the block size must be given (Events.BlockSize)")
	}
	if len(cfg.Targets) == 0 {
		return nil, errors.New("virtual router: no targets")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	v := &Virtual{model: cfg.Model, slot: make(map[targetid.ID]int, len(cfg.Targets)), now: cfg.Now, maxRetries: cfg.MaxRetries,
		health: cfg.Health, probes: upRuns(len(cfg.Targets)), unlisted: make([]bool, len(cfg.Targets)),
		started: make([]time.Time, len(cfg.Targets))}
	var observer kvindex.Observer
	if cfg.Policy == PolicySpeculative {
		stream := func(id targetid.ID) speculative.Stream {
			return speculative.Stream{Fresh: v.plane.Trust(id).Predictions}
		}
		var err error
		if v.spec, err = speculative.New(cfg.Speculative, speculative.Deps{Logger: log, Now: cfg.Now, Stream: stream}); err != nil {
			return nil, fmt.Errorf("virtual router: %w", err)
		}
		observer = v.spec.Observer()
	}
	var err error
	if v.plane, err = eventplane.New(cfg.Events, eventplane.Deps{Logger: log, Now: cfg.Now, Observer: observer, Replay: cfg.Replay}); err != nil {
		return nil, fmt.Errorf("virtual router: %w", err)
	}
	v.caches = make(map[targetid.ID]eventplane.Cache, len(cfg.Targets))
	for i, id := range cfg.Targets {
		t, err := health.Standalone(id, cfg.Model, cfg.Health, cfg.Now)
		if err != nil {
			return nil, fmt.Errorf("virtual router: %w", err)
		}
		v.targets = append(v.targets, t)
		v.slot[id] = i
		v.caches[id] = eventplane.Cache{Serving: true, Reported: true, BlockSize: cfg.Events.BlockSize,
			HashAlgo: cfg.Events.HashAlgo, NumGPUBlocks: cfg.NumGPUBlocks}
		if v.spec != nil {
			v.spec.AddTarget(id)
		}
	}
	v.plane.SetCaches(v.caches)
	for _, id := range cfg.Targets {
		v.plane.SetTarget(id, eventplane.Source{InProcess: true})
	}
	v.dec = New(cfg.Policy, cfg.Cost, v.plane, v.spec)
	v.dec.SeedTies(cfg.TieSeed)
	if cfg.Admission != nil {
		if err := cfg.Admission.Validate(); err != nil {
			return nil, fmt.Errorf("virtual router: %w", err)
		}
		if !cfg.Admission.Off {
			v.adm = v.dec.NewAdmission(*cfg.Admission, cfg.Now)
		}
	}
	return v, nil
}

// VirtualRequest is one request Virtual.Route dispatched: it holds the
// target's flight, the plane's expectation and the predicted placements
// until its end.
type VirtualRequest struct {
	v        *Virtual
	d        *Decision
	id       string
	book     *Booking
	sent     time.Time
	ttft     time.Duration
	answered bool
	// w is the request's place in flow control (Submit; nil: Route).
	w *Waiter
}

// Route decides where a prompt of token ids goes and dispatches it there,
// as the API path does between the decision and the request leaving:
// the load ledger, the event plane's expectation, the predicted placements
// (speculative policy) and the approximate policy's table. text is what
// the approximate policy hashes; session names the conversation for the
// holdback arm (empty: the request alone).
func (v *Virtual) Route(ids []uint32, text []byte, session string) (*VirtualRequest, error) {
	id, d, _, err := v.decide(ids, text, session)
	if err != nil {
		return nil, err
	}
	return v.dispatch(d, id, v.now()), nil
}

// decide names a new request and decides for it among the listed
// targets, which it returns with the decision.
func (v *Virtual) decide(ids []uint32, text []byte, session string) (string, *Decision, []*health.Target, error) {
	v.nextID++
	id := "des-" + strconv.FormatUint(v.nextID, 10)
	conv := speculative.Conversation{SessionID: session, RequestID: id}
	targets := v.listed()
	d, err := v.dec.Decide(Input{Model: v.model, Targets: targets, Prompt: IDsPrompt(ids), ApproxText: text, Conversation: conv})
	return id, d, targets, err
}

// Submit is Route under flow control (VirtualConfig.Admission): the
// request is dispatched at once while a pod has room, as Route does;
// past that it waits in the line (Verdict Queued) until Release hands it
// back dispatched or shed, or it is refused at once (Shed). class is its
// priority (flow.Config.ClassIndex), tenant whom it is charged to, output
// the tokens it is expected to generate.
func (v *Virtual) Submit(ids []uint32, text []byte, session string, class int, tenant string, output int) (*VirtualRequest, error) {
	if v.adm == nil {
		return v.Route(ids, text, session)
	}
	id, d, targets, err := v.decide(ids, text, session)
	if err != nil {
		return nil, err
	}
	r := &VirtualRequest{v: v, id: id, sent: v.now(), w: NewWaiter(d, targets, class, tenant, output)}
	r.w.Value = r
	if v.adm.Admit(r.w) == Admitted {
		r.booked(r.w.Decision())
	}
	return r, nil
}

// Release is the requests that left flow control's line since the last
// call (Verdict Admitted: dispatched on a decision made now; Shed), for
// the engine to call whenever a pod's queue may have got shorter (a
// first byte, an end, a scrape) and at every Tick.
func (v *Virtual) Release() []*VirtualRequest {
	if v.adm == nil {
		return nil
	}
	v.released = v.adm.Release(v.released[:0])
	out := make([]*VirtualRequest, 0, len(v.released))
	for _, w := range v.released {
		r := w.Value.(*VirtualRequest)
		if w.Verdict() == Admitted {
			r.booked(w.Decision())
		}
		out = append(out, r)
	}
	clear(v.released)
	return out
}

// Admission is the virtual router's flow control (nil: none).
func (v *Virtual) Admission() *Admission { return v.adm }

// booked dispatches r on d.
func (r *VirtualRequest) booked(d *Decision) {
	r.d = d.chosenOnly()
	r.book = r.d.Dispatch(Dispatch{RequestID: r.id})
}

// Verdict is what flow control made of the request (Admitted for one
// Route dispatched). A Queued request has no target yet.
func (r *VirtualRequest) Verdict() Verdict {
	if r.w == nil {
		return Admitted
	}
	return r.w.Verdict()
}

// Waiter is the request's place in flow control (nil: routed without).
func (r *VirtualRequest) Waiter() *Waiter { return r.w }

// Leave takes a queued request out of the line (its client gave up); it
// reports false when it was not waiting.
func (r *VirtualRequest) Leave() bool { return r.w != nil && r.v.adm.Leave(r.w) }

// listed is the fleet without its unlisted targets.
func (v *Virtual) listed() []*health.Target {
	if v.nUnlisted == 0 {
		return v.targets
	}
	out := make([]*health.Target, 0, len(v.targets)-v.nUnlisted)
	for i, t := range v.targets {
		if !v.unlisted[i] {
			out = append(out, t)
		}
	}
	return out
}

// Retry decides again for r, which failed at its target before the first
// byte (after Finish), as the API retries (Decision.Retry): the same
// request, prompt and holdback arm on the targets no attempt of it failed
// on, read as they are now. It returns nil once MaxRetries retries were
// made or no other target is routable.
func (r *VirtualRequest) Retry() *VirtualRequest {
	v := r.v
	if r.d.Attempts() > v.maxRetries {
		return nil
	}
	d, ok := r.d.Retry(v.listed())
	if !ok {
		return nil
	}
	return v.dispatch(d, r.id, r.sent)
}

// dispatch books decision d's target for request id, sent by the client
// at sent.
func (v *Virtual) dispatch(d *Decision, id string, sent time.Time) *VirtualRequest {
	r := &VirtualRequest{v: v, id: id, sent: sent}
	r.booked(d)
	return r
}

// chosenOnly is a copy of d with the chosen candidate alone and the
// prompt's count without its ids, all that is read of a decision after
// dispatch when there is no tail (a retry reads the fleet afresh): with
// hundreds of targets, a request's other candidates were most of what
// tens of thousands of requests in flight held.
func (d *Decision) chosenOnly() *Decision {
	c := *d
	c.cands, c.chosen = []Candidate{d.cands[d.chosen]}, 0
	c.prompt.IDs, c.prompt.Counted = nil, false
	return &c
}

// Target is where the request went.
func (r *VirtualRequest) Target() targetid.ID { return r.d.Target().Target.ID }

// PredictedCached is the prompt tokens the router expects the target to
// serve from its cache.
func (r *VirtualRequest) PredictedCached() int { return r.book.Predicted() }

// ConfirmedBlocks is the run of prompt blocks the index said the target
// holds (the API's X-Prefixrouter-Confirmed-Blocks).
func (r *VirtualRequest) ConfirmedBlocks() int { return r.book.Confirmed() }

// FirstByte records the request's first byte now: its prefill leaves the
// target's queue and the plane awaits the blocks it computed.
func (r *VirtualRequest) FirstByte() {
	if r.answered {
		return
	}
	r.answered = true
	r.ttft = r.v.now().Sub(r.sent)
	r.book.FirstByte()
}

// Finish ends the request: answered, with the cached tokens the pod
// reported, or failed at the pod before its first byte (its predicted
// placements are withdrawn).
func (r *VirtualRequest) Finish(answered bool, cachedTokens int) {
	if !answered {
		r.book.Withdraw()
		r.book.End(health.OutcomeUpstreamError)
		return
	}
	r.FirstByte()
	r.book.End(health.OutcomeSuccess)
	if r.d.predicting && r.v.spec != nil {
		r.v.spec.Record(r.book.Outcome(r.d.prompt.Count, r.book.Predicted(), cachedTokens, true, r.ttft))
	}
}

// Cancel ends the request for a client that went away before its answer
// (the run's drain bound): its predictions stay until confirmed or
// expired, as a client cancel's do on the HTTP path.
func (r *VirtualRequest) Cancel() {
	r.book.End(health.OutcomeCanceled)
}

// Prediction is what the request's dispatch predicted, for the peer
// replicas (PredictFrom); false when it predicted nothing, as the live
// replica then publishes nothing.
func (r *VirtualRequest) Prediction() (Prediction, bool) { return r.book.Prediction() }

// PredictFrom records a peer replica's prediction as origin's, as a live
// replica records what its peers publish (speculative.Store.PredictFrom).
// It returns the placement the origin's withdrawal ends (Withdraw); nil
// when it records nothing: the policy is not speculative, the target is
// not the router's or the deadline has passed.
func (v *Virtual) PredictFrom(origin string, p Prediction) (*speculative.Placement, error) {
	if v.spec == nil {
		return nil, nil
	}
	if _, ok := v.slot[p.Target]; !ok {
		return nil, nil
	}
	o := v.origins[origin]
	if o == nil {
		var err error
		if o, err = v.spec.Origin(origin); err != nil {
			return nil, fmt.Errorf("virtual router: %w", err)
		}
		if v.origins == nil {
			v.origins = map[string]*speculative.Origin{}
		}
		v.origins[origin] = o
	}
	return v.spec.PredictFrom(o, speculative.Dispatch{Target: p.Target, Namespace: p.Namespace}, p.Keys, p.Deadline), nil
}

// Flights is the router's own in-flight work on target id, what a live
// replica shares with its peers whenever it changes: when a request is
// routed, gets its first byte and ends.
func (v *Virtual) Flights(id targetid.ID) health.Flights {
	i, ok := v.slot[id]
	if !ok {
		return health.Flights{}
	}
	return v.targets[i].Flights()
}

// SetPeerFlights replaces the peer replicas' in-flight work on target id
// (their sum), which joins the router's own in the target's load.
func (v *Virtual) SetPeerFlights(id targetid.ID, f health.Flights) {
	if i, ok := v.slot[id]; ok {
		v.targets[i].SetPeerFlights(f)
	}
}

// Deliver applies batch seq of target id's KV-event stream, as the
// target's subscriber does once it received and decoded it.
func (v *Virtual) Deliver(id targetid.ID, seq uint64, b *events.Batch) { v.plane.Deliver(id, seq, b) }

// Scrape records what a scrape of target id's /metrics read now:
// requests running and waiting, the KV-cache usage and the process start
// time, whose change is a restart (as health's probe reads
// process_start_time_seconds): the event plane forgets the old process's
// placements although its stream has not shown it yet.
func (v *Virtual) Scrape(id targetid.ID, running, waiting int, kvUsage float64, processStart time.Time) {
	i, ok := v.slot[id]
	if !ok {
		return
	}
	if old := v.started[i]; !old.IsZero() && !old.Equal(processStart) {
		v.restarted(id)
	}
	v.started[i] = processStart
	v.targets[i] = v.targets[i].WithLoad(health.Load{Running: running, Waiting: waiting, KVUsage: kvUsage, At: v.now()})
}

// Evaluate judges every target's event stream now (the plane's
// EvalInterval).
func (v *Virtual) Evaluate() { v.plane.Evaluate() }

// Tick processes the predictions' expiries now and, once a second, their
// slow evaluations (every speculative.TimerResolution).
func (v *Virtual) Tick() {
	if v.spec != nil {
		v.spec.Tick()
	}
}

// Speculative is the predicted placements' view (GET /debug/speculative);
// false when the policy is not speculative.
func (v *Virtual) Speculative() (speculative.View, bool) {
	if v.spec == nil {
		return speculative.View{}, false
	}
	return v.spec.View(), true
}

// Routable reports whether the router would send new work to target id
// now: it is in the fleet and its state and circuit breaker allow it.
func (v *Virtual) Routable(id targetid.ID) bool {
	i, ok := v.slot[id]
	return ok && !v.unlisted[i] && v.targets[i].CanRoute()
}

// Verdict is the verdict on target id's event stream.
func (v *Virtual) Verdict(id targetid.ID) eventplane.Verdict { return v.plane.Verdict(id) }

// restarted is health's Restarted change as the router follows it: the
// plane rebuilds the target's placements, and a new process generation
// never confirms the old one's predictions.
func (v *Virtual) restarted(id targetid.ID) {
	v.plane.TargetRestarted(id)
	if v.spec != nil {
		v.spec.Invalidate(id, speculative.ReasonRestarted)
	}
}

// Probe records what a probe of target id's /health answered now, by the
// rule health's prober follows (health.ProbeRun): Health.FailureThreshold
// failures in a row take the target down (probe_failed),
// Health.SuccessThreshold answers bring it back, and a target listed anew
// is up on its first answer.
func (v *Virtual) Probe(id targetid.ID, ok bool) {
	i, found := v.slot[id]
	if !found {
		return
	}
	if !v.probes[i].Observe(ok, v.health) {
		return
	}
	if t := v.targets[i]; v.probes[i].Up {
		v.targets[i] = t.WithState(health.StateRoutable, health.ReasonOK, "", v.now())
	} else {
		v.targets[i] = t.WithState(health.StateDown, health.ReasonProbeFailed, "GET /health failed", v.now())
	}
}

// upRuns are the probe runs of n targets up from the start, as a virtual
// fleet's are.
func upRuns(n int) []health.ProbeRun {
	runs := make([]health.ProbeRun, n)
	for i := range runs {
		runs[i] = health.ProbeRun{Up: true, EverUp: true}
	}
	return runs
}

// Unlist takes target id out of the fleet, as an endpoints file without
// it does: no request goes there, the plane forgets its placements and
// its predictions end (removed). List brings it back.
func (v *Virtual) Unlist(id targetid.ID) {
	i, ok := v.slot[id]
	if !ok || v.unlisted[i] {
		return
	}
	v.unlisted[i] = true
	v.nUnlisted++
	v.plane.RemoveTarget(id)
	if v.spec != nil {
		v.spec.Invalidate(id, speculative.ReasonRemoved)
	}
	v.dec.Forget(id)
}

// List adds an unlisted target back as a new one: it awaits its first
// probe, its stream starts over and catches up from the replay buffer,
// and its load ledger and breaker start empty.
func (v *Virtual) List(id targetid.ID) error {
	i, ok := v.slot[id]
	if !ok || !v.unlisted[i] {
		return nil
	}
	t, err := health.Standalone(id, v.model, v.health, v.now)
	if err != nil {
		return fmt.Errorf("virtual router: %w", err)
	}
	v.targets[i] = t.WithState(health.StateDown, health.ReasonAwaitingProbe, "", v.now())
	v.probes[i] = health.ProbeRun{}
	v.unlisted[i] = false
	v.nUnlisted--
	v.plane.SetTarget(id, eventplane.Source{InProcess: true})
	v.plane.SetCaches(v.caches)
	v.plane.SetConnected(id, true)
	if v.spec != nil {
		v.spec.AddTarget(id)
	}
	return nil
}

// SetConnected cuts target id's event stream off (false) or lets it
// reconnect and catch up from the replay buffer (true), as a network cut
// between the router and the pod's publisher does.
func (v *Virtual) SetConnected(id targetid.ID, connected bool) { v.plane.SetConnected(id, connected) }

// Reason is why the router would not route to target id now ("" when it
// would): health's reason, or the open breaker.
func (v *Virtual) Reason(id targetid.ID) string {
	i, ok := v.slot[id]
	switch {
	case !ok || v.unlisted[i]:
		return string(health.ReasonRemoved)
	case v.targets[i].State != health.StateRoutable && v.targets[i].State != health.StateDegraded:
		return string(v.targets[i].Reason)
	case !v.targets[i].CanRoute():
		return string(health.ReasonCircuitOpen)
	}
	return ""
}

// ConfirmedBlocks is the run of ids' blocks from block 0 the router's
// index says target id holds.
func (v *Virtual) ConfirmedBlocks(id targetid.ID, ids []uint32) (int, error) {
	keys := v.plane.Keys()
	if keys == nil {
		return 0, errors.New("virtual router: no block keys")
	}
	chain, err := keys.Keyer.Keys(nil, ids, kvindex.RequestExtras{})
	if err != nil {
		return 0, fmt.Errorf("virtual router: block keys: %w", err)
	}
	for _, m := range v.plane.Index().Lookup(nil, chain) {
		if m.Target == id {
			return m.Blocks, nil
		}
	}
	return 0, nil
}
