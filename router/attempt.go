package router

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/health"
)

// exchange is one client request on the API listener, and for one sent to
// a pod, what the attempts on its targets share. The fasthttp.RequestCtx
// and the parsed Request are recycled when the handler returns, so a
// streamed response's relay, which outlives it, reads only the copies here
// and never in.
type exchange struct {
	in    *fasthttp.RequestCtx // the handler's: not after it returns
	path  string               // as the client named it, and sent upstream
	ep    Endpoint             // zero for the router's own answers
	id    string
	start time.Time
	// tenant names the client's API key (--api-key-file); "" without.
	tenant string

	// Set once the request is bound for a pod.
	life   *clientLife
	model  string
	stream bool           // the client asked for a stream
	dec    *brain.Decider // the policy that decides it
	tail   *brain.Tail
	// routeTime is the time from arrival to the first dispatch.
	routeTime time.Duration
	// A split request's decode stage, when it loads the prompt's blocks
	// (stageDecode, disagg.go): sendBody is the body sent to the decode
	// pod, the client's with the prefill pod's kv_transfer_params, and
	// prefilled the attempt that computed the prompt, whose answer says
	// what the request found in the prefix cache.
	sendBody  []byte
	prefilled *attempt
}

// body is the request body the attempt sends to its pod.
func (a *attempt) body() []byte {
	if a.d.stage.loadsPrompt() {
		return a.x.sendBody
	}
	return a.x.in.PostBody()
}

// promptAttempt is the attempt whose answer says what the request's
// prompt found in the prefix cache: the prefill stage's for a decode pod
// that loaded its blocks, a itself otherwise.
func (a *attempt) promptAttempt() *attempt {
	if a.d.stage.loadsPrompt() {
		return a.x.prefilled
	}
	return a
}

// attemptResult is how one attempt on one target ended.
type attemptResult uint8

const (
	attemptDone      attemptResult = iota // response (or error) written to the client
	attemptRetryable                      // failed before any byte reached the client
)

// dispatch proxies a decided request, retrying on other targets while no
// byte has reached the client.
func (r *Router) dispatch(x *exchange, d *decision) {
	if d.stage == stagePrefill {
		if d = r.prefill(x, d); d == nil {
			return
		}
	}
	for n := 0; ; n++ {
		a := r.newAttempt(x, d, n)
		if a.run() == attemptDone {
			return
		}
		failed := a.name
		next, ok := d.retry()
		if n >= r.cfg.MaxRetries || !ok {
			r.log.Warn("no target could answer the request", "request_id", x.id, "path", x.path, "last", failed, "attempts", n+1)
			a.fail(errUpstream(fasthttp.StatusBadGateway, "no target could answer the request"))
			r.recordOutcome(a)
			return
		}
		d = next
		r.met.retries.WithLabelValues(failed).Inc()
		r.log.Info("retrying on another target", "request_id", x.id, "failed", failed, "next", d.Target().Target.ID.String())
	}
}

// attempt is one try of a request on one target: it sends the request,
// awaits the first byte, and relays the response, buffered or streamed.
// It owns the target's flight, the upstream call, the response body and
// the pooled read buffer, and ends them once (end): when run returns, or,
// for a streamed response, when the relay that run hands the response to
// is done.
type attempt struct {
	r    *Router
	x    *exchange
	d    *decision
	n    int // 0 for the first attempt, then retries
	name string

	// book is what the attempt booked on its target (brain.Booking): the
	// flight, the plane's expectation, the predicted placements.
	book    *brain.Booking
	call    *call
	resp    *upResponse
	bufp    *[]byte
	first   []byte
	decided time.Duration // arrival to dispatch

	// What the client got, set before end.
	answered bool // the pod's answer (status and first bytes) was relayed
	status   int  // the pod's
	sent     int  // the status the client got; 0 when it got none
	ttft     time.Duration
	label    string // how the request ended: ok, client_error, upstream_error, timeout, canceled
	usage    usage
	// writeDeadline moves the client connection's write deadline on; the
	// stream relay calls it while fasthttp writes the answer, which keeps
	// the request's context alive until the relay returns.
	writeDeadline func(time.Time) error
	ended         bool
}

