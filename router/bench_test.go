package router

import (
	"fmt"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/targetid"
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

// benchSystemPrompt opens every benchmark conversation, as a deployment's
// system prompt does: every pod of the benchmark fleet holds its blocks.
var benchSystemPrompt = strings.Repeat("You are the operations assistant of an inference fleet. Answer precisely, cite the metric you rely on, and say when you are unsure. ", 12)

// chatBody builds a conversation of roughly 4k qwen3 tokens: the shared
// system prompt, then 20 turns. With cold set every turn's text is new
// (nothing for the tokenizer's segment cache); otherwise only the last turn
// changes, as in a live conversation.
func chatBody(i int, cold bool) []byte {
	msgs := []string{fmt.Sprintf(`{"role":"system","content":%q}`, benchSystemPrompt)}
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
			tag+strings.Repeat(fmt.Sprintf("Turn %d discusses prefix caching, block hashes and routing. ", turn), 12)))
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
	_, err := doPostTimed(c, url, body)
	return err
}

// doPostTimed posts body and returns the router's decide time from its
// Server-Timing header (0 when absent: a pod answered directly).
func doPostTimed(c *fasthttp.Client, url string, body []byte) (time.Duration, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	req.Header.SetMethod(http.MethodPost)
	req.Header.SetContentType("application/json")
	req.SetBodyRaw(body)
	if err := c.Do(req, resp); err != nil {
		return 0, err
	}
	if resp.StatusCode() != 200 {
		return 0, fmt.Errorf("status %d: %s", resp.StatusCode(), resp.Body())
	}
	var decide time.Duration
	if v, ok := strings.CutPrefix(string(resp.Header.Peek("Server-Timing")), "route;dur="); ok {
		ms, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("Server-Timing %q: %w", v, err)
		}
		decide = time.Duration(ms * float64(time.Millisecond))
	}
	return decide, nil
}

// BenchmarkRouterOverhead measures, side by side in one run, the latency of
// the same request sent straight to a pod and through the router (precise
// policy: parse, tokenize, key, index lookup, score, proxy), one request at
// a time, and reports the added latency at p50 and p99, plus the router's
// decide time (arrival to dispatch, from its Server-Timing header) at p50
// and p99.
//
// The fleet is four pods that all hold the system prompt every
// conversation opens with. The chat cases differ in what pod A holds and
// what the router has seen: "held-seen" is a live conversation (A holds the
// prompt, the router tokenized the earlier turns); "held-unseen" is a
// conversation another router replica served until now (A holds it, this
// router's caches know none of its text); "new" is text no one has seen
// past the system prompt. The router reads a prompt until the decision is
// settled (the first block no pod holds, or once only the cheapest pod can
// hold the rest) and encodes the rest after dispatch. The pods' holdings
// are stored in the router's index directly, keyed by a separate tokenizer
// so the router's own caches stay as each case says. Direct requests go to
// pod A; routed ones wherever the router sends them (A when it holds the
// prompt; any pod, all alike, for new text).
func BenchmarkRouterOverhead(b *testing.B) {
	var pods []*fakePod
	var endpoints []string
	for _, name := range []string{"A", "B", "C", "D"} {
		p := newFakePod(b, name, 16, true)
		pods, endpoints = append(pods, p), append(endpoints, p.endpoint())
	}
	// Both policies that read the prompt, side by side: the speculative
	// one reads all of it before dispatch, so that its predictions cover
	// every block at once.
	for _, pol := range []brain.Policy{brain.PolicyPrecise, brain.PolicySpeculative} {
		b.Run(pol.String(), func(b *testing.B) { benchmarkOverhead(b, pods, endpoints, pol) })
	}
}

