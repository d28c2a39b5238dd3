package router

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/logbuf"
)

func TestPodMessage(t *testing.T) {
	const base = "http://10.0.0.7:8000"
	for _, c := range []struct{ body, want string }{
		{`{"error":{"message":"template failed at http://10.0.0.7:8000/v1/render","type":"BadRequestError","code":400}}`,
			"template failed at [model server]/v1/render"},
		{`{"object":"error","message":"prompt too long for 10.0.0.7:8000","type":"BadRequestError","code":400}`,
			"prompt too long for [model server]"},
		{`{"detail":"host 10.0.0.7 refused"}`, "host [model server] refused"},
		{`{"error":"bad prompt"}`, "bad prompt"},
		{"upstream 10.0.0.7:8000 reset", "upstream [model server] reset"},
		{`{"error":{"message":"This model's maximum context length is 8192 tokens."}}`, "This model's maximum context length is 8192 tokens."},
	} {
		if got := podMessage(c.body, base); got != c.want {
			t.Errorf("podMessage(%s) = %q, want %q", c.body, got, c.want)
		}
	}
}

// hangUp is a pod handler that closes the connection without answering, as
// a pod that dies mid-request does.
func hangUp(w http.ResponseWriter, r *http.Request) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err == nil {
		conn.Close()
	}
}

