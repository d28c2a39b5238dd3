package health

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixrouter/prefixrouter/targetid"
)

// Resolver resolves discovery names to addresses; *net.Resolver is one.
type Resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
}

// Deps are the monitor's collaborators. Every field is optional.
type Deps struct {
	// Registerer receives the prefixrouter_health_* metrics; nil: none.
	Registerer prometheus.Registerer
	// Logger; nil: slog.Default().
	Logger *slog.Logger
	// Now is the clock; nil: time.Now.
	Now func() time.Time
	// Client makes probes and scrapes; nil: a client with its own pooled
	// transport (timeouts come from the Config either way).
	Client *http.Client
	// Resolver for --discover-dns; nil: net.DefaultResolver.
	Resolver Resolver
	// Authorization is the Authorization header sent on every call to a
	// target (probes, /v1/models, /metrics), read at each call so that a
	// rotated credential applies at once; nil or "": none.
	Authorization func() string
}

// Sources of targets, in order of precedence when two name one endpoint.
const (
	SourceFlag = "flag"
	SourceFile = "file"
	SourceDNS  = "dns"
)

var sourceRank = map[string]int{SourceFlag: 0, SourceFile: 1, SourceDNS: 2}

// ChangeKind says what happened to a target in the registry.
type ChangeKind string

// Change kinds.
const (
	Added   ChangeKind = "added"
	Updated ChangeKind = "updated"
	// Removed: the target left discovery. It takes no new work and drains;
	// its placements and predictions should be invalidated.
	Removed ChangeKind = "removed"
	// Restarted: the target's process start time changed. The new process
	// holds nothing the old one announced; its placements and predictions
	// should be dropped and rebuilt from its events.
	Restarted ChangeKind = "restarted"
)

// Change is one registry event delivered to subscribers.
type Change struct {
	Kind   ChangeKind
	Target TargetSpec
	// Previous is the spec before an update.
	Previous TargetSpec
}

// endpoint is the mutable state of one HTTP endpoint (all its ranks).
type endpoint struct {
	spec    Spec
	source  string
	targets []*rankState // sorted by rank; draining ranks may exceed spec.DP

	probed       bool
	run          ProbeRun
	lastProbe    time.Time
	lastUp       time.Time
	probeErr     string
	probeLatency time.Duration

	models    []string // from GET /v1/models
	modelsOK  bool
	modelsAt  time.Time
	modelsErr string
	// authErr is the last GET /v1/models refused as unauthorized, cleared
	// by the next answered one.
	authErr string

	scrapeAt  time.Time // last successful scrape
	scrapeErr string
}

func (e *endpoint) active() bool {
	for _, t := range e.targets {
		if !t.draining {
			return true
		}
	}
	return false
}

// rankState is the mutable state of one target (one rank of an endpoint).
type rankState struct {
	ts   TargetSpec
	ep   *endpoint
	live *live

	draining   bool
	drainSince time.Time

	load  Load
	cache CacheConfig

	state  State
	reason Reason
	detail string
	since  time.Time
	// judged is set once a state other than awaiting the first probe was
	// found; logged is when the state was last logged.
	judged         bool
	logged         time.Time
	conflict       string
	conflictModels []string
}

// Monitor is the registry, prober, scraper, circuit breaker and load
// ledger. Create it with New, start it with Run, read it with Snapshot.
type Monitor struct {
	cfg      Config
	log      *slog.Logger
	now      func() time.Time
	client   *http.Client
	resolver Resolver
	authz    func() string
	sh       *shared
	met      *metrics

	dnsSpecs []DNSSpec

	notifyMu sync.Mutex // held while applying a change and delivering it
	subs     map[int]func(Change)
	nextSub  int

	mu        sync.Mutex
	sources   map[string]map[string]Spec // source -> endpoint -> spec
	srcStatus map[string]*SourceStatus
	dnsLast   map[string]map[string]Spec // dns name:port -> endpoint -> spec
	endpoints map[string]*endpoint
	version   uint64

	snap     atomic.Pointer[Snapshot]
	probeNow chan struct{}
}

