package router

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prefixrouter/prefixrouter/brain"
)

func TestPrefillAndDecodeBodies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, client string
		want         map[string]any // members of the prefill body; nil: absent
	}{
		{"completions streamed", `{"model":"m","prompt":"hi","stream":true,"stream_options":{"include_usage":true},"max_tokens":50,"min_tokens":5}`,
			map[string]any{"stream": false, "max_tokens": 1.0, "stream_options": nil, "min_tokens": nil, "prompt": "hi"}},
		{"chat with max_completion_tokens", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":80,"min_completion_tokens":2}`,
			map[string]any{"stream": false, "max_tokens": 1.0, "max_completion_tokens": 1.0, "min_completion_tokens": nil}},
		{"client's own kv_transfer_params replaced", `{"model":"m","prompt":"hi","kv_transfer_params":{"do_remote_prefill":true}}`,
			map[string]any{"max_tokens": 1.0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := prefillBody([]byte(tc.client))
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]any
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatalf("prefill body is not JSON: %v: %s", err, b)
			}
			for k, want := range tc.want {
				v, ok := got[k]
				if want == nil {
					if ok {
						t.Errorf("%s = %v, want it removed", k, v)
					}
					continue
				}
				if fmt.Sprint(v) != fmt.Sprint(want) {
					t.Errorf("%s = %v, want %v", k, v, want)
				}
			}
			kv, _ := got["kv_transfer_params"].(map[string]any)
			if kv["do_remote_decode"] != true || kv["do_remote_prefill"] != false {
				t.Errorf("kv_transfer_params = %v, want a remote decode asked for", got["kv_transfer_params"])
			}
			for _, k := range []string{"remote_engine_id", "remote_block_ids", "remote_host", "remote_port"} {
				if v, ok := kv[k]; !ok || v != nil {
					t.Errorf("kv_transfer_params.%s = %v (present %v), want null", k, v, ok)
				}
			}

			u, params := prefillAnswer([]byte(`{"id":"x","choices":[],"usage":{"prompt_tokens":40,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":32}},"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"e1","remote_block_ids":[3,4],"remote_host":"10.0.0.1","remote_port":5600,"tp_size":1}}`))
			if !u.cachedKnown || u.cachedTokens != 32 {
				t.Errorf("prefill answer's usage %+v, want 32 cached tokens", u)
			}
			if params == nil {
				t.Fatal("no kv_transfer_params read from the prefill answer")
			}
			d, err := withTransferParams([]byte(tc.client), params)
			if err != nil {
				t.Fatal(err)
			}
			var dec, client map[string]any
			_ = json.Unmarshal(d, &dec)
			_ = json.Unmarshal([]byte(tc.client), &client)
			kv, _ = dec["kv_transfer_params"].(map[string]any)
			if kv["remote_engine_id"] != "e1" || fmt.Sprint(kv["remote_block_ids"]) != "[3 4]" || kv["do_remote_prefill"] != true {
				t.Errorf("decode body's kv_transfer_params = %v", dec["kv_transfer_params"])
			}
			delete(dec, "kv_transfer_params")
			delete(client, "kv_transfer_params")
			if fmt.Sprint(dec) != fmt.Sprint(client) {
				t.Errorf("decode body %v, want the client's %v", dec, client)
			}
		})
	}
	for _, answer := range []string{`{"choices":[]}`, `{"kv_transfer_params":null}`, `{"kv_transfer_params":[1]}`, `not json`} {
		if _, p := prefillAnswer([]byte(answer)); p != nil {
			t.Errorf("prefillAnswer(%s) = %s, want no parameters", answer, p)
		}
	}
}

// pdPods is a disaggregated fleet of fake pods: prefill pods answering as
// vLLM's NixlConnector does with do_remote_decode, and decode pods
// recording the kv_transfer_params they get.
type pdPods struct {
	prefill, decode []*fakePod
	mu              sync.Mutex
	decodeParams    []map[string]any // per decode request, nil when absent
}

func newPDPods(t *testing.T, nPrefill, nDecode int) *pdPods {
	f := &pdPods{}
	for i := range nPrefill {
		p := newFakePod(t, fmt.Sprintf("prefill%d", i), 16, false)
		p.setHandler(f.prefillAnswer(t, p.name))
		f.prefill = append(f.prefill, p)
	}
	for i := range nDecode {
		p := newFakePod(t, fmt.Sprintf("decode%d", i), 16, false)
		p.setHandler(f.decodeAnswer(p.name))
		f.decode = append(f.decode, p)
	}
	return f
}

func (f *pdPods) endpoints() []string {
	var eps []string
	for _, p := range f.prefill {
		eps = append(eps, p.endpoint()+"&role=prefill")
	}
	for _, p := range f.decode {
		eps = append(eps, p.endpoint()+"&role=decode")
	}
	return eps
}

