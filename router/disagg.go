package router

import (
	"encoding/json"
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fastjson"

	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/health"
)

// A model whose targets include prefill pods (role=prefill) is served in
// two stages, as vLLM's NixlConnector expects of the proxy in front of a
// disaggregated fleet: a prefill pod computes the prompt (the client's
// request with max_tokens 1, no stream, and kv_transfer_params asking for
// a remote decode) and answers where its KV blocks are; a decode pod gets
// the client's request with those kv_transfer_params, loads the blocks
// instead of computing them, and generates. The policy chooses the prefill
// pod: that is where the prompt's blocks are computed and cached, so the
// prefix cache, the KV events it publishes and the predicted placements
// all concern it. The decode pod is the least loaded one.

// stage is the part of a request that a decision, and every attempt on
// it, serves. A request of a model without prefill pods, or one a decode
// pod computes whole (decideSplit), is one stage; a split request is two,
// prefill then decode. Every difference the stages make is one of the
// questions below, asked where it matters.
type stage uint8

const (
	// stageWhole: one pod computes the prompt and answers the client.
	stageWhole stage = iota
	// stagePrefill: a prefill pod computes the prompt; the router reads
	// its answer for the kv_transfer_params.
	stagePrefill
	// stageDecode: a decode pod loads the prompt's blocks from the
	// prefill pod and answers the client.
	stageDecode
	// stageDecodeAlone: a decode pod computes the prompt itself and
	// answers the client: the prefill stage gave no kv_transfer_params.
	stageDecodeAlone
)

// usesTail reports whether the prompt tail looks up the decision's
// candidates: the policy chose them on the prompt's blocks. A decode
// stage's candidates, chosen on load, are not those.
func (s stage) usesTail() bool { return s == stageWhole || s == stagePrefill }

// carriesPrompt reports whether the decision carries the prompt's
// numbers: its first byte settles what the pod is expected to find in
// its cache and to announce, and the approximate policy records its
// choice. A decode stage's decision knows the prompt's length alone.
func (s stage) carriesPrompt() bool { return s == stageWhole || s == stagePrefill }

// routerTime reports whether the time from arrival to the dispatch is
// the router's own (the route time and the overhead metric): a decode
// stage starts after the prefill, which is the pods' time.
func (s stage) routerTime() bool { return s == stageWhole || s == stagePrefill }

// loadsPrompt reports whether the pod loads the prompt's blocks from the
// prefill pod instead of computing them: it is sent the client's body
// with the prefill pod's kv_transfer_params, and the prefill attempt's
// answer says what the prompt found in the cache.
func (s stage) loadsPrompt() bool { return s == stageDecode }

// booksUncached reports whether the target's load ledger counts the
// prompt's uncached tokens as work for the pod: a pod that loads the
// blocks computes none of them.
func (s stage) booksUncached() bool { return !s.loadsPrompt() }

// expectsEvents reports whether the pod is expected to announce the
// blocks it computes in KV events: a pod that loads them computes none.
func (s stage) expectsEvents() bool { return !s.loadsPrompt() }

// recordsOutcome reports whether the attempt's end records the request's
// outcome. A prefill stage's answer is the router's to read: the outcome
// is the decode stage's, or prefill's own when it ends the request there.
func (s stage) recordsOutcome() bool { return s != stagePrefill }

// decision is the brain's decision for one stage of a request: the
// stage it serves, and for a split request's prefill stage its decode
// stage's own decision.
type decision struct {
	*brain.Decision
	stage stage
	// decode is a split request's decode stage (stagePrefill): this
	// decision's target computes the prefill, decode's the rest. nil
	// when the chosen target serves the whole request.
	decode *decision
}

// as is d as the decision of stage s.
func (d *decision) as(s stage) *decision {
	c := *d
	c.stage = s
	return &c
}