// SourceStatus is what the debug view says about a discovery source.
type SourceStatus struct {
	Source    string    `json:"source"`
	Detail    string    `json:"detail,omitempty"`
	Endpoints int       `json:"endpoints"`
	LastOK    time.Time `json:"last_ok,omitzero"`
	LastError string    `json:"last_error,omitempty"`
	LastErrAt time.Time `json:"last_error_at,omitzero"`
	hash      [32]byte
	haveHash  bool
}

// New fills cfg's zero durations and counts from DefaultConfig, validates it
// (Config.Validate), parses the static endpoints and discovery specs, reads
// the endpoints file once, and returns a monitor whose snapshot already lists
// those targets (down until probed). Run starts the background work.
func New(cfg Config, deps Deps) (*Monitor, error) {
	cfg.fill()
	static, dnsSpecs, err := cfg.check()
	if err != nil {
		return nil, fmt.Errorf("health: %w", err)
	}
	m := &Monitor{
		cfg:       cfg,
		log:       deps.Logger,
		now:       deps.Now,
		client:    deps.Client,
		resolver:  deps.Resolver,
		authz:     deps.Authorization,
		subs:      map[int]func(Change){},
		sources:   map[string]map[string]Spec{},
		srcStatus: map[string]*SourceStatus{},
		endpoints: map[string]*endpoint{},
		probeNow:  make(chan struct{}, 1),
	}
	if m.log == nil {
		m.log = slog.Default()
	}
	m.log = m.log.With("component", "health")
	if m.now == nil {
		m.now = time.Now
	}
	if m.client == nil {
		m.client = &http.Client{Transport: &http.Transport{
			Proxy:                 nil,
			DialContext:           (&net.Dialer{Timeout: cfg.ProbeTimeout, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost:   2,
			IdleConnTimeout:       90 * time.Second,
			ResponseHeaderTimeout: max(cfg.ProbeTimeout, cfg.ScrapeTimeout),
			DisableCompression:    false,
		}}
	}
	if m.resolver == nil {
		m.resolver = net.DefaultResolver
	}
	m.sh = &shared{
		now:         m.now,
		failures:    int64(cfg.BreakerFailures),
		cooldown:    cfg.BreakerCooldown,
		maxCooldown: cfg.BreakerMaxCooldown,
		kick:        make(chan struct{}, 1),
	}

	m.dnsSpecs = dnsSpecs
	if m.met, err = newMetrics(m, deps.Registerer); err != nil {
		return nil, fmt.Errorf("health: metrics: %w", err)
	}
	m.setSource(SourceFlag, static)
	if len(static) > 0 {
		m.sourceOK(SourceFlag, len(static), "")
	}
	if cfg.EndpointsFile != "" {
		if err := m.reloadFile(); err != nil {
			return nil, fmt.Errorf("health: %w", err)
		}
	}
	m.mu.Lock()
	m.rebuildLocked()
	m.mu.Unlock()
	return m, nil
}

// Snapshot returns the current immutable snapshot. Lock-free.
func (m *Monitor) Snapshot() *Snapshot { return m.snap.Load() }

// Dispatch is Snapshot().Target(id) followed by Target.Dispatch; an unknown
// target yields a no-op Flight.
func (m *Monitor) Dispatch(id targetid.ID, promptTokens, uncachedTokens int) *Flight {
	t, ok := m.Snapshot().Target(id)
	if !ok {
		return nil
	}
	return t.Dispatch(promptTokens, uncachedTokens)
}

// Subscribe registers fn for registry changes. fn is first called with an
// Added change for every current (non-draining) target, then with every
// later change, in order, from the goroutine that applied it. fn must not
// block for long and must not call Subscribe or the returned cancel; it may
// read Snapshot, which already reflects the change.
func (m *Monitor) Subscribe(fn func(Change)) (cancel func()) {
	m.notifyMu.Lock()
	defer m.notifyMu.Unlock()
	id := m.nextSub
	m.nextSub++
	m.subs[id] = fn
	m.mu.Lock()
	var initial []Change
	for _, ep := range m.sortedEndpointsLocked() {
		for _, t := range ep.targets {
			if !t.draining {
				initial = append(initial, Change{Kind: Added, Target: t.ts})
			}
		}
	}
	m.mu.Unlock()
	for _, c := range initial {
		fn(c)
	}
	return func() {
		m.notifyMu.Lock()
		delete(m.subs, id)
		m.notifyMu.Unlock()
	}
}

// setSource replaces one source's endpoints and reconciles the registry,
// telling subscribers what changed.
func (m *Monitor) setSource(source string, specs map[string]Spec) {
	m.notifyMu.Lock()
	defer m.notifyMu.Unlock()
	m.mu.Lock()
	m.sources[source] = specs
	changes := m.reconcileLocked()
	if len(changes) > 0 {
		m.rebuildLocked()
	}
	m.mu.Unlock()
	if len(changes) > 0 {
		select {
		case m.probeNow <- struct{}{}:
		default:
		}
	}
	for _, c := range changes {
		m.log.Info("target "+string(c.Kind), "target", c.Target.ID.String(), "events", c.Target.Events, "source", source)
		for _, id := range slices.Sorted(maps.Keys(m.subs)) {
			m.subs[id](c)
		}
	}
}

// reconcileLocked brings endpoints in line with the merged sources.
func (m *Monitor) reconcileLocked() []Change {
	now := m.now()
	merged := map[string]Spec{}
	from := map[string]string{}
	for src, specs := range m.sources {
		for ep, spec := range specs {
			if cur, ok := from[ep]; ok {
				if sourceRank[src] >= sourceRank[cur] {
					continue
				}
			}
			merged[ep] = spec
			from[ep] = src
		}
	}
	var changes []Change
	for _, name := range slices.Sorted(maps.Keys(merged)) {
		spec := merged[name]
		tspecs, err := spec.Targets()
		if err != nil {
			m.log.Error("endpoint spec unusable", "endpoint", name, "err", err)
			continue
		}
		ep, ok := m.endpoints[name]
		if !ok {
			ep = &endpoint{spec: spec}
			m.endpoints[name] = ep
		}
		ep.spec = spec
		ep.source = from[name]
		for _, ts := range tspecs {
			t := ep.rank(ts.ID.Rank)
			switch {
			case t == nil:
				t = &rankState{ts: ts, ep: ep, live: &live{sh: m.sh}, state: StateDown, reason: ReasonAwaitingProbe, since: now}
				ep.targets = append(ep.targets, t)
				changes = append(changes, Change{Kind: Added, Target: ts})
			case t.draining:
				t.draining = false
				t.ts = ts
				changes = append(changes, Change{Kind: Added, Target: ts})
			case !targetSpecEqual(t.ts, ts):
				prev := t.ts
				t.ts = ts
				changes = append(changes, Change{Kind: Updated, Target: ts, Previous: prev})
			}
		}
		sort.Slice(ep.targets, func(i, j int) bool { return ep.targets[i].ts.ID.Rank < ep.targets[j].ts.ID.Rank })
		for _, t := range ep.targets {
			if t.ts.ID.Rank >= spec.DP && !t.draining {
				t.draining, t.drainSince = true, now
				changes = append(changes, Change{Kind: Removed, Target: t.ts})
			}
		}
	}
	for _, ep := range m.sortedEndpointsLocked() {
		if _, ok := merged[ep.spec.Endpoint]; ok {
			continue
		}
		for _, t := range ep.targets {
			if !t.draining {
				t.draining, t.drainSince = true, now
				changes = append(changes, Change{Kind: Removed, Target: t.ts})
			}
		}
	}
	return changes
}

func (e *endpoint) rank(r int) *rankState {
	for _, t := range e.targets {
		if t.ts.ID.Rank == r {
			return t
		}
	}
	return nil
}

func targetSpecEqual(a, b TargetSpec) bool {
	return a.ID == b.ID && a.Events == b.Events && a.EventsImplied == b.EventsImplied && a.Topic == b.Topic &&
		a.Replay == b.Replay && a.DP == b.DP &&
		a.Role == b.Role && slices.Equal(a.Models, b.Models)
}

func (m *Monitor) sortedEndpointsLocked() []*endpoint {
	out := make([]*endpoint, 0, len(m.endpoints))
	for _, ep := range m.endpoints {
		out = append(out, ep)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].spec.Endpoint < out[j].spec.Endpoint })
	return out
}

