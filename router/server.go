package router

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/prefixrouter/prefixrouter/health"
)

// handle is the API server's only handler.
func (r *Router) handle(ctx *fasthttp.RequestCtx) {
	path := ctx.Path()
	switch string(path) {
	case "/health":
		// Process liveness: answering at all is the signal.
		ctx.SetStatusCode(fasthttp.StatusOK)
		return
	case "/ready":
		if snap := r.mon.Snapshot(); snap.Routable() {
			ctx.SetStatusCode(fasthttp.StatusOK)
			ctx.SetBodyString(r.readyBody(snap))
		} else {
			errNoTarget("no routable target", r.retryAfter()).write(ctx)
		}
		return
	}
	ap, known := apiPaths[string(path)]
	x := newExchange(ctx, ap.path)
	if !r.authorize(x, path) {
		return
	}
	switch {
	case known:
		x.ep = ap.ep
		if r.requireMethod(x, ap.ep.method()) {
			body := r.readBody(x)
			if body == nil {
				return
			}
			defer body.release()
			if ap.ep.routed() {
				r.handleRouted(x)
			} else {
				r.handleForwarded(x)
			}
		}
	case string(path) == "/v1/models":
		x.path = "/v1/models"
		if r.requireMethod(x, fasthttp.MethodGet) {
			r.handleModels(x)
		}
	case bytes.HasPrefix(path, modelPrefix):
		x.path = string(path)
		if r.requireMethod(x, fasthttp.MethodGet) {
			r.handleModel(x, string(path[len(modelPrefix):]))
		}
	default:
		x.path = string(path)
		r.refuse(x, &apiError{Status: fasthttp.StatusNotFound, Message: "no route for " + x.path, Type: typeNotFound, Code: "not_found"}, "not_found")
	}
}

// modelPrefix starts GET /v1/models/{id} (the OpenAI SDK's models.retrieve);
// the id may hold slashes, as Hugging Face names do.
var modelPrefix = []byte("/v1/models/")

// newExchange starts an API request's exchange: its arrival, and the
// request id the client sent or a new one, which every answer carries.
func newExchange(in *fasthttp.RequestCtx, path string) *exchange {
	x := &exchange{in: in, path: path, start: time.Now(), id: requestID(in)}
	in.Response.Header.Set("X-Request-Id", x.id)
	return x
}

func (r *Router) requireMethod(x *exchange, method string) bool {
	if string(x.in.Method()) == method {
		return true
	}
	x.in.Response.Header.Set("Allow", method)
	r.refuse(x, &apiError{Status: fasthttp.StatusMethodNotAllowed, Message: "method not allowed; use " + method, Type: typeInvalidRequest}, "method_not_allowed")
	return false
}

// handleServerError answers requests fasthttp could not read, most of all
// bodies above --max-body-bytes, in the OpenAI error shape.
func (r *Router) handleServerError(ctx *fasthttp.RequestCtx, err error) {
	x := newExchange(ctx, string(ctx.Path()))
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		r.refuse(x, errTooLarge(r.cfg.MaxBodyBytes), rejectTooLarge)
	case errors.Is(err, fasthttp.ErrTimeout) || isTimeout(err):
		// A request line and headers (with the body's first bytes, up to
		// 8 KiB, which fasthttp reads with them) that did not arrive within
		// --header-read-timeout: the connection closes after this answer.
		r.refuse(x, &apiError{Status: fasthttp.StatusRequestTimeout, Message: "the request did not arrive within " + r.cfg.HeaderTimeout.String(), Type: typeInvalidRequest, Code: "request_timeout"}, rejectHeaderTimeout)
	default:
		var small *fasthttp.ErrSmallBuffer
		if errors.As(err, &small) {
			r.refuse(x, &apiError{Status: fasthttp.StatusRequestHeaderFieldsTooLarge, Message: "request headers too large", Type: typeInvalidRequest}, "read_error")
			return
		}
		// fasthttp's message quotes the bytes it read; the client has them.
		r.log.Debug("cannot read request", "request_id", x.id, "err", err)
		r.refuse(x, errBadRequest("", "cannot read the request: malformed HTTP"), "read_error")
	}
}

