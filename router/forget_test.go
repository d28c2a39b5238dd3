package router

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/brain"
)

// epsOf is the endpoint URLs the upstream keeps, sorted.
func epsOf(u *upstream) []string {
	var out []string
	u.eps.Range(func(k, _ any) bool { out = append(out, k.(string)); return true })
	slices.Sort(out)
	return out
}

// idleOf is the number of idle connections the upstream pools.
func idleOf(u *upstream) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, cs := range u.idle {
		n += len(cs)
	}
	return n
}

// closingServer is a pod whose closed connections are counted.
func closingServer(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int32) {
	var closed atomic.Int32
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			closed.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &closed
}

// TestUpstreamForgetsEndpoints: endpoints the upstream forgets leave its
// map and their idle connections are closed, while a request in flight on
// one completes and its connection is then closed, not pooled; an address
// another endpoint URL still dials keeps its idle connections.
func TestUpstreamForgetsEndpoints(t *testing.T) {
	u := newUpstream(DefaultConfig())
	defer u.close()
	const n = 5
	ok := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok")
	}
	var closed []*atomic.Int32
	var urls []string
	for range n {
		srv, c := closingServer(t, ok)
		closed = append(closed, c)
		urls = append(urls, srv.URL)
		resp, err := u.do(context.Background(), postTo(srv, "/x", "{}"))
		if err != nil {
			t.Fatal(err)
		}
		readBody(t, resp)
	}
	hold, release := holdingStream("data: first\n\n", "data: rest\n\n")
	held, _ := closingServer(t, hold)
	urls = append(urls, held.URL)
	resp, err := u.do(context.Background(), postTo(held, "/x", "{}"))
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "data: first\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	if got := epsOf(u); len(got) != n+1 || idleOf(u) != n {
		t.Fatalf("before forgetting: %d endpoints, %d idle connections; want %d and %d", len(got), idleOf(u), n+1, n)
	}

	for _, raw := range urls {
		u.forget(raw)
	}
	if got := epsOf(u); len(got) != 0 {
		t.Fatalf("endpoints kept after forgetting them all: %v", got)
	}
	if m := idleOf(u); m != 0 {
		t.Fatalf("%d idle connections kept to forgotten endpoints", m)
	}
	waitFor(t, "every pod to see its idle connection closed", func() bool {
		for _, c := range closed {
			if c.Load() != 1 {
				return false
			}
		}
		return true
	})

	// The request in flight on a forgotten endpoint reads on to its end.
	close(release)
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "\ndata: rest\n\n" {
		t.Fatalf("rest of the stream %q, %v", rest, err)
	}
	resp.Body.Close()
	if m := idleOf(u); m != 0 {
		t.Fatalf("the forgotten endpoint's connection went back to the pool: %d idle", m)
	}
	if got := epsOf(u); len(got) != 0 {
		t.Fatalf("endpoints after the in-flight request: %v", got)
	}

	// Two URLs of one address share its pool: forgetting one leaves the
	// other's idle connections.
	srv, c := closingServer(t, ok)
	for _, raw := range []string{srv.URL, srv.URL + "/base"} {
		resp, err := u.do(context.Background(), &upRequest{method: "POST", endpoint: raw, path: "/x", body: []byte("{}")})
		if err != nil {
			t.Fatal(err)
		}
		readBody(t, resp)
	}
	u.forget(srv.URL)
	if got := epsOf(u); !slices.Equal(got, []string{srv.URL + "/base"}) || idleOf(u) == 0 || c.Load() != 0 {
		t.Fatalf("after forgetting one of two URLs of an address: endpoints %v, %d idle, %d closed", got, idleOf(u), c.Load())
	}
	u.forget(srv.URL + "/base")
	if got := epsOf(u); len(got) != 0 || idleOf(u) != 0 {
		t.Fatalf("after forgetting both: endpoints %v, %d idle", got, idleOf(u))
	}
}

// TestRouterForgetsRemovedEndpoints: the router's upstream forgets an
// endpoint once discovery (here an endpoints file) removes it, unless a
// rank of it remains; a streamed request in flight on a removed endpoint
// completes.
func TestRouterForgetsRemovedEndpoints(t *testing.T) {
	t.Parallel()
	a, b, c := newFakePod(t, "a", 16, false), newFakePod(t, "b", 16, false), newFakePod(t, "c", 16, false)
	path := filepath.Join(t.TempDir(), "endpoints.json")
	write := func(specs ...string) {
		t.Helper()
		quoted := make([]string, len(specs))
		for i, s := range specs {
			quoted[i] = `"` + s + `"`
		}
		// Written aside and renamed: the watcher never reads half a file.
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(`{"endpoints":[`+strings.Join(quoted, ",")+`]}`), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write(a.endpoint())
	cfg := DefaultConfig()
	cfg.Policy = brain.PolicyRoundRobin
	cfg.Health = fastHealth()
	cfg.Health.EndpointsFile = path
	cfg.Health.FilePollInterval = 100 * time.Millisecond
	r := startRouter(t, cfg)
	waitFor(t, "pod a routable", func() bool { return routableCount(r, "m") == 1 })
	has := func(raw string) bool { return slices.Contains(epsOf(r.up), raw) }

	// A stream in flight on a when discovery drops it.
	hold, release := holdingStream("data: first\n\n", "data: rest\n\n")
	a.setHandler(hold)
	resp, err := http.Post("http://"+r.Addr()+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"m","prompt":"hello","stream":true,"max_tokens":3}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "data: first\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	if !has(a.srv.URL) {
		t.Fatalf("endpoints %v: a's missing while a request is on it", epsOf(r.up))
	}
	cSpec := c.srv.URL + "?model=m&dp=2"
	write(b.endpoint(), cSpec)
	waitFor(t, "a forgotten once removed", func() bool { return !has(a.srv.URL) })
	close(release)
	rest, err := io.ReadAll(br)
	if err != nil || resp.StatusCode != 200 || string(rest) != "\ndata: rest\n\n" {
		t.Fatalf("the stream on the removed pod: status %d, rest %q, %v", resp.StatusCode, rest, err)
	}

	// b and c (two ranks) in use; c shrinks to one rank and b leaves.
	waitFor(t, "b and c's two ranks routable", func() bool { return routableCount(r, "m") == 3 })
	for _, raw := range []string{b.srv.URL, c.srv.URL} {
		resp, err := r.up.do(context.Background(), &upRequest{method: "GET", endpoint: raw, path: "/v1/models"})
		if err != nil {
			t.Fatal(err)
		}
		readBody(t, resp)
	}
	write(c.srv.URL + "?model=m")
	waitFor(t, "b forgotten once removed", func() bool { return !has(b.srv.URL) })
	if !has(c.srv.URL) {
		t.Fatalf("endpoints %v: c's rank 0 still serves, its endpoint was forgotten with rank 1", epsOf(r.up))
	}

	write()
	waitFor(t, "every endpoint forgotten", func() bool { return len(epsOf(r.up)) == 0 })
	waitFor(t, "no idle connection kept", func() bool { return idleOf(r.up) == 0 })
}