// prefillAnswer checks the prefill request and answers where its blocks
// are.
func (f *pdPods) prefillAnswer(t *testing.T, name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req map[string]any
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Errorf("prefill request: %v", err)
		}
		kv, _ := req["kv_transfer_params"].(map[string]any)
		if req["stream"] != false || req["max_tokens"] != 1.0 || kv["do_remote_decode"] != true {
			t.Errorf("prefill request %v: want stream false, max_tokens 1, do_remote_decode", req)
		}
		if ae := r.Header.Get("Accept-Encoding"); ae != "" {
			t.Errorf("prefill request asks Accept-Encoding %q: the router reads the answer", ae)
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"p","object":"text_completion","choices":[{"index":0,"text":"x","finish_reason":"length"}],`+
			`"usage":{"prompt_tokens":40,"completion_tokens":1,"total_tokens":41,"prompt_tokens_details":{"cached_tokens":32}},`+
			`"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2],"remote_engine_id":%q,"remote_host":"h","remote_port":1,"tp_size":1}}`, name)
	}
}

// decodeAnswer records the request's kv_transfer_params and streams an
// answer naming the pod.
func (f *pdPods) decodeAnswer(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req map[string]any
		_ = json.NewDecoder(r.Body).Decode(&req)
		kv, _ := req["kv_transfer_params"].(map[string]any)
		f.mu.Lock()
		f.decodeParams = append(f.decodeParams, kv)
		f.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":%q}]}\n\n", name)
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":3,\"total_tokens\":43,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\ndata: [DONE]\n\n")
	}
}

func (f *pdPods) lastDecodeParams() map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.decodeParams) == 0 {
		return nil
	}
	return f.decodeParams[len(f.decodeParams)-1]
}

const pdStreamBody = `{"model":"m","prompt":"tell me a long story about a router","stream":true,"max_tokens":30}`

func startPDRouter(t *testing.T, f *pdPods, tune func(*Config)) *Router {
	cfg := DefaultConfig()
	cfg.Policy = brain.PolicyRoundRobin
	cfg.DebugHeaders = true
	cfg.Health = fastHealth(f.endpoints()...)
	cfg.Health.BreakerFailures = 1000
	if tune != nil {
		tune(&cfg)
	}
	r := startRouter(t, cfg)
	waitFor(t, "every pod routable", func() bool { return routableCount(r, "m") == len(f.prefill)+len(f.decode) })
	return r
}

func disaggCount(t *testing.T, r *Router, outcome string) float64 {
	return metricValue(t, r, `prefixrouter_disaggregation_total{model="m",outcome="`+outcome+`"}`)
}

