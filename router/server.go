package router

import (
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
	path := string(ctx.Path())
	switch path {
	case "/v1/completions":
		if r.requirePost(ctx) {
			r.handleRouted(ctx, EndpointCompletions)
		}
	case "/v1/chat/completions":
		if r.requirePost(ctx) {
			r.handleRouted(ctx, EndpointChat)
		}
	case "/v1/models":
		if ctx.IsGet() {
			r.handleModels(ctx)
		} else {
			methodNotAllowed(ctx, "GET")
		}
	case "/tokenize", "/detokenize":
		if r.requirePost(ctx) {
			r.handleForward(ctx, path)
		}
	case "/health":
		// Process liveness: answering at all is the signal.
		ctx.SetStatusCode(fasthttp.StatusOK)
	case "/ready":
		if snap := r.mon.Snapshot(); snap.Routable() {
			ctx.SetStatusCode(fasthttp.StatusOK)
			ctx.SetBodyString(r.readyBody(snap))
		} else {
			errNoTarget("no routable target", r.retryAfter()).write(ctx)
		}
	default:
		(&apiError{Status: fasthttp.StatusNotFound, Message: "no route for " + path, Type: typeNotFound, Code: "not_found"}).write(ctx)
	}
}

func (r *Router) requirePost(ctx *fasthttp.RequestCtx) bool {
	if ctx.IsPost() {
		return true
	}
	methodNotAllowed(ctx, "POST")
	return false
}

func methodNotAllowed(ctx *fasthttp.RequestCtx, allow string) {
	ctx.Response.Header.Set("Allow", allow)
	(&apiError{Status: fasthttp.StatusMethodNotAllowed, Message: "method not allowed; use " + allow, Type: typeInvalidRequest}).write(ctx)
}

// handleServerError answers requests fasthttp could not read, most of all
// bodies above --max-body-bytes, in the OpenAI error shape.
func (r *Router) handleServerError(ctx *fasthttp.RequestCtx, err error) {
	r.met.rejected.WithLabelValues("read_error").Inc()
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		errTooLarge(r.cfg.MaxBodyBytes).write(ctx)
	default:
		var small *fasthttp.ErrSmallBuffer
		if errors.As(err, &small) {
			(&apiError{Status: fasthttp.StatusRequestHeaderFieldsTooLarge, Message: "request headers too large", Type: typeInvalidRequest}).write(ctx)
			return
		}
		errBadRequest("", "cannot read request: "+err.Error()).write(ctx)
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

func (r *Router) reject(ctx *fasthttp.RequestCtx, err error) {
	var br *BadRequest
	if errors.As(err, &br) {
		r.met.rejected.WithLabelValues("bad_request").Inc()
		errBadRequest(br.Param, br.Message).write(ctx)
		return
	}
	r.log.Error("request parsing failed", "err", err)
	(&apiError{Status: fasthttp.StatusInternalServerError, Message: "internal error", Type: typeServer}).write(ctx)
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

// pickAny returns a routable target serving model (or any model when model
// is empty), rotating so that forwarded calls spread.
func (r *Router) pickAny(snap *health.Snapshot, model string) (*health.Target, *apiError) {
	ts := snap.Targets
	if model != "" {
		ts = snap.ForModel(model)
		if len(ts) == 0 {
			if len(snap.Models) == 0 && len(snap.Targets) > 0 {
				return nil, errNoTarget("no target has reported its models yet", r.retryAfter())
			}
			return nil, errUnknownModel(model)
		}
	}
	n := int(r.ch.rr.Add(1))
	for i := range ts {
		t := ts[(n+i)%len(ts)]
		if t.CanRoute() {
			return t, nil
		}
	}
	return nil, errNoTarget("no routable target for this model", r.retryAfter())
}

// handleForward sends /tokenize and /detokenize to a target of the body's
// model, unchanged.
func (r *Router) handleForward(ctx *fasthttp.RequestCtx, path string) {
	id := requestID(ctx)
	ctx.Response.Header.Set("X-Request-Id", id)
	model, err := ParseModelField(ctx.PostBody())
	if err != nil {
		r.reject(ctx, err)
		return
	}
	snap := r.mon.Snapshot()
	if model == "" {
		if names := snap.ModelNames(); len(names) == 1 {
			model = names[0]
		} else if len(names) > 1 {
			errBadRequest("model", "you must provide a model parameter: this router serves several models").write(ctx)
			return
		}
	}
	t, aerr := r.pickAny(snap, model)
	if aerr != nil {
		aerr.write(ctx)
		return
	}
	life := r.beginLife(ctx)
	defer life.release()
	r.forwardSimple(ctx, life, t, path, id)
}

// handleModels answers the union of the targets' /v1/models.
func (r *Router) handleModels(ctx *fasthttp.RequestCtx) {
	life := r.beginLife(ctx)
	defer life.release()
	cctx, cancel := context.WithTimeout(life.ctx, 3*time.Second)
	defer cancel()
	body := r.cat.union(cctx)
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

func itoa(n int) string { return strconv.Itoa(n) }
