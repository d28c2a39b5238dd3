package router

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/prefixrouter/prefixrouter/health"
)

// upstream sends requests to the targets over pooled HTTP/1.1 connections.
// A request is written and its response read on the calling goroutine:
// net/http's transport hands each request to a connection's writer and
// reader goroutines. BenchmarkUpstream compares the two on our two cores:
// through net/http a proxy added 127 µs at p50 and 358 at p99 to a pod
// that answers at once, through this pool 58 and 192. Cancelling a
// request's context closes its connection, which is how a vLLM pod learns
// that the client gave up and frees the request's KV blocks; fasthttp's
// client cannot abort a request in flight.
type upstream struct {
	dialer net.Dialer
	mu     sync.Mutex
	idle   map[string][]*upConn // by upEndpoint.key, most recently used last
	closed bool
	// eps holds the endpoints requests went to, by their URL: forget
	// drops one that left the fleet, and a fleet whose pods come and go
	// keeps those it has.
	eps    sync.Map // target endpoint URL -> *upEndpoint
	stop   chan struct{}
	reaped sync.WaitGroup
	// cred is the router's credentials: the key every request carries
	// (--upstream-api-key-file) and whether the client's Authorization
	// is the router's own (--api-key-file). Nil: none, forwarded as is.
	cred *credentials
	// trustForwarded keeps a client's X-Forwarded-For chain, Forwarded
	// and X-Real-Ip (--trust-forwarded-for); otherwise the peer's address
	// replaces them.
	trustForwarded bool
}

// upstreamIdleTimeout drops pooled connections before vLLM's server does
// (uvicorn closes a keep-alive connection after 5 s idle): a request sent
// on a connection the pod is closing fails before its first byte.
const upstreamIdleTimeout = 4 * time.Second

// maxIdlePerTarget bounds the idle connections kept to one target.
const maxIdlePerTarget = 1024

// A deadline in the past makes every pending read and write on a
// connection fail at once.
var aLongTimeAgo = time.Unix(1, 0)

func newUpstream(cfg Config) *upstream {
	u := &upstream{
		dialer: net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: 30 * time.Second},
		idle:   make(map[string][]*upConn),
		stop:   make(chan struct{}),

		trustForwarded: cfg.TrustForwardedFor,
	}
	u.reaped.Add(1)
	go u.reapIdle()
	return u
}

// reapIdle closes idle connections past the timeout, so that a pod that
// gets no more requests (or left the fleet) holds none of the router's
// descriptors.
func (u *upstream) reapIdle() {
	defer u.reaped.Done()
	t := time.NewTicker(upstreamIdleTimeout)
	defer t.Stop()
	for {
		select {
		case <-u.stop:
			return
		case now := <-t.C:
			u.dropIdle(now)
		}
	}
}

// dropIdle closes the connections idle since before now minus the timeout.
func (u *upstream) dropIdle(now time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for addr, cs := range u.idle {
		stale := 0
		// The oldest come first.
		for stale < len(cs) && now.Sub(cs[stale].idleSince) >= upstreamIdleTimeout {
			cs[stale].nc.Close()
			stale++
		}
		switch {
		case stale == len(cs):
			delete(u.idle, addr)
		case stale > 0:
			u.idle[addr] = append(cs[:0], cs[stale:]...)
		}
	}
}

// close drops the idle connections; those in use close when released.
func (u *upstream) close() {
	u.mu.Lock()
	if !u.closed {
		close(u.stop)
	}
	u.closed = true
	idle := u.idle
	u.idle = map[string][]*upConn{}
	u.mu.Unlock()
	u.reaped.Wait()
	for _, cs := range idle {
		for _, c := range cs {
			c.nc.Close()
		}
	}
}

// upEndpoint is a target's base URL, parsed once.
type upEndpoint struct {
	tls      bool
	addr     string // host:port to dial
	key      string // the pool's key: addr, marked when TLS
	host     string // Host header
	basePath string
	sni      string
	// forgotten: the endpoint left the fleet (forget), and a connection
	// to it is closed when released instead of kept. Guarded by the
	// upstream's mu.
	forgotten bool
}