// reapLocked forgets draining targets whose requests finished or whose
// drain timed out. It reports whether anything was removed.
func (m *Monitor) reapLocked(now time.Time) bool {
	changed := false
	for name, ep := range m.endpoints {
		kept := ep.targets[:0]
		for _, t := range ep.targets {
			if t.draining && (t.live.inflight.Load() <= 0 || now.Sub(t.drainSince) >= m.cfg.DrainTimeout) {
				if n := t.live.inflight.Load(); n > 0 {
					m.log.Warn("drain timed out", "target", t.ts.ID.String(), "in_flight", n)
				}
				changed = true
				continue
			}
			kept = append(kept, t)
		}
		clear(ep.targets[len(kept):])
		ep.targets = kept
		if len(ep.targets) == 0 {
			delete(m.endpoints, name)
		}
	}
	return changed
}

// Run starts discovery, probes, scrapes and evaluation, and blocks until
// ctx is done.
func (m *Monitor) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	loop := func(interval time.Duration, first bool, extra <-chan struct{}, step func(context.Context)) {
		wg.Go(func() {
			tk := time.NewTicker(interval)
			defer tk.Stop()
			if first {
				step(ctx)
			}
			for {
				select {
				case <-ctx.Done():
					return
				case <-tk.C:
				case <-extra:
				}
				step(ctx)
			}
		})
	}
	if len(m.dnsSpecs) > 0 {
		loop(m.cfg.DNSInterval, true, nil, m.resolveAll)
	}
	if m.cfg.EndpointsFile != "" {
		wg.Go(func() { m.watchFile(ctx) })
	}
	loop(m.cfg.ProbeInterval, true, m.probeNow, m.probeAll)
	loop(m.cfg.ScrapeInterval, true, nil, m.scrapeAll)
	loop(m.cfg.EvalInterval, false, m.sh.kick, func(context.Context) { m.evaluate() })
	<-ctx.Done()
	wg.Wait()
	return nil
}

