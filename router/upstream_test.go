package router

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// countingServer is a pod whose accepted connections are counted.
func countingServer(t testing.TB, h http.HandlerFunc) (*httptest.Server, *atomic.Int32) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &conns
}

func postTo(srv *httptest.Server, path, body string) *upRequest {
	return &upRequest{method: fasthttp.MethodPost, endpoint: srv.URL, path: path, body: []byte(body)}
}

func readBody(t *testing.T, resp *upResponse) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return string(b)
}

func TestUpstreamReusesConnections(t *testing.T) {
	for _, tc := range []struct {
		name      string
		handler   http.HandlerFunc
		readAll   bool
		wantConns int32
	}{
		{"length-delimited", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }, true, 1},
		{"chunked", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "a")
			w.(http.Flusher).Flush()
			io.WriteString(w, "b")
		}, true, 1},
		{"pod closes", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Connection", "close")
			io.WriteString(w, "ok")
		}, true, 3},
		{"body left unread", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, strings.Repeat("x", 100<<10))
		}, false, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, conns := countingServer(t, tc.handler)
			u := newUpstream(DefaultConfig())
			defer u.close()
			for range 3 {
				resp, err := u.do(context.Background(), postTo(srv, "/x", "{}"))
				if err != nil {
					t.Fatal(err)
				}
				if tc.readAll {
					readBody(t, resp)
				} else {
					resp.Body.Read(make([]byte, 10))
					resp.Body.Close()
				}
			}
			if got := conns.Load(); got != tc.wantConns {
				t.Fatalf("%d connections for 3 requests, want %d", got, tc.wantConns)
			}
		})
	}
}

// Idle connections past the timeout are closed and forgotten, for every
// target, whether or not it gets another request.
func TestUpstreamDropsIdleConnections(t *testing.T) {
	closed := make(chan struct{}, 4)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			closed <- struct{}{}
		}
	}
	srv.Start()
	defer srv.Close()
	u := newUpstream(DefaultConfig())
	defer u.close()
	resp, err := u.do(context.Background(), postTo(srv, "/x", "{}"))
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	u.dropIdle(time.Now())
	if n := len(u.idle); n != 1 {
		t.Fatalf("a fresh idle connection was dropped: %d targets pooled", n)
	}
	u.dropIdle(time.Now().Add(upstreamIdleTimeout))
	if n := len(u.idle); n != 0 {
		t.Fatalf("%d targets still pooled past the idle timeout", n)
	}
	waitFor(t, "the pod to see the idle connection close", signalled(closed))
}

// A pooled connection the pod has closed while idle is tried, found closed
// before any response byte, and replaced by a new one: each request is
// served exactly once.
func TestUpstreamRedialsAConnectionClosedWhileIdle(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// The pod answers one request per connection with keep-alive, then
	// closes the connection for writing, as a server whose idle timeout
	// has passed closes it: the client reads EOF. Reading on tells whether
	// the client still sent a request there (tried).
	var accepted, served atomic.Int32
	closed := make(chan struct{}, 4)
	tried := make(chan bool, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				if _, err := c.Read(buf); err != nil {
					return
				}
				served.Add(1)
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				c.(*net.TCPConn).CloseWrite()
				closed <- struct{}{}
				n, _ := c.Read(buf)
				tried <- n > 0
			}()
		}
	}()
	u := newUpstream(DefaultConfig())
	defer u.close()
	rq := &upRequest{method: fasthttp.MethodPost, endpoint: "http://" + ln.Addr().String(), path: "/x", body: []byte("{}")}
	for i := range 3 {
		if i > 0 {
			waitFor(t, "the pod to close the last connection", signalled(closed))
		}
		resp, err := u.do(context.Background(), rq)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if b := readBody(t, resp); b != "ok" {
			t.Fatalf("request %d: body %q", i, b)
		}
		if i > 0 {
			select {
			case sent := <-tried:
				if !sent {
					t.Fatalf("request %d was not tried on the pooled connection the pod had closed", i)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("request %d: the client neither tried nor closed the connection the pod had closed", i)
			}
		}
		if n := accepted.Load(); n != int32(i+1) {
			t.Fatalf("after request %d: the pod accepted %d connections, want %d", i, n, i+1)
		}
		if n := served.Load(); n != int32(i+1) {
			t.Fatalf("after request %d: the pod served %d requests, want %d", i, n, i+1)
		}
	}
}

