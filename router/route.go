package router

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/target"
)

// routePlan is everything decided about a request before it is proxied:
// its prompt as the pod will see it, its block keys, the candidates with
// their confirmed runs and costs, and the choice.
type routePlan struct {
	model  string
	tokens promptTokens
	// chain holds the prompt's block keys up to the first block no target
	// holds (all of them when every block is held somewhere): the rest
	// cannot change any target's run.
	chain        kvindex.KeyChain
	blockSize    int
	cands        []Candidate
	dec          decision
	approxChunks []uint64
	// settled is set when reading stopped while the chosen target still
	// held every block so far: no other target could catch up, so more
	// blocks could only lengthen the winner's run. Its whole run is looked
	// up after dispatch, with the keyer and extras kept for it, as of
	// asOf: the index as it stood when the plan settled, before the
	// request could make the pod store anything.
	settled bool
	asOf    kvindex.StoreMark
	keyer   kvindex.Keyer
	extras  kvindex.RequestExtras
	// full is closed once finishPrompt has encoded the rest of the prompt
	// into finished (and, when settled, looked up every candidate's whole
	// run into finalBlocks, by candidate); nil when there was nothing left
	// to encode.
	full        chan struct{}
	finished    promptTokens
	finalBlocks []int
	// flight is a settled plan's attempt in progress, until its first
	// byte: dispatched with the run read so far, a lower bound of what the
	// pod holds, it queues more uncached tokens than the pod has to
	// compute. The tail corrects it once the whole run is known.
	// flightMu guards it and every call on it while it is set.
	flightMu sync.Mutex
	flight   *health.Flight
}

// plan resolves targets, tokenizes, looks the blocks up and chooses. With
// dryRun nothing is recorded: round-robin does not advance.
func (r *Router) plan(ctx context.Context, req *Request, dryRun bool) (*routePlan, *apiError) {
	snap := r.mon.Snapshot()
	targets := snap.ForModel(req.Model)
	if len(targets) == 0 {
		if len(snap.Models) == 0 && len(snap.Targets) > 0 {
			return nil, errNoTarget("no target has reported its models yet", r.retryAfter())
		}
		return nil, errUnknownModel(req.Model)
	}
	pl := &routePlan{model: req.Model, cands: make([]Candidate, 0, len(targets))}
	routable := 0
	for _, t := range targets {
		if t.Spec.Role == health.RolePrefill {
			// A prefill-only pod of a disaggregated fleet takes work from
			// its decode peer, not from clients.
			continue
		}
		v := r.ev.Verdict(t.ID)
		c := Candidate{Target: t, Routable: t.CanRoute(), Trusted: v.Trusted(),
			Trust: v.ConfirmedWeight(), Load: loadOf(t, v)}
		if c.Routable {
			routable++
		}
		pl.cands = append(pl.cands, c)
	}
	if routable == 0 {
		return nil, errNoTarget("no routable target for model "+req.Model, r.retryAfter())
	}

	ks := r.ev.Keys()
	needIDs := r.cfg.Policy == PolicyPrecise
	tctx, cancel := context.WithTimeout(ctx, r.cfg.TokenizeTimeout)
	defer cancel()
	pt, err := r.tok.prompt(tctx, req, r.cat, needIDs, func() string {
		// Remote tokenization asks a routable pod of the model.
		if t, e := r.pickAny(snap, req.Model); e == nil {
			return t.ID.Endpoint
		}
		return ""
	})
	if err != nil {
		return nil, err
	}
	pl.tokens = pt
	if ks != nil {
		pl.blockSize = ks.BlockSize
	}
	precise := r.cfg.Policy == PolicyPrecise
	if ks != nil && (pt.ids != nil || (pt.stream != nil && precise)) {
		extras := kvindex.RequestExtras{CacheSalt: req.CacheSalt}
		if r.cat.isAdapter(req.Model) {
			extras.LoRAName = req.Model
		}
		var kerr error
		if pt.stream != nil {
			pl.keyer, pl.extras = ks.Keyer, extras
			kerr = r.keyUntilDecided(pl)
		} else {
			kerr = ks.Keyer.Extend(&pl.chain, pt.ids, extras)
		}
		if kerr != nil {
			return nil, errBadRequest("prompt", "cannot compute block keys: "+kerr.Error())
		}
		// A settled plan's last check already looked these keys up.
		if keys := pl.chain.Keys; len(keys) > 0 && precise && !pl.settled {
			var mbuf [16]kvindex.Match
			matchInto(pl.cands, r.ev.Index().Lookup(mbuf[:0], keys))
		}
	}
	if r.ch.approx != nil {
		pl.approxChunks = approxChunks(nil, approxText(req))
		r.ch.approx.match(pl.cands, pl.approxChunks)
	}
	pl.dec = r.ch.choose(pl.cands, pl.tokens.count, pl.blockSize, dryRun)
	if pl.dec.idx < 0 {
		return nil, errNoTarget("no routable target for model "+req.Model, r.retryAfter())
	}
	if pl.settled {
		pl.dec.reason = fmt.Sprintf("lowest cost; confirmed run of at least %d blocks, which no other target can catch up with",
			pl.cands[pl.dec.idx].ConfirmedBlocks)
	}
	return pl, nil
}