// retry decides again after the chosen target failed before its first
// byte (brain.Decision.Retry), for the same stage, among the targets the
// first decision was offered.
func (d *decision) retry() (*decision, bool) {
	next, ok := d.Retry(d.Offered())
	if !ok {
		return nil, false
	}
	c := *d
	c.Decision = next
	return &c, true
}

// booking is how an attempt on the stage's decision books its target.
func (s stage) booking(requestID string, tail *brain.Tail, forwarded bool, p brain.Peers) brain.Dispatch {
	return brain.Dispatch{RequestID: requestID, Tail: tail, LoadsPrompt: s.loadsPrompt(), LengthOnly: !s.carriesPrompt(),
		Forwarded: forwarded, Peers: p}
}

// Outcomes of prefixrouter_disaggregation_total: how a request of a model
// with prefill pods was served.
const (
	pdSplit = "split" // prefill on a prefill pod, decode on a decode pod
	// The decode pod computed the whole request:
	pdShortPrompt      = "short_prompt"          // the prompt is below --pd-threshold
	pdNotSplittable    = "not_splittable"        // a batch prompt or an endpoint the connector does not carry
	pdNoPrefillTarget  = "no_prefill_target"     // no prefill pod could take it
	pdPrefillFailed    = "prefill_failed"        // every prefill pod tried failed before answering
	pdNoTransferParams = "no_kv_transfer_params" // the prefill pod answered without them: no connector
)

// upstreamNoTransferParams is the upstream error of a prefill pod that
// answered without kv_transfer_params: it runs without a KV connector
// (--kv-transfer-config), a wiring fault the operator must see.
const upstreamNoTransferParams = "no_kv_transfer_params"

func newDisaggMetric() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "prefixrouter_disaggregation_total",
		Help: "Requests of models with prefill pods, by how they were served: split (prefill pod, then decode pod) or why the decode pod computed the whole request.",
	}, []string{"model", "outcome"})
}

// splitRoles separates a model's prefill pods from the pods that serve
// clients (decode and both).
func splitRoles(ts []*health.Target) (prefill, serving []*health.Target) {
	for _, t := range ts {
		if t.Spec.Role == health.RolePrefill {
			prefill = append(prefill, t)
		} else {
			serving = append(serving, t)
		}
	}
	return prefill, serving
}

// decideSplit decides a request of a model with prefill pods: the policy
// picks the prefill pod, least load the decode pod (the returned
// decision's decode). The decode pod computes the whole request instead
// (a decision without decode, on the serving pods) for a batch prompt or
// an endpoint the connector does not carry, a prompt below --pd-threshold,
// or when no prefill pod can take it; each is counted.
func (r *Router) decideSplit(in brain.Input, req *Request, prefill, serving []*health.Target) (*decision, error) {
	whole := func(outcome string) (*decision, error) {
		if !in.Peek {
			r.met.disagg.WithLabelValues(in.Model, outcome).Inc()
		}
		in.Targets = serving
		d, err := r.dec.Decide(in)
		if err != nil {
			return nil, err
		}
		return &decision{Decision: d}, nil
	}
	switch {
	case req.BatchSize > 1 || (req.Endpoint != EndpointCompletions && req.Endpoint != EndpointChat):
		return whole(pdNotSplittable)
	case r.cfg.PDThreshold > 0 && in.Prompt.Estimate() < r.cfg.PDThreshold:
		return whole(pdShortPrompt)
	}
	pin := in
	pin.Targets = prefill
	pd, err := r.dec.Decide(pin)
	if errors.Is(err, brain.ErrNoRoutable) {
		if !in.Peek {
			r.log.Warn("no prefill target can take the request; the decode target computes it", "model", in.Model, "prefill_targets", len(prefill))
		}
		return whole(pdNoPrefillTarget)
	}
	if err != nil {
		return nil, err
	}
	dd, err := r.fwd.Decide(brain.Input{Model: in.Model, Targets: serving, Peek: in.Peek,
		Prompt: brain.Prompt{Count: pd.Prompt().Count, Source: "estimate"}})
	if err != nil {
		return nil, err
	}
	return &decision{Decision: pd, stage: stagePrefill, decode: &decision{Decision: dd, stage: stageDecode}}, nil
}

