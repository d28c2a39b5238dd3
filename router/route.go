package router

import (
	"context"
	"errors"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/speculative"
)

// handleRouted serves the endpoints the router's policy routes from their
// prompt (completions, chat, responses): parse, tokenize, decide,
// dispatch.
func (r *Router) handleRouted(x *exchange) {
	req := acquireRequest()
	defer releaseRequest(req)
	if err := ParseRequest(x.ep, x.in.PostBody(), req); err != nil {
		r.reject(x, err)
		return
	}
	life := r.beginLife(x.in)
	defer life.release()
	x.life, x.dec, x.stream = life, r.dec, req.Stream
	req.SessionID = string(x.in.Request.Header.Peek("X-Session-Id"))
	d, aerr := r.route(life.ctx, life.watchClient, req, x.id, false)
	x.model = req.Model
	switch {
	case aerr != nil:
		r.refuse(x, aerr, rejectReason(aerr))
		return
	case life.clientGone():
		// The client left while its prompt was being tokenized.
		r.met.requests.WithLabelValues(req.Model, x.dec.policyName, "canceled").Inc()
		x.in.SetConnectionClose()
		r.logAnswered(x, "canceled")
		return
	}
	x.tail = startTail(d, r.ev.Index(), &r.tails)
	r.dispatch(x, d)
}

// handleForwarded serves the endpoints forwarded to the least loaded
// routable pod of the body's model (embeddings, pooling, classify, score,
// rerank, tokenize, detokenize) or of any model (version), through the
// same attempts as the routed ones: retried before the first byte,
// streamed or buffered as the pod answers.
func (r *Router) handleForwarded(x *exchange) {
	req := acquireRequest()
	defer releaseRequest(req)
	if x.ep.method() == "POST" {
		if err := ParseRequest(x.ep, x.in.PostBody(), req); err != nil {
			r.reject(x, err)
			return
		}
	}
	snap := r.mon.Snapshot()
	if req.Model == "" && x.ep != EndpointVersion {
		model, aerr := r.defaultModel(snap)
		if aerr != nil {
			r.refuse(x, aerr, rejectReason(aerr))
			return
		}
		req.Model = model
	}
	x.model, x.dec = req.Model, r.fwd
	targets, aerr := r.targetsFor(snap, req.Model)
	if aerr != nil {
		r.refuse(x, aerr, rejectReason(aerr))
		return
	}
	// A prefill pod of a disaggregated fleet takes prefills from the
	// router, never a client's whole request.
	_, targets = splitRoles(targets)
	d, err := r.fwd.decide(decisionInput{model: req.Model, targets: targets,
		prompt: promptTokens{count: estimateTokens(req), source: "estimate"}})
	if err != nil {
		msg := "no routable target for model " + req.Model
		if req.Model == "" {
			msg = "no routable target"
		}
		aerr := errNoTarget(msg, r.retryAfter())
		r.refuse(x, aerr, rejectReason(aerr))
		return
	}
	x.life = r.beginLife(x.in)
	defer x.life.release()
	r.dispatch(x, d)
}

// route resolves the model's targets, tokenizes the prompt and decides.
// With peek (the dry run) nothing is recorded: round-robin does not
// advance. ctx bounds a remote tokenization, and beforeWait (may be nil)
// runs before one. A request that names no
// model (responses may leave it out) takes the fleet's only one.
func (r *Router) route(ctx context.Context, beforeWait func(), req *Request, requestID string, peek bool) (*decision, *apiError) {
	snap := r.mon.Snapshot()
	if req.Model == "" {
		model, aerr := r.defaultModel(snap)
		if aerr != nil {
			return nil, aerr
		}
		req.Model = model
	}
	targets, aerr := r.targetsFor(snap, req.Model)
	if aerr != nil {
		return nil, aerr
	}
	pt, aerr := r.tok.prompt(ctx, req, r.cat, r.cfg.Policy.readsPrompt(), func() string {
		// Remote tokenization asks a routable pod of the model.
		if t, e := r.pickAny(snap, req.Model); e == nil {
			return t.ID.Endpoint
		}
		return ""
	}, beforeWait)
	if aerr != nil {
		return nil, aerr
	}
	in := decisionInput{model: req.Model, targets: targets, prompt: pt, peek: peek,
		extras:       kvindex.RequestExtras{CacheSalt: req.CacheSalt},
		conversation: speculative.Conversation{SessionID: req.SessionID, User: req.User, RequestID: requestID}}
	if r.cat.isAdapter(req.Model) {
		in.extras.LoRAName = req.Model
	}
	if r.ch.approx != nil {
		in.approxText = approxText(req)
	}
	var d *decision
	var err error
	if prefill, serving := splitRoles(targets); len(prefill) > 0 {
		d, err = r.decideSplit(in, req, prefill, serving)
	} else {
		d, err = r.dec.decide(in)
	}
	var kerr *keyError
	switch {
	case errors.As(err, &kerr):
		return nil, errBadRequest("prompt", kerr.Error())
	case err != nil:
		return nil, errNoTarget("no routable target for model "+req.Model, r.retryAfter())
	}
	return d, nil
}
