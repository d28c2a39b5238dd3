package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/router"
	"github.com/prefixrouter/prefixrouter/sim"
	"github.com/prefixrouter/prefixrouter/targetid"
	"github.com/prefixrouter/prefixrouter/tokenize"
)

// fleetRun is one policy's fresh fleet, with the router in front unless
// the policy is the oracle.
type fleetRun struct {
	fleet  *sim.Fleet
	router *router.Router
	route  routeFunc
	podOf  func(answer, dest) string
	close  func()
	// pods names each target ("endpoint#rank") by its pod (pod-0, ...).
	pods map[string]string
	// endpointsFile is the file the router reads its pods from ("": the
	// pods are its flags).
	endpointsFile string
	// endpoints are the pods' endpoint URLs as the router is given them;
	// with relays, events come through relays[i] (the faults workload).
	endpoints []string
	relays    []*eventRelay

	lagMu  sync.Mutex
	maxLag time.Duration
	stop   chan struct{}
	wg     sync.WaitGroup
}

// startFleetRun starts pods (and the router) for one policy and waits until
// requests can be routed as the policy means: every pod routable with a
// fresh event stream. With endpointsDir the router reads its pods from an
// endpoints file there (listEndpoints rewrites it), else from its flags.
func startFleetRun(ctx context.Context, cfg sim.Config, policy string, seed uint64, rs routerSettings, endpointsDir string, log *slog.Logger) (_ *fleetRun, err error) {
	fr := &fleetRun{stop: make(chan struct{})}
	var cleanup []func()
	fr.close = func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
	}
	defer func() {
		if err != nil {
			fr.close()
		}
	}()
	cfg.Logger = log
	fr.fleet, err = sim.StartFleet(ctx, cfg)
	if err != nil {
		return nil, err
	}
	cleanup = append(cleanup, func() { _ = fr.fleet.Close() })
	fr.podOf = func(_ answer, d dest) string { return d.pod }
	if policy == Oracle {
		fr.route = newOracle(fr.fleet, seed).route
	} else if err := fr.startRouter(ctx, policy, rs, endpointsDir, log, &cleanup); err != nil {
		return nil, err
	}
	fr.wg.Add(1)
	go fr.watchLag()
	cleanup = append(cleanup, func() {
		close(fr.stop)
		fr.wg.Wait()
	})
	return fr, nil
}

func (fr *fleetRun) startRouter(ctx context.Context, policy string, rs routerSettings, endpointsDir string, log *slog.Logger, cleanup *[]func()) error {
	spec := rs.Speculative
	pol, err := brain.ParsePolicy(policy)
	if err != nil {
		return err
	}
	model := fr.fleet.Config().Model
	cfg := router.DefaultConfig()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", ""
	cfg.Policy = pol
	cfg.DebugHeaders = true // requests are attributed to pods by X-Prefixrouter-Target
	fr.endpoints = fr.fleet.Endpoints()
	if endpointsDir != "" {
		if err := fr.relayEvents(cleanup); err != nil {
			return err
		}
	}
	cfg.Health.Endpoints = fr.endpoints
	if endpointsDir != "" {
		fr.endpointsFile = filepath.Join(endpointsDir, "endpoints.json")
		if err := fr.listEndpoints(-1); err != nil {
			return err
		}
		cfg.Health.Endpoints, cfg.Health.EndpointsFile = nil, fr.endpointsFile
	}
	// The router watches the pods as often in model time as serve's
	// defaults do in real time: at time scale 8 a 500 ms scrape interval is
	// 62 ms of wall time, or the router would judge on data eight times
	// older than it would in production.
	scale := fr.fleet.Config().TimeScale
	scaled := func(d time.Duration) time.Duration { return max(20*time.Millisecond, time.Duration(float64(d)/scale)) }
	def := router.DefaultConfig()
	cfg.Health.ProbeInterval = scaled(def.Health.ProbeInterval)
	cfg.Health.ProbeTimeout = min(def.Health.ProbeTimeout, cfg.Health.ProbeInterval)
	cfg.Health.ScrapeInterval = scaled(def.Health.ScrapeInterval)
	cfg.Health.ScrapeTimeout = min(def.Health.ScrapeTimeout, cfg.Health.ScrapeInterval)
	cfg.Health.EvalInterval = scaled(def.Health.EvalInterval)
	cfg.Events.EvalInterval = scaled(def.Events.EvalInterval)
	cfg.Events.StaleAfter = scaled(def.Events.StaleAfter)
	cfg.Health.SuccessThreshold = 1
	// A breaker opened by a pod's failures stays open as long in model
	// time as serve's would in real time.
	cfg.Health.BreakerCooldown = scaled(def.Health.BreakerCooldown)
	cfg.Health.BreakerMaxCooldown = scaled(def.Health.BreakerMaxCooldown)
	// Predictions live as long in model time as serve's defaults let them
	// in real time; a fixed TTL is given in model time.
	cfg.Speculative.MaxStale = scaled(def.Speculative.MaxStale)
	if spec.TTL > 0 {
		cfg.Speculative.TTL = max(time.Duration(float64(spec.TTL)/scale), time.Millisecond)
	}
	if spec.Holdback != nil {
		cfg.Speculative.Holdback = *spec.Holdback
	}
	if rs.Cost != nil {
		cfg.Cost = *rs.Cost
	}
	toks := tokenize.NewRegistry(tokenize.Options{Logger: log})
	*cleanup = append(*cleanup, toks.Close)
	if _, err := toks.Add(model, fr.fleet.Config().Tokenizer, tokenize.ModeLocal); err != nil {
		return fmt.Errorf("router tokenizer: %w", err)
	}
	rt, err := router.New(cfg, router.Deps{Tokenizers: toks, Logger: log})
	if err != nil {
		return fmt.Errorf("router: %w", err)
	}
	rctx, stop := context.WithCancel(ctx)
	if err := rt.Start(rctx); err != nil {
		stop()
		return fmt.Errorf("router: %w", err)
	}
	*cleanup = append(*cleanup, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = rt.Shutdown(sctx)
		stop()
	})
	fr.router = rt
	if err := waitRouterReady(ctx, rt, model, len(fr.fleet.Pods)); err != nil {
		return err
	}
	fr.pods = map[string]string{}
	for i, p := range fr.fleet.Pods {
		for r := range fr.fleet.Config().DP {
			fr.pods[targetid.ID{Endpoint: p.URL(), Rank: r}.String()] = podName(i)
		}
	}
	url := "http://" + rt.Addr() + "/v1/completions"
	fr.route = func(context.Context, string) (dest, error) { return dest{url: url}, nil }
	fr.podOf = func(a answer, _ dest) string {
		if a.prefillTarget != "" {
			// A split request belongs to the pod that computed its prompt
			// and holds it in its cache.
			return fr.pods[a.prefillTarget]
		}
		return fr.pods[a.target]
	}
	return nil
}

