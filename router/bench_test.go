package router

import (
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// benchTokenizer is the real qwen3 tokenizer when `make testdata` fetched it
// (the overhead goal includes tokenization), else the built-in bytes model.
func benchTokenizer(b *testing.B) string {
	const dir = "../testdata/tokenizers/models/qwen3"
	if _, err := os.Stat(dir + "/tokenizer.json"); err == nil {
		return "m=" + dir
	}
	b.Logf("qwen3 tokenizer not fetched (make testdata): using the bytes model")
	return "m=bytes"
}

// chatBody builds a 20-turn conversation of roughly 4k qwen3 tokens. With
// cold set every turn's text is new (nothing for the tokenizer's segment
// cache); otherwise only the last turn changes, as in a live conversation.
func chatBody(i int, cold bool) []byte {
	var msgs []string
	for turn := 0; turn < 20; turn++ {
		tag := ""
		if cold || turn == 19 {
			tag = fmt.Sprintf("[req %d] ", i)
		}
		role := "user"
		if turn%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, fmt.Sprintf(`{"role":%q,"content":%q}`, role,
			tag+strings.Repeat(fmt.Sprintf("Turn %d discusses prefix caching, block hashes and routing. ", turn), 14)))
	}
	return []byte(`{"model":"m","max_tokens":1,"messages":[` + strings.Join(msgs, ",") + `]}`)
}

func percentile(xs []time.Duration, q float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func doPost(c *fasthttp.Client, url string, body []byte) error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	req.Header.SetMethod(http.MethodPost)
	req.Header.SetContentType("application/json")
	req.SetBodyRaw(body)
	if err := c.Do(req, resp); err != nil {
		return err
	}
	if resp.StatusCode() != 200 {
		return fmt.Errorf("status %d: %s", resp.StatusCode(), resp.Body())
	}
	return nil
}

// BenchmarkRouterOverhead measures, side by side in one run, the latency of
// the same request sent straight to a pod and through the router (precise
// policy: parse, tokenize, key, index lookup, score, proxy), one request at
// a time, and reports the added latency at p50 and p99.
func BenchmarkRouterOverhead(b *testing.B) {
	pod := newFakePod(b, "A", 16, false)
	cfg := DefaultConfig()
	cfg.Policy = PolicyPrecise
	cfg.BlockSize = 16
	cfg.Health = fastHealth(pod.endpoint())
	r := startRouter(b, cfg, benchTokenizer(b))
	waitFor(b, "pod routable", func() bool { return routableCount(r, "m") == 1 })
	client := &fasthttp.Client{MaxConnsPerHost: 64}

	ids := func(i int) []byte {
		// A 4,096-token prompt given as token ids: no tokenization, so this
		// is the router's own cost (parse, keys, lookup, score, proxy).
		var sb strings.Builder
		fmt.Fprintf(&sb, `{"model":"m","max_tokens":1,"prompt":[%d`, i)
		for j := 1; j < 4096; j++ {
			fmt.Fprintf(&sb, ",%d", 1000+j)
		}
		sb.WriteString("]}")
		return []byte(sb.String())
	}
	for _, mode := range []struct {
		name string
		path string
		body func(int) []byte
	}{
		{"completion-4k-token-ids", "/v1/completions", ids},
		{"chat-4k-multiturn", "/v1/chat/completions", func(i int) []byte { return chatBody(i, false) }},
		{"chat-4k-cold", "/v1/chat/completions", func(i int) []byte { return chatBody(i, true) }},
	} {
		b.Run(mode.name, func(b *testing.B) {
			ep := EndpointChat
			if mode.path == "/v1/completions" {
				ep = EndpointCompletions
			}
			var tokens int
			if pl, aerr := r.plan(b.Context(), parseOrFail(b, ep, mode.body(0)), true); aerr == nil {
				tokens = pl.tokens.count
			}
			direct, routed := pod.srv.URL+mode.path, "http://"+r.Addr()+mode.path
			sum0, n0 := routingSeconds(b, r)
			var dl, rl []time.Duration
			i := 0
			for b.Loop() {
				i++
				body := mode.body(i)
				t0 := time.Now()
				if err := doPost(client, direct, body); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := doPost(client, routed, body); err != nil {
					b.Fatal(err)
				}
				t2 := time.Now()
				dl, rl = append(dl, t1.Sub(t0)), append(rl, t2.Sub(t1))
			}
			us := func(d time.Duration) float64 { return float64(d) / 1e3 }
			sum1, n1 := routingSeconds(b, r)
			if n1 > n0 {
				// Arrival to dispatch: parse, tokenize, key, look up, score.
				b.ReportMetric((sum1-sum0)/float64(n1-n0)*1e6, "decide-mean-us")
			}
			b.ReportMetric(float64(tokens), "prompt-tokens")
			b.ReportMetric(us(percentile(dl, 0.5)), "direct-p50-us")
			b.ReportMetric(us(percentile(rl, 0.5)), "routed-p50-us")
			b.ReportMetric(us(percentile(rl, 0.5)-percentile(dl, 0.5)), "added-p50-us")
			b.ReportMetric(us(percentile(dl, 0.99)), "direct-p99-us")
			b.ReportMetric(us(percentile(rl, 0.99)), "routed-p99-us")
			b.ReportMetric(us(percentile(rl, 0.99)-percentile(dl, 0.99)), "added-p99-us")
		})
	}
}

func parseOrFail(b *testing.B, ep Endpoint, body []byte) *Request {
	r := new(Request)
	if err := ParseRequest(ep, body, r); err != nil {
		b.Fatal(err)
	}
	return r
}

// BenchmarkRouterThroughput is the most small requests per second the
// router sustains on this machine (client, router and pod share its cores),
// next to the same load sent straight to the pod.
func BenchmarkRouterThroughput(b *testing.B) {
	pod := newFakePod(b, "A", 16, false)
	cfg := DefaultConfig()
	cfg.Policy = PolicyPrecise
	cfg.BlockSize = 16
	cfg.Health = fastHealth(pod.endpoint())
	r := startRouter(b, cfg, "m=bytes")
	waitFor(b, "pod routable", func() bool { return routableCount(r, "m") == 1 })
	body := []byte(`{"model":"m","prompt":"Say hello to the fleet operator in one short sentence.","max_tokens":8}`)
	for _, target := range []struct{ name, url string }{
		{"direct", pod.srv.URL + "/v1/completions"},
		{"routed", "http://" + r.Addr() + "/v1/completions"},
	} {
		b.Run(target.name, func(b *testing.B) {
			client := &fasthttp.Client{MaxConnsPerHost: 256}
			var failed atomic.Int64
			b.SetParallelism(8)
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := doPost(client, target.url, body); err != nil {
						failed.Add(1)
					}
				}
			})
			if n := failed.Load(); n > 0 {
				b.Fatalf("%d requests failed", n)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
		})
	}
}

// routingSeconds reads the sum and count of prefixrouter_routing_seconds.
func routingSeconds(b *testing.B, r *Router) (float64, uint64) {
	mfs, err := r.reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "prefixrouter_routing_seconds" {
			continue
		}
		var sum float64
		var n uint64
		for _, m := range mf.GetMetric() {
			sum += m.GetHistogram().GetSampleSum()
			n += m.GetHistogram().GetSampleCount()
		}
		return sum, n
	}
	return 0, 0
}
