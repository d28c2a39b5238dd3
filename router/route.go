package router

import (
	"context"
	"encoding/binary"
	"errors"

	"github.com/prefixrouter/prefixrouter/brain"
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
		r.met.requests.WithLabelValues(req.Model, x.dec.PolicyName(), "canceled").Inc()
		x.in.SetConnectionClose()
		r.logAnswered(x, "canceled")
		return
	}
	x.tail = brain.StartTail(d.Decision, r.ev.Index(), &r.tails)
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
	bd, err := r.fwd.Decide(brain.Input{Model: req.Model, Targets: targets,
		Prompt: brain.Prompt{Count: estimateTokens(req), Source: "estimate"}})
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
	r.dispatch(x, &decision{Decision: bd})
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
	pt, aerr := r.tok.prompt(ctx, req, r.cat, r.cfg.Policy.ReadsPrompt(), func() string {
		// Remote tokenization asks a routable pod of the model.
		if t, e := r.pickAny(snap, req.Model); e == nil {
			return t.ID.Endpoint
		}
		return ""
	}, beforeWait)
	if aerr != nil {
		return nil, aerr
	}
	in := brain.Input{Model: req.Model, Targets: targets, Prompt: pt, Peek: peek,
		Extras:       kvindex.RequestExtras{CacheSalt: req.CacheSalt},
		Conversation: speculative.Conversation{SessionID: req.SessionID, User: req.User, RequestID: requestID}}
	if r.cat.isAdapter(req.Model) {
		in.Extras.LoRAName = req.Model
	}
	if r.dec.UsesApprox() {
		in.ApproxText = approxText(req)
	}
	var d *decision
	var err error
	if prefill, serving := splitRoles(targets); len(prefill) > 0 {
		d, err = r.decideSplit(in, req, prefill, serving)
	} else {
		var bd *brain.Decision
		if bd, err = r.dec.Decide(in); err == nil {
			d = &decision{Decision: bd}
		}
	}
	var kerr *brain.KeyError
	switch {
	case errors.As(err, &kerr):
		return nil, errBadRequest("prompt", kerr.Error())
	case err != nil:
		return nil, errNoTarget("no routable target for model "+req.Model, r.retryAfter())
	}
	return d, nil
}

// approxText is the text the approximate policy hashes: the prompt, the
// chat messages as sent, or the token ids' bytes.
func approxText(r *Request) []byte {
	switch {
	case r.Endpoint.rendersChat():
		return r.Chat.Messages
	case r.HasIDs:
		b := make([]byte, 4*len(r.PromptIDs))
		for i, id := range r.PromptIDs {
			binary.LittleEndian.PutUint32(b[4*i:], id)
		}
		return b
	}
	return []byte(r.PromptText)
}
