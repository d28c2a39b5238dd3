package router

import (
	"context"
	"errors"
	"net"
	"sync/atomic"

	"github.com/valyala/fasthttp"
)

// Why a request's work was cancelled: the cause of its contexts.
var (
	errClientGone       = errors.New("client disconnected")
	errFirstByteTimeout = errors.New("first-byte timeout")
	errIdleTimeout      = errors.New("stream idle timeout")
	errShutdown         = errors.New("router shutting down")
	errRequestDone      = errors.New("request done")
)

// clientLife is one client request's lifetime, from its arrival to the end
// of its response. Every context on the request path (tokenization,
// remote rendering, upstream calls) derives from ctx, which ends with
// cause errClientGone as soon as the client disconnects, errShutdown when
// the router stops waiting for in-flight requests, and errRequestDone
// when the response is over.
//
// A fasthttp.RequestCtx is not a request-scoped context: it is done only
// at server shutdown, and it is recycled after the handler returns. So
// nothing derives from it.
//
// The disconnect watch starts only before the request first waits on the
// network (watchClient): a decision made on local tokens alone takes
// microseconds, and a client that leaves during it is seen as the upstream
// call starts, which then closes the pod's request at once.
//
// The handler owns the life and releases it when it returns; a streamed
// response outlives the handler, so its relay retains the life first and
// releases it when the stream ends. The last release ends it.
type clientLife struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	conn   net.Conn
	watch  *disconnectWatch // set by watchClient, on the handler's goroutine
	refs   atomic.Int32
}

// beginLife starts the lifetime of the request in rc.
func (r *Router) beginLife(rc *fasthttp.RequestCtx) *clientLife {
	ctx, cancel := context.WithCancelCause(r.reqCtx)
	l := &clientLife{ctx: ctx, cancel: cancel, conn: rc.Conn()}
	l.refs.Store(1)
	return l
}

// watchClient starts watching the client connection, once; from then on a
// disconnect cancels ctx with errClientGone. Call it on the handler's
// goroutine before a wait on the network: a remote tokenization, an
// upstream call.
func (l *clientLife) watchClient() {
	if l.watch == nil {
		l.watch = watchDisconnect(l.conn, func() { l.cancel(errClientGone) })
	}
}

// retain keeps the life going past the handler's release.
func (l *clientLife) retain() { l.refs.Add(1) }

// release ends the life once every holder has released it: the watch
// stops (before fasthttp reads the connection's next request) and every
// context derived from it ends.
func (l *clientLife) release() {
	if l.refs.Add(-1) != 0 {
		return
	}
	l.watch.stop()
	l.cancel(errRequestDone)
}

// clientGone reports whether the client disconnected.
func (l *clientLife) clientGone() bool {
	return errors.Is(context.Cause(l.ctx), errClientGone)
}