// keyUntilDecided encodes the prompt a segment at a time and keys each new
// block, and stops reading as soon as the rest cannot change the decision:
//   - at the first block no target holds: runs start at block 0, so no
//     later block can lengthen any run;
//   - or once the cheapest candidate is strictly cheapest and no other
//     routable candidate still holds every block so far: more blocks could
//     only lengthen the winner's run and lower its cost.
//
// For a prompt no pod has seen, or one a single pod holds (a conversation
// lives on one pod; others share at most its system prompt), this is the
// difference between encoding a few segments and encoding all of them
// before the request leaves. The rest is encoded after dispatch.
func (r *Router) keyUntilDecided(pl *routePlan) error {
	st := pl.tokens.stream
	var reach kvindex.Reach
	// A check that has to look every block so far up again and still
	// cannot settle makes the next wait until the blocks have doubled.
	checkFrom := 0
	// readOn is set once reading looks set to go on: a check looked the
	// blocks up and could not settle, or two checks found several
	// holders (more than a shared system prompt).
	readOn, shared := false, 0
	for !st.Done() {
		if err := st.Step(); err != nil {
			// The pod will judge the prompt; route on what is known.
			slog.Debug("tokenization failed; routing on the blocks so far", "model", pl.model, "err", err)
			pl.tokens.stream = nil
			break
		}
		before := len(pl.chain.Keys)
		if err := pl.keyer.Extend(&pl.chain, st.IDs(), pl.extras); err != nil {
			return err
		}
		if n := len(pl.chain.Keys); n > before {
			if !r.ev.Index().Extend(&reach, pl.chain.Keys[before:]) {
				break
			}
			if n >= checkFrom && !st.Done() {
				done, looked := r.settled(pl, &reach, st.EstimateCount())
				if done {
					pl.settled, pl.asOf = true, r.ev.Index().MarkStores()
					break
				}
				if looked {
					checkFrom, readOn = 2*n, true
				} else if shared++; shared >= 2 {
					readOn = true
				}
			}
			if readOn {
				// The second core encodes the later half meanwhile.
				st.Prefetch()
			}
		}
	}
	if st.Done() {
		// Finish encodes nothing more here; it records the encode and, in
		// auto mode, starts the sampled comparison.
		if ids, err := st.Finish(); err == nil {
			pl.tokens = promptTokens{ids: ids, count: len(ids), source: "local"}
		}
	} else {
		st.StopPrefetch()
		pl.tokens.count = st.EstimateCount()
	}
	return nil
}

// settled reports whether the blocks read so far already decide the
// request (see keyUntilDecided): the cheapest routable candidate is
// strictly cheapest, and it is the only routable one that may still hold
// the blocks to come. While two routable candidates hold every block so
// far (a system prompt all pods share) it answers at once; otherwise it
// looks the blocks up, fills the candidates' runs so far, and says so in
// looked.
func (r *Router) settled(pl *routePlan, reach *kvindex.Reach, count int) (done, looked bool) {
	var hbuf [8]target.ID
	holders := r.ev.Index().Holders(reach, hbuf[:0])
	routableHolders := 0
	for i := range pl.cands {
		c := &pl.cands[i]
		if c.Routable && !c.excluded && slices.Contains(holders, c.Target.ID) {
			routableHolders++
		}
	}
	if routableHolders > 1 {
		return false, false
	}
	var mbuf [16]kvindex.Match
	matchInto(pl.cands, r.ev.Index().Lookup(mbuf[:0], pl.chain.Keys))
	dec := r.ch.choose(pl.cands, count, pl.blockSize, true)
	if dec.idx < 0 {
		return false, true
	}
	best := &pl.cands[dec.idx]
	for i := range pl.cands {
		c := &pl.cands[i]
		if i == dec.idx || !c.Routable || c.excluded {
			continue
		}
		if c.Cost <= best.Cost+1e-9 || slices.Contains(holders, c.Target.ID) {
			return false, true
		}
	}
	return true, true
}

