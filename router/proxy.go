package router

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"

	"github.com/prefixrouter/prefixrouter/health"
)

// Hop-by-hop headers (RFC 9110 section 7.6.1) never cross the proxy.
var hopHeaders = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Proxy-Connection": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

// hopByHop reports whether a header (canonical key) is hop-by-hop: one of
// RFC 9110's, or one the message's Connection header lists.
func hopByHop(key, conn string) bool {
	return hopHeaders[key] || (conn != "" && connectionListed(conn, key))
}

// notForwarded reports whether a client's header stays at the router: the
// hop-by-hop ones and those the router sets itself.
func notForwarded(key, conn string) bool {
	switch key {
	case "Host", "Content-Length", "X-Request-Id", "X-Data-Parallel-Rank":
		return true
	}
	return hopByHop(key, conn)
}

func connectionListed(conn, key string) bool {
	for f := range strings.SplitSeq(conn, ",") {
		if strings.EqualFold(strings.TrimSpace(f), key) {
			return true
		}
	}
	return false
}

// copyResponseHeaders copies the pod's end-to-end headers to the client.
func copyResponseHeaders(dst, src *fasthttp.ResponseHeader) {
	conn := string(src.Peek("Connection"))
	src.VisitAll(func(k, v []byte) {
		key := string(k)
		if key == "Content-Length" || key == "X-Request-Id" || hopByHop(key, conn) {
			return
		}
		dst.AddBytesKV(k, v)
	})
}

// upstreamRequest is the request to one target.
func upstreamRequest(t *health.Target, path string, body []byte, in *fasthttp.RequestCtx, id string) *upRequest {
	rq := &upRequest{method: fasthttp.MethodPost, endpoint: t.ID.Endpoint, path: path, body: body,
		in: &in.Request.Header, clientIP: in.RemoteIP(), id: id}
	if t.Spec.DP > 1 {
		rq.dpRank = strconv.Itoa(t.ID.Rank)
	}
	return rq
}

// attemptResult is how one attempt on one target ended.
type attemptResult uint8

const (
	attemptDone      attemptResult = iota // response (or error) written to the client
	attemptRetryable                      // failed before any byte reached the client
)

// call is one upstream request's lifetime: its context, the timers that
// cancel it and why it was cancelled.
type call struct {
	ctx       context.Context
	cancel    context.CancelFunc
	why       atomic.Uint32 // cancelReason
	timer     *time.Timer
	timerDur  time.Duration
	timerKind uint32
}

type cancelReason = uint32

const (
	cancelNone cancelReason = iota
	cancelClientGone
	cancelFirstByteTimeout
	cancelIdleTimeout
	cancelShutdown
)

func newCall(parent context.Context) *call {
	c := &call{}
	c.ctx, c.cancel = context.WithCancel(parent)
	return c
}

func (c *call) abort(why cancelReason) {
	c.why.CompareAndSwap(cancelNone, why)
	c.cancel()
}

// arm starts (or restarts) the timer that aborts the call after d.
func (c *call) arm(d time.Duration, why cancelReason) {
	if c.timer == nil {
		c.timerKind = why
		c.timer = time.AfterFunc(d, func() { c.abort(c.timerKindLoad()) })
		return
	}
	c.timer.Stop()
	atomic.StoreUint32(&c.timerKind, why)
	c.timer.Reset(d)
}

func (c *call) timerKindLoad() cancelReason { return atomic.LoadUint32(&c.timerKind) }

func (c *call) end() {
	if c.timer != nil {
		c.timer.Stop()
	}
	c.cancel()
}

var chunkPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// dispatch proxies a planned request, retrying on other targets while no
// byte has reached the client.
func (r *Router) dispatch(ctx *fasthttp.RequestCtx, req *Request, pl *routePlan, id string, start time.Time) {
	body := ctx.PostBody()
	pl.startFinishing(r.ev.Index(), &r.tails)
	for attempt := 0; ; attempt++ {
		cd := &pl.cands[pl.dec.idx]
		res := r.attempt(ctx, req, pl, cd, body, id, start, attempt)
		if res == attemptDone {
			return
		}
		if attempt >= r.cfg.MaxRetries || !r.rechoose(pl) {
			r.met.requests.WithLabelValues(req.Model, r.cfg.Policy.String(), "upstream_error").Inc()
			errUpstream(fasthttp.StatusBadGateway, "no target could answer the request (last: "+cd.Target.ID.String()+")").write(ctx)
			return
		}
		r.met.retries.WithLabelValues(cd.Target.ID.String()).Inc()
		r.log.Info("retrying on another target", "request_id", id, "failed", cd.Target.ID.String(), "next", pl.cands[pl.dec.idx].Target.ID.String())
	}
}