// forget drops what the upstream keeps of endpoint raw, which left the
// fleet: its entry and, unless another entry dials the same address, its
// idle connections. A request still in flight on it completes; its
// connection is closed when released. A later request to raw (the pod
// back at the same address) parses it anew.
func (u *upstream) forget(raw string) {
	v, ok := u.eps.LoadAndDelete(raw)
	if !ok {
		return
	}
	ep := v.(*upEndpoint)
	shared := false
	u.eps.Range(func(_, o any) bool {
		shared = o.(*upEndpoint).key == ep.key
		return !shared
	})
	u.mu.Lock()
	ep.forgotten = true
	var idle []*upConn
	if !shared {
		idle = u.idle[ep.key]
		delete(u.idle, ep.key)
	}
	u.mu.Unlock()
	for _, c := range idle {
		c.nc.Close()
	}
}

// forgetEndpoint has the upstream forget endpoint, one of whose targets
// health removed, unless another target (another rank of it) still uses
// it: one that is not draining. Those draining finish their requests on
// the connections they hold.
func (r *Router) forgetEndpoint(endpoint string) {
	if snap := r.mon.Snapshot(); snap != nil {
		for _, t := range snap.Targets {
			if t.ID.Endpoint == endpoint && t.State != health.StateDraining {
				return
			}
		}
	}
	r.up.forget(endpoint)
}

func (u *upstream) endpoint(raw string) (*upEndpoint, error) {
	if ep, ok := u.eps.Load(raw); ok {
		return ep.(*upEndpoint), nil
	}
	pu, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("target %q: %w", raw, err)
	}
	ep := &upEndpoint{tls: pu.Scheme == "https", host: pu.Host, basePath: pu.EscapedPath(), sni: pu.Hostname()}
	switch {
	case pu.Scheme != "http" && pu.Scheme != "https":
		return nil, fmt.Errorf("target %q: scheme %q is not http or https", raw, pu.Scheme)
	case pu.Host == "":
		return nil, fmt.Errorf("target %q: no host", raw)
	case pu.Port() != "":
		ep.addr = pu.Host
	case ep.tls:
		ep.addr = net.JoinHostPort(pu.Hostname(), "443")
	default:
		ep.addr = net.JoinHostPort(pu.Hostname(), "80")
	}
	ep.key = ep.addr
	if ep.tls {
		ep.key = "tls " + ep.addr
	}
	if len(ep.basePath) > 0 && ep.basePath[len(ep.basePath)-1] == '/' {
		ep.basePath = ep.basePath[:len(ep.basePath)-1]
	}
	u.eps.Store(raw, ep)
	return ep, nil
}

// upConn is one pooled connection.
type upConn struct {
	nc        net.Conn
	br        *bufio.Reader
	bw        *bufio.Writer
	ep        *upEndpoint
	key       string // ep.key
	idleSince time.Time
}

// get takes the most recently used idle connection to ep, or dials one;
// reused says which.
func (u *upstream) get(ctx context.Context, ep *upEndpoint) (c *upConn, reused bool, err error) {
	now := time.Now()
	u.mu.Lock()
	for cs := u.idle[ep.key]; len(cs) > 0; cs = u.idle[ep.key] {
		c = cs[len(cs)-1]
		u.idle[ep.key] = cs[:len(cs)-1]
		if now.Sub(c.idleSince) < upstreamIdleTimeout {
			u.mu.Unlock()
			return c, true, nil
		}
		c.nc.Close()
	}
	u.mu.Unlock()
	var nc net.Conn
	if ep.tls {
		d := tls.Dialer{NetDialer: &u.dialer, Config: &tls.Config{ServerName: ep.sni}}
		nc, err = d.DialContext(ctx, "tcp", ep.addr)
	} else {
		nc, err = u.dialer.DialContext(ctx, "tcp", ep.addr)
	}
	if err != nil {
		return nil, false, err
	}
	return &upConn{nc: nc, br: bufio.NewReaderSize(nc, 32<<10), bw: bufio.NewWriterSize(nc, 32<<10), ep: ep, key: ep.key}, false, nil
}