// TestDisaggregatedRequest: a request of a model with prefill pods is
// prefilled on a prefill pod and decoded on a decode pod, with the
// prefill pod's kv_transfer_params; the client gets the decode pod's
// stream and the outcome metrics the prefill pod's cached tokens.
func TestDisaggregatedRequest(t *testing.T) {
	t.Parallel()
	f := newPDPods(t, 2, 2)
	alog := filepath.Join(t.TempDir(), "access.log")
	r := startPDRouter(t, f, func(c *Config) { c.AccessLog = alog })
	for i := range 4 {
		code, hdr, b := post(t, "http://"+r.Addr()+"/v1/completions", pdStreamBody)
		if code != 200 || !strings.Contains(string(b), "decode") || !strings.Contains(string(b), "[DONE]") {
			t.Fatalf("request %d: status %d body %s", i, code, b)
		}
		if tgt := hdr.Get("X-Prefixrouter-Target"); tgt != targetName(f.decode[0].srv.URL) && tgt != targetName(f.decode[1].srv.URL) {
			t.Fatalf("request %d: X-Prefixrouter-Target %s, want a decode pod", i, tgt)
		}
		if tgt := hdr.Get("X-Prefixrouter-Prefill-Target"); tgt != targetName(f.prefill[0].srv.URL) && tgt != targetName(f.prefill[1].srv.URL) {
			t.Fatalf("request %d: X-Prefixrouter-Prefill-Target %s, want a prefill pod", i, tgt)
		}
		kv := f.lastDecodeParams()
		if kv == nil || kv["do_remote_prefill"] != true || !strings.HasPrefix(fmt.Sprint(kv["remote_engine_id"]), "prefill") {
			t.Fatalf("request %d: decode pod got kv_transfer_params %v, want the prefill pod's", i, kv)
		}
	}
	for _, p := range f.prefill {
		if p.hits.Load() != 2 {
			t.Errorf("%s took %d prefills, want 2 (round-robin over the prefill pods)", p.name, p.hits.Load())
		}
	}
	if n := f.decode[0].hits.Load() + f.decode[1].hits.Load(); n != 4 {
		t.Errorf("decode pods took %d requests, want 4", n)
	}
	if n := disaggCount(t, r, pdSplit); n != 4 {
		t.Errorf("split requests counted %v, want 4", n)
	}
	// The prompt's cache outcome is the prefill pod's answer (32 cached).
	var reported float64
	for _, p := range f.prefill {
		reported += metricValue(t, r, `prefixrouter_reported_cached_tokens_total{model="m",policy="round-robin",target="`+targetName(p.srv.URL)+`"}`)
	}
	if reported != 4*32 {
		t.Errorf("reported cached tokens on the prefill pods %v, want %d", reported, 4*32)
	}
	// Forwarded endpoints never reach a prefill pod.
	for range 4 {
		if code, _, b := post(t, "http://"+r.Addr()+"/v1/embeddings", `{"model":"m","input":"x"}`); code != 200 {
			t.Fatalf("embeddings: %d %s", code, b)
		}
	}
	for _, p := range f.prefill {
		if p.forwardHits.Load() != 0 {
			t.Errorf("%s got %d forwarded requests", p.name, p.forwardHits.Load())
		}
	}
	// The access line names both pods and the prefill pod's cached tokens.
	waitFor(t, "the access lines", func() bool {
		b, _ := os.ReadFile(alog)
		return strings.Count(string(b), "\n") >= 8
	})
	b, _ := os.ReadFile(alog)
	first := strings.SplitN(string(b), "\n", 2)[0]
	var line accessLine
	if err := json.Unmarshal([]byte(first), &line); err != nil {
		t.Fatal(err)
	}
	if line.PrefillTarget == "" || line.PrefillTarget == line.Target || line.ReportedCachedTokens == nil || *line.ReportedCachedTokens != 32 {
		t.Errorf("access line %s: want the prefill pod and its 32 cached tokens beside the decode pod", first)
	}
	d := dryRun(t, r, "/v1/completions", pdStreamBody)
	isPod := func(url string, pods []*fakePod) bool {
		return slices.ContainsFunc(pods, func(p *fakePod) bool { return p.srv.URL == url })
	}
	if d.Decision.Decode == nil || !isPod(d.Decision.Target, f.prefill) || !isPod(d.Decision.Decode.Target, f.decode) {
		t.Fatalf("dry run decision %+v: want a prefill target and a decode target", d.Decision)
	}
	for _, c := range d.Candidates {
		for _, p := range f.decode {
			if c.Target == p.srv.URL {
				t.Errorf("dry run's candidates include decode pod %s: they are the prefill pods", c.Target)
			}
		}
	}
}