// answeredSettled takes back, at the first byte, the flight of a plan that
// settled early (see routePlan.flight). Once the tail has looked the whole
// run up, the flight stands corrected, and the pod is expected to announce
// only the blocks it really had to compute. While the tail runs on, nothing
// is expected (a pod that held the whole prompt rightly announces nothing,
// and awaiting its events would judge it stale) and the mean uncached
// count is not fed a guess. It returns the predicted cached tokens as now
// known.
func (r *Router) answeredSettled(pl *routePlan, flight *health.Flight, predicted int) int {
	pl.untrack()
	count, cached, ok := pl.wholePrompt(pl.dec.idx)
	if !ok {
		flight.Revise(pl.tokens.count, 0)
		return predicted
	}
	flight.Revise(count, count-cached)
	r.ch.observeUncached(count - cached)
	return cached
}

// attempt sends the request to one candidate. It returns attemptRetryable
// only when nothing was written to the client.
func (r *Router) attempt(ctx *fasthttp.RequestCtx, req *Request, pl *routePlan, cd *Candidate, body []byte, id string, start time.Time, attempt int) attemptResult {
	t := cd.Target
	tname := t.ID.String()
	predicted := pl.predictedCached(cd)
	flight := t.Dispatch(pl.tokens.count, pl.tokens.count-predicted)
	expect := r.ev.Dispatch(t.ID)
	if pl.settled {
		pl.track(&flight)
	} else {
		r.ch.observeUncached(pl.tokens.count - predicted)
	}
	if r.ch.approx != nil && len(pl.approxChunks) > 0 {
		r.ch.approx.record(t.ID, pl.approxChunks)
	}
	r.met.routed.WithLabelValues(tname, req.Model, r.cfg.Policy.String()).Inc()
	decided := time.Since(start)
	r.met.overhead.WithLabelValues(r.cfg.Policy.String()).Observe(decided.Seconds())

	c := newCall(r.reqCtx)
	watch := watchDisconnect(ctx.Conn(), func() { c.abort(cancelClientGone) })
	finish := func(o health.Outcome) {
		watch.stop()
		c.end()
		if pl.settled {
			pl.untrack()
		}
		flight.Finish(o)
	}
	c.arm(r.cfg.FirstByteTimeout, cancelFirstByteTimeout)
	resp, err := r.up.do(c.ctx, upstreamRequest(t, req.Endpoint.Path(), body, ctx, id))
	if err != nil {
		return r.failedBeforeByte(ctx, req, c, finish, tname, err)
	}
	// Hold the response until its first body byte: a pod that dies in
	// prefill after sending headers (streaming) can still be retried.
	bufp := chunkPool.Get().(*[]byte)
	buf := *bufp
	n, rerr := readSome(resp.Body, buf)
	if n == 0 && rerr != nil && !errors.Is(rerr, io.EOF) {
		resp.Body.Close()
		chunkPool.Put(bufp)
		return r.failedBeforeByte(ctx, req, c, finish, tname, rerr)
	}
	if attempt < r.cfg.MaxRetries && pl.hasAlternative() {
		reason := ""
		switch {
		case resp.StatusCode >= 500:
			reason = "status_5xx" // the pod's failure; another may do better
		case resp.StatusCode < 300 && sseErrorFirst(buf[:n]):
			// vLLM streams a failure in prefill as a 200 whose first event
			// is an error: nothing was generated, so nothing is lost.
			reason = "stream_error_event"
		}
		if reason != "" {
			resp.Body.Close()
			chunkPool.Put(bufp)
			finish(health.OutcomeUpstreamError)
			r.met.upstreamErrors.WithLabelValues(tname, reason).Inc()
			return attemptRetryable
		}
	}
	if pl.settled {
		predicted = r.answeredSettled(pl, &flight, predicted)
	}
	flight.FirstByte()
	expect.FirstByte(flight.Tokens())
	ttft := time.Since(start)

	ctx.SetStatusCode(resp.StatusCode)
	copyResponseHeaders(&ctx.Response.Header, resp.Header)
	ctx.Response.Header.Set("X-Request-Id", id)
	if r.cfg.DebugHeaders {
		h := &ctx.Response.Header
		h.Set("X-Prefixrouter-Target", tname)
		// An estimate while the rest of the prompt is still being encoded.
		h.Set("X-Prefixrouter-Prompt-Blocks", itoa(pl.promptBlocks(pl.promptNow())))
		h.Set("X-Prefixrouter-Looked-Up-Blocks", itoa(len(pl.chain.Keys)))
		h.Set("X-Prefixrouter-Confirmed-Blocks", itoa(pl.confirmedNow(pl.dec.idx)))
		h.Set("X-Prefixrouter-Predicted-Cached-Tokens", itoa(predicted))
		h.Set("X-Prefixrouter-Reason", pl.dec.reason)
		// Arrival to dispatch, the router's own time before the pod starts.
		h.Set("Server-Timing", "route;dur="+strconv.FormatFloat(float64(decided.Microseconds())/1e3, 'f', 3, 64))
	}
	oc := &outcomeRec{r: r, model: req.Model, target: tname, predicted: predicted, plan: pl, cand: pl.dec.idx, status: resp.StatusCode, start: start, ttft: ttft}
	if resp.StatusCode >= 500 {
		r.met.upstreamErrors.WithLabelValues(tname, "status_5xx").Inc()
	}
	outcomeFor := func(gone bool) health.Outcome {
		switch {
		case gone:
			return health.OutcomeCanceled
		case resp.StatusCode >= 500:
			return health.OutcomeUpstreamError
		case resp.StatusCode >= 400:
			return health.OutcomeClientError
		}
		return health.OutcomeSuccess
	}

	stream := bytes.HasPrefix(resp.Header.ContentType(), []byte("text/event-stream")) ||
		(resp.streamed() && req.Stream)
	if !stream {
		// Small, complete JSON: read it whole and parse usage from it.
		rest, err := readAllLimit(resp.Body, buf[:n], r.cfg.MaxResponseBytes)
		resp.Body.Close()
		chunkPool.Put(bufp)
		if err != nil {
			gone := c.why.Load() == cancelClientGone
			finish(outcomeFor(gone))
			oc.finish(outcomeLabel(c, err, resp.StatusCode), usage{})
			if gone {
				ctx.SetConnectionClose()
				return attemptDone
			}
			errUpstream(fasthttp.StatusBadGateway, "upstream response failed: "+err.Error()).write(ctx)
			ctx.Response.Header.Set("X-Request-Id", id)
			return attemptDone
		}
		ctx.SetBody(rest)
		u := usageFromBody(rest)
		finish(outcomeFor(false))
		oc.finish(statusLabel(resp.StatusCode), u)
		return attemptDone
	}

	// Streaming: pass every chunk through as it arrives.
	ctx.Response.Header.Del("Content-Length")
	first := buf[:n]
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer chunkPool.Put(bufp)
		defer resp.Body.Close()
		var sc usageScanner
		gone := false
		var rerr error
		chunk := first
		for {
			if len(chunk) > 0 {
				sc.Write(chunk)
				if _, err := w.Write(chunk); err != nil {
					gone = true
					break
				}
				if err := w.Flush(); err != nil {
					gone = true
					break
				}
			}
			if rerr != nil {
				break
			}
			c.arm(r.cfg.IdleTimeout, cancelIdleTimeout)
			var m int
			m, rerr = resp.Body.Read(buf)
			chunk = buf[:m]
		}
		if gone {
			c.abort(cancelClientGone)
		}
		gone = gone || c.why.Load() == cancelClientGone
		label := statusLabel(resp.StatusCode)
		switch {
		case gone:
			label = "canceled"
		case rerr != nil && !errors.Is(rerr, io.EOF):
			label = outcomeLabel(c, rerr, resp.StatusCode)
			r.met.upstreamErrors.WithLabelValues(tname, "stream_broken").Inc()
		}
		o := outcomeFor(gone)
		if label == "upstream_error" || label == "timeout" {
			o = health.OutcomeUpstreamError
		}
		// The body first: a connection read to its end goes back to the
		// pool, and finish ends the call's context, which would close it.
		resp.Body.Close()
		finish(o)
		oc.finish(label, sc.usage())
	})
	return attemptDone
}