// listEndpoints writes the router's endpoints file: every pod but unlisted
// (-1: every pod), replaced at once by a rename as a ConfigMap update is.
func (fr *fleetRun) listEndpoints(unlisted int) error {
	list := []string{} // "[]", not "null": an empty list is valid, no list is not
	for i, ep := range fr.endpoints {
		if i != unlisted {
			list = append(list, ep)
		}
	}
	raw, err := json.Marshal(list)
	if err != nil {
		return fmt.Errorf("endpoints file: %w", err)
	}
	tmp := fr.endpointsFile + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o644); err != nil {
		return fmt.Errorf("endpoints file: %w", err)
	}
	if err := os.Rename(tmp, fr.endpointsFile); err != nil {
		return fmt.Errorf("endpoints file: %w", err)
	}
	return nil
}

// relayEvents puts an eventRelay between the router and each pod's event
// publishers, so that a fault can sever the router's subscriber.
func (fr *fleetRun) relayEvents(cleanup *[]func()) error {
	dp := fr.fleet.Config().DP
	for i, p := range fr.fleet.Pods {
		addrs := make([]string, dp)
		for r := range dp {
			addrs[r] = p.EventsAddr(r)
		}
		rel, err := newEventRelay(addrs)
		if err != nil {
			return err
		}
		*cleanup = append(*cleanup, func() { _ = rel.close() })
		fr.relays = append(fr.relays, rel)
		if fr.endpoints[i], err = rel.endpoint(fr.endpoints[i]); err != nil {
			return err
		}
	}
	return nil
}

// podOfTarget names a router's target by its pod, or by itself when it is
// none of the fleet's.
func (fr *fleetRun) podOfTarget(id targetid.ID) string {
	if p, ok := fr.pods[id.String()]; ok {
		return p
	}
	return id.String()
}

// waitRouterReady waits until every pod is routable with a fresh event
// stream and the router knows the pods' block keys.
func waitRouterReady(ctx context.Context, rt *router.Router, model string, pods int) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		n := 0
		for _, t := range rt.Monitor().Snapshot().ForModel(model) {
			if t.CanRoute() && rt.EventPlane().Verdict(t.ID) == eventplane.VerdictFresh {
				n++
			}
		}
		if n >= pods && rt.KeysReady() {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pods not ready: %d of %d routable with fresh events", n, pods)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// watchLag samples how far the pods' model clocks trail the wall clock.
func (fr *fleetRun) watchLag() {
	defer fr.wg.Done()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-fr.stop:
			return
		case <-t.C:
			for _, p := range fr.fleet.Pods {
				for _, st := range p.Stats() {
					fr.lagMu.Lock()
					fr.maxLag = max(fr.maxLag, st.Lag)
					fr.lagMu.Unlock()
				}
			}
		}
	}
}

// prefillCache is the prefill pods' prefix-cache lookups and hits, in
// prompt tokens (GPU hits: a prefill pod loads nothing from elsewhere).
func (fr *fleetRun) prefillCache() (queries, hits int64) {
	for _, p := range fr.fleet.Pods {
		if p.Role() != "prefill" {
			continue
		}
		for _, st := range p.Stats() {
			queries += st.PrefixQueries
			hits += st.PrefixHits
		}
	}
	return queries, hits
}

// stats are the pods' own numbers of the run: the worst lag of the model
// clock behind the wall (in model time) and the preemptions.
func (fr *fleetRun) stats() (lag time.Duration, preemptions int64) {
	for _, p := range fr.fleet.Pods {
		for _, st := range p.Stats() {
			preemptions += st.Preemptions
			lag = max(lag, st.Lag)
		}
	}
	fr.lagMu.Lock()
	defer fr.lagMu.Unlock()
	return max(lag, fr.maxLag), preemptions
}