// TestClientErrorsNameNoAddress sends every failure path the API listener
// has and finds no pod address (URL, host:port, KV-event endpoint, target
// id) in any byte a client sees: status, headers or body. The detail is in
// the log and in GET /debug/targets, by the client's request id.
func TestClientErrorsNameNoAddress(t *testing.T) {
	t.Parallel()
	a := newFakePod(t, "A", 16, true)
	b := newFakePod(t, "B", 16, true)
	pods := []*fakePod{a, b}
	cfg := DefaultConfig()
	cfg.MaxBodyBytes = 4096
	cfg.FirstByteTimeout = 300 * time.Millisecond
	cfg.Health = fastHealth(a.endpoint(), b.endpoint())
	// Every failure path, not the breaker's 503, until the pods are gone.
	cfg.Health.BreakerFailures = 1000
	var logs logbuf.Buffer
	r := startRouterLogging(t, cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	waitFor(t, "pods routable", func() bool { return routableCount(r, "m") == 2 })
	base := "http://" + r.Addr()

	var secrets []string
	for _, p := range pods {
		secrets = append(secrets, p.srv.URL, strings.TrimPrefix(p.srv.URL, "http://"), targetName(p.srv.URL))
		for _, ep := range []string{p.pub.Endpoint(), p.pub.ReplayEndpoint()} {
			u, err := url.Parse(ep)
			if err != nil {
				t.Fatal(err)
			}
			secrets = append(secrets, ep, u.Host)
		}
	}
	seen := 0
	check := func(name, method, path, body string, want int) string {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Request-Id", name)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var visible strings.Builder
		fmt.Fprintf(&visible, "%s\n", resp.Status)
		for k, vs := range resp.Header {
			fmt.Fprintf(&visible, "%s: %s\n", k, strings.Join(vs, ", "))
		}
		visible.Write(out)
		if resp.StatusCode != want {
			t.Fatalf("%s: status %d, want %d: %s", name, resp.StatusCode, want, visible.String())
		}
		for _, s := range secrets {
			if strings.Contains(visible.String(), s) {
				t.Errorf("%s: the client sees %q:\n%s", name, s, visible.String())
			}
		}
		seen++
		return string(out)
	}

	// The pods' render calls reject the prompt, naming themselves.
	for _, p := range pods {
		h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(400)
			fmt.Fprintf(w, `{"error":{"message":"cannot render at %s/v1/completions/render","type":"BadRequestError","code":400}}`, p.srv.URL)
		})
		p.render.Store(&h)
	}
	if out := check("render-rejected", "POST", "/v1/completions", `{"model":"m","prompt":"hi"}`, 400); !strings.Contains(out, "cannot render at [model server]") {
		t.Fatalf("render rejection lost the pod's reason: %s", out)
	}
	for _, p := range pods {
		p.render.Store(nil)
	}

	// Every pod hangs up before answering.
	for _, p := range pods {
		p.setHandler(hangUp)
		p.setForward(hangUp)
	}
	check("completions-no-target-answered", "POST", "/v1/completions", `{"model":"m","prompt":"hi"}`, 502)
	check("chat-no-target-answered", "POST", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, 502)
	check("responses-no-target-answered", "POST", "/v1/responses", `{"model":"m","input":"hi"}`, 502)
	check("embeddings-no-target-answered", "POST", "/v1/embeddings", `{"model":"m","input":"hi"}`, 502)
	check("detokenize-no-target-answered", "POST", "/detokenize", `{"model":"m","tokens":[1]}`, 502)
	check("version-no-target-answered", "GET", "/version", ``, 502)

	// Too slow, then an answer that breaks off.
	slow := func(w http.ResponseWriter, q *http.Request) {
		// Read to the end: the server then notices the router hanging up.
		_, _ = io.Copy(io.Discard, q.Body)
		select {
		case <-q.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}
	for _, p := range pods {
		p.setHandler(slow)
	}
	check("first-byte-timeout", "POST", "/v1/completions", `{"model":"m","prompt":"hi"}`, 504)
	brokeOff := func(w http.ResponseWriter, q *http.Request) {
		conn, bw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		fmt.Fprint(bw, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"id\":")
		bw.Flush()
		conn.Close()
	}
	for _, p := range pods {
		p.setHandler(brokeOff)
	}
	check("answer-broke-off", "POST", "/v1/completions", `{"model":"m","prompt":"hi"}`, 502)
	// A stream cut after its first event, once mid-event: the client
	// gets the events relayed, then an error event that says so.
	for _, cut := range []string{"data: {\"id\":\"a\"}\n\n", "data: {\"id\":\"a\"}\n\ndata: {\"id\""} {
		streamBrokeOff := func(w http.ResponseWriter, q *http.Request) {
			conn, bw, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			fmt.Fprintf(bw, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(cut), cut)
			bw.Flush()
			conn.Close()
		}
		for _, p := range pods {
			p.setHandler(streamBrokeOff)
		}
		out := check("stream-broke-off", "POST", "/v1/completions", `{"model":"m","prompt":"hi","stream":true}`, 200)
		want := "\n\ndata: {\"error\":{\"message\":\"the model server's stream broke off before its end\",\"type\":\"server_error\",\"param\":null,\"code\":\"upstream_error\"}}\n\n"
		if !strings.HasPrefix(out, "data: {\"id\":\"a\"}\n\n") || !strings.HasSuffix(out, want) || strings.Count(out, "\n\n\n") > 0 && strings.HasSuffix(cut, "\n\n") {
			t.Fatalf("a stream cut after %q reached the client as %q", cut, out)
		}
	}

	// What the router refuses itself.
	check("bad-json", "POST", "/v1/completions", `{"model":`, 400)
	check("unknown-model", "POST", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, 404)
	check("unknown-model-forwarded", "POST", "/v1/rerank", `{"model":"nope","query":"q","documents":["d"]}`, 404)
	check("unknown-model-retrieve", "GET", "/v1/models/nope", ``, 404)
	check("method", "GET", "/v1/embeddings", ``, 405)
	check("too-large", "POST", "/v1/completions", `{"model":"m","prompt":"`+strings.Repeat("x", 5000)+`"}`, 413)
	check("no-route", "POST", "/v1/nothing", `{}`, 404)
	check("models", "GET", "/v1/models", ``, 200)
	check("ready", "GET", "/ready", ``, 200)

	// The operator has the detail the clients were spared.
	if len(logs.Lines("no target could answer the request", "request_id=completions-no-target-answered", "last=")) == 0 {
		t.Fatal("the log does not name the targets a 502 tried")
	}
	var view struct {
		Health struct {
			Targets []struct {
				Target string           `json:"target"`
				Last   *upstreamFailure `json:"last_upstream_error"`
			} `json:"targets"`
		} `json:"health"`
	}
	adminDebugTargets(t, r, &view)
	if len(view.Health.Targets) != 2 {
		t.Fatalf("debug targets: %d, want 2", len(view.Health.Targets))
	}
	for _, tg := range view.Health.Targets {
		if l := tg.Last; l == nil || l.Detail == "" || l.RequestID == "" || l.Reason == "" {
			t.Fatalf("%s: last upstream error %+v", tg.Target, l)
		}
	}

	// No pod left.
	for _, p := range pods {
		p.srv.Close()
	}
	waitFor(t, "pods down", func() bool { return routableCount(r, "m") == 0 })
	check("no-routable-target", "POST", "/v1/completions", `{"model":"m","prompt":"hi"}`, 503)
	check("no-routable-target-forwarded", "POST", "/classify", `{"model":"m","input":"hi"}`, 503)
	check("no-routable-target-version", "GET", "/version", ``, 503)
	check("ready-none", "GET", "/ready", ``, 503)
	check("models-none", "GET", "/v1/models", ``, 200)
	t.Logf("%d answers checked", seen)
}
