package sim

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/sim/publish"
)

// Pod is one simulated vLLM server: an HTTP listener, one engine and one
// event publisher per data-parallel rank.
type Pod struct {
	index   int
	cfg     Config
	prof    Profile
	tok     Tokenizer
	loraIDs map[string]int64
	faults  *faultBox
	log     *slog.Logger
	started atomic.Int64 // unix nanoseconds the current process generation started
	// unauthorized counts the requests refused for want of Config.APIKey,
	// keyless those that came without it on any path.
	unauthorized, keyless atomic.Int64

	engines []*engine
	pubs    []*publish.Publisher

	ln         net.Listener
	srv        *http.Server
	eventsPort int
	replayPort int

	down     atomic.Bool // restarting: 503 everywhere
	ctlMu    sync.Mutex  // serialises restarts and fault changes
	reqSeq   atomic.Uint64
	cancel   context.CancelFunc
	engineWG sync.WaitGroup
	httpDone chan struct{}
}

// startPod binds and starts pod index of cfg (already defaulted).
func startPod(ctx context.Context, cfg Config, index int, tok Tokenizer) (_ *Pod, err error) {
	newHasher := func() (*kvindex.Hasher, error) {
		return kvindex.NewHasher(cfg.HashAlgo, cfg.HashSeed, cfg.Profile.BlockSize)
	}
	if cfg.RandomHashSeed {
		newHasher = func() (*kvindex.Hasher, error) { return randomHasher(cfg.HashAlgo, cfg.Profile.BlockSize) }
	}
	p := &Pod{
		index: index, cfg: cfg, prof: cfg.Profile, tok: tok,
		loraIDs:  make(map[string]int64, len(cfg.LoRAs)),
		faults:   newFaultBox(cfg.Faults),
		log:      cfg.Logger.With("pod", index),
		httpDone: make(chan struct{}),
	}
	p.started.Store(time.Now().UnixNano())
	for i, l := range cfg.LoRAs {
		p.loraIDs[l] = int64(i + 1)
	}
	defer func() {
		if err != nil {
			p.closeSockets()
		}
	}()

	httpPort := 0
	if cfg.HTTPPort != 0 {
		httpPort = cfg.HTTPPort + index
	}
	p.ln, err = net.Listen("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(httpPort)))
	if err != nil {
		return nil, fmt.Errorf("pod %d: listen: %w", index, err)
	}
	evBase, rpBase := 0, 0
	if cfg.EventsPort != 0 {
		evBase = cfg.EventsPort + 2*cfg.DP*index
		rpBase = evBase + cfg.DP
	}
	seed := cfg.Seed*1000003 + uint64(index)
	if cfg.EventsConnect != "" && cfg.Topic == "" {
		// The topic deployments give each pod publishing to a collector.
		cfg.Topic = "kv@" + p.ln.Addr().String() + "@" + cfg.Model
		p.cfg.Topic = cfg.Topic
	}
	p.pubs, p.eventsPort, p.replayPort, err = startPublishers(cfg, evBase, rpBase, seed, p.log)
	if err != nil {
		return nil, fmt.Errorf("pod %d: %w", index, err)
	}
	p.pushFaults(cfg.Faults)

	output := outputTokens(tok)
	ectx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	for r := 0; r < cfg.DP; r++ {
		hasher, err := newHasher()
		if err != nil {
			cancel()
			p.closePublishers()
			return nil, fmt.Errorf("pod %d: %w", index, err)
		}
		e := newEngine(cfg.Profile, r, hasher, cfg.TimeScale, output, p.pubs[r], p.faults, seed)
		setup := engineSetup{
			enc: cfg.EventEncoding, kvSpec: cfg.KVSpec, window: cfg.SlidingWindow,
			cpuBlocks: cfg.CPUOffloadBlocks, cpuLoad: cfg.CPULoadPerBlock,
			kvTransfer: cfg.KVTransferPerBlock, dp: cfg.DP,
			streamEvery: cfg.StreamInterval,
		}
		if cfg.RandomHashSeed {
			setup.newHasher = newHasher
		}
		e.configure(setup)
		if cfg.Faults.Dead {
			e.dead = true
		}
		p.engines = append(p.engines, e)
		e.rejoin() // run's goroutine takes it out of the registry when it ends
		p.engineWG.Add(1)
		go func() {
			defer p.engineWG.Done()
			e.run(ectx)
		}()
	}
	p.srv = &http.Server{
		Handler:           p.routes(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
	}
	go func() {
		defer close(p.httpDone)
		if err := p.srv.Serve(p.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			p.log.Error("http server", "err", err)
		}
	}()
	return p, nil
}

func (p *Pod) closeSockets() {
	if p.ln != nil {
		p.ln.Close()
	}
	p.closePublishers()
}

func (p *Pod) closePublishers() {
	for _, pub := range p.pubs {
		_ = pub.Close() // Close never fails; it only stops goroutines
	}
}

// pushFaults hands the transport faults to the publishers, in wall-clock
// time.
func (p *Pod) pushFaults(f Faults) {
	pf := publish.Faults{
		Delay:  time.Duration(float64(f.EventDelay) / p.cfg.TimeScale),
		Jitter: time.Duration(float64(f.EventJitter) / p.cfg.TimeScale),
		Drop:   f.DropEvents,
	}
	for _, pub := range p.pubs {
		if err := pub.SetFaults(pf); err != nil {
			p.log.Error("event faults", "err", err) // validated already: unreachable
		}
	}
}

// randomHasher is vLLM's root without PYTHONHASHSEED: 32 bytes of
// os.urandom, unknowable outside the process.
func randomHasher(algo kvindex.HashAlgo, blockSize int) (*kvindex.Hasher, error) {
	var root [32]byte
	if _, err := crand.Read(root[:]); err != nil {
		return nil, fmt.Errorf("random hash root: %w", err)
	}
	h, err := kvindex.NewHasherWithRoot(algo, root[:], blockSize)
	if err != nil {
		return nil, fmt.Errorf("random hash root: %w", err)
	}
	return h, nil
}

// startPublishers binds one publisher per rank: PUB sockets on evBase+r
// (or connecting to Config.EventsConnect's port + r) and ROUTER sockets on
// rpBase+r. With base 0 the OS picks rank 0's ports and the other ranks
// take the following ones; when one is taken meanwhile the whole run is
// released and tried again. Connecting, the events port is 0.
func startPublishers(cfg Config, evBase, rpBase int, seed uint64, log *slog.Logger) ([]*publish.Publisher, int, int, error) {
	attempts := 1
	if rpBase == 0 {
		attempts = 32
	}
	var lastErr error
	for a := 0; a < attempts; a++ {
		pubs, ev, rp, err := tryPublishers(cfg, evBase, rpBase, seed, log)
		if err == nil {
			return pubs, ev, rp, nil
		}
		lastErr = err
	}
	return nil, 0, 0, fmt.Errorf("event sockets: %w", lastErr)
}

func tryPublishers(cfg Config, evBase, rpBase int, seed uint64, log *slog.Logger) ([]*publish.Publisher, int, int, error) {
	pubs := make([]*publish.Publisher, 0, cfg.DP)
	fail := func(err error) ([]*publish.Publisher, int, int, error) {
		for _, pub := range pubs {
			_ = pub.Close()
		}
		return nil, 0, 0, err
	}
	addr := func(base, r int) string {
		if base == 0 {
			return "tcp://" + net.JoinHostPort(cfg.Host, "*")
		}
		return "tcp://" + net.JoinHostPort(cfg.Host, strconv.Itoa(base+r))
	}
	pick := rpBase == 0
	for r := 0; r < cfg.DP; r++ {
		pc := publish.Config{
			ReplayBind: addr(rpBase, r), Topic: cfg.Topic,
			BufferSize: cfg.ReplayBuffer, LegacyReplay: cfg.LegacyReplay,
			Seed: seed + uint64(r)*7919, Logger: log.With("rank", r),
		}
		if cfg.EventsConnect != "" {
			pc.Connect = connectAddr(cfg.EventsConnect, r)
		} else {
			pc.Bind = addr(evBase, r)
		}
		pub, err := publish.New(pc)
		if err != nil {
			return fail(err)
		}
		pubs = append(pubs, pub)
		if r == 0 && pick {
			if cfg.EventsConnect == "" {
				if evBase, err = portOfEndpoint(pub.Endpoint()); err != nil {
					return fail(err)
				}
			}
			if rpBase, err = portOfEndpoint(pub.ReplayEndpoint()); err != nil {
				return fail(err)
			}
		}
	}
	if cfg.EventsConnect != "" {
		evBase = 0
	}
	return pubs, evBase, rpBase, nil
}

// connectAddr is the collector address rank r connects to: the port
// offset by the rank, as vLLM offsets a data-parallel rank's endpoint.
func connectAddr(addr string, r int) string {
	host, ps, _ := net.SplitHostPort(strings.TrimPrefix(addr, "tcp://")) // validated by withDefaults
	port, _ := strconv.Atoi(ps)
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(port+r))
}

// portOfEndpoint reads the port of a bound ZMQ tcp endpoint.
func portOfEndpoint(ep string) (int, error) {
	_, ps, err := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
	if err != nil {
		return 0, fmt.Errorf("zmq endpoint %q: %w", ep, err)
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port <= 0 {
		return 0, fmt.Errorf("zmq endpoint %q: bad port", ep)
	}
	return port, nil
}

// Close stops the pod: in-flight requests end, the listener and sockets
// close, every goroutine exits.
func (p *Pod) Close() error {
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	p.cancel() // engines fail what is in flight
	p.engineWG.Wait()
	err := p.srv.Shutdown(shutdownCtx)
	if err != nil {
		err = p.srv.Close()
	}
	<-p.httpDone
	p.closePublishers()
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("pod %d: close: %w", p.index, err)
	}
	return nil
}

// Index is the pod's position in its fleet.
func (p *Pod) Index() int { return p.index }

// Model is the served base model name.
func (p *Pod) Model() string { return p.cfg.Model }

// URL is the pod's HTTP base URL, e.g. http://127.0.0.1:18000.
func (p *Pod) URL() string { return "http://" + p.ln.Addr().String() }

// EventsPort is rank 0's PUB port; rank r publishes on EventsPort()+r. It is
// 0 when the publishers connect to Config.EventsConnect.
func (p *Pod) EventsPort() int { return p.eventsPort }

// Topic is the topic frame the pod's publishers send.
func (p *Pod) Topic() string { return p.cfg.Topic }

// ReplayPort is rank 0's replay (ROUTER) port; rank r answers on ReplayPort()+r.
func (p *Pod) ReplayPort() int { return p.replayPort }

// EventsAddr is the ZMQ address rank r publishes on: bound on the pod, or
// the collector's it connects to.
func (p *Pod) EventsAddr(rank int) string {
	if p.cfg.EventsConnect != "" {
		return connectAddr(p.cfg.EventsConnect, rank)
	}
	return "tcp://" + net.JoinHostPort(p.cfg.Host, strconv.Itoa(p.eventsPort+rank))
}

// ReplayAddr is the ZMQ address rank r answers replay on.
func (p *Pod) ReplayAddr(rank int) string {
	return "tcp://" + net.JoinHostPort(p.cfg.Host, strconv.Itoa(p.replayPort+rank))
}

// Endpoint is the pod as `prefixrouter serve --endpoint` takes it:
// http://HOST:PORT?events=tcp://HOST:EV&replay=tcp://HOST:RP&dp=N&model=NAME,
// without events= when the publishers connect to a collector (the router
// then expects the pod on its --events-listen bus), and with
// &role=prefill or &role=decode in a disaggregated fleet (Config.PrefillPods).
func (p *Pod) Endpoint() string {
	q := "replay=" + p.ReplayAddr(0) +
		"&dp=" + strconv.Itoa(p.cfg.DP) + "&model=" + url.QueryEscape(p.cfg.Model)
	if p.cfg.EventsConnect == "" {
		q = "events=" + p.EventsAddr(0) + "&" + q
	}
	if role := p.Role(); role != "" {
		q += "&role=" + role
	}
	return p.URL() + "?" + q
}

// Role is the pod's announced role in a disaggregated fleet, "prefill" or
// "decode", or "" when the fleet is not disaggregated.
func (p *Pod) Role() string {
	switch {
	case p.cfg.PrefillPods == 0:
		return ""
	case p.index < p.cfg.PrefillPods:
		return "prefill"
	}
	return "decode"
}

// EngineID is rank's KV-connector engine id of the current process
// generation: what a prefill's kv_transfer_params name as remote_engine_id.
func (p *Pod) EngineID(rank int) string {
	if id := p.engines[rank].engineID.Load(); id != nil {
		return *id
	}
	return ""
}

// Faults returns the pod's current faults.
func (p *Pod) Faults() Faults { return p.faults.get() }

// SetFaults replaces the pod's faults. Setting Dead fails every in-flight
// request and stops events; clearing it brings the pod back as a fresh
// process (sequence 0, empty cache).
func (p *Pod) SetFaults(ctx context.Context, f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	p.ctlMu.Lock()
	defer p.ctlMu.Unlock()
	was := p.faults.get().Dead
	p.faults.set(f)
	p.pushFaults(f)
	switch {
	case f.Dead && !was:
		for _, e := range p.engines {
			if _, err := e.control(ctx, msgDie); err != nil {
				return fmt.Errorf("pod %d: kill: %w", p.index, err)
			}
		}
	case !f.Dead && was:
		return p.restartLocked(ctx)
	}
	return nil
}

// Restart simulates a process restart: in-flight requests fail (their
// connections drop), the prefix cache is lost without any event, event
// sequence numbers start again at 0 and the replay buffer is empty. The pod
// answers 503 for Config.RestartDowntime (model time).
func (p *Pod) Restart(ctx context.Context) error {
	p.ctlMu.Lock()
	defer p.ctlMu.Unlock()
	f := p.faults.get()
	f.Dead = false
	p.faults.set(f)
	return p.restartLocked(ctx)
}

func (p *Pod) restartLocked(ctx context.Context) error {
	p.down.Store(true)
	defer p.down.Store(false)
	for _, e := range p.engines {
		if _, err := e.control(ctx, msgRestart); err != nil {
			return fmt.Errorf("pod %d: restart: %w", p.index, err)
		}
	}
	if d := p.cfg.RestartDowntime; d > 0 {
		t := time.NewTimer(time.Duration(float64(d) / p.cfg.TimeScale))
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	p.started.Store(time.Now().UnixNano())
	return nil
}

// ResetPrefixCache is vLLM's /reset_prefix_cache: it succeeds (and publishes
// AllBlocksCleared) on every rank whose cache holds no block in use.
func (p *Pod) ResetPrefixCache(ctx context.Context) (bool, error) {
	all := true
	for _, e := range p.engines {
		ok, err := e.control(ctx, msgReset)
		if err != nil {
			return false, fmt.Errorf("pod %d: reset prefix cache: %w", p.index, err)
		}
		all = all && ok
	}
	return all, nil
}

// RankStats is a snapshot of one rank's gauges and counters.
type RankStats struct {
	Running, Waiting     int
	KVUsage              float64
	PrefixQueries        int64 // prompt tokens looked up
	PrefixHits           int64 // prompt tokens served from cache
	Preemptions          int64
	Steps                int64
	Lag                  time.Duration // wall-clock lag of the model clock
	CPUHits              int64         // prompt tokens loaded from the CPU offloading tier
	KVTransferHits       int64         // prompt tokens pulled from a remote prefill engine
	KVTransferFailures   int64         // decodes recomputed because their prefill engine was gone
	EventBatchesSent     uint64
	EventBatchesDropped  uint64
	ReplayRequestsServed uint64
}

// Stats returns one snapshot per rank.
func (p *Pod) Stats() []RankStats {
	out := make([]RankStats, len(p.engines))
	for i, e := range p.engines {
		s := &e.stats
		out[i] = RankStats{
			Running: int(s.running.Load()), Waiting: int(s.waiting.Load()), KVUsage: s.usage(),
			PrefixQueries: s.queries.Load(), PrefixHits: s.hits.Load(), Preemptions: s.preemptions.Load(),
			Steps: s.steps.Load(), Lag: time.Duration(s.lagNanos.Load()), CPUHits: s.cpuHits.Load(),
			KVTransferHits: s.kvLoaded.Load(), KVTransferFailures: s.kvFailures.Load(),
		}
		ps := p.pubs[i].Stats()
		out[i].EventBatchesSent, out[i].EventBatchesDropped, out[i].ReplayRequestsServed = ps.Sent, ps.Dropped, ps.Replays
	}
	return out
}

// pickRank chooses a rank for a request: the header's, or the least loaded
// (vLLM's internal balancer scores waiting × 4 + running).
func (p *Pod) pickRank(header string) (int, error) {
	if header != "" {
		r, err := strconv.Atoi(header)
		if err != nil || r < 0 || r >= len(p.engines) {
			return 0, badRequest("X-data-parallel-rank %q: want a rank in 0..%d", header, len(p.engines)-1)
		}
		return r, nil
	}
	best, bestLoad := 0, int64(-1)
	for i, e := range p.engines {
		if l := e.load(); bestLoad < 0 || l < bestLoad {
			best, bestLoad = i, l
		}
	}
	return best, nil
}