// newAttempt dispatches the request to d's choice: the target's load
// ledger counts it from now on.
func (r *Router) newAttempt(x *exchange, d *decision, n int) *attempt {
	a := &attempt{r: r, x: x, d: d, n: n, name: d.Target().Target.ID.String()}
	var p brain.Peers
	if r.links != nil {
		p = r.links
	}
	a.book = d.Dispatch(d.stage.booking(x.id, a.tail(), !x.ep.routed(), p))
	r.met.routed.WithLabelValues(a.name, x.model, x.dec.PolicyName()).Inc()
	a.decided = time.Since(x.start)
	if d.stage.routerTime() {
		if n == 0 {
			x.routeTime = a.decided
		}
		r.met.overhead.WithLabelValues(x.dec.PolicyName()).Observe(a.decided.Seconds())
	}
	a.call = newCall(x.life.ctx)
	return a
}

// tail is the prompt tail of the attempt's decision: nil for a split
// request's decode stage, whose candidates are not those the tail looks up.
func (a *attempt) tail() *brain.Tail {
	if !a.d.stage.usesTail() {
		return nil
	}
	return a.x.tail
}

// withdraw ends the attempt's predictions, here and at the peer replicas
// it shared them with: the pod rejected the request before computing
// anything.
func (a *attempt) withdraw() { a.book.Withdraw() }

// run sends the request and answers the client, or reports that another
// target may be tried: only when nothing was written to the client.
func (a *attempt) run() attemptResult {
	// handedOff is the handler's own: once the stream relay has the
	// attempt, the relay ends it.
	handedOff := false
	defer func() {
		if !handedOff {
			a.end()
		}
	}()
	r, x := a.r, a.x
	a.call.arm(r.cfg.FirstByteTimeout, &errFirstByteTimeout)
	x.life.watchClient()
	resp, err := r.up.do(a.call.ctx, upstreamRequest(a.d.Target().Target, x.path, a.body(), x.in, x.id))
	if err != nil {
		return a.failedBeforeByte(err)
	}
	a.resp = resp
	// Hold the response until its first body byte: a pod that dies in
	// prefill after sending headers (streaming) can still be retried.
	a.bufp = chunkPool.Get().(*[]byte)
	n, err := readSome(resp.Body, *a.bufp)
	if n == 0 && err != nil && !errors.Is(err, io.EOF) {
		return a.failedBeforeByte(err)
	}
	a.first = (*a.bufp)[:n]
	if reason := a.retryableAnswer(); reason != "" {
		a.withdraw() // the pod computed nothing
		a.label = "upstream_error"
		a.upstreamFailed(reason, "HTTP "+itoa(resp.StatusCode)+", tried on another target: "+string(a.first[:min(len(a.first), 256)]))
		return attemptRetryable
	}
	a.answer()
	if !a.streamed() || resp.StatusCode >= 400 {
		// An error is read whole even when it comes chunked: the router
		// rewords or scrubs it before the client sees it.
		a.relayBuffered()
		return attemptDone
	}
	// From SetBodyStreamWriter on, the relay owns the attempt: fasthttp
	// starts it at once, on a goroutine of its own, beside the rest of
	// the handler, and it ends the attempt and the request's life when
	// the stream is over. Nothing touches the attempt after it here.
	x.life.retain()
	x.in.Response.Header.Del("Content-Length")
	a.writeDeadline = x.in.SetWriteDeadline
	handedOff = true
	x.in.SetBodyStreamWriter(a.relayStream)
	return attemptDone
}

// retryableAnswer names why an answer that reached the router is better
// tried on another target, or "" to relay it: a pod failure before any
// byte reached the client, while another target remains.
func (a *attempt) retryableAnswer() string {
	if a.n >= a.r.cfg.MaxRetries || !a.d.HasAlternative() {
		return ""
	}
	switch {
	case a.resp.StatusCode >= 500:
		return upstreamStatus5xx // the pod's failure; another may do better
	case a.resp.StatusCode < 300 && sseErrorFirst(a.first):
		// vLLM streams a failure in prefill as a 200 whose first event
		// is an error: nothing was generated, so nothing is lost.
		return upstreamStreamErrorEvent
	}
	return ""
}

