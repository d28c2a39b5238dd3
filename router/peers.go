package router

import (
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/peers"
	"github.com/prefixrouter/prefixrouter/speculative"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// Prediction sharing between replicas (--peer-listen, --peers): the peers
// package carries the messages; the router composes what they mean. A
// peer's prediction enters the speculative store as its origin's
// (speculative.Store.PredictFrom), on a target this replica knows; its
// withdrawal withdraws that placement; the sum of the live peers' in-flight
// work joins each target's load (health.Target.SetPeerFlights), so the
// cost model's queued uncached tokens count what every replica sent. This
// replica publishes each placement it records (brain.Booking, through Share), its
// withdrawals (Withdraw) and its own in-flight work.

// peerLinks maps each peer's placement numbers to the placements their
// predictions made here, for the withdrawals that name them; an entry
// goes once its deadline passed (nothing is left to withdraw).
type peerLinks struct {
	r *Router
	// next numbers this replica's own placements on the wire.
	next atomic.Uint64

	mu      sync.Mutex
	origins map[string]*speculative.Origin
	byKey   map[peerPlacement]*speculative.Placement
	fifo    []peerLink // by arrival; deadlines capped at the stale window
	ignored *prometheus.CounterVec
}

type peerPlacement struct {
	origin    string
	placement uint64
}

type peerLink struct {
	key      peerPlacement
	deadline time.Time
}

// Reasons a peer's prediction is not recorded (the ignored counter).
const (
	peerIgnoredUnknownTarget = "unknown_target"
	peerIgnoredNotPredicting = "not_predicting"
	peerIgnoredOrigins       = "too_many_origins"
)

// defaultReplicaID names a replica that was given no --replica-id: its
// host name (a pod's name) and its peer port, unique on one host too.
func defaultReplicaID(listen string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "replica"
	}
	if _, port, err := kvindex.ParseListenAddr(listen); err == nil {
		return net.JoinHostPort(host, itoa(port))
	}
	return host
}

// newPeers makes the replica's mesh when --peer-listen is set.
func (r *Router) newPeers(cfg peers.Config, reg prometheus.Registerer) error {
	if !cfg.Enabled() {
		return nil
	}
	if cfg.ID == "" {
		cfg.ID = defaultReplicaID(cfg.Listen)
	}
	l := &peerLinks{r: r, origins: map[string]*speculative.Origin{}, byKey: map[peerPlacement]*speculative.Placement{},
		ignored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixrouter_peer_predictions_ignored_total",
			Help: "Predictions received from peer replicas and not recorded, by reason: unknown_target (a target this replica does not know), not_predicting (this replica's policy is not speculative), too_many_origins.",
		}, []string{"reason"})}
	for _, reason := range []string{peerIgnoredUnknownTarget, peerIgnoredNotPredicting, peerIgnoredOrigins} {
		l.ignored.WithLabelValues(reason)
	}
	if err := reg.Register(l.ignored); err != nil {
		return err
	}
	m, err := peers.New(cfg, peers.Handlers{
		Prediction: l.predicted,
		Withdrawal: l.withdrawn,
		Flights:    l.flights,
		Own:        l.own,
		OwnOf:      l.ownOf,
	}, peers.Deps{Logger: r.log, Registerer: reg})
	if err != nil {
		return err
	}
	r.mesh, r.links = m, l
	return nil
}

// predicted records a peer's prediction as its origin's.
func (l *peerLinks) predicted(origin string, p peers.Prediction) {
	spec := l.r.spec
	if spec == nil {
		l.ignored.WithLabelValues(peerIgnoredNotPredicting).Inc()
		return
	}
	if _, ok := l.r.mon.Snapshot().Target(p.Target); !ok {
		l.ignored.WithLabelValues(peerIgnoredUnknownTarget).Inc()
		return
	}
	o, err := l.origin(origin)
	if err != nil {
		l.ignored.WithLabelValues(peerIgnoredOrigins).Inc()
		return
	}
	h := spec.PredictFrom(o, speculative.Dispatch{Target: p.Target,
		Namespace: speculative.Namespace{Model: p.Model, LoRA: p.LoRA, BlockSize: p.BlockSize}}, p.Keys, p.Deadline)
	if h == nil {
		return
	}
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pruneLocked(now)
	k := peerPlacement{origin, p.Placement}
	l.byKey[k] = h
	l.fifo = append(l.fifo, peerLink{key: k, deadline: h.Deadline()})
}

