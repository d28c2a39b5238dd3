package des

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prefixrouter/prefixrouter/bench/report"
	"github.com/prefixrouter/prefixrouter/bench/workload"
	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/router"
	"github.com/prefixrouter/prefixrouter/sim"
	"github.com/prefixrouter/prefixrouter/speculative"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// Oracle is the policy that routes on the pods' true state.
const Oracle = "oracle"

// Delivery is the model of the way from a client to a pod and of the KV
// events' way from a pod to each router, in model time.
type Delivery struct {
	// Request is from a client's send to its request's arrival at the
	// pod: the client's and the router's HTTP hops and the router's own
	// work; RequestJitter adds an exponential draw of that mean per
	// request (a loaded machine's delays have a long tail).
	Request, RequestJitter time.Duration
	// Transport is from a batch's publication to its arrival at a
	// router; Jitter adds up to that much more, drawn per batch and
	// router (batches still arrive in order).
	Transport, Jitter time.Duration
	// ApplyPerBatch is a router's time to apply one batch: batches of a
	// pod arriving faster wait behind each other (the subscriber's
	// backlog).
	ApplyPerBatch time.Duration
	// PeerDelay is from a router replica's change to its peers' seeing
	// it, when they share predictions (Config.SharePredictions): a
	// dispatch's predictions, their withdrawal, its in-flight work on a
	// pod.
	PeerDelay time.Duration
}

// DefaultDelivery is the delivery the engine assumes unless told: the live
// engine's on loopback at time scale 5, where every wall millisecond is
// five of model time (docs/performance.md, "Discrete-event engine"): a
// request reaches its pod 5 ms of model time after it is sent plus an
// exponential 3 ms on average (the des engine's TTFT p50 and p90 then
// match the live one's within a few percent on the quick presets), a
// batch its router within a millisecond, and the subscriber keeps up. For
// a fleet on a real network, give its own. Replicas sharing predictions
// see each other's 0.5 ms later, the mean peer lag two live replicas
// measured on loopback (docs/performance.md, "Router replicas sharing
// predictions").
func DefaultDelivery() Delivery {
	return Delivery{Request: 5 * time.Millisecond, RequestJitter: 3 * time.Millisecond,
		Transport: 500 * time.Microsecond, Jitter: 500 * time.Microsecond, ApplyPerBatch: 20 * time.Microsecond,
		PeerDelay: 500 * time.Microsecond}
}

// Config is one policy's run.
type Config struct {
	Workload *workload.Workload
	// Fleet is the simulated pods (Pods, Profile, StreamInterval, hashing,
	// Faults.EventDelay); TimeScale and the sockets are ignored.
	Fleet  sim.Config
	Policy string
	// Routers is the number of router replicas (0: 1); session i is sent
	// through router i mod Routers, as a Service spreads connections.
	Routers int
	// SharePredictions has the replicas share what live replicas with
	// --peer-listen and --peers do, each reaching the others
	// Delivery.PeerDelay later: every dispatch's predicted placements
	// (entering their stores as its origin's) and their withdrawal, and
	// each router's in-flight work on a pod whenever it changes (joining
	// the pod's load there).
	SharePredictions bool
	Seed             uint64
	Delivery         Delivery
	// Speculative configures the speculative policy's routers (serve's
	// defaults, then these).
	SpeculativeTTL time.Duration
	Holdback       *float64
	// Cost is the routers' cost model (nil: serve's default).
	Cost *brain.CostConfig
	// Drain bounds (model time) how long requests may still run once the
	// last session has started; those still running count as unfinished.
	Drain time.Duration
	// Conduct, when set, is called once at model time 0 with the run's
	// Control: it schedules faults (the faults workload) and, with
	// ManualSends, sends the sessions itself instead of at their start
	// times (paired-gap's cells, one after another; the drain bound does
	// not apply then).
	Conduct     func(*Control)
	ManualSends bool
	// ReplayBuffer is how many batches each pod keeps for replay (0:
	// none, and a router's gap is unrecovered): the faults that lose
	// batches need it (sim.Config.ReplayBuffer's 10,000); other runs save
	// the memory.
	ReplayBuffer int
	// Admission is the routers' flow control (nil: none): each replica
	// admits through its own, every request with its class, tenant and
	// max tokens; a request it sheds is recorded as report.ErrShed. With
	// Off every request is dispatched at once, as without it, and its
	// classes still name each request's class in the records.
	Admission *brain.AdmissionConfig
	// Sent and Done, when set, are told of every request sent and of
	// every request that ends (failed or not).
	Sent   func()
	Done   func(failed bool)
	Logger *slog.Logger
}