func (r *Router) retryAfter() int {
	s := int(r.cfg.RetryAfter.Round(time.Second) / time.Second)
	return max(s, 1)
}

// requestID propagates the client's X-Request-Id or makes one.
func requestID(ctx *fasthttp.RequestCtx) string {
	if v := ctx.Request.Header.Peek("X-Request-Id"); len(v) > 0 && len(v) <= 128 {
		return string(v)
	}
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// reject answers a body the parser refused.
func (r *Router) reject(x *exchange, err error) {
	var br *BadRequest
	if errors.As(err, &br) {
		r.refuse(x, errBadRequest(br.Param, br.Message), "bad_request")
		return
	}
	r.log.Error("request parsing failed", "request_id", x.id, "err", err)
	r.refuse(x, &apiError{Status: fasthttp.StatusInternalServerError, Message: "internal error", Type: typeServer}, "other")
}

// refuse answers a request the router will not send to a pod, counted by
// reason in prefixrouter_requests_rejected_total.
func (r *Router) refuse(x *exchange, e *apiError, reason string) {
	r.met.rejected.WithLabelValues(reason).Inc()
	e.write(x.in)
	r.logAnswered(x, reason)
}

func rejectReason(e *apiError) string {
	switch e.Status {
	case fasthttp.StatusNotFound:
		return "unknown_model"
	case fasthttp.StatusServiceUnavailable:
		return "no_target"
	case fasthttp.StatusBadRequest:
		return "bad_request"
	}
	return "other"
}

// targetsFor is the snapshot's targets of model, or every target when
// model is empty, or why the router answers itself.
func (r *Router) targetsFor(snap *health.Snapshot, model string) ([]*health.Target, *apiError) {
	if model == "" {
		return snap.Targets, nil
	}
	ts := snap.ForModel(model)
	if len(ts) == 0 {
		if len(snap.Models) == 0 && len(snap.Targets) > 0 {
			return nil, errNoTarget("no target has reported its models yet", r.retryAfter())
		}
		return nil, errUnknownModel(model)
	}
	return ts, nil
}

// defaultModel is the model of a body that names none, as vLLM takes it:
// the only one the fleet serves.
func (r *Router) defaultModel(snap *health.Snapshot) (string, *apiError) {
	switch names := snap.ModelNames(); {
	case len(names) == 1:
		return names[0], nil
	case len(names) > 1:
		return "", errBadRequest("model", "you must provide a model parameter: this router serves several models")
	}
	return "", errNoTarget("no target has reported its models yet", r.retryAfter())
}

// pickAny returns a routable target serving model, rotating so that calls
// spread.
func (r *Router) pickAny(snap *health.Snapshot, model string) (*health.Target, *apiError) {
	ts, aerr := r.targetsFor(snap, model)
	if aerr != nil {
		return nil, aerr
	}
	n := int(r.dec.Turn())
	for i := range ts {
		t := ts[(n+i)%len(ts)]
		if t.CanRoute() {
			return t, nil
		}
	}
	return nil, errNoTarget("no routable target for this model", r.retryAfter())
}

// handleModels answers the union of the targets' /v1/models.
func (r *Router) handleModels(x *exchange) {
	life := r.beginLife(x.in)
	defer life.release()
	life.watchClient()
	cctx, cancel := context.WithTimeout(life.ctx, 3*time.Second)
	defer cancel()
	x.in.SetContentType("application/json")
	x.in.SetBody(r.cat.union(cctx))
	r.logAnswered(x, "ok")
}

// handleModel answers GET /v1/models/{id}: the entry of that id in the
// union of the targets' lists, or an OpenAI-shaped 404.
func (r *Router) handleModel(x *exchange, id string) {
	x.model = id
	life := r.beginLife(x.in)
	defer life.release()
	life.watchClient()
	cctx, cancel := context.WithTimeout(life.ctx, 3*time.Second)
	defer cancel()
	entry, ok := r.cat.entry(cctx, id)
	if !ok {
		r.refuse(x, errUnknownModel(id), "unknown_model")
		return
	}
	x.in.SetContentType("application/json")
	x.in.SetBody(entry)
	r.logAnswered(x, "ok")
}

func itoa(n int) string { return strconv.Itoa(n) }
