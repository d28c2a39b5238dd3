package speculative

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex"
)

// Router replicas behind one Service each see every pod's KV events, so
// their confirmed state converges; their predictions do not, unless they
// share them. A prediction received from a peer replica enters the store
// as that origin's: it is looked up, scored with the target's trust and
// confirmed by the same BlockStored as a local one, and it ends on its own
// deadline (a lost peer's predictions expire on their TTL), but it is
// counted apart: its outcomes go to the origin's own cohorts, never to the
// target's, so that trust and the TTL controller rest on this replica's
// own predictions and route-to-confirmation latencies alone.

// MaxOrigins bounds the peer replicas a store accounts for (the origin
// label of the prefixrouter_speculative_peer_* series).
const MaxOrigins = 64

// Origin is a peer replica whose predictions the store receives. Get one
// with Store.Origin.
type Origin struct{ name string }

// Name is the replica's id, as it names itself on the wire.
func (o *Origin) Name() string { return o.name }

// Origin returns the origin named name, registering it on first use; an
// error once MaxOrigins are known.
func (s *Store) Origin(name string) (*Origin, error) {
	s.originsMu.Lock()
	defer s.originsMu.Unlock()
	if o := s.origins[name]; o != nil {
		return o, nil
	}
	if len(s.origins) >= MaxOrigins {
		return nil, fmt.Errorf("speculative: more than %d peer replicas: predictions of %q not accounted for", MaxOrigins, name)
	}
	o := &Origin{name: name}
	s.origins[name] = o
	return o, nil
}

// peerLedger is one origin's predictions on one target. Guarded by the
// target's lock.
type peerLedger struct {
	cohorts cohortBook
	live    int64
	// arrivedExpired counts predictions whose deadline had passed when
	// they arrived.
	arrivedExpired                   uint64
	inserted, confirmed, late        uint64
	followed                         uint64
	falseWarmRoutes, falseWarmTokens uint64
}

// peerLocked is o's ledger on t, created on first use.
func (t *targetState) peerLocked(o *Origin) *peerLedger {
	l := t.peers[o]
	if l == nil {
		l = &peerLedger{}
		if t.peers == nil {
			t.peers = map[*Origin]*peerLedger{}
		}
		t.peers[o] = l
	}
	return l
}

// PredictFrom records a prediction a peer replica (o) made when its own
// routing decision committed: keys on d.Target until deadline (the
// origin's clock; the store takes it as it comes, capped at now +
// MaxStale, so a prediction never counts longer here than a local one
// could). Keys pending already, local or another origin's, are only
// claimed. It returns the placement a withdrawal from the origin ends; nil
// when the deadline has passed. The router calls it for every prediction
// a peer publishes, on targets it knows.
func (s *Store) PredictFrom(o *Origin, d Dispatch, keys []kvindex.Key, deadline time.Time) *Placement {
	t := s.targetOrAdd(d.Target)
	now := s.clock()
	dl := min(s.since(deadline), now+int64(s.cfg.MaxStale))
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.peerLocked(o)
	if dl <= now {
		l.arrivedExpired++
		return nil
	}
	s.expireLocked(t, now)
	h := &Placement{s: s, t: t, gen: t.gen, id: d.RequestID, ns: d.Namespace, routed: now, deadline: dl,
		peer: l, preds: make([]*prediction, 0, len(keys))}
	s.insertLocked(t, h, keys, now)
	return h
}

// PeerView is one origin's predictions: on one target, or summed over
// targets. Its outcomes are counted apart from the local ones (and from
// the target's funnel, save the follower routes and false-warm routes,
// which are this replica's routes on any origin's predictions).
type PeerView struct {
	Origin string `json:"origin"`
	// Live are its pending predictions; ArrivedExpired those whose
	// deadline had passed on arrival (not inserted).
	Live           int64       `json:"live"`
	ArrivedExpired uint64      `json:"arrived_expired"`
	Inserted       uint64      `json:"inserted"`
	Confirmed      uint64      `json:"confirmed"`
	ConfirmedLate  uint64      `json:"confirmed_late"`
	Followed       uint64      `json:"followed"`
	Pending        PendingView `json:"pending"`
	// MatureTotal are its mature cohorts since the router started.
	MatureTotal CohortView    `json:"mature_total"`
	FalseWarm   FalseWarmView `json:"false_warm"`
}

// peerSums are what the views and the metrics sum over targets per
// origin.
type peerSums struct {
	l              peerLedger
	pending, total counts
}

func (p *peerSums) add(l *peerLedger) {
	p.l.live += l.live
	p.l.arrivedExpired += l.arrivedExpired
	p.l.inserted += l.inserted
	p.l.confirmed += l.confirmed
	p.l.late += l.late
	p.l.followed += l.followed
	p.l.falseWarmRoutes += l.falseWarmRoutes
	p.l.falseWarmTokens += l.falseWarmTokens
	pend := l.cohorts.pendingSum()
	p.pending.addAll(&pend)
	p.total.addAll(&l.cohorts.total)
}

func (p *peerSums) view(origin string) PeerView {
	return PeerView{
		Origin: origin, Live: p.l.live, ArrivedExpired: p.l.arrivedExpired, Inserted: p.l.inserted,
		Confirmed: p.l.confirmed, ConfirmedLate: p.l.late, Followed: p.l.followed,
		Pending: pendingView(p.l.live, &p.pending), MatureTotal: cohortView(&p.total),
		FalseWarm: FalseWarmView{Routes: p.l.falseWarmRoutes, Tokens: p.l.falseWarmTokens},
	}
}

// peerSumsLocked adds t's ledgers into by (origin name → sums).
func (t *targetState) peerSumsLocked(by map[string]*peerSums) {
	for o, l := range t.peers {
		p := by[o.name]
		if p == nil {
			p = &peerSums{}
			by[o.name] = p
		}
		p.add(l)
	}
}

// peerViews lists sums by origin name.
func peerViews(by map[string]*peerSums) []PeerView {
	out := make([]PeerView, 0, len(by))
	for name, p := range by {
		out = append(out, p.view(name))
	}
	slices.SortFunc(out, func(a, b PeerView) int { return cmp.Compare(a.Origin, b.Origin) })
	return out
}
