package des

import (
	"time"

	"github.com/prefixrouter/prefixrouter/bench/report"
	"github.com/prefixrouter/prefixrouter/sim"
	"github.com/prefixrouter/prefixrouter/speculative"
)

// Control is what a conductor (Config.Conduct) does to a run as it goes:
// it sends sessions when it chooses, cancels requests, changes pods'
// faults and restarts them, and reads the routers' and the pods' state.
// Its methods run on the run's goroutine, from Conduct and from the
// functions it schedules (At) or is called back with (Send).
type Control struct{ r *run }

// Sent is one request a conductor sent.
type Sent struct {
	// Pod is where it went (-1: nowhere).
	Pod int
	// ConfirmedBlocks and PredictedTokens are what its router counted
	// for that pod: the confirmed run of blocks and the prompt tokens it
	// expected cached, predictions included (the API's debug headers).
	// Routed says a router decided (not the oracle).
	ConfirmedBlocks, PredictedTokens int
	Routed                           bool
	// Record is the request as the run recorded it, once it ended.
	Record report.Record
	q      *request
	ended  func(*Sent)
}

// Now is the model time.
func (c *Control) Now() time.Duration { return c.r.now }

// At runs fn at model time t (now if t has passed).
func (c *Control) At(t time.Duration, fn func()) {
	c.r.q.push(item{at: max(t, c.r.now), kind: evCall, fn: fn})
}

// Send sends turn 0 of session i now; ended is called once it ends
// (answered, failed or canceled), its Record filled in. A session's later
// turns follow as in any run.
func (c *Control) Send(i int, ended func(*Sent)) *Sent {
	s := &Sent{Pod: -1, ended: ended}
	r := c.r
	q := &request{conducted: s}
	s.q = q
	q = r.sendRequest(q, i, 0, nil)
	if !q.over && !q.queued {
		s.Pod = q.pod
		if q.vr != nil {
			s.Routed, s.ConfirmedBlocks, s.PredictedTokens = true, q.vr.ConfirmedBlocks(), q.vr.PredictedCached()
		}
	}
	return s
}

// Cancel ends s as a client that goes away does: the router ends it (its
// predictions stay until confirmed or expired) and its pod aborts it
// between steps. It is recorded as failed (ErrCanceled) at once; a
// request already ended is left alone.
func (c *Control) Cancel(s *Sent) {
	r, q := c.r, s.q
	if q.over {
		return
	}
	q.canceled = true
	if q.queued {
		// Still in its router's line: it leaves it, holding nothing.
		rt := r.rts[q.router]
		delete(rt.waiting, q.vr)
		q.vr.Leave()
		q.queued, q.rec.QueueS, q.vr = false, q.vr.Waiter().QueueTime().Seconds(), nil
	}
	if q.vr != nil {
		q.vr.Cancel()
		r.flightsChanged(q)
	}
	if sq := q.sq; sq != nil {
		p := r.pods[q.pod]
		r.betweenSteps(p, func() { p.rank.Abort(sq) })
	}
	q.rec.Err = ErrCanceled
	r.end(q, true)
}

// SetEventDelay holds pod's KV-event batches back by d from now on
// (batches still leave in order).
func (c *Control) SetEventDelay(pod int, d time.Duration) { c.r.pods[pod].eventDelay = d }

// EventDelay is pod's event delay now.
func (c *Control) EventDelay(pod int) time.Duration { return c.r.pods[pod].eventDelay }

// SetFaults sets the faults pod's engine models itself (sim.Rank.SetFaults:
// FailPrefill, Slow).
func (c *Control) SetFaults(pod int, f sim.Faults) { c.r.pods[pod].rank.SetFaults(f) }

// Restart restarts pod's process between steps: its requests fail, its
// cache is lost without an event and its event stream's sequence starts
// again, which the routers read as a restart.
func (c *Control) Restart(pod int) {
	r, p := c.r, c.r.pods[pod]
	r.betweenSteps(p, func() {
		r.failAll(p, p.rank.Restart())
		p.ended = append(p.ended, r.now)
		p.nextSeq, p.started, p.dead = 0, r.now, false
		p.gen++
		p.buffer = p.buffer[:0]
	})
}