// prefill runs the prefill stage of split decision d, retrying on other
// prefill pods while nothing reached the client, and returns the decode
// stage's decision: stageDecode, with the exchange's body for it (the
// client's request with the prefill pod's kv_transfer_params) and the
// attempt that computed the prompt, or stageDecodeAlone when no prefill
// pod answered with them (the decode pod then computes the prompt from
// the client's request as it came). It returns nil when the request
// ended in the prefill stage (the client left, a timeout, the pod refused
// the request itself); the client has its answer then.
func (r *Router) prefill(x *exchange, d *decision) *decision {
	alone := func(outcome string) *decision {
		r.met.disagg.WithLabelValues(x.model, outcome).Inc()
		return d.decode.as(stageDecodeAlone)
	}
	body, err := prefillBody(x.in.PostBody())
	if err != nil {
		// ParseRequest read the same body: it is a JSON object.
		r.log.Error("cannot build the prefill request", "request_id", x.id, "err", err)
		return alone(pdPrefillFailed)
	}
	for n := 0; ; n++ {
		a := r.newAttempt(x, d, n)
		params, res := a.runPrefill(body)
		switch {
		case params != nil:
			send, err := withTransferParams(x.in.PostBody(), params)
			if err != nil {
				r.log.Error("cannot build the decode request", "request_id", x.id, "err", err)
				return alone(pdPrefillFailed)
			}
			x.prefilled, x.sendBody = a, send
			r.met.disagg.WithLabelValues(x.model, pdSplit).Inc()
			return d.decode
		case res == attemptDone && a.label != "ok":
			r.recordOutcome(a)
			return nil
		case res == attemptDone:
			// Answered without kv_transfer_params (upstreamNoTransferParams):
			// another pod is likely wired the same way.
			return alone(pdNoTransferParams)
		}
		failed := a.name
		// A retry's decision is a copy of d: a prefill stage, with d's
		// decode stage.
		next, ok := d.retry()
		if n >= r.cfg.MaxRetries || !ok {
			r.log.Warn("no prefill target could answer; the decode target computes the request", "request_id", x.id, "last", failed, "attempts", n+1)
			return alone(pdPrefillFailed)
		}
		d = next
		r.met.retries.WithLabelValues(failed).Inc()
		r.log.Info("retrying the prefill on another target", "request_id", x.id, "failed", failed, "next", d.Target().Target.ID.String())
	}
}

// runPrefill sends the prefill request and reads the pod's whole answer.
// It returns the answer's kv_transfer_params (raw JSON) when the pod
// computed the prompt; otherwise attemptRetryable as run does, or
// attemptDone with the client answered (a 4xx the pod gave the request
// itself, a timeout, the client gone), or attemptDone labelled ok for a
// pod that answered without kv_transfer_params.
func (a *attempt) runPrefill(body []byte) ([]byte, attemptResult) {
	defer a.end()
	r, x := a.r, a.x
	a.call.arm(r.cfg.FirstByteTimeout, &errFirstByteTimeout)
	x.life.watchClient()
	rq := upstreamRequest(a.d.Target().Target, x.path, body, x.in, x.id)
	rq.identity = true
	resp, err := r.up.do(a.call.ctx, rq)
	if err != nil {
		return nil, a.failedBeforeByte(err)
	}
	a.resp = resp
	out, err := readAllLimit(resp.Body, nil, r.cfg.MaxResponseBytes)
	if err != nil {
		return nil, a.failedBeforeByte(err)
	}
	if resp.StatusCode >= 500 {
		// Whether another prefill pod is tried is prefill's to decide.
		a.withdraw()
		a.label = "upstream_error"
		a.upstreamFailed(upstreamStatus5xx, "HTTP "+itoa(resp.StatusCode)+" to the prefill request: "+string(out[:min(len(out), 256)]))
		return nil, attemptRetryable
	}
	a.label = statusLabel(resp.StatusCode)
	if resp.StatusCode >= 400 {
		// The pod refused the request itself: the decode pod would too.
		// The client gets its answer (answer withdraws the predictions).
		a.answer()
		x.in.SetBody(out)
		return nil, attemptDone
	}
	a.firstByte()
	a.status = resp.StatusCode
	var params []byte
	a.usage, params = prefillAnswer(out)
	if params == nil {
		a.upstreamFailed(upstreamNoTransferParams, "the prefill pod answered without kv_transfer_params: is it started with --kv-transfer-config?")
		r.log.Warn("prefill target answered without kv_transfer_params; the decode target computes the request", "request_id", x.id, "target", a.name)
		return nil, attemptDone
	}
	return params, attemptDone
}