// failedBeforeByte handles an attempt that ended before any response byte:
// a client that left, a timeout or a shutdown end the request; anything
// else may be retried.
func (a *attempt) failedBeforeByte(err error) attemptResult {
	r, in := a.r, a.x.in
	switch context.Cause(a.call.ctx) {
	case errClientGone:
		a.label = "canceled"
		in.SetConnectionClose()
		return attemptDone
	case errFirstByteTimeout:
		a.label = "timeout"
		a.upstreamFailed(upstreamFirstByteTimeout, "no first byte within --first-byte-timeout "+r.cfg.FirstByteTimeout.String())
		r.log.Warn("target did not answer in time", "request_id", a.x.id, "target", a.name, "timeout", r.cfg.FirstByteTimeout)
		// The pod may have computed for minutes; retrying elsewhere would
		// double the work and the wait. Report it.
		a.fail(errUpstream(fasthttp.StatusGatewayTimeout, "the model server did not answer within "+r.cfg.FirstByteTimeout.String()))
		return attemptDone
	case errShutdown:
		a.label = "canceled"
		a.fail(errNoTarget("router shutting down", r.retryAfter()))
		return attemptDone
	}
	a.label = "upstream_error"
	// Refused, reset or closed before any answer: the pod stored nothing
	// of this request.
	a.withdraw()
	a.upstreamFailed(upstreamBeforeFirstByte, err.Error())
	r.log.Warn("target failed before the first byte", "request_id", a.x.id, "target", a.name, "err", err)
	return attemptRetryable
}

// fail answers the client with the router's own error instead of the
// pod's answer.
func (a *attempt) fail(e *apiError) {
	e.write(a.x.in)
	a.sent = e.Status
}

// answer records the first byte and relays the pod's status and headers.
func (a *attempt) answer() {
	r, x, resp := a.r, a.x, a.resp
	v := a.firstByte()
	a.answered, a.status, a.sent, a.ttft = true, resp.StatusCode, resp.StatusCode, time.Since(x.start)
	if resp.StatusCode >= 400 {
		// Rejected before computing anything: its predictions will not
		// be confirmed. (A client that cancels keeps them: the pod may
		// have stored blocks already.)
		a.withdraw()
	}
	if resp.StatusCode >= 500 {
		a.upstreamFailed(upstreamStatus5xx, "HTTP "+itoa(resp.StatusCode)+", answered to the client in the router's words: no other target to try")
	}
	in := x.in
	in.SetStatusCode(resp.StatusCode)
	copyResponseHeaders(&in.Response.Header, resp.Header)
	in.Response.Header.Set("X-Request-Id", x.id)
	if r.cfg.DebugHeaders {
		h := &in.Response.Header
		h.Set("X-Prefixrouter-Target", a.name)
		// The prompt's numbers are those of the attempt that computed it:
		// a split request's prefill stage.
		pa := a.promptAttempt()
		if pa != a {
			h.Set("X-Prefixrouter-Prefill-Target", pa.name)
			v = pa.d.View(pa.tail(), pa.d.Chosen())
		}
		// An estimate while the rest of the prompt is still being encoded.
		h.Set("X-Prefixrouter-Prompt-Blocks", itoa(pa.d.PromptBlocks(v.Prompt)))
		h.Set("X-Prefixrouter-Looked-Up-Blocks", itoa(pa.d.LookedUpBlocks()))
		h.Set("X-Prefixrouter-Confirmed-Blocks", itoa(v.Confirmed))
		h.Set("X-Prefixrouter-Predicted-Cached-Tokens", itoa(pa.book.Predicted()))
		h.Set("X-Prefixrouter-Reason", pa.d.Reason())
		// Arrival to dispatch, the router's own time before the pod starts.
		h.Set("Server-Timing", "route;dur="+strconv.FormatFloat(float64(a.decided.Microseconds())/1e3, 'f', 3, 64))
	}
}