// TestDisaggregatedFallbacks: what happens when the prefill stage cannot
// hand a request over, each counted by its outcome.
func TestDisaggregatedFallbacks(t *testing.T) {
	t.Parallel()
	status := func(code int) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			fmt.Fprintf(w, `{"error":{"message":"status %d","type":"X","code":%d}}`, code, code)
		}
	}
	for _, tc := range []struct {
		name    string
		prefill []func(*testing.T, *pdPods) http.HandlerFunc // per prefill pod; nil: a good one
		tune    func(*Config)
		body    string
		code    int
		outcome string
		// params: the decode pod got kv_transfer_params
		params bool
		// decoded: the decode pod was reached
		decoded bool
	}{
		{name: "one prefill pod fails, the other computes", code: 200, outcome: pdSplit, params: true, decoded: true,
			prefill: []func(*testing.T, *pdPods) http.HandlerFunc{func(*testing.T, *pdPods) http.HandlerFunc { return status(503) }, nil}},
		{name: "every prefill pod fails", code: 200, outcome: pdPrefillFailed, decoded: true,
			prefill: []func(*testing.T, *pdPods) http.HandlerFunc{
				func(*testing.T, *pdPods) http.HandlerFunc { return status(503) },
				func(*testing.T, *pdPods) http.HandlerFunc { return status(500) }}},
		{name: "prefill pod without a connector", code: 200, outcome: pdNoTransferParams, decoded: true,
			prefill: []func(*testing.T, *pdPods) http.HandlerFunc{
				func(_ *testing.T, f *pdPods) http.HandlerFunc { return f.prefill[0].echo },
				func(_ *testing.T, f *pdPods) http.HandlerFunc { return f.prefill[1].echo }}},
		{name: "prefill pod refuses the request", code: 400, outcome: "",
			prefill: []func(*testing.T, *pdPods) http.HandlerFunc{
				func(*testing.T, *pdPods) http.HandlerFunc { return status(400) },
				func(*testing.T, *pdPods) http.HandlerFunc { return status(400) }}},
		{name: "short prompt", code: 200, outcome: pdShortPrompt, decoded: true,
			tune: func(c *Config) { c.PDThreshold = 1000 }},
		{name: "batch prompt", code: 200, outcome: pdNotSplittable, decoded: true,
			body: `{"model":"m","prompt":["one","two"],"max_tokens":3}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newPDPods(t, 2, 1)
			for i, h := range tc.prefill {
				if h != nil {
					f.prefill[i].setHandler(h(t, f))
				}
			}
			r := startPDRouter(t, f, tc.tune)
			body := tc.body
			if body == "" {
				body = pdStreamBody
			}
			code, _, b := post(t, "http://"+r.Addr()+"/v1/completions", body)
			if code != tc.code {
				t.Fatalf("status %d, want %d: %s", code, tc.code, b)
			}
			if code == 200 && !strings.Contains(string(b), "decode0") {
				t.Errorf("answer %s, want the decode pod's", b)
			}
			if got := f.decode[0].hits.Load() > 0; got != tc.decoded {
				t.Errorf("decode pod reached: %v, want %v", got, tc.decoded)
			}
			if got := f.lastDecodeParams() != nil; got != tc.params {
				t.Errorf("decode pod got kv_transfer_params: %v, want %v", got, tc.params)
			}
			if tc.outcome != "" {
				if n := disaggCount(t, r, tc.outcome); n != 1 {
					t.Errorf("outcome %s counted %v, want 1", tc.outcome, n)
				}
			}
			if tc.outcome == pdNoTransferParams {
				var n float64
				for _, p := range f.prefill {
					n += metricValue(t, r, `prefixrouter_upstream_errors_total{reason="no_kv_transfer_params",target="`+targetName(p.srv.URL)+`"}`)
				}
				if n != 1 {
					t.Errorf("no_kv_transfer_params upstream errors %v, want 1 (the pod's wiring fault is visible)", n)
				}
			}
		})
	}
}

// FuzzSplitBodies: a valid JSON body the prefill rewrite takes becomes a
// JSON object asking one token with a remote decode, and the decode body
// adds the prefill pod's parameters to it; whatever a pod answers, reading
// its kv_transfer_params gives a valid object or nothing. Never a panic.
// (A body that is not valid JSON, which the router's parser may let
// through in members it does not read, reaches the pods no better than it
// came, and they refuse it.)
func FuzzSplitBodies(f *testing.F) {
	f.Add([]byte(`{"model":"m","prompt":"hi","stream":true,"stream_options":{"include_usage":true}}`), []byte(`{"kv_transfer_params":{"remote_engine_id":"e","remote_block_ids":[1,2]}}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":"x"}],"max_completion_tokens":9,"min_tokens":2}`), []byte(`{"kv_transfer_params":null}`))
	f.Add([]byte(`[1,2]`), []byte(`{"kv_transfer_params":[]}`))
	f.Add([]byte(`{"a":1,"a":2}`), []byte(`garbage`))
	f.Fuzz(func(t *testing.T, client, answer []byte) {
		valid := json.Valid(client)
		if b, err := prefillBody(client); err == nil && valid {
			var got map[string]any
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatalf("prefill body %q of %q is not a JSON object: %v", b, client, err)
			}
			kv, _ := got["kv_transfer_params"].(map[string]any)
			if got["max_tokens"] != 1.0 || got["stream"] != false || kv["do_remote_decode"] != true {
				t.Fatalf("prefill body %q of %q", b, client)
			}
		}
		_, params := prefillAnswer(answer)
		if params == nil {
			return
		}
		var kv map[string]any
		if err := json.Unmarshal(params, &kv); err != nil {
			t.Fatalf("kv_transfer_params %q of %q is not an object: %v", params, answer, err)
		}
		d, err := withTransferParams(client, params)
		if err != nil || !valid {
			return
		}
		var dec map[string]any
		if err := json.Unmarshal(d, &dec); err != nil {
			t.Fatalf("decode body %q is not JSON: %v", d, err)
		}
		if _, ok := dec["kv_transfer_params"].(map[string]any); !ok {
			t.Fatalf("decode body %q without the prefill pod's parameters", d)
		}
	})
}

// TestStageQuestions pins what each stage of a request answers to the
// questions the attempt asks of it.
func TestStageQuestions(t *testing.T) {
	type answers struct{ tail, prompt, routerTime, loads, uncached, events, outcome bool }
	for _, tc := range []struct {
		name string
		s    stage
		want answers
	}{
		{"whole", stageWhole, answers{tail: true, prompt: true, routerTime: true, uncached: true, events: true, outcome: true}},
		{"prefill", stagePrefill, answers{tail: true, prompt: true, routerTime: true, uncached: true, events: true}},
		{"decode", stageDecode, answers{loads: true, outcome: true}},
		{"decode alone", stageDecodeAlone, answers{uncached: true, events: true, outcome: true}},
	} {
		s := tc.s
		got := answers{s.usesTail(), s.carriesPrompt(), s.routerTime(), s.loadsPrompt(), s.booksUncached(), s.expectsEvents(), s.recordsOutcome()}
		if got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