func (l *peerLinks) origin(name string) (*speculative.Origin, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if o := l.origins[name]; o != nil {
		return o, nil
	}
	o, err := l.r.spec.Origin(name)
	if err == nil {
		l.origins[name] = o
	}
	return o, err
}

// pruneLocked forgets placements whose deadline passed. Deadlines are
// capped at now + the stale window on arrival, so the FIFO is ordered up
// to that window: an entry may outlive its deadline by at most it.
func (l *peerLinks) pruneLocked(now time.Time) {
	n := 0
	for n < len(l.fifo) && l.fifo[n].deadline.Before(now) {
		delete(l.byKey, l.fifo[n].key)
		n++
	}
	if n > 0 {
		l.fifo = append(l.fifo[:0], l.fifo[n:]...)
	}
}

// withdrawn withdraws a peer's placement.
func (l *peerLinks) withdrawn(origin string, placement uint64) {
	k := peerPlacement{origin, placement}
	l.mu.Lock()
	h := l.byKey[k]
	delete(l.byKey, k)
	l.mu.Unlock()
	h.Withdraw()
}

// flights sets the peers' in-flight work on the targets it names.
func (l *peerLinks) flights(sums map[targetid.ID]peers.TargetFlights) {
	snap := l.r.mon.Snapshot()
	for id, f := range sums {
		if t, ok := snap.Target(id); ok {
			t.SetPeerFlights(health.Flights{InFlight: f.InFlight, Prefilling: f.Prefilling, QueuedUncachedTokens: f.QueuedUncachedTokens})
		}
	}
}

// own is this replica's in-flight work, for its peers.
func (l *peerLinks) own() []peers.TargetFlights {
	var out []peers.TargetFlights
	for _, t := range l.r.mon.Snapshot().Targets {
		if f := t.Flights(); !f.IsZero() {
			out = append(out, peerFlights(t.ID, f))
		}
	}
	return out
}

// ownOf is this replica's in-flight work on one target.
func (l *peerLinks) ownOf(id targetid.ID) peers.TargetFlights {
	t, _ := l.r.mon.Snapshot().Target(id)
	return peerFlights(id, t.Flights())
}

func peerFlights(id targetid.ID, f health.Flights) peers.TargetFlights {
	return peers.TargetFlights{Target: id, InFlight: f.InFlight, Prefilling: f.Prefilling, QueuedUncachedTokens: f.QueuedUncachedTokens}
}

// Share publishes a prediction this replica's booking recorded and
// returns its number on the wire, for its withdrawal (brain.Peers).
func (l *peerLinks) Share(p brain.Prediction) uint64 {
	n := l.next.Add(1)
	l.r.mesh.Publish(peers.Prediction{Placement: n, Target: p.Target, Deadline: p.Deadline, Model: p.Namespace.Model,
		LoRA: p.Namespace.LoRA, BlockSize: p.Namespace.BlockSize, Keys: p.Keys})
	return n
}

// Withdraw withdraws the shared prediction numbered n at the peers.
func (l *peerLinks) Withdraw(n uint64) { l.r.mesh.Withdraw(n) }

// Changed sends this replica's work on target id to the peers at once.
func (l *peerLinks) Changed(id targetid.ID) { l.r.mesh.Changed(id) }

// PeersView is the replica mesh's view; false without --peer-listen.
func (r *Router) PeersView() (peers.View, bool) {
	if r.mesh == nil {
		return peers.View{}, false
	}
	return r.mesh.View(), true
}