func TestUpstreamCancel(t *testing.T) {
	for _, tc := range []struct {
		name        string
		afterHeader bool
	}{{"waiting for headers", false}, {"reading the body", true}} {
		t.Run(tc.name, func(t *testing.T) {
			gone := make(chan struct{})
			srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
				// net/http notices a closed connection once the body is read.
				io.ReadAll(r.Body)
				if tc.afterHeader {
					w.Header().Set("Content-Type", "text/event-stream")
					io.WriteString(w, "data: 1\n\n")
					w.(http.Flusher).Flush()
				}
				select {
				case <-r.Context().Done():
					close(gone)
				case <-time.After(10 * time.Second):
				}
			})
			u := newUpstream(DefaultConfig())
			defer u.close()
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(50*time.Millisecond, cancel)
			resp, err := u.do(ctx, postTo(srv, "/x", "{}"))
			if !tc.afterHeader {
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("err %v, want cancellation", err)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("body err %v, want cancellation", err)
				}
			}
			waitFor(t, "the pod to see the request cancelled", signalled(gone))
		})
	}
}

func TestUpstreamStreamsIncrementally(t *testing.T) {
	release := make(chan struct{})
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		<-release
		io.WriteString(w, "data: second\n\n")
	})
	u := newUpstream(DefaultConfig())
	defer u.close()
	resp, err := u.do(context.Background(), postTo(srv, "/x", "{}"))
	if err != nil {
		t.Fatal(err)
	}
	if !resp.streamed() || string(resp.Header.ContentType()) != "text/event-stream" {
		t.Fatalf("streamed %v, content type %q", resp.streamed(), resp.Header.ContentType())
	}
	buf := make([]byte, 100)
	n, err := readSome(resp.Body, buf)
	if err != nil || string(buf[:n]) != "data: first\n\n" {
		t.Fatalf("first read %q, %v", buf[:n], err)
	}
	close(release)
	if rest := readBody(t, resp); rest != "data: second\n\n" {
		t.Fatalf("rest %q", rest)
	}
}

func TestUpstreamRequestHeaders(t *testing.T) {
	got := make(chan *http.Request, 1)
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(b))
		got <- r
	})
	var in fasthttp.RequestHeader
	in.Set("Authorization", "Bearer k")
	in.Set("Connection", "keep-alive, X-Secret")
	in.Set("X-Secret", "hop")
	in.Set("Keep-Alive", "timeout=5")
	in.Set("X-Request-Id", "from-client")
	in.Set("X-Data-Parallel-Rank", "7")
	in.Set("X-Forwarded-For", "10.1.1.1")
	in.SetContentType("application/json")
	u := newUpstream(DefaultConfig())
	defer u.close()
	rq := &upRequest{method: fasthttp.MethodPost, endpoint: srv.URL + "/base/", path: "/v1/completions", body: []byte(`{"a":1}`),
		in: &in, clientIP: net.ParseIP("192.0.2.9"), id: "rid", dpRank: "1"}
	resp, err := u.do(context.Background(), rq)
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	r := <-got
	body, _ := io.ReadAll(r.Body)
	want := map[string]string{
		"Authorization": "Bearer k", "Content-Type": "application/json", "X-Request-Id": "rid",
		"X-Data-Parallel-Rank": "1", "X-Forwarded-For": "192.0.2.9", "X-Secret": "", "Keep-Alive": "",
	}
	for k, v := range want {
		if vs := r.Header.Values(k); strings.Join(vs, ";") != v {
			t.Errorf("%s: %q, want %q", k, vs, v)
		}
	}
	if r.URL.Path != "/base/v1/completions" || string(body) != `{"a":1}` || r.Host != srv.Listener.Addr().String() {
		t.Fatalf("path %q host %q body %q", r.URL.Path, r.Host, body)
	}
}