// evaluate reaps drained targets and rebuilds the snapshot (states depend
// on time: load staleness, breaker cooldowns).
func (m *Monitor) evaluate() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reapLocked(m.now())
	m.rebuildLocked()
}

// rebuildLocked recomputes every target's state and publishes a new
// snapshot.
func (m *Monitor) rebuildLocked() {
	now := m.now()
	m.version++
	snap := &Snapshot{
		Version: m.version,
		Built:   now,
		byID:    map[targetid.ID]*Target{},
		byModel: map[string][]*Target{},
	}
	eps := m.sortedEndpointsLocked()
	all := make([]*rankState, 0, len(eps))
	for _, ep := range eps {
		all = append(all, ep.targets...)
	}
	snap.Models = m.checkCacheConfigs(all)
	for _, t := range all {
		t.load.Stale = t.load.At.IsZero() || now.Sub(t.load.At) > m.cfg.LoadStaleAfter
		st, reason, detail := m.stateOf(t)
		m.logState(t, st, reason, detail, now)
		if st != t.state || reason != t.reason {
			if st != t.state {
				t.since = now
				t.live.transitions.Add(1)
			}
			t.state, t.reason = st, reason
		}
		t.detail = detail
		pub := &Target{
			ID:             t.ts.ID,
			Spec:           t.ts,
			Name:           t.ts.ID.String(),
			Source:         t.ep.source,
			State:          st,
			Reason:         reason,
			Detail:         detail,
			Since:          t.since,
			Models:         t.models(),
			Scraped:        t.load,
			Cache:          t.cache,
			ConfigConflict: t.conflict,
			conflictModels: t.conflictModels,
			live:           t.live,
		}
		snap.Targets = append(snap.Targets, pub)
		snap.byID[pub.ID] = pub
		if t.draining {
			continue
		}
		for _, model := range pub.Models {
			snap.byModel[model] = append(snap.byModel[model], pub)
		}
	}
	m.snap.Store(snap)
}