// Result is what a run measured.
type Result struct {
	Records []report.Record
	// Preemptions are the pods'.
	Preemptions int64
	// Speculative is each router's predicted placements (speculative
	// policy; nil otherwise).
	Speculative []*speculative.View
	// Decision is the wall time the routers spent deciding and
	// dispatching each request, in microseconds.
	Decision report.Dist
	// Steps counts the pods' engine steps, Published the KV-event batches
	// they published and Delivered those delivered to routers (each
	// batch to every router).
	Steps, Published, Delivered int64
	// Wall is the run's wall time.
	Wall time.Duration
	// Budget is the routers' flow-control budget (0: flow control off).
	Budget time.Duration
}

// ErrUnfinished is the error of a request still running at the drain
// bound (the live engine's words).
const ErrUnfinished = "unfinished at the drain bound"

// ErrStream is the error of a request whose stream ended in an error
// chunk, in the live client's words.
const ErrStream = "error in stream"

// ErrCanceled is the error of a request its client went away from
// (Control.Cancel), in the live client's words.
const ErrCanceled = "no answer"

// epoch anchors the virtual clock: time.Time values the router's packages
// read are epoch plus the model time.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// PodName names pod i as the reports do.
func PodName(i int) string { return "pod-" + strconv.Itoa(i) }

// TargetOf is pod i's target id, as the routers know it.
func TargetOf(i int) targetid.ID {
	return targetid.ID{Endpoint: "http://" + PodName(i) + podDomain}
}

// podDomain ends every des target's endpoint.
const podDomain = ".des:8000"

// PodNameOf names the pod of a des target (TargetOf), or the target
// itself when it is none.
func PodNameOf(id targetid.ID) string {
	if name, ok := strings.CutSuffix(strings.TrimPrefix(id.Endpoint, "http://"), podDomain); ok {
		return name
	}
	return id.String()
}

// run is one run's state; everything runs on Run's goroutine.
type run struct {
	cfg    Config
	w      *workload.Workload
	now    time.Duration
	q      queue
	pods   []*pod
	rts    []*routerState
	tok    sim.Tokenizer
	rng    *rand.Rand
	recs   []report.Record
	decide []float64 // wall µs per routed request
	oracle *oracleRouter
	res    Result
	bound  time.Duration
}

// pod is one simulated pod and its event stream.
type pod struct {
	i       int
	id      targetid.ID
	rank    *sim.Rank
	busy    bool // a step is in progress
	nextSeq uint64
	// eventDelay holds the pod's batches back before publication.
	eventDelay time.Duration
	// started is when the pod's process last started (model time); gen
	// counts its starts, and ended is when each earlier process ended.
	started time.Duration
	gen     int
	ended   []time.Duration
	// between are changes that wait for the step in progress to end (a
	// live engine takes them between steps).
	between []func()
	// Faults the run models around the engine: a dead engine (no events,
	// failing probes), batches published but not sent (dropped) or not
	// reaching the routers (severed).
	dead, dropEvents, severed bool
	// buffer is the replay buffer: the current process's last
	// bufferSize batches (Config.ReplayBuffer).
	buffer     []buffered
	bufferSize int
}

// buffered is a batch in a pod's replay buffer.
type buffered struct {
	seq   uint64
	batch *events.Batch
}

// replay reads the pod's replay buffer (its last bufferSize batches) for
// a router's stream.
func (p *pod) replay(start uint64, fn func(uint64, *events.Batch) bool) {
	for _, b := range p.buffer[max(0, len(p.buffer)-p.bufferSize):] {
		if b.seq >= start && !fn(b.seq, b.batch) {
			return
		}
	}
}

// remember keeps a published batch in the replay buffer.
func (p *pod) remember(seq uint64, b *events.Batch) {
	if p.bufferSize <= 0 {
		return
	}
	if len(p.buffer) >= 2*p.bufferSize {
		// Amortized: drop the older half at once.
		p.buffer = append(p.buffer[:0], p.buffer[len(p.buffer)-p.bufferSize:]...)
	}
	p.buffer = append(p.buffer, buffered{seq, b})
}

// routerState is one router replica and what it receives.
type routerState struct {
	v *brain.Virtual
	// applied is when each pod's last batch is applied at this router.
	applied []time.Duration
	// next* are the periodic work's next times.
	nextEval, nextTick, nextScrape, nextProbe time.Duration
	// peerFlights are the other replicas' last reported in-flight work,
	// by replica and pod (SharePredictions).
	peerFlights [][]health.Flights
	// admits says the replica routes through flow control; waiting are
	// its requests in the line, by their router's handle.
	admits  bool
	waiting map[*brain.VirtualRequest]*request
}