func benchmarkOverhead(b *testing.B, pods []*fakePod, endpoints []string, pol brain.Policy) {
	pod := pods[0]
	cfg := DefaultConfig()
	cfg.Policy = pol
	cfg.Events.BlockSize = 16
	cfg.DebugHeaders = true
	cfg.Health = fastHealth(endpoints...)
	// These pods compute nothing and announce nothing; the benchmark puts
	// their holdings in the index itself. Silence after new text would
	// make them stale (their confirmed runs would count half) ten seconds
	// in, so that judgment is put beyond the run.
	cfg.Events.StaleAfter = time.Hour
	spec := benchTokenizer(b)
	r := startRouter(b, cfg, spec)
	waitFor(b, "pods fresh", func() bool { return freshCount(r, "m") == len(pods) })
	waitFor(b, "block keys", func() bool { return r.ev.Keys() != nil })
	var holder targetid.ID
	var others []targetid.ID
	for _, t := range r.mon.Snapshot().Targets {
		if t.ID.Endpoint == pod.srv.URL {
			holder = t.ID
		} else {
			others = append(others, t.ID)
		}
	}
	client := &fasthttp.Client{MaxConnsPerHost: 64}

	podKeys := chatKeysAsPodsSee(b, r, spec)

	// Every pod holds the system prompt: the blocks two conversations share.
	k1, k2 := podKeys(chatBody(1, true)), podKeys(chatBody(2, true))
	shared := 0
	for shared < min(len(k1), len(k2)) && k1[shared] == k2[shared] {
		shared++
	}
	for _, id := range append(others, holder) {
		r.ev.Index().Store(id, kvindex.TierGPU, k1[:shared])
	}

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
	// Each case runs twice: against pods that answer at once, which leaves
	// all the router's work on the measured path, and against pods that
	// take 2 ms to answer, as a fast pod would take for a fully cached
	// prompt (vLLM takes longer), which the work the router does after
	// dispatch overlaps. Every run numbers its bodies apart, so "unseen"
	// stays unseen.
	runs := 0
	for _, mode := range []struct {
		name string
		path string
		body func(int) []byte
		held bool
	}{
		{"completion-4k-token-ids", "/v1/completions", ids, false},
		{"chat-4k-held-seen", "/v1/chat/completions", func(i int) []byte { return chatBody(i, false) }, true},
		{"chat-4k-held-unseen", "/v1/chat/completions", func(i int) []byte { return chatBody(i, true) }, true},
		{"chat-4k-new", "/v1/chat/completions", func(i int) []byte { return chatBody(-i, true) }, false},
	} {
		for _, prefill := range []time.Duration{0, 2 * time.Millisecond} {
			for _, p := range pods {
				p.setHandler(func(w http.ResponseWriter, req *http.Request) {
					time.Sleep(prefill)
					p.echo(w, req)
				})
			}
			name := mode.name + "/instant-pod"
			if prefill > 0 {
				name = fmt.Sprintf("%s/pod-%v", mode.name, prefill)
			}
			runs++
			first := runs * 1_000_000
			b.Run(name, func(b *testing.B) {
				d := dryRunBody(b, r, mode.path, mode.body(first))
				direct, routed := pod.srv.URL+mode.path, "http://"+r.Addr()+mode.path
				var dl, rl, decide []time.Duration
				var lookedUp int
				// Bodies, and the keys the pod holds for them, are made a
				// round at a time and the garbage collected before the
				// round is sent, so that neither the pod side's work nor
				// its garbage lands on the router's requests. The pod
				// stores a batch's keys just before the batch goes out.
				const round, batch = 256, 16
				var bodies [][]byte
				var held, stored [][]kvindex.Key
				forget := func() {
					for _, keys := range stored {
						r.ev.Index().Remove(holder, kvindex.TierGPU, keys)
					}
					stored = stored[:0]
				}
				i := 0
				for b.Loop() {
					if i%round == 0 {
						bodies, held = bodies[:0], held[:0]
						for j := range round {
							body := mode.body(first + i + j + 1)
							bodies = append(bodies, body)
							if mode.held {
								held = append(held, podKeys(body))
							}
						}
						runtime.GC()
					}
					if mode.held && i%batch == 0 {
						// A pod evicts old conversations as it takes new
						// ones, and says so: the batch before leaves pod
						// A as this one arrives. Its placements stay well
						// within the index's cap, whose oldest-first
						// eviction is only a safety net for missed
						// removals and would take the system prompt.
						forget()
						stored = append(stored, held[i%round:i%round+batch]...)
						for _, keys := range stored {
							r.ev.Index().Store(holder, kvindex.TierGPU, keys)
						}
					}
					body := bodies[i%round]
					i++
					t0 := time.Now()
					if err := doPost(client, direct, body); err != nil {
						b.Fatal(err)
					}
					t1 := time.Now()
					dec, err := doPostTimed(client, routed, body)
					if err != nil {
						b.Fatal(err)
					}
					t2 := time.Now()
					// The router encodes the rest of a prompt after the
					// response; the next pair starts once that is done, so
					// that it is measured against a quiet router (its cost
					// shows in BenchmarkRouterThroughput).
					r.tails.Wait()
					dl, rl, decide = append(dl, t1.Sub(t0)), append(rl, t2.Sub(t1)), append(decide, dec)
					if mode.held && i == 1 {
						lookedUp = dryRunBody(b, r, mode.path, body).LookedUpBlocks
					}
				}
				forget()
				for _, t := range r.mon.Snapshot().Targets {
					if v := r.ev.Freshness(t.ID); v.Verdict != eventplane.VerdictFresh {
						b.Fatalf("%s: event stream %s (%s): the case did not run against the index it claims", t.ID.Endpoint, v.Verdict, v.Detail)
					}
				}
				us := func(d time.Duration) float64 { return float64(d) / 1e3 }
				b.ReportMetric(float64(d.PromptTokens), "prompt-tokens")
				if mode.held {
					b.ReportMetric(float64(lookedUp), "looked-up-blocks")
				} else {
					b.ReportMetric(float64(d.LookedUpBlocks), "looked-up-blocks")
				}
				b.ReportMetric(us(percentile(decide, 0.5)), "decide-p50-us")
				b.ReportMetric(us(percentile(decide, 0.99)), "decide-p99-us")
				b.ReportMetric(us(percentile(dl, 0.5)), "direct-p50-us")
				b.ReportMetric(us(percentile(rl, 0.5)), "routed-p50-us")
				b.ReportMetric(us(percentile(rl, 0.5)-percentile(dl, 0.5)), "added-p50-us")
				b.ReportMetric(us(percentile(dl, 0.99)), "direct-p99-us")
				b.ReportMetric(us(percentile(rl, 0.99)), "routed-p99-us")
				b.ReportMetric(us(percentile(rl, 0.99)-percentile(dl, 0.99)), "added-p99-us")
			})
		}
	}
}