// stateLogEvery bounds how often a target that stays down or degraded is
// logged again.
const stateLogEvery = time.Minute

// logState logs a target's state: at its first judgement (the state a
// target is created in, awaiting its first probe, is no judgement and is
// not shown as a previous state), at every change, and once every
// stateLogEvery while it stays down or degraded, so that a lasting fault
// (a cache-config conflict, prefix caching off, a pod that never answers)
// stays in the log. Down and degraded are warnings.
func (m *Monitor) logState(t *rankState, st State, reason Reason, detail string, now time.Time) {
	args := []any{"target", t.ts.ID.String(), "state", st, "reason", reason, "detail", detail}
	bad := st == StateDown || st == StateDegraded
	switch {
	case !t.judged && reason == ReasonAwaitingProbe:
		return
	case !t.judged:
		t.judged = true
	case st != t.state || reason != t.reason:
		args = append(args, "previous", t.state, "previous_reason", t.reason)
	case bad && now.Sub(t.logged) >= stateLogEvery:
		args = append(args, "for", now.Sub(t.since).Round(time.Second), "repeats_every", stateLogEvery)
	default:
		return
	}
	lvl := slog.LevelInfo
	if bad {
		lvl = slog.LevelWarn
	}
	m.log.Log(context.Background(), lvl, "target state", args...)
	t.logged = now
}

// models returns the models the target serves.
func (t *rankState) models() []string {
	if len(t.ts.Models) > 0 {
		return t.ts.Models
	}
	return t.ep.models
}

// stateOf decides a target's state, in order of severity.
func (m *Monitor) stateOf(t *rankState) (State, Reason, string) {
	ep := t.ep
	switch {
	case t.draining:
		return StateDraining, ReasonRemoved, fmt.Sprintf("removed from discovery; %d requests in flight", t.live.inflight.Load())
	case !ep.probed:
		return StateDown, ReasonAwaitingProbe, "not probed yet"
	case !ep.run.Up:
		return StateDown, ReasonProbeFailed, ep.probeErr
	}
	if ep.authErr != "" {
		return StateDown, ReasonUnauthorized, ep.authErr
	}
	switch t.live.breakerState() {
	case "open":
		return StateDown, ReasonCircuitOpen, fmt.Sprintf("%d consecutive upstream failures; retry after %s",
			t.live.consecFail.Load(), time.Unix(0, t.live.breakerUntil.Load()).UTC().Format(time.RFC3339Nano))
	}
	if len(t.models()) == 0 {
		d := "GET /v1/models not answered yet"
		if ep.modelsErr != "" {
			d = ep.modelsErr
		}
		return StateDown, ReasonModelsUnknown, d
	}
	if len(t.ts.Models) > 0 && ep.modelsOK {
		for _, mod := range t.ts.Models {
			if !slices.Contains(ep.models, mod) {
				return StateDown, ReasonModelsUnknown, fmt.Sprintf("configured model %q is not in the pod's /v1/models %v", mod, ep.models)
			}
		}
	}
	if t.live.breakerState() == "half_open" {
		return StateDegraded, ReasonCircuitHalf, "circuit half-open: one trial request at a time"
	}
	if t.cache.PrefixCachingDisabled() {
		// Before a block-size or hash conflict: without prefix caching
		// those settings decide nothing.
		return StateDegraded, ReasonPrefixCachingOff, fmt.Sprintf(
			"prefix caching is disabled on the pod (vllm:cache_config_info enable_prefix_caching=%s): no KV events, no cache hits; start vLLM with --enable-prefix-caching",
			t.cache.PrefixCaching)
	}
	if t.conflict != "" {
		return StateDegraded, ReasonConfigConflict, t.conflict
	}
	if t.load.Stale {
		d := "metrics never scraped"
		if !t.load.At.IsZero() {
			d = fmt.Sprintf("last scrape %s ago", m.now().Sub(t.load.At).Round(time.Millisecond))
		}
		if ep.scrapeErr != "" {
			d += ": " + ep.scrapeErr
		}
		return StateDegraded, ReasonMetricsStale, d
	}
	return StateRoutable, ReasonOK, ""
}

func sortStrings(s []string) { sort.Strings(s) }
