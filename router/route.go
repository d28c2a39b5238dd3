package router

import (
	"context"
	"errors"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/prefixrouter/prefixrouter/kvindex"
)

// handleRouted serves /v1/completions and /v1/chat/completions: parse,
// tokenize, decide, dispatch.
func (r *Router) handleRouted(in *fasthttp.RequestCtx, ep Endpoint) {
	start := time.Now()
	id := requestID(in)
	in.Response.Header.Set("X-Request-Id", id)
	req := acquireRequest()
	defer releaseRequest(req)
	if err := ParseRequest(ep, in.PostBody(), req); err != nil {
		r.reject(in, err)
		return
	}
	life := r.beginLife(in)
	defer life.release()
	d, aerr := r.route(life.ctx, req, false)
	switch {
	case aerr != nil:
		r.met.rejected.WithLabelValues(rejectReason(aerr)).Inc()
		aerr.write(in)
		return
	case life.clientGone():
		// The client left while its prompt was being tokenized.
		r.met.requests.WithLabelValues(req.Model, r.cfg.Policy.String(), "canceled").Inc()
		in.SetConnectionClose()
		return
	}
	x := &exchange{in: in, life: life, model: req.Model, path: ep.Path(), stream: req.Stream, id: id, start: start,
		tail: startTail(d, r.ev.Index(), &r.tails)}
	r.dispatch(x, d)
}

// route resolves the model's targets, tokenizes the prompt and decides.
// With peek (the dry run) nothing is recorded: round-robin does not
// advance. ctx bounds a remote tokenization.
func (r *Router) route(ctx context.Context, req *Request, peek bool) (*decision, *apiError) {
	snap := r.mon.Snapshot()
	targets := snap.ForModel(req.Model)
	if len(targets) == 0 {
		if len(snap.Models) == 0 && len(snap.Targets) > 0 {
			return nil, errNoTarget("no target has reported its models yet", r.retryAfter())
		}
		return nil, errUnknownModel(req.Model)
	}
	tctx, cancel := context.WithTimeout(ctx, r.cfg.TokenizeTimeout)
	defer cancel()
	pt, aerr := r.tok.prompt(tctx, req, r.cat, r.cfg.Policy == PolicyPrecise, func() string {
		// Remote tokenization asks a routable pod of the model.
		if t, e := r.pickAny(snap, req.Model); e == nil {
			return t.ID.Endpoint
		}
		return ""
	})
	if aerr != nil {
		return nil, aerr
	}
	in := decisionInput{model: req.Model, targets: targets, prompt: pt, peek: peek,
		extras: kvindex.RequestExtras{CacheSalt: req.CacheSalt}}
	if r.cat.isAdapter(req.Model) {
		in.extras.LoRAName = req.Model
	}
	if r.ch.approx != nil {
		in.approxText = approxText(req)
	}
	d, err := r.dec.decide(in)
	var kerr *keyError
	switch {
	case errors.As(err, &kerr):
		return nil, errBadRequest("prompt", kerr.Error())
	case err != nil:
		return nil, errNoTarget("no routable target for model "+req.Model, r.retryAfter())
	}
	return d, nil
}