// Kill kills pod's engine between steps: its requests fail, later ones
// are refused, it publishes nothing and its probes fail until Restart
// brings it back as a new process.
func (c *Control) Kill(pod int) {
	r, p := c.r, c.r.pods[pod]
	r.betweenSteps(p, func() {
		p.dead = true
		r.failAll(p, p.rank.Die())
	})
}

// DropEvents has pod publish its batches without sending them (they take
// their sequence numbers and stay in its replay buffer), or send them
// again.
func (c *Control) DropEvents(pod int, drop bool) { c.r.pods[pod].dropEvents = drop }

// Sever cuts every router's event stream off pod (their streams read
// disconnected, batches published meanwhile never reach them) or mends
// it (they reconnect and catch up from the pod's replay buffer).
func (c *Control) Sever(pod int, cut bool) {
	p := c.r.pods[pod]
	p.severed = cut
	for _, rt := range c.r.rts {
		rt.v.SetConnected(p.id, !cut)
	}
}

// Unlist takes pod out of every router's fleet (as an endpoints file
// without it); List puts it back as a new target.
func (c *Control) Unlist(pod int) {
	for _, rt := range c.r.rts {
		rt.v.Unlist(c.r.pods[pod].id)
	}
}

// List puts an unlisted pod back into every router's fleet.
func (c *Control) List(pod int) error {
	p := c.r.pods[pod]
	for _, rt := range c.r.rts {
		if err := rt.v.List(p.id); err != nil {
			return err
		}
		// A target added to the fleet is probed at once, as health's
		// Monitor probes a new endpoint.
		rt.v.Probe(p.id, !p.dead)
	}
	return nil
}

// Routers is the number of router replicas (0 for the oracle).
func (c *Control) Routers() int { return len(c.r.rts) }

// Verdict is router ri's verdict on pod's event stream.
func (c *Control) Verdict(ri, pod int) string {
	return string(c.r.rts[ri].v.Verdict(c.r.pods[pod].id))
}

// Reason is why router ri would not route to pod now ("" when it would).
func (c *Control) Reason(ri, pod int) string { return c.r.rts[ri].v.Reason(c.r.pods[pod].id) }

// Encode is a prompt's token ids as the pods read it.
func (c *Control) Encode(text string) ([]uint32, error) { return c.r.tok.Encode(text, true) }

// ConfirmedBlocks is the run of ids' blocks router ri's index says pod
// holds.
func (c *Control) ConfirmedBlocks(ri, pod int, ids []uint32) (int, error) {
	return c.r.rts[ri].v.ConfirmedBlocks(c.r.pods[pod].id, ids)
}

// CachedTokens is the prompt tokens of ids pod would serve from its cache
// now (its true state).
func (c *Control) CachedTokens(pod int, ids []uint32) (int, error) {
	st, err := c.r.pods[pod].rank.State(ids)
	return st.CachedTokens, err
}

// BlockSize is the pods' KV block size in tokens.
func (c *Control) BlockSize() int { return c.r.cfg.Fleet.Profile.BlockSize }

// Pods is the fleet's size.
func (c *Control) Pods() int { return len(c.r.pods) }

// Routable reports whether every router would send new work to pod now.
func (c *Control) Routable(pod int) bool {
	for _, rt := range c.r.rts {
		if !rt.v.Routable(c.r.pods[pod].id) {
			return false
		}
	}
	return true
}

// Speculative is the first router's predicted placements (false unless
// the policy is speculative).
func (c *Control) Speculative() (speculative.View, bool) {
	if len(c.r.rts) == 0 {
		return speculative.View{}, false
	}
	return c.r.rts[0].v.Speculative()
}

// HolderOf is the pod caching most of session i's first prompt (-1 when
// none caches any of it), from the pods' true state.
func (c *Control) HolderOf(i int) int {
	r := c.r
	ids, err := r.tok.Encode(r.w.Sessions[i].Prompt(0, nil), true)
	if err != nil {
		return -1
	}
	best, most := -1, 0
	for _, p := range r.pods {
		st, err := p.rank.State(ids)
		if err == nil && st.CachedTokens > most {
			best, most = p.i, st.CachedTokens
		}
	}
	return best
}
