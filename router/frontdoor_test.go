package router

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// rawConn opens a TCP connection to addr from the loopback address src
// ("" for the system's choice).
func rawConn(t testing.TB, addr, src string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if src != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %q: %v", addr, src, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedWithin reports whether the router closes c within d, after
// reading (and discarding) whatever it answers first.
func closedWithin(c net.Conn, d time.Duration) (answer string, closed bool) {
	_ = c.SetReadDeadline(time.Now().Add(d))
	b, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return string(b), false
	}
	return string(b), true
}

func rejectedCount(r *Router, reason string) float64 {
	return testutil.ToFloat64(r.met.rejected.WithLabelValues(reason))
}

func echoRouter(t *testing.T, edit func(*Config)) *Router {
	t.Helper()
	p := newFakePod(t, "A", 16, false)
	cfg := DefaultConfig()
	cfg.Health = fastHealth(p.endpoint())
	if edit != nil {
		edit(&cfg)
	}
	r := startRouter(t, cfg)
	waitFor(t, "pod routable", func() bool { return routableCount(r, "m") == 1 })
	return r
}

// TestDeclaredBodiesCostWhatArrives: connections that declare 32 MiB
// bodies and send 12 KiB hold about what they sent, not what they
// declared, and a normal request still answers meanwhile. (fasthttp
// without streaming allocated each declared length at once: 16 such
// connections took 512 MiB.) Not parallel: it reads the heap.
func TestDeclaredBodiesCostWhatArrives(t *testing.T) {
	r := echoRouter(t, nil)
	// fasthttp reads up to 8 KiB of a body with its headers; the router
	// reads the rest as it arrives.
	const conns, sent = 16, 12 << 10
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	for range conns {
		c := rawConn(t, r.Addr(), "")
		fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 33554000\r\n\r\n")
		if _, err := c.Write([]byte(`{"model":"m","prompt":"` + strings.Repeat("x", sent))); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "every connection's bytes held", func() bool { return r.door.inFlight.Load() >= conns*sent })
	status, _, _ := post(t, "http://"+r.Addr()+"/v1/completions", `{"model":"m","prompt":"hi"}`)
	if status != http.StatusOK {
		t.Fatalf("a normal request beside them: status %d", status)
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	if held := r.door.inFlight.Load(); held > conns*(bodyChunk+1024) {
		t.Fatalf("body bytes in flight %d for %d connections that sent 12 KiB each", held, conns)
	}
	if grown > 64<<20 {
		t.Fatalf("heap grew %d MiB for %d connections that each sent 12 KiB of a declared 32 MiB", grown>>20, conns)
	}
}

// TestBodyLimits: a declared length past --max-body-bytes is refused at
// once, before any byte of the body; a chunked body is refused as soon
// as what arrived passes it; both 413 in the OpenAI shape.
func TestBodyLimits(t *testing.T) {
	t.Parallel()
	r := echoRouter(t, func(c *Config) { c.MaxBodyBytes = 4096 })
	c := rawConn(t, r.Addr(), "")
	// fasthttp reads the body's first bytes, up to the limit, with the
	// headers; the refusal comes then, without the rest.
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50000\r\n\r\n%s", strings.Repeat("y", 4096))
	answer, closed := closedWithin(c, 10*time.Second)
	if !strings.HasPrefix(answer, "HTTP/1.1 413") || !strings.Contains(answer, `"code":"request_too_large"`) || !closed {
		t.Fatalf("declared 50000 bytes past a 4096 limit: closed %v, answer %q", closed, answer)
	}
	c = rawConn(t, r.Addr(), "")
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
	for range 3 {
		fmt.Fprintf(c, "800\r\n%s\r\n", strings.Repeat("y", 0x800))
	}
	answer, closed = closedWithin(c, 10*time.Second)
	if !strings.HasPrefix(answer, "HTTP/1.1 413") || !closed {
		t.Fatalf("6 KiB chunked past a 4096 limit: closed %v, answer %q", closed, answer)
	}
	if got := rejectedCount(r, rejectTooLarge); got != 2 {
		t.Fatalf("rejected too_large = %v, want 2", got)
	}
	// An empty body is bad input, answered at once.
	if status, _, body := post(t, "http://"+r.Addr()+"/v1/completions", ""); status != http.StatusBadRequest {
		t.Fatalf("an empty body: status %d, %s", status, body)
	}
}

// TestBodyBudget: while the bodies in flight fill the budget, a new
// request gets 503 at once with Retry-After; once they are gone it is
// served again.
func TestBodyBudget(t *testing.T) {
	t.Parallel()
	r := echoRouter(t, func(c *Config) { c.MaxBodyBytes = 64 << 10; c.BodyBudget = 64 << 10 })
	hog := rawConn(t, r.Addr(), "")
	fmt.Fprintf(hog, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", 64<<10)
	if _, err := hog.Write([]byte(`{"model":"m","prompt":"` + strings.Repeat("x", 64<<10-100))); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the hog's body held", func() bool { return r.door.inFlight.Load() >= 64<<10-100 })
	// One more small body passes the budget while the hog holds it.
	second := rawConn(t, r.Addr(), "")
	fmt.Fprintf(second, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 200\r\n\r\n%s", strings.Repeat("z", 200))
	answer, _ := closedWithin(second, 10*time.Second)
	if !strings.HasPrefix(answer, "HTTP/1.1 503") || !strings.Contains(answer, "Retry-After: 1") || !strings.Contains(answer, `"code":"overloaded"`) {
		t.Fatalf("a body past the budget: %q", answer)
	}
	if got := rejectedCount(r, rejectBodyBudget); got != 1 {
		t.Fatalf("rejected body_budget = %v, want 1", got)
	}
	hog.Close()
	waitFor(t, "the hog's bytes released", func() bool { return r.door.inFlight.Load() == 0 })
	if status, _, _ := post(t, "http://"+r.Addr()+"/v1/completions", `{"model":"m","prompt":"hi"}`); status != http.StatusOK {
		t.Fatalf("after the hog left: status %d", status)
	}
}

// TestSlowClientsAreCutOff: connections that send half a request line, or
// nothing, or headers and then a stalled body, are answered 408 and
// closed within the timeouts; each is counted.
func TestSlowClientsAreCutOff(t *testing.T) {
	t.Parallel()
	r := echoRouter(t, func(c *Config) {
		c.HeaderTimeout = 300 * time.Millisecond
		c.BodyIdleTimeout = 300 * time.Millisecond
	})
	const slow = 40
	conns := make([]net.Conn, slow)
	for i := range conns {
		conns[i] = rawConn(t, r.Addr(), "")
		if i%2 == 0 {
			fmt.Fprint(conns[i], "POST /v1/compl")
		}
	}
	body := rawConn(t, r.Addr(), "")
	fmt.Fprintf(body, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 20000\r\n\r\n{\"model\":\"%s", strings.Repeat("m", 9000))
	var wg sync.WaitGroup
	open := make(chan int, slow)
	for i, c := range conns {
		wg.Go(func() {
			if _, closed := closedWithin(c, 10*time.Second); !closed {
				open <- i
			}
		})
	}
	answer, closed := closedWithin(body, 10*time.Second)
	wg.Wait()
	close(open)
	if n := len(open); n > 0 {
		t.Fatalf("%d of %d slow-header connections still open after 10 s (header timeout 300 ms)", n, slow)
	}
	if !closed || !strings.HasPrefix(answer, "HTTP/1.1 408") {
		t.Fatalf("stalled body: closed %v, answer %q", closed, answer)
	}
	if got := rejectedCount(r, rejectBodyTimeout); got != 1 {
		t.Fatalf("rejected body_timeout = %v, want 1", got)
	}
	if got := rejectedCount(r, rejectHeaderTimeout); got < slow/2 {
		t.Fatalf("rejected header_timeout = %v, want at least the %d half request lines", got, slow/2)
	}
}

// TestConnectionLimits: past --max-connections a new connection gets 503
// and is closed; past --max-connections-per-ip one address gets 429 while
// another is still served.
func TestConnectionLimits(t *testing.T) {
	t.Parallel()
	r := echoRouter(t, func(c *Config) { c.MaxConnections = 6; c.MaxConnectionsPerIP = 3 })
	// The health monitor's connections are outgoing: only these count.
	for range 3 {
		c := rawConn(t, r.Addr(), "127.0.0.1")
		fmt.Fprint(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
		if line, _ := bufio.NewReader(c).ReadString('\n'); !strings.HasPrefix(line, "HTTP/1.1 200") {
			t.Fatalf("a connection within the limits: %q", line)
		}
	}
	answer, closed := closedWithin(rawConn(t, r.Addr(), "127.0.0.1"), 10*time.Second)
	if !closed || !strings.HasPrefix(answer, "HTTP/1.1 429") || !strings.Contains(answer, "too_many_connections") {
		t.Fatalf("a fourth connection from one address: closed %v, answer %q", closed, answer)
	}
	for range 3 {
		c := rawConn(t, r.Addr(), "127.0.0.2")
		fmt.Fprint(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
		if line, _ := bufio.NewReader(c).ReadString('\n'); !strings.HasPrefix(line, "HTTP/1.1 200") {
			t.Fatalf("a connection from another address: %q", line)
		}
	}
	answer, closed = closedWithin(rawConn(t, r.Addr(), "127.0.0.3"), 10*time.Second)
	if !closed || !strings.HasPrefix(answer, "HTTP/1.1 503") {
		t.Fatalf("a seventh connection in all: closed %v, answer %q", closed, answer)
	}
	for reason, want := range map[string]float64{refusePerIP: 1, refuseMaxConnections: 1} {
		if got := testutil.ToFloat64(r.door.refusedConns.WithLabelValues(reason)); got != want {
			t.Errorf("refused %s = %v, want %v", reason, got, want)
		}
	}
}

// TestStalledReaderIsCutOff: a client that stops reading a stream is cut
// off after --write-timeout: the pod's request is cancelled and its load
// released, instead of a relay held for as long as the pod generates.
func TestStalledReaderIsCutOff(t *testing.T) {
	t.Parallel()
	p := newFakePod(t, "A", 16, false)
	canceled := make(chan struct{})
	p.setHandler(func(w http.ResponseWriter, q *http.Request) {
		_, _ = io.Copy(io.Discard, q.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := "data: {\"choices\":[{\"text\":\"" + strings.Repeat("a", 32<<10) + "\"}]}\n\n"
		defer close(canceled)
		for q.Context().Err() == nil {
			if _, err := io.WriteString(w, chunk); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	})
	cfg := DefaultConfig()
	cfg.Health = fastHealth(p.endpoint())
	cfg.WriteTimeout = 500 * time.Millisecond
	r := startRouter(t, cfg)
	waitFor(t, "pod routable", func() bool { return routableCount(r, "m") == 1 })
	c := rawConn(t, r.Addr(), "")
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4 << 10)
	}
	body := `{"model":"m","prompt":"hi","stream":true}`
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	if line, _ := bufio.NewReader(c).ReadString('\n'); !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Fatalf("stream status line: %q", line)
	}
	// The client reads nothing more.
	select {
	case <-canceled:
	case <-time.After(30 * time.Second):
		t.Fatal("the pod's request was never cancelled for a client that stopped reading")
	}
	waitFor(t, "the pod's load released", func() bool {
		return r.mon.Snapshot().ForModel("m")[0].Busy().InFlight == 0
	})
	if got := testutil.ToFloat64(r.door.writeTimeouts); got != 1 {
		t.Fatalf("write timeouts = %v, want 1", got)
	}
}

// TestPodErrorsToClients: a pod's 5xx reaches the client as the router's
// own error of the same status, without the pod's text; a 4xx, which the
// client needs, comes through with the pod's address taken out.
func TestPodErrorsToClients(t *testing.T) {
	t.Parallel()
	p := newFakePod(t, "A", 16, false)
	addr := strings.TrimPrefix(p.srv.URL, "http://")
	p.setHandler(func(w http.ResponseWriter, q *http.Request) {
		b, _ := io.ReadAll(q.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Pod-Secret", "internal")
		if strings.Contains(string(b), "boom") {
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprintf(w, `{"error":{"message":"engine at %s died: /opt/vllm/engine.py line 12","type":"InternalServerError","code":500}}`, p.srv.URL)
			return
		}
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"error":{"message":"max_tokens too large for %s (host %s)","type":"BadRequestError","param":"max_tokens","code":400}}`, addr, strings.Split(addr, ":")[0])
	})
	cfg := DefaultConfig()
	cfg.Health = fastHealth(p.endpoint())
	r := startRouter(t, cfg)
	waitFor(t, "pod routable", func() bool { return routableCount(r, "m") == 1 })

	status, h, body := post(t, "http://"+r.Addr()+"/v1/completions", `{"model":"m","prompt":"boom"}`)
	var e errorBody
	if err := json.Unmarshal(body, &e); err != nil || status != http.StatusInternalServerError {
		t.Fatalf("5xx: status %d, body %s (%v)", status, body, err)
	}
	if strings.Contains(string(body), "127.0.0.1") || strings.Contains(string(body), "engine.py") || h.Get("X-Pod-Secret") != "" {
		t.Fatalf("5xx leaks the pod's detail: %s %v", body, h)
	}
	if e.Error.Type != typeServer || h.Get("X-Request-Id") == "" {
		t.Fatalf("5xx: %+v, request id %q", e.Error, h.Get("X-Request-Id"))
	}
	status, _, body = post(t, "http://"+r.Addr()+"/v1/completions", `{"model":"m","prompt":"hi","stream":true}`)
	if status != http.StatusBadRequest || strings.Contains(string(body), "127.0.0.1") || !strings.Contains(string(body), "max_tokens too large for [model server]") {
		t.Fatalf("4xx: status %d, body %s", status, body)
	}
}