// firstByte settles what the attempt's first byte (for a prefill stage,
// its whole answer) says (brain.Booking.FirstByte). It returns the prompt
// as known now.
func (a *attempt) firstByte() brain.View { return a.book.FirstByte() }

// streamed reports whether the answer is relayed chunk by chunk.
func (a *attempt) streamed() bool {
	return bytes.HasPrefix(a.resp.Header.ContentType(), []byte("text/event-stream")) ||
		(a.resp.streamed() && a.x.stream)
}

// relayBuffered reads a small, complete JSON answer whole, parses its
// usage and answers the client with it.
func (a *attempt) relayBuffered() {
	in := a.x.in
	body, err := readAllLimit(a.resp.Body, a.first, a.r.cfg.MaxResponseBytes)
	if err != nil {
		a.label = a.failureLabel()
		if a.x.life.clientGone() {
			in.SetConnectionClose()
			return
		}
		a.r.log.Warn("target's answer broke off", "request_id", a.x.id, "target", a.name, "err", err)
		a.replaceAnswer(errUpstream(fasthttp.StatusBadGateway, "the model server's answer broke off"))
		return
	}
	switch {
	case a.status >= 500:
		// A pod's failure is the operator's to read, not the client's:
		// its text may name addresses, files and versions.
		a.r.log.Warn("target answered a server error; the client gets the router's own", "request_id", a.x.id, "target", a.name,
			"status", a.status, "body", string(body[:min(len(body), 512)]))
		a.replaceAnswer(errUpstream(a.status, "the model server failed to answer the request (HTTP "+itoa(a.status)+")"))
		a.label = statusLabel(a.status)
		return
	case a.status >= 400:
		body = scrubAddress(body, a.d.Target().Target.ID.Endpoint)
	}
	in.SetBody(body)
	a.usage = usageFromBody(body)
	a.label = statusLabel(a.status)
}

// replaceAnswer answers the client with the router's own error instead of
// the pod's answer, whose status and headers were copied already: none of
// them stays.
func (a *attempt) replaceAnswer(e *apiError) {
	in := a.x.in
	in.Response.Header.Reset()
	a.fail(e)
	in.Response.Header.Set("X-Request-Id", a.x.id)
}

// relayStream passes every chunk of a streamed answer through as it
// arrives (fasthttp runs it on its own goroutine).
func (a *attempt) relayStream(w *bufio.Writer) {
	defer a.x.life.release()
	defer a.end()
	var sc usageScanner
	chunk, buf := a.first, *a.bufp
	var rerr error
	// tail is the last two bytes relayed: whether they end an event (a
	// blank line) tells an error event that may have to follow them.
	tail := [2]byte{'\n', '\n'}
	// A client has --write-timeout to take each chunk: the deadline moves
	// on before every write, and once more for the stream's end, which
	// fasthttp writes after the relay returns.
	wt := a.r.cfg.WriteTimeout
	defer func() { _ = a.writeDeadline(time.Now().Add(wt)) }()
	for {
		if len(chunk) > 0 {
			sc.Write(chunk)
			armed := time.Now()
			_ = a.writeDeadline(armed.Add(wt))
			_, err := w.Write(chunk)
			if err == nil {
				err = w.Flush()
			}
			if err != nil {
				a.clientStopped(armed)
				break
			}
			if n := len(chunk); n >= 2 {
				tail = [2]byte{chunk[n-2], chunk[n-1]}
			} else {
				tail = [2]byte{tail[1], chunk[0]}
			}
		}
		if rerr != nil {
			break
		}
		a.call.arm(a.r.cfg.IdleTimeout, &errIdleTimeout)
		var m int
		m, rerr = a.resp.Body.Read(buf)
		chunk = buf[:m]
	}
	a.usage = sc.usage()
	switch {
	case context.Cause(a.call.ctx) == errClientGone:
		a.label = "canceled"
	case rerr != nil && !errors.Is(rerr, io.EOF):
		a.label = a.failureLabel()
		a.upstreamFailed(upstreamStreamBroken, rerr.Error())
		a.endStreamWithError(w, tail == [2]byte{'\n', '\n'})
	default:
		a.label = statusLabel(a.status)
	}
}

