package router

import (
	"context"

	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/kvindex"
)

// routePlan is everything decided about a request before it is proxied:
// its prompt as the pod will see it, its block keys, the candidates with
// their confirmed runs and costs, and the choice.
type routePlan struct {
	model        string
	tokens       promptTokens
	keys         []kvindex.Key
	blockSize    int
	cands        []Candidate
	dec          decision
	approxChunks []uint64
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
	if ks != nil && pt.ids != nil {
		pl.blockSize = ks.blockSize
		extras := kvindex.RequestExtras{CacheSalt: req.CacheSalt}
		if r.cat.isAdapter(req.Model) {
			extras.LoRAName = req.Model
		}
		keys, kerr := ks.keyer.Keys(nil, pt.ids, extras)
		if kerr != nil {
			return nil, errBadRequest("prompt", "cannot compute block keys: "+kerr.Error())
		}
		pl.keys = keys
		if len(keys) > 0 && r.cfg.Policy == PolicyPrecise {
			var mbuf [16]kvindex.Match
			matchInto(pl.cands, r.pl.index.Lookup(mbuf[:0], keys))
		}
	} else if ks != nil {
		pl.blockSize = ks.blockSize
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