// sharedPrediction is one dispatch's predictions on their way to the
// other replicas, and the placements they made at each (by replica), which
// the origin's withdrawal ends.
type sharedPrediction struct {
	p  brain.Prediction
	at []*speculative.Placement
}

// peerMessage is what one replica tells the others: a prediction, its
// withdrawal, or its in-flight work on a pod.
type peerMessage struct {
	pred    *sharedPrediction
	pod     int
	flights health.Flights
}

// request is one turn in flight.
type request struct {
	s          *session
	sess, turn int
	sent       time.Duration
	ids        []uint32
	pod        int
	router     int // the replica that routed it
	vr         *brain.VirtualRequest
	shared     *sharedPrediction
	sq         *sim.Request
	first      bool
	rec        report.Record
	// over is set once the request's record is made; canceled once its
	// client went away (Control.Cancel); queued while it waits in its
	// router's line (flow control), of priority class (an index into the
	// admission's classes).
	over, canceled, queued bool
	class                  int
	// conducted is the conductor's view of it (Config.Conduct).
	conducted *Sent
}

// session is one conversation's state.
type session struct {
	s       *workload.Session
	answers []string
}

// Run runs the workload under cfg.Policy and returns what it measured.
// ctx stops it between events.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	start := time.Now()
	r, err := newRun(cfg)
	if err != nil {
		return nil, err
	}
	if err := r.loop(ctx); err != nil {
		return nil, err
	}
	r.res.Records = r.recs
	r.res.Decision = report.DistOf(r.decide)
	for _, p := range r.pods {
		r.res.Preemptions += p.rank.Preemptions()
	}
	for _, rt := range r.rts {
		if a := rt.v.Admission(); a != nil {
			r.res.Budget = a.Budget()
		}
		if v, ok := rt.v.Speculative(); ok {
			r.res.Speculative = append(r.res.Speculative, &v)
		}
	}
	r.res.Wall = time.Since(start)
	return &r.res, nil
}

