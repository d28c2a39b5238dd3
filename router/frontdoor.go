package router

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/prefixrouter/prefixrouter/internal/memlimit"
)

// The front door's limits: what a client may cost the router before it is
// refused. fasthttp would allocate a body's declared Content-Length at
// once; the server streams bodies instead (StreamRequestBody) and the
// router reads them here, so that memory grows with the bytes that
// arrive, within a budget shared by every request, and never with what a
// header declares. Connections are counted and capped, in all and per
// client address, before fasthttp serves them; a client that sends its
// headers or body too slowly, or stops reading its answer, is cut off.

// Reasons of prefixrouter_requests_rejected_total the front door answers.
const (
	rejectTooLarge      = "too_large"
	rejectBodyBudget    = "body_budget"
	rejectMemory        = "memory"
	rejectBodyTimeout   = "body_timeout"
	rejectHeaderTimeout = "header_timeout"
)

// Reasons of prefixrouter_connections_refused_total.
const (
	refuseMaxConnections = "max_connections"
	refusePerIP          = "per_ip"
)

// frontDoor holds the limits' state: the body bytes in flight, the
// connections open, whether memory is short. The router owns one; its
// watch of memory runs in the router's background work.
type frontDoor struct {
	cfg Config
	log *slog.Logger
	// budget is the body bytes in flight beyond which new requests are
	// refused; inFlight the bytes of bodies read and not yet released.
	budget   int64
	inFlight atomic.Int64
	// memLimit is the runtime's soft limit (0: none); shedAt the counted
	// memory beyond which new requests are refused; short says it is
	// reached, as last sampled.
	memLimit int64
	shedAt   int64
	short    atomic.Bool

	connsOpen atomic.Int64
	mu        sync.Mutex
	perIP     map[string]int

	refusedConns  *prometheus.CounterVec
	writeTimeouts prometheus.Counter
}

// defaultBodyBudget is the body budget without a memory limit to size it
// from. A body costs several times its size while the router holds it
// (parsed, tokenized, sent on): measured, a 32 MiB prompt took about
// 140 MiB of the router's memory; so the budget is an eighth of the
// memory limit, which leaves room for what the bodies cost beyond their
// bytes.
const defaultBodyBudget = 128 << 20

// bodyBudgetShare is the share of the memory limit the body budget
// defaults to.
const bodyBudgetShare = 8

// bodyChunk is what one read of a request body asks for: small enough
// that a connection that stalls holds little, large enough to take a big
// prompt in few reads.
const bodyChunk = 64 << 10