// clientStopped ends a relay whose client no longer takes the answer:
// gone, or silent past --write-timeout since the write began at armed.
// The pod's request is cancelled either way, and its load released.
func (a *attempt) clientStopped(armed time.Time) {
	if time.Since(armed) >= a.r.cfg.WriteTimeout {
		a.r.door.writeTimeouts.Inc()
		a.r.log.Info("client took none of its answer for --write-timeout: cut off", "request_id", a.x.id, "target", a.name, "write_timeout", a.r.cfg.WriteTimeout)
	}
	a.call.abort(errClientGone)
}

// endStreamWithError ends a stream the pod broke off (its connection cut,
// or silent past --idle-timeout) with an OpenAI-shaped error event, as a
// pod ends a stream it fails itself: a client cannot tell a cut from an
// end otherwise, and the request would be lost without a word. An event
// the relayed bytes left unfinished (ended false) is closed first.
func (a *attempt) endStreamWithError(w *bufio.Writer, ended bool) {
	msg := "the model server's stream broke off before its end"
	if a.label == "timeout" {
		msg = "the model server stopped sending before the stream's end"
	}
	if !ended {
		w.WriteString("\n\n")
	}
	w.WriteString("data: ")
	w.Write(errUpstream(fasthttp.StatusBadGateway, msg).body())
	w.WriteString("\n\n")
	w.Flush()
}

// failureLabel names an answer that broke off: why the call was
// cancelled, or the pod's failure.
func (a *attempt) failureLabel() string {
	switch context.Cause(a.call.ctx) {
	case errClientGone:
		return "canceled"
	case errFirstByteTimeout, errIdleTimeout:
		return "timeout"
	}
	return "upstream_error"
}

// end releases everything the attempt holds, once, and records how the
// request ended.
func (a *attempt) end() {
	if a.ended {
		return
	}
	a.ended = true
	if a.resp != nil {
		// The body first: a connection read to its end goes back to the
		// pool, and ending the call's context would close it.
		a.resp.Body.Close()
	}
	if a.bufp != nil {
		chunkPool.Put(a.bufp)
	}
	a.call.end()
	if a.label == "" {
		a.label = "upstream_error"
	}
	// Ended before a first byte (answer settles it otherwise), the pod
	// may have computed some blocks, and their events are due.
	a.book.End(healthOutcome(a.label))
	if !a.d.stage.recordsOutcome() {
		return
	}
	if a.label == "upstream_error" && !a.answered {
		// Failed before any byte: dispatch retries, or counts the request
		// once it gives up.
		return
	}
	a.r.recordOutcome(a)
}

// healthOutcome is what a request's end says about its target, for the
// circuit breaker.
func healthOutcome(label string) health.Outcome {
	switch label {
	case "ok":
		return health.OutcomeSuccess
	case "client_error":
		return health.OutcomeClientError
	case "canceled":
		return health.OutcomeCanceled
	}
	return health.OutcomeUpstreamError
}

// call is one upstream request's context and the timer that cancels it,
// with the cause as its reason.
type call struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer
	// cause is what the timer cancels with; arm changes it. It points
	// at one of the package's cause variables, so arming allocates nothing.
	cause atomic.Pointer[error]
}

func newCall(parent context.Context) *call {
	c := &call{}
	c.ctx, c.cancel = context.WithCancelCause(parent)
	return c
}

func (c *call) abort(cause error) { c.cancel(cause) }

// arm starts (or restarts) the timer that cancels the call after d with
// *cause.
func (c *call) arm(d time.Duration, cause *error) {
	c.cause.Store(cause)
	if c.timer == nil {
		c.timer = time.AfterFunc(d, func() { c.cancel(*c.cause.Load()) })
		return
	}
	c.timer.Reset(d)
}

func (c *call) end() {
	if c.timer != nil {
		c.timer.Stop()
	}
	c.cancel(errRequestDone)
}

var chunkPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}