func newRun(cfg Config) (*run, error) {
	if cfg.Workload == nil {
		return nil, errors.New("des: no workload")
	}
	if cfg.Routers <= 0 {
		cfg.Routers = 1
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Fleet.Pods <= 0 {
		return nil, errors.New("des: no pods")
	}
	if a := cfg.Admission; a != nil {
		if err := a.Validate(); err != nil {
			return nil, fmt.Errorf("des: %w", err)
		}
		for i := range cfg.Workload.Sessions {
			for _, t := range cfg.Workload.Sessions[i].Turns {
				if t.Class != "" && a.Line.ClassIndex(t.Class) < 0 {
					return nil, fmt.Errorf("des: the workload's class %q is none of flow control's classes", t.Class)
				}
			}
		}
	}
	r := &run{cfg: cfg, w: cfg.Workload, tok: sim.BytesTokenizer(), rng: rand.New(rand.NewPCG(cfg.Seed, 0x646573 /* "des" */))}
	for i := range cfg.Fleet.Pods {
		rank, err := sim.NewRank(cfg.Fleet, i)
		if err != nil {
			return nil, fmt.Errorf("des: %w", err)
		}
		r.pods = append(r.pods, &pod{i: i, id: TargetOf(i), rank: rank, eventDelay: cfg.Fleet.Faults.EventDelay, bufferSize: cfg.ReplayBuffer})
	}
	if cfg.Policy == Oracle {
		r.oracle = &oracleRouter{cost: brain.DefaultCostConfig(), rng: rand.New(rand.NewPCG(cfg.Seed, 0x6f7261636c65))}
	} else if err := r.startRouters(); err != nil {
		return nil, err
	}
	if cfg.Conduct != nil {
		r.q.push(item{kind: evCall, fn: func() { cfg.Conduct(&Control{r: r}) }})
		if cfg.ManualSends {
			return r, nil
		}
	}
	if n := len(r.w.Sessions); n > 0 {
		r.bound = r.w.Sessions[n-1].Start + cfg.Drain
	}
	for i := range r.w.Sessions {
		r.q.push(item{at: r.w.Sessions[i].Start, kind: evSend, a: i})
	}
	return r, nil
}

func (r *run) startRouters() error {
	pol, err := brain.ParsePolicy(r.cfg.Policy)
	if err != nil {
		return fmt.Errorf("des: %w", err)
	}
	prof := r.cfg.Fleet.Profile
	ids := make([]targetid.ID, len(r.pods))
	for i, p := range r.pods {
		ids[i] = p.id
	}
	for range r.cfg.Routers {
		def := router.DefaultConfig()
		vc := brain.VirtualConfig{Policy: pol, Cost: def.Cost, Events: def.Events, Speculative: def.Speculative,
			Health: def.Health, Model: prof.Model, Targets: ids, NumGPUBlocks: prof.NumGPUBlocks,
			Now: r.clock, Logger: r.cfg.Logger}
		// As the live bench's router: block size from the pods, keys
		// derived from the blocks' tokens (no hash seed given).
		vc.Events.BlockSize = prof.BlockSize
		if r.cfg.SpeculativeTTL > 0 {
			vc.Speculative.TTL = r.cfg.SpeculativeTTL
		}
		if r.cfg.Holdback != nil {
			vc.Speculative.Holdback = *r.cfg.Holdback
		}
		if r.cfg.Cost != nil {
			vc.Cost = *r.cfg.Cost
		}
		// Each router breaks its cost ties from the run's seed, so that
		// a run repeats.
		vc.TieSeed = r.cfg.Seed + uint64(len(r.rts))
		vc.MaxRetries = def.MaxRetries
		// As the live bench's router: one good probe brings a pod back.
		vc.Health.SuccessThreshold = 1
		if r.cfg.ReplayBuffer > 0 {
			vc.Replay = func(id targetid.ID) kvindex.ReplayBuffer { return r.pods[r.podOf(id)].replay }
		}
		if a := r.cfg.Admission; a != nil {
			// Each replica its own line, pace and budget, as live
			// replicas each have.
			own := *a
			vc.Admission = &own
		}
		v, err := brain.NewVirtual(vc)
		if err != nil {
			return fmt.Errorf("des: %w", err)
		}
		rt := &routerState{v: v, applied: make([]time.Duration, len(r.pods)), admits: v.Admission() != nil,
			waiting: map[*brain.VirtualRequest]*request{}}
		if r.cfg.SharePredictions {
			rt.peerFlights = make([][]health.Flights, r.cfg.Routers)
			for i := range rt.peerFlights {
				rt.peerFlights[i] = make([]health.Flights, len(r.pods))
			}
		}
		r.rts = append(r.rts, rt)
	}
	return nil
}

// clock is the virtual clock as the router's packages read it.
func (r *run) clock() time.Time { return epoch.Add(r.now) }

// Event kinds.
const (
	evSend         = iota // a: session; b: turn
	evArrive              // a request reaches its pod
	evStepEnd             // a: pod
	evDeliver             // a: router; b: pod
	evPeerPredict         // a: receiving router; b: origin router
	evPeerWithdraw        // a: receiving router
	evPeerFlights         // a: receiving router; b: origin router
	evCall                // fn: the conductor's
)

func (r *run) loop(ctx context.Context) error {
	for n := 0; r.q.len() > 0; n++ {
		if n%4096 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		if r.bound > 0 && r.q.peek() > r.bound {
			break
		}
		if err := r.handle(r.q.pop()); err != nil {
			return err
		}
	}
	r.unfinished()
	return nil
}

// handle runs one event at its time.
func (r *run) handle(it item) error {
	r.advance(it.at)
	switch it.kind {
	case evSend:
		r.send(it.a, it.b, it.sess)
	case evArrive:
		r.arrive(it.req)
	case evStepEnd:
		r.stepEnd(r.pods[it.a])
	case evDeliver:
		if p := r.pods[it.b]; it.gen < p.gen && it.pub > p.ended[it.gen] {
			break // held back by a process that ended before publishing it
		}
		r.rts[it.a].v.Deliver(r.pods[it.b].id, it.seq, it.batch)
		r.res.Delivered++
	case evPeerPredict:
		sp := it.msg.pred
		h, err := r.rts[it.a].v.PredictFrom(routerName(it.b), sp.p)
		if err != nil {
			return fmt.Errorf("des: %w", err)
		}
		sp.at[it.a] = h
	case evPeerWithdraw:
		it.msg.pred.at[it.a].Withdraw()
	case evPeerFlights:
		r.peerFlights(it.a, it.b, it.msg)
	case evCall:
		it.fn()
	}
	return nil
}

// advance moves the clock to t, running each router's periodic work that
// falls due on the way at its own time: freshness evaluations, the
// predictions' timer, the scrapes of the pods' gauges.
func (r *run) advance(t time.Duration) {
	if len(r.rts) > 0 {
		hc, ec := health.DefaultConfig(), eventplane.DefaultConfig()
		for ri, rt := range r.rts {
			for {
				next := min(rt.nextEval, rt.nextTick, rt.nextScrape, rt.nextProbe)
				if next > t {
					break
				}
				r.now = max(r.now, next)
				switch next {
				case rt.nextProbe:
					for _, p := range r.pods {
						rt.v.Probe(p.id, !p.dead)
					}
					rt.nextProbe += hc.ProbeInterval
				case rt.nextScrape:
					for _, p := range r.pods {
						run, wait, kv := p.rank.Gauges()
						rt.v.Scrape(p.id, run, wait, kv, epoch.Add(p.started))
					}
					rt.nextScrape += hc.ScrapeInterval
					r.release(ri) // a scrape may show a shorter queue
				case rt.nextEval:
					rt.v.Evaluate()
					rt.nextEval += ec.EvalInterval
				default:
					rt.v.Tick()
					rt.nextTick += speculative.TimerResolution
					r.release(ri) // deadlines pass
				}
			}
		}
	}
	r.now = max(r.now, t)
}

// send sends turn k of session i (a fresh session starts at turn 0).
func (r *run) send(i, k int, s *session) { r.sendRequest(&request{}, i, k, s) }

// sendRequest sends turn k of session i as q and returns it.
func (r *run) sendRequest(q *request, i, k int, s *session) *request {
	if s == nil {
		s = &session{s: &r.w.Sessions[i]}
	}
	t := &s.s.Turns[k]
	q.s, q.sess, q.turn, q.sent = s, i, k, r.now
	q.rec = report.Record{Session: i, Turn: k, Group: s.s.Group, Stage: t.Stage, Sent: r.now.Seconds(), Tenant: t.Tenant}
	q.class, q.rec.Class = r.classOf(t.Class)
	text := s.s.Prompt(k, s.answers)
	ids, err := r.tok.Encode(text, true)
	if err != nil {
		r.fail(q, s, fmt.Sprintf("encode: %v", err))
		return q
	}
	q.ids = ids
	q.rec.Demand = len(ids) + t.MaxTokens
	if r.cfg.Sent != nil {
		r.cfg.Sent()
	}
	if r.oracle != nil {
		pi, err := r.oracle.route(r.pods, ids)
		if err != nil {
			r.fail(q, s, err.Error())
			return q
		}
		q.pod = pi
	} else {
		q.router = i % len(r.rts)
		rt := r.rts[q.router]
		w0 := time.Now()
		var vr *brain.VirtualRequest
		if rt.admits {
			vr, err = rt.v.Submit(ids, []byte(text), q.session(), q.class, t.Tenant, t.MaxTokens)
		} else {
			vr, err = rt.v.Route(ids, []byte(text), q.session())
		}
		r.decide = append(r.decide, float64(time.Since(w0).Nanoseconds())/1e3)
		if err != nil {
			// The router answers 503 when no target can take the request.
			q.rec.Status, q.rec.APIError = 503, "service_unavailable"
			r.fail(q, s, "no answer")
			return q
		}
		switch vr.Verdict() {
		case brain.Queued:
			q.vr, q.queued, q.rec.Queued = vr, true, true
			rt.waiting[vr] = q
		case brain.Shed:
			r.shed(q, vr.Waiter())
		default:
			r.dispatched(q, vr)
			r.toPod(q)
		}
		// What the Admit let go besides this request.
		r.release(q.router)
		return q
	}
	r.toPod(q)
	return q
}

// classOf is the priority (an index into flow control's classes) and the
// name of a request of class name ("": the default class); none without
// flow control.
func (r *run) classOf(name string) (int, string) {
	a := r.cfg.Admission
	if a == nil {
		return 0, name
	}
	if name == "" {
		name = a.Line.DefaultClass
		if name == "" {
			name = a.Line.Classes[0].Name
		}
	}
	return max(a.Line.ClassIndex(name), 0), name
}

// release takes router ri's requests that left its line since the last
// call (flow control): a released one goes to the pod decided at its
// release, a shed one is recorded as such. The engine calls it after
// every event that can shorten a pod's queue (a first byte, an end, a
// scrape) and at each of the router's Ticks.
func (r *run) release(ri int) {
	rt := r.rts[ri]
	if !rt.admits || len(rt.waiting) == 0 {
		return
	}
	for _, vr := range rt.v.Release() {
		q := rt.waiting[vr]
		if q == nil {
			continue
		}
		delete(rt.waiting, vr)
		q.queued = false
		if vr.Verdict() != brain.Admitted {
			r.shed(q, vr.Waiter())
			continue
		}
		q.rec.QueueS = vr.Waiter().QueueTime().Seconds()
		r.dispatched(q, vr)
		r.toPod(q)
	}
}

// releaseAll is release for every router.
func (r *run) releaseAll() {
	for ri := range r.rts {
		r.release(ri)
	}
}

// shed records q as refused by its router's flow control, as the router
// answers it: 429 (503 when no pod of its model is routable any more).
func (r *run) shed(q *request, w *brain.Waiter) {
	q.vr = nil // it holds nothing at the router
	q.rec.Status, q.rec.APIError = 429, "rate_limit_exceeded"
	if w.ShedReason() == brain.ShedNoTarget {
		q.rec.Status, q.rec.APIError = 503, "service_unavailable"
	}
	q.rec.ShedReason, q.rec.QueueS = w.ShedReason(), w.QueueTime().Seconds()
	r.fail(q, q.s, report.ErrShed)
}

// session names q's conversation for the holdback arm (none for a
// single request).
func (q *request) session() string {
	if len(q.s.s.Turns) > 1 {
		return "s" + strconv.Itoa(q.sess)
	}
	return ""
}

// dispatched takes vr as q's attempt: its pod, and what the other
// replicas learn of it.
func (r *run) dispatched(q *request, vr *brain.VirtualRequest) {
	q.vr, q.shared = vr, nil
	q.pod = r.podOf(vr.Target())
	if p, ok := vr.Prediction(); ok && r.cfg.SharePredictions && len(r.rts) > 1 {
		q.shared = &sharedPrediction{p: p, at: make([]*speculative.Placement, len(r.rts))}
		r.tellPeers(q.router, evPeerPredict, &peerMessage{pred: q.shared})
	}
	r.flightsChanged(q)
}

// toPod sends q on its way to its pod.
func (r *run) toPod(q *request) {
	at := r.now + r.cfg.Delivery.Request
	if j := r.cfg.Delivery.RequestJitter; j > 0 {
		at += time.Duration(r.rng.ExpFloat64() * float64(j))
	}
	r.q.push(item{at: at, kind: evArrive, req: q})
}

// retry sends q, whose attempt failed at its pod before the first byte
// (and ended at its router), to another pod as its router decides
// (VirtualRequest.Retry), and reports whether it did.
func (r *run) retry(q *request) bool {
	if q.vr == nil || q.canceled {
		return false
	}
	text := q.s.s.Prompt(q.turn, q.s.answers)
	ids, err := r.tok.Encode(text, true)
	if err != nil {
		return false
	}
	w0 := time.Now()
	vr := q.vr.Retry()
	r.decide = append(r.decide, float64(time.Since(w0).Nanoseconds())/1e3)
	if vr == nil {
		return false
	}
	q.ids, q.sq, q.first = ids, nil, false
	r.dispatched(q, vr)
	r.toPod(q)
	return true
}

func (r *run) podOf(id targetid.ID) int {
	for i, p := range r.pods {
		if p.id == id {
			return i
		}
	}
	return -1
}

// arrive hands a request to its pod, which starts a step if idle.
func (r *run) arrive(q *request) {
	if q.canceled {
		return
	}
	p := r.pods[q.pod]
	sq, err := p.rank.Add(q.ids, q.s.s.Turns[q.turn].MaxTokens, r.now)
	if err != nil {
		r.finish(q, false, 0)
		if !r.retry(q) {
			r.upstreamFailed(q, err.Error())
		}
		return
	}
	sq.Tag = q
	q.sq = sq
	// The pod's request holds the prompt from here on.
	q.rec.PromptTokens, q.ids = len(q.ids), nil
	if !p.busy {
		r.step(p)
	}
}

// step starts p's next step.
func (r *run) step(p *pod) {
	d := p.rank.Step(r.now)
	p.busy = true
	r.res.Steps++
	r.q.push(item{at: r.now + d, kind: evStepEnd, a: p.i})
}

// stepEnd applies p's step: first tokens, ends, and the step's KV events
// on their way to every router.
func (r *run) stepEnd(p *pod) {
	p.busy = false
	for _, sq := range p.rank.FinishStep(r.now) {
		q := sq.Tag.(*request)
		if q.canceled {
			continue
		}
		snap := sq.Snapshot()
		if !q.first && snap.Generated > 0 {
			q.first = true
			q.rec.TTFT = (r.now - q.sent).Seconds()
			if q.vr != nil {
				q.vr.FirstByte()
				r.flightsChanged(q)
			}
		}
		if snap.Done {
			r.done(p, q, snap)
		}
	}
	r.publish(p)
	between := p.between
	p.between = nil
	for _, change := range between {
		change()
	}
	if !p.rank.Idle() {
		r.step(p)
	}
	// First bytes and ends shortened the pods' queues.
	r.releaseAll()
}

// publish sends the batches p published on their way to every router
// (unless the pod drops them or is cut off), keeping them for replay.
func (r *run) publish(p *pod) {
	for _, b := range p.rank.Events() {
		seq := p.nextSeq
		p.nextSeq++
		r.res.Published++
		b.TS = r.now.Seconds()
		p.remember(seq, &b)
		if p.dropEvents || p.severed {
			continue
		}
		for ri, rt := range r.rts {
			d := r.cfg.Delivery
			at := r.now + p.eventDelay + d.Transport
			if d.Jitter > 0 {
				at += time.Duration(r.rng.Int64N(int64(d.Jitter)))
			}
			at = max(at, rt.applied[p.i]) + d.ApplyPerBatch
			rt.applied[p.i] = at
			r.q.push(item{at: at, kind: evDeliver, a: ri, b: p.i, seq: seq, batch: &b, gen: p.gen, pub: r.now + p.eventDelay})
		}
	}
}

// failAll ends the requests a pod's engine failed at once (a restart, a
// death): each is retried or recorded as its failure says.
func (r *run) failAll(p *pod, failed []*sim.Request) {
	for _, sq := range failed {
		if q := sq.Tag.(*request); !q.canceled {
			r.done(p, q, sq.Snapshot())
		}
	}
}

// betweenSteps runs change on p now if it is idle, otherwise once its
// step in progress ends, then publishes what it published.
func (r *run) betweenSteps(p *pod, change func()) {
	do := func() {
		change()
		r.publish(p)
	}
	if p.busy {
		p.between = append(p.between, do)
		return
	}
	do()
}

// done records an ended request and sends its session's next turn.
func (r *run) done(p *pod, q *request, snap sim.Snapshot) {
	s := q.s
	if snap.Err != nil || snap.Generated == 0 {
		r.finish(q, false, 0)
		if !q.first && r.retry(q) {
			return
		}
		msg := "no answer"
		if snap.Err != nil {
			msg = snap.Err.Error()
		}
		r.upstreamFailed(q, msg)
		return
	}
	r.finish(q, true, snap.CachedTokens)
	q.rec.Status = 200
	q.rec.E2E = (r.now - q.sent).Seconds()
	q.rec.CachedTokens, q.rec.OutputTokens = snap.CachedTokens, snap.Generated
	q.rec.Pod = PodName(p.i)
	r.end(q, false)
	if q.turn+1 < len(s.s.Turns) {
		text, err := p.rank.Answer(q.sq)
		if err != nil {
			r.skip(s, q.sess, q.turn+1, err.Error())
			return
		}
		s.answers = append(s.answers, text)
		next := s.s.Turns[q.turn+1]
		r.q.push(item{at: r.now + next.Think, kind: evSend, a: q.sess, b: q.turn + 1, sess: s})
	}
}

// finish ends q at its router (answered, or failed at the pod before its
// first byte) and tells the other replicas what changed.
func (r *run) finish(q *request, answered bool, cachedTokens int) {
	if q.vr == nil {
		return
	}
	q.vr.Finish(answered, cachedTokens)
	if !answered && q.shared != nil {
		r.tellPeers(q.router, evPeerWithdraw, &peerMessage{pred: q.shared})
	}
	r.flightsChanged(q)
	if !answered {
		// Outside a step's end (a refused arrival, a restart), the
		// queue it left is shorter now.
		r.release(q.router)
	}
}

// flightsChanged tells the other replicas q's router's in-flight work on
// q's pod as it is now, as a live replica does on each change.
func (r *run) flightsChanged(q *request) {
	if r.cfg.SharePredictions && len(r.rts) > 1 {
		f := r.rts[q.router].v.Flights(r.pods[q.pod].id)
		r.tellPeers(q.router, evPeerFlights, &peerMessage{pod: q.pod, flights: f})
	}
}

// tellPeers sends m from router origin to every other router, arriving
// Delivery.PeerDelay from now (in the order sent).
func (r *run) tellPeers(origin int, kind uint8, m *peerMessage) {
	for ri := range r.rts {
		if ri != origin {
			r.q.push(item{at: r.now + r.cfg.Delivery.PeerDelay, kind: kind, a: ri, b: origin, msg: m})
		}
	}
}

// peerFlights records at router ri what origin reported of its in-flight
// work on a pod, and sets the pod's peer load there to the sum of what
// every other replica last reported.
func (r *run) peerFlights(ri, origin int, m *peerMessage) {
	rt := r.rts[ri]
	rt.peerFlights[origin][m.pod] = m.flights
	var sum health.Flights
	for _, of := range rt.peerFlights {
		sum = sum.Add(of[m.pod])
	}
	rt.v.SetPeerFlights(r.pods[m.pod].id, sum)
}

// routerName names router replica i as its peers know it.
func routerName(i int) string { return "router-" + strconv.Itoa(i) }

// upstreamFailed records q as failed at its pod for good, with the
// OpenAI error the router answers: 502 before the first byte, an error
// chunk in the stream after it (ErrStream).
func (r *run) upstreamFailed(q *request, why string) {
	q.rec.APIError = "server_error"
	if q.first {
		q.rec.Status, why = 200, ErrStream
	} else {
		q.rec.Status = 502
	}
	r.fail(q, q.s, why)
}

// fail records q as failed with why, and its session's later turns as
// never sent.
func (r *run) fail(q *request, s *session, why string) {
	q.rec.Err = why
	r.end(q, true)
	if s != nil {
		r.skip(s, q.sess, q.turn+1, "not sent: an earlier turn failed")
	}
}

func (r *run) skip(s *session, i, from int, why string) {
	for k := from; k < len(s.s.Turns); k++ {
		t := &s.s.Turns[k]
		r.record(report.Record{Session: i, Turn: k, Group: s.s.Group, Stage: t.Stage, Sent: r.now.Seconds(), Err: why}, true)
	}
}

// end records q as it ended and tells its conductor.
func (r *run) end(q *request, failed bool) {
	q.over = true
	r.record(q.rec, failed)
	if c := q.conducted; c != nil {
		c.Record = q.rec
		if c.ended != nil {
			c.ended(c)
		}
	}
}

func (r *run) record(rec report.Record, failed bool) {
	r.recs = append(r.recs, rec)
	if r.cfg.Done != nil {
		r.cfg.Done(failed)
	}
}

// unfinished records the requests still running at the drain bound (at
// a pod, or on their way to one), and the turns their sessions never
// sent.
func (r *run) unfinished() {
	// Those still in a router's line leave it, in the order they came.
	for _, rt := range r.rts {
		waiting := make([]*request, 0, len(rt.waiting))
		for _, q := range rt.waiting {
			waiting = append(waiting, q)
		}
		slices.SortFunc(waiting, func(a, b *request) int {
			return cmp.Or(cmp.Compare(a.sent, b.sent), cmp.Compare(a.sess, b.sess), cmp.Compare(a.turn, b.turn))
		})
		for _, q := range waiting {
			delete(rt.waiting, q.vr)
			q.vr.Leave()
			q.queued = false
			q.rec.QueueS = q.vr.Waiter().QueueTime().Seconds()
			q.vr = nil
			q.rec.Err = ErrUnfinished
			r.end(q, true)
			r.skip(q.s, q.sess, q.turn+1, "not sent: an earlier turn failed")
		}
	}
	var left []*request
	for _, p := range r.pods {
		for _, sq := range p.rank.Pending() {
			left = append(left, sq.Tag.(*request))
		}
	}
	for _, it := range r.q.items {
		switch it.kind {
		case evArrive:
			left = append(left, it.req)
		case evSend:
			if it.sess != nil {
				r.skip(it.sess, it.a, it.b, ErrUnfinished)
			} else {
				r.skip(&session{s: &r.w.Sessions[it.a]}, it.a, 0, ErrUnfinished)
			}
		}
	}
	for _, q := range left {
		if q.over {
			continue // canceled by its client, its abort still to come
		}
		if q.vr != nil {
			q.vr.Cancel()
		}
		q.rec.Err = ErrUnfinished
		r.end(q, true)
		r.skip(q.s, q.sess, q.turn+1, "not sent: an earlier turn failed")
	}
}

// item is one event of the queue.
type item struct {
	at    time.Duration
	order uint64
	kind  uint8
	a, b  int
	seq   uint64
	batch *events.Batch
	req   *request
	sess  *session
	msg   *peerMessage
	fn    func()
	// gen is the pod process that published a batch, at pub.
	gen int
	pub time.Duration
}