// dryRunBody asks the admin listener's dry run about body.
func dryRunBody(b *testing.B, r *Router, path string, body []byte) DryRun {
	return dryRun(b, r, path, string(body))
}

// BenchmarkRouterThroughput is the most small requests per second the
// router sustains on this machine (client, router and pod share its cores),
// next to the same load sent straight to the pod.
func BenchmarkRouterThroughput(b *testing.B) {
	pod := newFakePod(b, "A", 16, false)
	cfg := DefaultConfig()
	cfg.Policy = brain.PolicyPrecise
	cfg.Events.BlockSize = 16
	cfg.Health = fastHealth(pod.endpoint())
	r := startRouter(b, cfg, "m=bytes")
	waitFor(b, "pod routable", func() bool { return routableCount(r, "m") == 1 })
	body := []byte(`{"model":"m","prompt":"Say hello to the fleet operator in one short sentence.","max_tokens":8}`)
	for _, tc := range []struct{ name, url string }{
		{"direct", pod.srv.URL + "/v1/completions"},
		{"routed", "http://" + r.Addr() + "/v1/completions"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			client := &fasthttp.Client{MaxConnsPerHost: 256}
			var failed atomic.Int64
			b.SetParallelism(8)
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := doPost(client, tc.url, body); err != nil {
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