func newFrontDoor(cfg Config, reg prometheus.Registerer, log *slog.Logger) (*frontDoor, error) {
	f := &frontDoor{cfg: cfg, log: log, perIP: map[string]int{}, memLimit: memlimit.Current()}
	f.budget = cfg.BodyBudget
	if f.budget == 0 {
		f.budget = defaultBodyBudget
		if f.memLimit > 0 {
			f.budget = f.memLimit / bodyBudgetShare
		}
	}
	if f.memLimit > 0 {
		f.shedAt = int64(float64(f.memLimit) * cfg.MemoryShedFraction)
	}
	f.refusedConns = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "prefixrouter_connections_refused_total",
		Help: "Client connections closed at accept, by reason (max_connections, per_ip).",
	}, []string{"reason"})
	for _, r := range []string{refuseMaxConnections, refusePerIP} {
		f.refusedConns.WithLabelValues(r)
	}
	f.writeTimeouts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "prefixrouter_client_write_timeouts_total",
		Help: "Responses cut off because the client took none of it for --write-timeout; the pod's request was cancelled.",
	})
	cs := []prometheus.Collector{
		f.refusedConns, f.writeTimeouts,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "prefixrouter_connections_open",
			Help: "Client connections open on the API listener.",
		}, func() float64 { return float64(f.connsOpen.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "prefixrouter_request_body_bytes_in_flight",
			Help: "Request body bytes received and held by requests in progress.",
		}, func() float64 { return float64(f.inFlight.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "prefixrouter_request_body_budget_bytes",
			Help: "Body bytes in flight beyond which new requests get 503 (--max-body-bytes-in-flight).",
		}, func() float64 { return float64(f.budget) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "prefixrouter_memory_limit_bytes",
			Help: "The Go runtime's soft memory limit (GOMEMLIMIT, or set from the container's); 0: none.",
		}, func() float64 { return float64(f.memLimit) }),
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// admit refuses a new request at once while the body budget is spent or
// memory is short; nil lets it in.
func (f *frontDoor) admit(retryAfter int) (*apiError, string) {
	if f.short.Load() {
		return errOverloaded("the router is short of memory", retryAfter), rejectMemory
	}
	if f.inFlight.Load() >= f.budget {
		return errOverloaded("the router holds too many request bodies", retryAfter), rejectBodyBudget
	}
	return nil, ""
}

// watchMemory samples the memory the runtime counts every interval until
// ctx ends, and marks the door short while it is past the shedding point.
func (f *frontDoor) watchMemory(ctx context.Context, interval time.Duration) {
	if f.shedAt == 0 {
		return
	}
	heap := memlimit.NewHeap()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		short := heap.Bytes() >= f.shedAt
		if short != f.short.Load() {
			f.short.Store(short)
			if short {
				f.log.Warn("memory is short: new requests get 503 until it is not", "limit_bytes", f.memLimit, "shed_at_bytes", f.shedAt)
			} else {
				f.log.Info("memory is no longer short")
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// requestBody is a request body the front door read, and its share of
// the budget until release.
type requestBody struct {
	f     *frontDoor
	bytes []byte
	held  int64
}

// release gives the body's bytes back to the budget, once.
func (b *requestBody) release() {
	if b == nil || b.f == nil {
		return
	}
	b.f.inFlight.Add(-b.held)
	b.f = nil
}

// hold counts n more bytes in flight and says whether the budget still
// allows them.
func (b *requestBody) hold(n int) bool {
	b.held += int64(n)
	return b.f.inFlight.Add(int64(n)) <= b.f.budget
}

// readBody reads the request body from the connection as it arrives:
// refused beyond --max-body-bytes (by its declared length at once, or by
// what arrived), beyond the body budget, or when the client sends nothing
// for --body-idle-timeout. On a refusal it has answered the client
// (counted by reason) and returns nil. The body lives until release.
func (r *Router) readBody(x *exchange) *requestBody {
	f, in := r.door, x.in
	limit := r.cfg.MaxBodyBytes
	declared := in.Request.Header.ContentLength()
	if declared > limit {
		in.SetConnectionClose()
		r.refuse(x, errTooLarge(limit), rejectTooLarge)
		return nil
	}
	if e, reason := f.admit(r.retryAfter()); e != nil {
		in.SetConnectionClose()
		r.refuse(x, e, reason)
		return nil
	}
	b := &requestBody{f: f}
	stream := in.RequestBodyStream()
	switch {
	case stream == nil:
		// A body fasthttp read whole (a HEAD, a GET).
		b.bytes = in.Request.Body()
		b.hold(len(b.bytes))
		return b
	case declared == 0:
		// No body: the empty stream is closed, so that reading the body
		// later reads no stream.
		in.Request.SetBodyRaw(nil)
		return b
	}
	size := 4 << 10 // a chunked body's first guess
	if declared > 0 {
		size = min(declared, bodyChunk)
	}
	buf := make([]byte, 0, size)
	for {
		if len(buf) == cap(buf) {
			// Grow only by what arrived: the next read fills the new room.
			grown := make([]byte, len(buf), min(2*cap(buf), limit+1))
			copy(grown, buf)
			buf = grown
		}
		_ = in.SetReadDeadline(time.Now().Add(r.cfg.BodyIdleTimeout))
		room := buf[len(buf):min(cap(buf), len(buf)+bodyChunk)]
		n, err := stream.Read(room)
		buf = buf[:len(buf)+n]
		overBudget := !b.hold(n)
		switch {
		case len(buf) > limit:
			b.release()
			in.SetConnectionClose()
			r.refuse(x, errTooLarge(limit), rejectTooLarge)
			return nil
		case overBudget:
			b.release()
			in.SetConnectionClose()
			r.refuse(x, errOverloaded("the router holds too many request bodies", r.retryAfter()), rejectBodyBudget)
			return nil
		case errors.Is(err, io.EOF) || len(buf) == declared:
			_ = in.SetReadDeadline(time.Time{})
			b.bytes = buf
			in.Request.SetBodyRaw(buf)
			return b
		case err != nil:
			b.release()
			in.SetConnectionClose()
			if isTimeout(err) {
				r.refuse(x, errBodyTimeout(r.cfg.BodyIdleTimeout), rejectBodyTimeout)
			} else {
				r.log.Debug("cannot read request body", "request_id", x.id, "err", err)
				r.refuse(x, errBadRequest("", "cannot read the request body"), "read_error")
			}
			return nil
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// limitListener counts the connections fasthttp serves and closes, as it
// accepts them, those past --max-connections or past
// --max-connections-per-ip from one address, with a 503 or a 429 that
// says why.
type limitListener struct {
	net.Listener
	f *frontDoor
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if lc := l.f.take(c); lc != nil {
			return lc, nil
		}
	}
}

// take admits c, or refuses it (answering on its own goroutine, so that a
// client that does not read never holds up the accept loop) and returns
// nil.
func (f *frontDoor) take(c net.Conn) net.Conn {
	ip := remoteIP(c)
	reason, status, msg := "", 0, ""
	f.mu.Lock()
	switch {
	case f.cfg.MaxConnections > 0 && f.connsOpen.Load() >= int64(f.cfg.MaxConnections):
		reason, status, msg = refuseMaxConnections, fasthttp.StatusServiceUnavailable, "the router serves as many connections as it may"
	case f.cfg.MaxConnectionsPerIP > 0 && f.perIP[ip] >= f.cfg.MaxConnectionsPerIP:
		reason, status, msg = refusePerIP, fasthttp.StatusTooManyRequests, "too many connections from this address"
	default:
		f.connsOpen.Add(1)
		if f.cfg.MaxConnectionsPerIP > 0 {
			f.perIP[ip]++
		}
	}
	f.mu.Unlock()
	if reason != "" {
		f.refusedConns.WithLabelValues(reason).Inc()
		go refuseConn(c, status, msg)
		return nil
	}
	lc := &limitedConn{Conn: c, f: f, ip: ip}
	if tc, ok := c.(*net.TCPConn); ok {
		return &limitedTCPConn{limitedConn: lc, tcp: tc}
	}
	return lc
}

func (f *frontDoor) closed(ip string) {
	f.mu.Lock()
	f.connsOpen.Add(-1)
	if f.cfg.MaxConnectionsPerIP > 0 {
		if f.perIP[ip]--; f.perIP[ip] <= 0 {
			delete(f.perIP, ip)
		}
	}
	f.mu.Unlock()
}

// refuseConn answers a refused connection with an OpenAI-shaped error and
// closes it, giving the client a second to take the answer.
func refuseConn(c net.Conn, status int, msg string) {
	defer c.Close()
	e := &apiError{Status: status, Message: msg, Type: typeUnavailable, Code: "too_many_connections", RetryAfter: 1}
	body := e.body()
	head := "HTTP/1.1 " + itoa(status) + " " + fasthttp.StatusMessage(status) + "\r\n" +
		"Content-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " + itoa(len(body)) + "\r\n\r\n"
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.Write(append([]byte(head), body...))
}

func remoteIP(c net.Conn) string {
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return host
}

// limitedConn gives its place back once, when fasthttp closes it.
type limitedConn struct {
	net.Conn
	f    *frontDoor
	ip   string
	once sync.Once
}

func (c *limitedConn) Close() error {
	c.once.Do(func() { c.f.closed(c.ip) })
	return c.Conn.Close()
}

// limitedTCPConn keeps what the router reads of a TCP connection: its
// file descriptor, which the disconnect watch polls (syscall.Conn).
type limitedTCPConn struct {
	*limitedConn
	tcp *net.TCPConn
}

func (c *limitedTCPConn) SyscallConn() (syscall.RawConn, error) { return c.tcp.SyscallConn() }