func TestUpstreamEndpoint(t *testing.T) {
	u := newUpstream(DefaultConfig())
	for _, tc := range []struct {
		raw, addr, base string
		tls             bool
		bad             bool
	}{
		{raw: "http://10.0.0.7:8000", addr: "10.0.0.7:8000"},
		{raw: "http://pod-a", addr: "pod-a:80"},
		{raw: "https://pod-a/prefix/", addr: "pod-a:443", base: "/prefix", tls: true},
		{raw: "http://[::1]:9000", addr: "[::1]:9000"},
		{raw: "ftp://pod", bad: true},
		{raw: "http://", bad: true},
		{raw: "http://a b", bad: true},
	} {
		ep, err := u.endpoint(tc.raw)
		if tc.bad {
			if err == nil {
				t.Errorf("%q: no error", tc.raw)
			}
			continue
		}
		if err != nil || ep.addr != tc.addr || ep.basePath != tc.base || ep.tls != tc.tls || (ep.key == ep.addr) == tc.tls {
			t.Errorf("%q: %+v %v", tc.raw, ep, err)
		}
	}
}

// BenchmarkUpstream compares, side by side in one run, the latency a proxy
// adds when it forwards through net/http's client and through the router's
// upstream: a fasthttp front for each, one request at a time, to a pod that
// answers at once or after 2 ms.
func BenchmarkUpstream(b *testing.B) {
	serve := func(h fasthttp.RequestHandler) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		srv := &fasthttp.Server{Handler: h}
		go srv.Serve(ln)
		b.Cleanup(func() { srv.Shutdown() })
		return "http://" + ln.Addr().String()
	}
	for _, wait := range []time.Duration{0, 2 * time.Millisecond} {
		pod := serve(func(ctx *fasthttp.RequestCtx) {
			time.Sleep(wait)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"usage":{"prompt_tokens":10}}`)
		})
		nh := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
		viaNetHTTP := serve(func(ctx *fasthttp.RequestCtx) {
			req, _ := http.NewRequestWithContext(ctx, "POST", pod+"/x", bytes.NewReader(ctx.PostBody()))
			resp, err := nh.Do(req)
			if err != nil {
				ctx.Error(err.Error(), 502)
				return
			}
			relay(ctx, resp.Body)
		})
		up := newUpstream(DefaultConfig())
		b.Cleanup(up.close)
		viaUpstream := serve(func(ctx *fasthttp.RequestCtx) {
			resp, err := up.do(ctx, &upRequest{method: "POST", endpoint: pod, path: "/x", body: ctx.PostBody()})
			if err != nil {
				ctx.Error(err.Error(), 502)
				return
			}
			relay(ctx, resp.Body)
		})
		client := &fasthttp.Client{}
		body := bytes.Repeat([]byte("x"), 16<<10)
		do := func(url string) time.Duration {
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.SetRequestURI(url)
			req.Header.SetMethod("POST")
			req.SetBody(body)
			t := time.Now()
			if err := client.Do(req, resp); err != nil || resp.StatusCode() != 200 {
				b.Fatal(err, resp.StatusCode())
			}
			return time.Since(t)
		}
		b.Run("pod-"+wait.String(), func(b *testing.B) {
			var direct, viaNet, viaUp []time.Duration
			for b.Loop() {
				direct = append(direct, do(pod+"/x"))
				viaNet = append(viaNet, do(viaNetHTTP+"/x"))
				viaUp = append(viaUp, do(viaUpstream+"/x"))
			}
			q := func(d []time.Duration, p float64) float64 {
				sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
				return float64(d[int(float64(len(d)-1)*p)]) / 1e3
			}
			for _, p := range []float64{0.5, 0.99} {
				name := map[float64]string{0.5: "p50", 0.99: "p99"}[p]
				b.ReportMetric(q(viaNet, p)-q(direct, p), "nethttp-added-"+name+"-us")
				b.ReportMetric(q(viaUp, p)-q(direct, p), "upstream-added-"+name+"-us")
			}
		})
	}
}

// relay answers with a pod's whole body.
func relay(ctx *fasthttp.RequestCtx, body io.ReadCloser) {
	b, _ := io.ReadAll(body)
	body.Close()
	ctx.SetBody(b)
}

// signalled is a waitFor condition: a value has arrived on ch, or ch is
// closed.
func signalled(ch <-chan struct{}) func() bool {
	return func() bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
}