// put returns a connection whose last response was read to its end.
func (u *upstream) put(c *upConn) {
	u.mu.Lock()
	cs := u.idle[c.key]
	if u.closed || c.ep.forgotten || len(cs) >= maxIdlePerTarget {
		u.mu.Unlock()
		c.nc.Close()
		return
	}
	c.idleSince = time.Now()
	u.idle[c.key] = append(cs, c)
	u.mu.Unlock()
}

// upRequest is one request to a target.
type upRequest struct {
	method   string
	endpoint string // the target's base URL
	path     string
	body     []byte
	// in carries the client's headers; its end-to-end ones are forwarded.
	in       *fasthttp.RequestHeader
	clientIP net.IP
	id       string
	dpRank   string // X-data-parallel-rank; empty sends none
	// identity asks for the answer unencoded (no client Accept-Encoding):
	// the router reads it (a split request's prefill answer).
	identity bool
}

// upResponse is a target's answer: its status and headers, and its body to
// be read and closed by the caller.
type upResponse struct {
	StatusCode int
	Header     *fasthttp.ResponseHeader
	Body       io.ReadCloser
}

// streamed reports whether the body is sent without a length (chunked or
// until the connection closes), as streams are.
func (r *upResponse) streamed() bool { return r.Header.ContentLength() < 0 }

// do sends rq and returns once the response's headers are read. The body
// must be closed. A connection the pool kept, found closed by the target
// before any response byte, is replaced by a new one once.
func (u *upstream) do(ctx context.Context, rq *upRequest) (*upResponse, error) {
	ep, err := u.endpoint(rq.endpoint)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		// A kept connection would take the request before the
		// cancellation could reach it.
		return nil, fmt.Errorf("%s %s: %w", rq.method, ep.addr, err)
	}
	for try := 0; ; try++ {
		c, reused, err := u.get(ctx, ep)
		if err != nil {
			return nil, fmt.Errorf("dial %s: %w", ep.addr, err)
		}
		nc := c.nc
		stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(aLongTimeAgo) })
		resp, answered, err := c.roundTrip(u, ep, rq)
		if err == nil {
			return &upResponse{StatusCode: resp.StatusCode(), Header: &resp.Header,
				Body: &upBody{u: u, c: c, resp: resp, stream: resp.BodyStream(), ctx: ctx, stop: stop}}, nil
		}
		stop()
		c.nc.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s %s: %w", rq.method, ep.addr, ctx.Err())
		}
		if reused && !answered && try == 0 && closedByPeer(err) {
			continue
		}
		return nil, fmt.Errorf("%s %s: %w", rq.method, ep.addr, err)
	}
}

// closedByPeer reports whether err is a connection the other side closed.
func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// roundTrip writes rq and reads the response's headers; answered says
// whether any response byte arrived.
func (c *upConn) roundTrip(u *upstream, ep *upEndpoint, rq *upRequest) (resp *fasthttp.Response, answered bool, err error) {
	c.writeRequest(ep, rq, u.cred, u.trustForwarded)
	if err := c.bw.Flush(); err != nil {
		return nil, false, err
	}
	if _, err := c.br.Peek(1); err != nil {
		return nil, false, err
	}
	resp = fasthttp.AcquireResponse()
	resp.StreamBody = true
	if rq.method == fasthttp.MethodHead {
		resp.SkipBody = true
	}
	if err := resp.Read(c.br); err != nil {
		fasthttp.ReleaseResponse(resp)
		return nil, true, err
	}
	return resp, true, nil
}