// finishPrompt encodes the rest of a prompt the plan stopped reading,
// after the request left: the exact token count for the outcome metrics,
// the segment cache warm for the conversation's next turn, auto mode's
// sampled comparison. It runs once; finished is written only here, and
// read by others after full is closed.
func (pl *routePlan) finishPrompt(ix *kvindex.Index) {
	defer close(pl.full)
	st := pl.tokens.stream
	for !st.Done() {
		if err := st.Step(); err != nil {
			slog.Debug("tokenization failed after dispatch", "model", pl.model, "err", err)
			return
		}
		// Requests in flight come first. A goroutine that only yields is
		// run again before the scheduler polls the network, so other
		// requests' bytes would wait for the whole tail; sleeping lets
		// the poller in. In a quiet process each sleep may last up to a
		// millisecond, which is why a settled plan's lookup is as of
		// its mark: by then the pod may have reported this very
		// request's blocks.
		time.Sleep(time.Microsecond)
	}
	ids, err := st.Finish()
	if err != nil {
		slog.Debug("tokenization failed after dispatch", "model", pl.model, "err", err)
		return
	}
	pl.finished = promptTokens{ids: ids, count: len(ids), source: "local"}
	if !pl.settled {
		return
	}
	// The plan's chain is read by the request; extend a copy.
	chain := pl.chain
	chain.Keys = slices.Clone(chain.Keys)
	if err := pl.keyer.Extend(&chain, ids, pl.extras); err != nil {
		return
	}
	pl.finalBlocks = make([]int, len(pl.cands))
	var mbuf [16]kvindex.Match
	for _, m := range ix.LookupAsOf(mbuf[:0], chain.Keys, pl.asOf) {
		if i := candidateOf(pl.cands, m.Target); i >= 0 {
			pl.finalBlocks[i] = m.Blocks
			if m.Lost {
				// The run may count this request's own blocks; the
				// run read before dispatch is certain.
				pl.finalBlocks[i] = pl.cands[i].ConfirmedBlocks
			}
		}
	}
}

// startFinishing starts finishPrompt, counted in tails, when the plan left
// part of the prompt unread, and returns at once.
func (pl *routePlan) startFinishing(ix *kvindex.Index, tails *sync.WaitGroup) {
	if pl.tokens.stream == nil || pl.full != nil {
		return
	}
	pl.full = make(chan struct{})
	tails.Add(1)
	go func() {
		defer tails.Done()
		pl.finishPrompt(ix)
		pl.flightMu.Lock()
		pl.reviseLocked()
		pl.flightMu.Unlock()
	}()
}

// track registers the flight of a settled plan's attempt, for the tail to
// correct, and corrects it now if the tail is already done.
func (pl *routePlan) track(f *health.Flight) {
	pl.flightMu.Lock()
	defer pl.flightMu.Unlock()
	pl.flight = f
	pl.reviseLocked()
}

// untrack ends the tail's hold on the attempt's flight: at its first byte,
// or when the attempt ends before one. The flight is the caller's alone
// afterwards.
func (pl *routePlan) untrack() {
	pl.flightMu.Lock()
	pl.flight = nil
	pl.flightMu.Unlock()
}

// reviseLocked corrects the tracked flight to the whole run, once known.
func (pl *routePlan) reviseLocked() {
	if pl.flight == nil {
		return
	}
	if count, cached, ok := pl.wholePrompt(pl.dec.idx); ok {
		pl.flight.Revise(count, count-cached)
	}
}