// failedBeforeByte handles an attempt that ended before any response byte:
// a client that left ends the request; anything else may be retried.
func (r *Router) failedBeforeByte(ctx *fasthttp.RequestCtx, req *Request, c *call, finish func(health.Outcome), tname string, err error) attemptResult {
	switch c.why.Load() {
	case cancelClientGone:
		finish(health.OutcomeCanceled)
		r.met.requests.WithLabelValues(req.Model, r.cfg.Policy.String(), "canceled").Inc()
		ctx.SetConnectionClose()
		return attemptDone
	case cancelFirstByteTimeout:
		finish(health.OutcomeUpstreamError)
		r.met.upstreamErrors.WithLabelValues(tname, "first_byte_timeout").Inc()
		r.met.requests.WithLabelValues(req.Model, r.cfg.Policy.String(), "timeout").Inc()
		// The pod may have computed for minutes; retrying elsewhere would
		// double the work and the wait. Report it.
		errUpstream(fasthttp.StatusGatewayTimeout, "the target did not answer within "+r.cfg.FirstByteTimeout.String()).write(ctx)
		return attemptDone
	case cancelShutdown:
		finish(health.OutcomeCanceled)
		errNoTarget("router shutting down", r.retryAfter()).write(ctx)
		return attemptDone
	}
	if r.reqCtx.Err() != nil {
		finish(health.OutcomeCanceled)
		errNoTarget("router shutting down", r.retryAfter()).write(ctx)
		return attemptDone
	}
	finish(health.OutcomeUpstreamError)
	r.met.upstreamErrors.WithLabelValues(tname, "before_first_byte").Inc()
	r.log.Warn("target failed before the first byte", "target", tname, "err", err)
	return attemptRetryable
}