// prefillBody is the client's body as the prefill pod is sent it: one
// token, no stream, and kv_transfer_params asking for a remote decode
// (the members vLLM's NixlConnector reads). min_tokens would make the pod
// generate more than one token.
func prefillBody(client []byte) ([]byte, error) {
	return editBody(client, func(o *fastjson.Object) {
		var a fastjson.Arena
		hasMaxCompletion := o.Get("max_completion_tokens") != nil
		setMember(o, "stream", a.NewFalse())
		setMember(o, "max_tokens", a.NewNumberInt(1))
		if hasMaxCompletion {
			setMember(o, "max_completion_tokens", a.NewNumberInt(1))
		}
		delMember(o, "stream_options")
		delMember(o, "min_tokens")
		delMember(o, "min_completion_tokens")
		setMember(o, "kv_transfer_params", remoteDecodeParams)
	})
}

// delMember removes every member named key: fastjson's Del and Set touch the
// first of duplicates, and the pod's parser keeps the last.
func delMember(o *fastjson.Object, key string) {
	for o.Get(key) != nil {
		o.Del(key)
	}
}

// setMember makes v the only member named key.
func setMember(o *fastjson.Object, key string, v *fastjson.Value) {
	delMember(o, key)
	o.Set(key, v)
}

// editBody is the client's JSON object body changed by edit.
func editBody(client []byte, edit func(*fastjson.Object)) ([]byte, error) {
	p := parserPool.Get()
	defer parserPool.Put(p)
	v, err := p.ParseBytes(client)
	if err != nil {
		return nil, err
	}
	o, err := v.Object()
	if err != nil {
		return nil, err
	}
	edit(o)
	return v.MarshalTo(nil), nil
}

// remoteDecodeParams asks the prefill pod to keep the blocks for a remote
// decode.
var remoteDecodeParams = fastjson.MustParse(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// prefillAnswer reads a prefill pod's answer once: its usage, and its
// kv_transfer_params object raw, or nil when it has none, or none that is
// valid JSON (fastjson takes numbers such as .5 that a decode pod's parser
// would refuse).
func prefillAnswer(answer []byte) (u usage, params []byte) {
	p := parserPool.Get()
	defer parserPool.Put(p)
	v, err := p.ParseBytes(answer)
	if err != nil {
		return usage{}, nil
	}
	u = usageOf(v)
	kv := v.Get("kv_transfer_params")
	if kv == nil || kv.Type() != fastjson.TypeObject {
		return u, nil
	}
	if params = kv.MarshalTo(nil); !json.Valid(params) {
		return u, nil
	}
	return u, params
}

// withTransferParams is the client's body with the prefill pod's
// kv_transfer_params, as the decode pod is sent it.
func withTransferParams(client, params []byte) ([]byte, error) {
	var pp fastjson.Parser
	kv, err := pp.ParseBytes(params)
	if err != nil {
		return nil, err
	}
	return editBody(client, func(o *fastjson.Object) { setMember(o, "kv_transfer_params", kv) })
}