// promptForOutcome is the prompt as the outcome records it: the finished
// count when the plan stopped early.
func (pl *routePlan) promptForOutcome() promptTokens {
	if pl.full == nil {
		return pl.tokens
	}
	<-pl.full
	if pl.finished.ids == nil {
		return pl.tokens
	}
	return pl.finished
}

// whenFinished calls fn with the prompt as the outcome records it: now if
// nothing is left to encode, else from another goroutine once it is, so
// that a response never waits for the tail of its prompt.
func (pl *routePlan) whenFinished(fn func(promptTokens)) {
	if pl.full != nil && !pl.finishedNow() {
		go func() { fn(pl.promptForOutcome()) }()
		return
	}
	fn(pl.promptForOutcome())
}

// promptNow is the prompt as known at this moment, without waiting: the
// finished count if finishPrompt is done, else the plan's (an estimate when
// it stopped early).
func (pl *routePlan) promptNow() promptTokens {
	if pl.finishedNow() && pl.finished.ids != nil {
		return pl.finished
	}
	return pl.tokens
}

// finishedNow reports whether finishPrompt has run to its end.
func (pl *routePlan) finishedNow() bool {
	if pl.full == nil {
		return false
	}
	select {
	case <-pl.full:
		return true
	default:
		return false
	}
}

// promptBlocks is the number of full blocks of pt, or of the keys looked up
// when the router has no count of its own.
func (pl *routePlan) promptBlocks(pt promptTokens) int {
	if pl.blockSize == 0 || (pt.ids == nil && pt.stream == nil) {
		return len(pl.chain.Keys)
	}
	return pt.count / pl.blockSize
}

// predictedCached is the number of prompt tokens the router expects the
// chosen candidate to serve from cache: its trusted confirmed run.
func (pl *routePlan) predictedCached(c *Candidate) int {
	return pl.predictedFor(c, c.ConfirmedBlocks, pl.tokens.count)
}

// predictedFor is predictedCached for a confirmed run of blocks and a
// prompt of count tokens.
func (pl *routePlan) predictedFor(c *Candidate, blocks, count int) int {
	if c.Trust == 0 || pl.blockSize == 0 {
		return 0
	}
	n := blocks * pl.blockSize
	if c.Trusted {
		n += c.SpeculativeBlocks * pl.blockSize
	}
	// vLLM never serves the whole prompt from cache: the last token is
	// always computed, so hits stop at the last full block before it.
	if count > 0 {
		n = min(n, (count-1)/pl.blockSize*pl.blockSize)
	}
	return max(n, 0)
}

// wholePrompt is, for a plan that settled early, the prompt's exact count
// and candidate i's predicted cached tokens over its whole run, once
// finishPrompt has looked it up; ok is false until then, and for plans
// that read the whole prompt before dispatch.
func (pl *routePlan) wholePrompt(i int) (count, cached int, ok bool) {
	if !pl.finishedNow() || pl.finalBlocks == nil {
		return 0, 0, false
	}
	count = pl.finished.count
	return count, pl.predictedFor(&pl.cands[i], pl.finalBlocks[i], count), true
}

// confirmedNow is candidate i's confirmed run as known at this moment: of
// the whole prompt once finishPrompt has looked it up (the plan may have
// settled on fewer blocks), else of the blocks the plan read.
func (pl *routePlan) confirmedNow(i int) int {
	if pl.finishedNow() && pl.finalBlocks != nil {
		return pl.finalBlocks[i]
	}
	return pl.cands[i].ConfirmedBlocks
}

// rechoose excludes the failed candidate and chooses again.
func (r *Router) rechoose(pl *routePlan) bool {
	pl.cands[pl.dec.idx].excluded = true
	for i := range pl.cands {
		c := &pl.cands[i]
		if !c.excluded {
			c.Routable = c.Target.CanRoute()
			c.Load = loadOf(c.Target, eventplane.Verdict(c.Load.Events))
		}
	}
	pl.dec = r.ch.choose(pl.cands, pl.tokens.count, pl.blockSize, false)
	return pl.dec.idx >= 0
}

// hasAlternative reports whether another routable candidate remains after
// the current choice.
func (pl *routePlan) hasAlternative() bool {
	for i := range pl.cands {
		c := &pl.cands[i]
		if i != pl.dec.idx && !c.excluded && c.Target.CanRoute() {
			return true
		}
	}
	return false
}
