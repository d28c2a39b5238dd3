package router

import (
	"context"
	"log/slog"

	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/kvindex"
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
	// full is closed once finishPrompt has encoded the rest of the prompt
	// into finished; nil when there was nothing left to encode.
	full     chan struct{}
	finished promptTokens
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
		c := Candidate{Target: t, Routable: t.CanRoute(), Trusted: t.Events.Trusted(),
			Trust: confirmedTrust(t.Events.Verdict), Load: loadOf(t)}
		if c.Routable {
			routable++
		}
		pl.cands = append(pl.cands, c)
	}
	if routable == 0 {
		return nil, errNoTarget("no routable target for model "+req.Model, r.retryAfter())
	}

	ks := r.pl.keyer.Load()
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
		pl.blockSize = ks.blockSize
	}
	precise := r.cfg.Policy == PolicyPrecise
	if ks != nil && (pt.ids != nil || (pt.stream != nil && precise)) {
		extras := kvindex.RequestExtras{CacheSalt: req.CacheSalt}
		if r.cat.isAdapter(req.Model) {
			extras.LoRAName = req.Model
		}
		var kerr error
		if pt.stream != nil {
			kerr = r.keyUntilMiss(pl, ks.keyer, extras)
		} else {
			kerr = ks.keyer.Extend(&pl.chain, pt.ids, extras)
		}
		if kerr != nil {
			return nil, errBadRequest("prompt", "cannot compute block keys: "+kerr.Error())
		}
		if keys := pl.chain.Keys; len(keys) > 0 && precise {
			var mbuf [16]kvindex.Match
			matchInto(pl.cands, r.pl.index.Lookup(mbuf[:0], keys))
		}
	}
	if r.ch.approx != nil {
		pl.approxChunks = approxChunks(nil, approxText(req))
		r.ch.approx.match(pl.cands, pl.approxChunks)
	}
	pl.dec = r.ch.choose(pl.cands, pt.count, pl.blockSize, dryRun)
	if pl.dec.idx < 0 {
		return nil, errNoTarget("no routable target for model "+req.Model, r.retryAfter())
	}
	return pl, nil
}

// keyUntilMiss encodes the prompt a segment at a time and keys each new
// block, stopping at the first block no target holds: runs start at block
// 0, so no later block can lengthen any target's run, and the decision is
// the one the whole prompt would give. For a prompt no pod has seen, this is
// the difference between encoding a few dozen tokens and encoding all of
// them before the request leaves. The rest is encoded after dispatch.
func (r *Router) keyUntilMiss(pl *routePlan, keyer kvindex.Keyer, extras kvindex.RequestExtras) error {
	st := pl.tokens.stream
	var reach kvindex.Reach
	for !st.Done() {
		if err := st.Step(); err != nil {
			// The pod will judge the prompt; route on what is known.
			slog.Debug("tokenization failed; routing on the blocks so far", "model", pl.model, "err", err)
			pl.tokens.stream = nil
			break
		}
		before := len(pl.chain.Keys)
		if err := keyer.Extend(&pl.chain, st.IDs(), extras); err != nil {
			return err
		}
		if len(pl.chain.Keys) > before {
			if !r.pl.index.Extend(&reach, pl.chain.Keys[before:]) {
				break
			}
			// A pod holds the prompt's start: it will likely be read to
			// the end, so the second core encodes the later half meanwhile.
			st.Prefetch()
		}
	}
	if st.Done() {
		// Finish encodes nothing more here; it records the encode and, in
		// auto mode, starts the sampled comparison.
		if ids, err := st.Finish(); err == nil {
			pl.tokens = promptTokens{ids: ids, count: len(ids), source: "local"}
		}
	} else {
		pl.tokens.count = st.EstimateCount()
	}
	return nil
}

// finishPrompt encodes the rest of a prompt the plan stopped reading,
// after the request left: the exact token count for the outcome metrics,
// the segment cache warm for the conversation's next turn, auto mode's
// sampled comparison. It runs once; finished is written only here, and
// read by others after full is closed.
func (pl *routePlan) finishPrompt() {
	defer close(pl.full)
	st := pl.tokens.stream
	ids, err := st.Finish()
	if err != nil {
		slog.Debug("tokenization failed after dispatch", "model", pl.model, "err", err)
		return
	}
	pl.finished = promptTokens{ids: ids, count: len(ids), source: "local"}
}

// startFinishing starts finishPrompt when the plan left part of the prompt
// unread, and returns at once.
func (pl *routePlan) startFinishing() {
	if pl.tokens.stream == nil || pl.full != nil {
		return
	}
	pl.full = make(chan struct{})
	go pl.finishPrompt()
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

// promptNow is the prompt as known at this moment, without waiting: the
// finished count if finishPrompt is done, else the plan's (an estimate when
// it stopped early).
func (pl *routePlan) promptNow() promptTokens {
	if pl.full != nil {
		select {
		case <-pl.full:
			if pl.finished.ids != nil {
				return pl.finished
			}
		default:
		}
	}
	return pl.tokens
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
	if c.Trust == 0 || pl.blockSize == 0 {
		return 0
	}
	n := c.ConfirmedBlocks * pl.blockSize
	if c.Trusted {
		n += c.SpeculativeBlocks * pl.blockSize
	}
	// vLLM never serves the whole prompt from cache: the last token is
	// always computed, so hits stop at the last full block before it.
	if pl.tokens.count > 0 {
		n = min(n, (pl.tokens.count-1)/pl.blockSize*pl.blockSize)
	}
	return max(n, 0)
}

// rechoose excludes the failed candidate and chooses again.
func (r *Router) rechoose(pl *routePlan) bool {
	pl.cands[pl.dec.idx].excluded = true
	for i := range pl.cands {
		c := &pl.cands[i]
		if !c.excluded {
			c.Routable = c.Target.CanRoute()
			c.Load = loadOf(c.Target)
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