func outcomeLabel(c *call, err error, status int) string {
	switch c.why.Load() {
	case cancelClientGone:
		return "canceled"
	case cancelFirstByteTimeout, cancelIdleTimeout:
		return "timeout"
	}
	if err != nil {
		return "upstream_error"
	}
	return statusLabel(status)
}

func statusLabel(status int) string {
	switch {
	case status >= 500:
		return "upstream_error"
	case status >= 400:
		return "client_error"
	}
	return "ok"
}

// readSome reads until at least one byte or an error.
func readSome(r io.Reader, buf []byte) (int, error) {
	for {
		n, err := r.Read(buf)
		if n > 0 || err != nil {
			return n, err
		}
	}
}

// readAllLimit reads the rest of r after the bytes already in first.
func readAllLimit(r io.Reader, first []byte, limit int64) ([]byte, error) {
	out := make([]byte, len(first), max(len(first)*2, 4096))
	copy(out, first)
	for {
		if int64(len(out)) > limit {
			return nil, fmt.Errorf("response larger than %d bytes", limit)
		}
		if len(out) == cap(out) {
			out = append(out, 0)[:len(out)]
		}
		n, err := r.Read(out[len(out):cap(out)])
		out = out[:len(out)+n]
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// forwardSimple proxies a small request/response pair (tokenize,
// detokenize) without routing logic.
func (r *Router) forwardSimple(ctx *fasthttp.RequestCtx, t *health.Target, path, id string) {
	cctx, cancel := context.WithTimeout(r.reqCtx, 30*time.Second)
	defer cancel()
	resp, err := r.up.do(cctx, upstreamRequest(t, path, ctx.PostBody(), ctx, id))
	if err != nil {
		errUpstream(fasthttp.StatusBadGateway, "target "+t.ID.String()+" failed: "+err.Error()).write(ctx)
		return
	}
	defer resp.Body.Close()
	b, err := readAllLimit(resp.Body, nil, r.cfg.MaxResponseBytes)
	if err != nil {
		errUpstream(fasthttp.StatusBadGateway, "target "+t.ID.String()+" failed: "+err.Error()).write(ctx)
		return
	}
	ctx.SetStatusCode(resp.StatusCode)
	copyResponseHeaders(&ctx.Response.Header, resp.Header)
	ctx.Response.Header.Set("X-Request-Id", id)
	ctx.SetBody(b)
}

// sseErrorFirst reports whether a stream's first bytes are an SSE event
// carrying a top-level "error" object, as vLLM sends when a streamed
// request fails before its first token.
func sseErrorFirst(b []byte) bool {
	b = bytes.TrimLeft(b, " \r\n")
	rest, ok := bytes.CutPrefix(b, []byte("data:"))
	if !ok {
		return false
	}
	line, _, _ := bytes.Cut(rest, []byte("\n"))
	line = bytes.TrimSpace(line)
	if len(line) == 0 || line[0] != '{' {
		return false
	}
	p := parserPool.Get()
	defer parserPool.Put(p)
	v, err := p.ParseBytes(line)
	if err != nil {
		return false
	}
	e := v.Get("error")
	return e != nil && e.Type() == fastjson.TypeObject && v.Get("choices") == nil
}