// writeRequest writes rq's head and body into the connection's buffer.
//
// Of the client's headers, the hop-by-hop ones and those the router sets
// itself stay behind (notForwarded), and so do:
//   - Authorization, when the router checks API keys of its own or sends
//     the upstream key (which then takes its place): a client's key is
//     the router's business, never the pod's;
//   - Cookie: a model server reads none, and an edge router's cookies
//     (a session with some other service on the same domain) are no
//     business of the pods';
//   - X-Forwarded-For, Forwarded and X-Real-Ip, unless trustForwarded: a
//     chain the client wrote is a claim nobody checked, so the pod hears
//     of the connection's peer alone (X-Forwarded-For: PEER); trusted, the
//     chain is kept and the peer appended, as a proxy behind another does.
func (c *upConn) writeRequest(ep *upEndpoint, rq *upRequest, cred *credentials, trustForwarded bool) {
	w := c.bw
	w.WriteString(rq.method)
	w.WriteByte(' ')
	w.WriteString(ep.basePath)
	w.WriteString(rq.path)
	w.WriteString(" HTTP/1.1\r\nHost: ")
	w.WriteString(ep.host)
	header := func(k, v string) {
		w.WriteString("\r\n")
		w.WriteString(k)
		w.WriteString(": ")
		w.WriteString(v)
	}
	if rq.method != fasthttp.MethodGet || len(rq.body) > 0 {
		header("Content-Length", strconv.Itoa(len(rq.body)))
	}
	forwardedFor := ""
	if rq.in != nil {
		conn := string(rq.in.Peek("Connection"))
		clientAuth := cred.forwardClientAuthorization()
		for k, v := range rq.in.All() {
			key := string(k)
			switch {
			case notForwarded(key, conn), rq.identity && key == "Accept-Encoding",
				key == "Authorization" && !clientAuth, key == "Cookie":
				continue
			case key == "X-Forwarded-For":
				if trustForwarded {
					if forwardedFor != "" {
						forwardedFor += ", "
					}
					forwardedFor += string(v)
				}
				continue
			case (key == "Forwarded" || key == "X-Real-Ip") && !trustForwarded:
				continue
			}
			w.WriteString("\r\n")
			w.Write(k)
			w.WriteString(": ")
			w.Write(v)
		}
	}
	if a := cred.upstreamHeader(); a != "" {
		header("Authorization", a)
	}
	if rq.id != "" {
		header("X-Request-Id", rq.id)
	}
	if rq.dpRank != "" {
		header("X-data-parallel-rank", rq.dpRank)
	}
	if rq.clientIP != nil {
		if forwardedFor != "" {
			forwardedFor += ", "
		}
		header("X-Forwarded-For", forwardedFor+rq.clientIP.String())
	} else if forwardedFor != "" {
		header("X-Forwarded-For", forwardedFor)
	}
	w.WriteString("\r\n\r\n")
	w.Write(rq.body)
}

// upBody is a response body read from its pooled connection. Read to its
// end and closed, it gives the connection back to the pool; closed early,
// or after its context ended, it closes the connection.
type upBody struct {
	u      *upstream
	c      *upConn
	resp   *fasthttp.Response
	stream io.Reader // nil when the response has no body
	ctx    context.Context
	stop   func() bool
	eof    bool
	closed bool
}

func (b *upBody) Read(p []byte) (int, error) {
	if b.closed {
		return 0, errors.New("read of a closed response body")
	}
	if b.stream == nil {
		b.eof = true
		return 0, io.EOF
	}
	n, err := b.stream.Read(p)
	switch {
	case err == io.EOF:
		b.eof = true
	case err != nil && b.ctx.Err() != nil:
		err = b.ctx.Err()
	}
	return n, err
}

func (b *upBody) Close() error {
	if b.closed {
		return nil
	}
	b.closed = true
	// stop reports false once the context's end has poisoned the
	// connection's deadline.
	reusable := b.stop() && b.eof && !b.resp.Header.ConnectionClose() && b.resp.Header.ContentLength() >= -1
	_ = b.resp.CloseBodyStream()
	fasthttp.ReleaseResponse(b.resp)
	if reusable {
		b.u.put(b.c)
	} else {
		b.c.nc.Close()
	}
	return nil
}
