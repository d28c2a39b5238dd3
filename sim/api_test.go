package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

type completionBody struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int     `json:"index"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
		Message      *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		TotalTokens         int `json:"total_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func decodeBody(t *testing.T, raw []byte) completionBody {
	t.Helper()
	var b completionBody
	if err := json.Unmarshal(raw, &b); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
	return b
}

func TestCompletionsNonStreaming(t *testing.T) {
	f := startTestFleet(t, Config{TimeScale: 50})
	pod := f.Pods[0]
	prompt := strings.Repeat("the quick brown fox ", 5) // 100 bytes + BOS
	code, hdr, raw := post(t, pod.URL()+"/v1/completions", map[string]any{"model": "sim-test", "prompt": prompt, "max_tokens": 12}, "X-Request-Id", "abc")
	if code != 200 {
		t.Fatalf("%d %s", code, raw)
	}
	if hdr.Get("X-Sim-Time-Scale") != "50" || hdr.Get("X-Request-Id") != "abc" {
		t.Fatalf("headers %v", hdr)
	}
	b := decodeBody(t, raw)
	if b.Object != "text_completion" || b.Model != "sim-test" || len(b.Choices) != 1 || b.ID != "cmpl-abc" {
		t.Fatalf("body %s", raw)
	}
	if c := b.Choices[0]; c.Text != lorem[:12] || c.FinishReason == nil || *c.FinishReason != "length" {
		t.Fatalf("choice %+v", c)
	}
	u := b.Usage
	if u == nil || u.PromptTokens != 101 || u.CompletionTokens != 12 || u.TotalTokens != 113 || u.PromptTokensDetails == nil || u.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("usage %s", raw)
	}
	// Repeat: 100 of 101 tokens are in full blocks (6 × 16 = 96).
	_, _, raw = post(t, pod.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1})
	if got := cachedTokens(t, raw); got != 96 {
		t.Fatalf("repeat cached %d, want 96", got)
	}
}

func TestCacheSaltAndLoRAChangeHashes(t *testing.T) {
	f := startTestFleet(t, Config{LoRAs: []string{"sql-lora"}})
	url := f.Pods[0].URL() + "/v1/completions"
	prompt := tokenRange(0, 64)
	tests := []struct {
		name string
		body map[string]any
		want int
	}{
		{"first plain", map[string]any{"prompt": prompt}, 0},
		{"plain again", map[string]any{"prompt": prompt}, 48},
		{"salted: different chain", map[string]any{"prompt": prompt, "cache_salt": "tenant-a"}, 0},
		{"same salt", map[string]any{"prompt": prompt, "cache_salt": "tenant-a"}, 48},
		{"other salt", map[string]any{"prompt": prompt, "cache_salt": "tenant-b"}, 0},
		{"lora adapter", map[string]any{"prompt": prompt, "model": "sql-lora"}, 0},
		{"lora again", map[string]any{"prompt": prompt, "model": "sql-lora"}, 48},
	}
	for _, tc := range tests {
		tc.body["max_tokens"] = 1
		code, _, raw := post(t, url, tc.body)
		if code != 200 {
			t.Fatalf("%s: %d %s", tc.name, code, raw)
		}
		if got := cachedTokens(t, raw); got != tc.want {
			t.Fatalf("%s: cached %d, want %d", tc.name, got, tc.want)
		}
	}
}

// sse reads a streaming response's data events.
func sse(t *testing.T, resp *http.Response) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "data: ") {
			out = append(out, strings.TrimPrefix(line, "data: "))
		} else if line != "" {
			t.Fatalf("unexpected SSE line %q", line)
		}
	}
	return out
}

func streamPost(t *testing.T, ctx context.Context, url string, body any) *http.Response {
	t.Helper()
	raw, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("stream: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return resp
}

func TestStreaming(t *testing.T) {
	tests := []struct {
		name  string
		path  string
		body  map[string]any
		usage bool
	}{
		{"completions with usage", "/v1/completions", map[string]any{"prompt": "hello world, hello world", "max_tokens": 8, "stream": true, "stream_options": map[string]any{"include_usage": true}}, true},
		{"completions without usage", "/v1/completions", map[string]any{"prompt": "hello", "max_tokens": 8, "stream": true}, false},
		{"chat with usage", "/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": "hi there"}}, "max_tokens": 8, "stream": true, "stream_options": map[string]any{"include_usage": true}}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := startTestFleet(t, Config{})
			resp := streamPost(t, context.Background(), f.Pods[0].URL()+tc.path, tc.body)
			defer resp.Body.Close()
			evs := sse(t, resp)
			// Tokens may coalesce into one chunk: at least one chunk, then [DONE].
			if len(evs) < 2 || evs[len(evs)-1] != "[DONE]" {
				t.Fatalf("events %q", evs)
			}
			chat := strings.Contains(tc.path, "chat")
			text, finish := "", ""
			var usageSeen bool
			for i, e := range evs[:len(evs)-1] {
				b := decodeBody(t, []byte(e))
				if b.Usage != nil {
					if len(b.Choices) != 0 || i != len(evs)-2 {
						t.Fatalf("usage chunk must be last and have no choices: %s", e)
					}
					if b.Usage.CompletionTokens != 8 || b.Usage.PromptTokensDetails == nil {
						t.Fatalf("usage %s", e)
					}
					usageSeen = true
					continue
				}
				c := b.Choices[0]
				if chat {
					if b.Object != "chat.completion.chunk" || c.Delta == nil {
						t.Fatalf("chunk %s", e)
					}
					if i == 0 && c.Delta.Role != "assistant" {
						t.Fatalf("first chat chunk must carry the role: %s", e)
					}
					if c.Delta.Content != nil {
						text += *c.Delta.Content
					}
				} else {
					text += c.Text
				}
				if c.FinishReason != nil {
					finish = *c.FinishReason
				}
			}
			if text != lorem[:8] || finish != "length" || usageSeen != tc.usage {
				t.Fatalf("text %q finish %q usage %v", text, finish, usageSeen)
			}
		})
	}
}

func TestChatNonStreamingMatchesTokenize(t *testing.T) {
	f := startTestFleet(t, Config{})
	pod := f.Pods[0]
	msgs := []map[string]any{{"role": "system", "content": "be brief"}, {"role": "user", "content": []map[string]any{{"type": "text", "text": "hi"}}}}
	code, _, raw := post(t, pod.URL()+"/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 4})
	if code != 200 {
		t.Fatalf("%d %s", code, raw)
	}
	b := decodeBody(t, raw)
	if b.Object != "chat.completion" || b.Choices[0].Message == nil || b.Choices[0].Message.Content != lorem[:4] || b.Choices[0].Message.Role != "assistant" {
		t.Fatalf("body %s", raw)
	}
	// The built-in template: <|im_start|>role\ncontent<|im_end|>\n … <|im_start|>assistant\n
	want := "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
	wantIDs, _ := BytesTokenizer().Encode(want, false)
	if b.Usage.PromptTokens != len(wantIDs) {
		t.Fatalf("prompt tokens %d, want %d", b.Usage.PromptTokens, len(wantIDs))
	}
	code, _, raw = post(t, pod.URL()+"/tokenize", map[string]any{"model": "sim-test", "messages": msgs})
	var tok tokenizeResponse
	if code != 200 || json.Unmarshal(raw, &tok) != nil || tok.Count != len(wantIDs) || len(tok.Tokens) != len(wantIDs) {
		t.Fatalf("tokenize: %d %s", code, raw)
	}
	code, _, raw = post(t, pod.URL()+"/v1/chat/completions/render", map[string]any{"model": "sim-test", "messages": msgs})
	var gr generateRequest
	if code != 200 || json.Unmarshal(raw, &gr) != nil || len(gr.TokenIDs) != len(wantIDs) {
		t.Fatalf("chat render: %d %s", code, raw)
	}
	code, _, raw = post(t, pod.URL()+"/detokenize", map[string]any{"model": "sim-test", "tokens": tok.Tokens})
	var detok struct{ Prompt string }
	if code != 200 || json.Unmarshal(raw, &detok) != nil || detok.Prompt != want {
		t.Fatalf("detokenize: %d %s", code, raw)
	}
}

func TestTokenizeAndRenderPrompt(t *testing.T) {
	f := startTestFleet(t, Config{})
	pod := f.Pods[0]
	code, _, raw := post(t, pod.URL()+"/tokenize", map[string]any{"prompt": "ab"})
	if code != 200 || string(raw) != `{"count":3,"max_model_len":4096,"tokens":[256,97,98],"token_strs":null}` {
		t.Fatalf("tokenize: %d %s", code, raw)
	}
	code, _, raw = post(t, pod.URL()+"/tokenize", map[string]any{"prompt": "ab", "add_special_tokens": false})
	if code != 200 || !strings.Contains(string(raw), `"tokens":[97,98]`) {
		t.Fatalf("tokenize without specials: %d %s", code, raw)
	}
	code, _, raw = post(t, pod.URL()+"/v1/completions/render", map[string]any{"prompt": []any{"ab", []int{5, 6, 7}}, "cache_salt": "s"})
	var grs []generateRequest
	if code != 200 || json.Unmarshal(raw, &grs) != nil || len(grs) != 2 {
		t.Fatalf("render: %d %s", code, raw)
	}
	if len(grs[0].TokenIDs) != 3 || len(grs[1].TokenIDs) != 3 || grs[1].TokenIDs[2] != 7 || grs[0].CacheSalt == nil || *grs[0].CacheSalt != "s" {
		t.Fatalf("render: %s", raw)
	}
}

func TestModels(t *testing.T) {
	f := startTestFleet(t, Config{LoRAs: []string{"a1", "a2"}})
	code, raw := get(t, f.Pods[0].URL()+"/v1/models")
	var ml struct {
		Object string
		Data   []struct {
			ID, Object, Root string
			Parent           *string
		}
	}
	if code != 200 || json.Unmarshal(raw, &ml) != nil || ml.Object != "list" || len(ml.Data) != 3 {
		t.Fatalf("%d %s", code, raw)
	}
	if ml.Data[0].ID != "sim-test" || ml.Data[0].Parent != nil || ml.Data[2].ID != "a2" || ml.Data[2].Parent == nil || *ml.Data[2].Parent != "sim-test" {
		t.Fatalf("models %s", raw)
	}
}

func TestErrorsAreOpenAIShaped(t *testing.T) {
	f := startTestFleet(t, Config{MaxBodyBytes: 4096})
	url := f.Pods[0].URL()
	tests := []struct {
		name   string
		path   string
		body   any
		status int
	}{
		{"malformed JSON", "/v1/completions", `{"prompt": `, 400},
		{"trailing garbage", "/v1/completions", `{"prompt": "a"} x`, 400},
		{"missing prompt", "/v1/completions", map[string]any{"model": "sim-test"}, 400},
		{"prompt wrong type", "/v1/completions", map[string]any{"prompt": 12}, 400},
		{"negative token id", "/v1/completions", map[string]any{"prompt": []int{1, -2}}, 400},
		{"empty prompt list", "/v1/completions", map[string]any{"prompt": []int{}}, 400},
		{"empty prompt string", "/v1/completions", map[string]any{"prompt": "", "add_special_tokens": false}, 400},
		{"max_tokens zero", "/v1/completions", map[string]any{"prompt": "a", "max_tokens": 0}, 400},
		{"max_tokens wrong type", "/v1/completions", map[string]any{"prompt": "a", "max_tokens": "x"}, 400},
		{"n=2", "/v1/completions", map[string]any{"prompt": "a", "n": 2}, 400},
		{"empty cache_salt", "/v1/completions", map[string]any{"prompt": "a", "cache_salt": ""}, 400},
		{"too long", "/v1/completions", map[string]any{"prompt": "a", "max_tokens": 5000}, 400},
		{"unknown model", "/v1/completions", map[string]any{"prompt": "a", "model": "gpt-9"}, 404},
		{"missing messages", "/v1/chat/completions", map[string]any{"model": "sim-test"}, 400},
		{"messages not a list", "/v1/chat/completions", map[string]any{"messages": "hi"}, 400},
		{"message without role", "/v1/chat/completions", map[string]any{"messages": []map[string]any{{"content": "x"}}}, 400},
		{"oversized body", "/v1/completions", map[string]any{"prompt": strings.Repeat("x", 5000)}, 413},
		{"tokenize nothing", "/tokenize", map[string]any{"model": "sim-test"}, 400},
		{"detokenize bad ids", "/detokenize", map[string]any{"tokens": []any{"a"}}, 400},
		{"faults out of range", "/sim/faults", map[string]any{"drop_events": 2}, 400},
		{"unknown path", "/v2/whatever", map[string]any{}, 404},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, _, raw := post(t, url+tc.path, tc.body)
			if code != tc.status {
				t.Fatalf("status %d, want %d: %s", code, tc.status, raw)
			}
			var e errorBody
			if err := json.Unmarshal(raw, &e); err != nil || e.Error.Message == "" || e.Error.Type == "" || e.Error.Code != tc.status {
				t.Fatalf("not an OpenAI error: %s", raw)
			}
		})
	}
}

func TestDeadPodAndRecovery(t *testing.T) {
	f := startTestFleet(t, Config{})
	pod := f.Pods[0]
	prompt := map[string]any{"prompt": tokenRange(0, 40), "max_tokens": 1}
	post(t, pod.URL()+"/v1/completions", prompt)
	if code, _, raw := post(t, pod.URL()+"/sim/faults", `{"dead": true}`); code != 200 {
		t.Fatalf("%d %s", code, raw)
	}
	if code, _ := get(t, pod.URL()+"/health"); code != 503 {
		t.Fatalf("health %d, want 503", code)
	}
	if code, _, _ := post(t, pod.URL()+"/v1/completions", prompt); code != 500 {
		t.Fatalf("completions on a dead pod: %d, want 500", code)
	}
	if code, _, raw := post(t, pod.URL()+"/sim/faults", `{"dead": false}`); code != 200 {
		t.Fatalf("%d %s", code, raw)
	}
	if code, _ := get(t, pod.URL()+"/health"); code != 200 {
		t.Fatalf("health %d, want 200", code)
	}
	// Back as a new process: the cache is empty.
	code, _, raw := post(t, pod.URL()+"/v1/completions", prompt)
	if code != 200 || cachedTokens(t, raw) != 0 {
		t.Fatalf("%d %s", code, raw)
	}
}

func TestFailPrefillFault(t *testing.T) {
	f := startTestFleet(t, Config{})
	pod := f.Pods[0]
	if code, _, raw := post(t, pod.URL()+"/sim/faults", `{"fail_prefill": 1}`); code != 200 {
		t.Fatalf("%d %s", code, raw)
	}
	code, _, raw := post(t, pod.URL()+"/v1/completions", map[string]any{"prompt": "abc"})
	if code != 500 || !strings.Contains(string(raw), "prefill") {
		t.Fatalf("%d %s", code, raw)
	}
	resp := streamPost(t, context.Background(), pod.URL()+"/v1/completions", map[string]any{"prompt": "abc", "stream": true})
	defer resp.Body.Close()
	evs := sse(t, resp)
	if len(evs) != 2 || !strings.Contains(evs[0], `"error"`) || evs[1] != "[DONE]" {
		t.Fatalf("stream events %q", evs)
	}
}

func TestClientCancelFreesRequest(t *testing.T) {
	f := startTestFleet(t, Config{TimeScale: 1})
	pod := f.Pods[0]
	ctx, cancel := context.WithCancel(context.Background())
	resp := streamPost(t, ctx, pod.URL()+"/v1/completions", map[string]any{"prompt": tokenRange(0, 100), "max_tokens": 800, "stream": true})
	sc := bufio.NewScanner(resp.Body)
	if !sc.Scan() {
		t.Fatal("no first chunk")
	}
	if st := pod.Stats()[0]; st.Running != 1 || st.KVUsage == 0 {
		t.Fatalf("while streaming: %+v", st)
	}
	cancel()
	resp.Body.Close()
	deadline := time.Now().Add(5 * time.Second)
	for pod.Stats()[0].Running != 0 || pod.Stats()[0].KVUsage != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("request still running after client cancel: %+v", pod.Stats()[0])
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Its blocks are free (reset succeeds) and still cached until then.
	_, _, raw := post(t, pod.URL()+"/v1/completions", map[string]any{"prompt": tokenRange(0, 100), "max_tokens": 1})
	if got := cachedTokens(t, raw); got != 96 {
		t.Fatalf("cached %d after cancel, want 96", got)
	}
}

func TestRestartDropsInFlightConnections(t *testing.T) {
	f := startTestFleet(t, Config{TimeScale: 1})
	pod := f.Pods[0]
	resp := streamPost(t, context.Background(), pod.URL()+"/v1/completions", map[string]any{"prompt": "abc", "max_tokens": 800, "stream": true})
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	if !sc.Scan() {
		t.Fatal("no first chunk")
	}
	if code, _, raw := post(t, pod.URL()+"/sim/restart", ""); code != 200 {
		t.Fatalf("%d %s", code, raw)
	}
	for sc.Scan() {
		if strings.Contains(sc.Text(), "[DONE]") {
			t.Fatal("stream ended cleanly; a restart must drop it")
		}
	}
	if sc.Err() == nil {
		t.Fatal("stream ended without an error")
	}
}

func TestMetricsUseVLLMNames(t *testing.T) {
	f := startTestFleet(t, Config{TimeScale: 250, HashSeed: "42"})
	pod := f.Pods[0]
	for i := 0; i < 2; i++ {
		post(t, pod.URL()+"/v1/completions", map[string]any{"prompt": tokenRange(0, 64), "max_tokens": 2})
	}
	// The response can reach the client a step before the engine retires
	// the request: wait (bounded) for the gauges to settle.
	var text string
	for deadline := time.Now().Add(5 * time.Second); ; {
		code, raw := get(t, pod.URL()+"/metrics")
		if code != 200 {
			t.Fatal(code)
		}
		text = string(raw)
		if strings.Contains(text, `vllm:num_requests_running{engine="0",model_name="sim-test"} 0`) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, want := range []string{
		`vllm:num_requests_running{engine="0",model_name="sim-test"} 0`,
		`vllm:num_requests_waiting{engine="0",model_name="sim-test"} 0`,
		`vllm:kv_cache_usage_perc{engine="0",model_name="sim-test"} 0`,
		`vllm:prefix_cache_queries_total{engine="0",model_name="sim-test"} 128`,
		`vllm:prefix_cache_hits_total{engine="0",model_name="sim-test"} 48`,
		`vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="64",prefix_caching_hash_algo="sha256"} 1`,
		`vllm:time_to_first_token_seconds_count{engine="0",model_name="sim-test"} 2`,
		`vllm:request_success_total{engine="0",finished_reason="length",model_name="sim-test"} 2`,
		"# TYPE vllm:prefix_cache_hits_total counter",
		"prefixrouter_sim_time_scale 250",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	// The exposition parses as Prometheus text, as the health scraper reads it.
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("metrics do not parse: %v", err)
	}
	if h := fams["vllm:time_to_first_token_seconds"]; h == nil || h.GetMetric()[0].GetHistogram().GetSampleCount() != 2 {
		t.Fatalf("TTFT histogram %v", h)
	}
	// A restart is visible as a new process start time, as with vLLM.
	startTime := func() float64 {
		_, raw := get(t, pod.URL()+"/metrics")
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(strings.NewReader(string(raw)))
		if err != nil || fams["process_start_time_seconds"] == nil {
			t.Fatalf("process_start_time_seconds missing: %v", err)
		}
		return fams["process_start_time_seconds"].GetMetric()[0].GetGauge().GetValue()
	}
	before := startTime()
	if err := pod.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	if after := startTime(); after <= before {
		t.Fatalf("process start time %v after restart, was %v", after, before)
	}
}

// TestTTFTOverHTTP checks TTFT through the HTTP surface: in model time (the
// TTFT histogram) it is exactly the profile's prediction, and on the wall
// clock a miss takes at least its predicted prefill time.
func TestTTFTOverHTTP(t *testing.T) {
	prof := testProfile()
	prof.StepFixed = 5 * time.Millisecond
	prof.PrefillPerToken = time.Millisecond
	prof.MaxNumBatchedTokens = 1024
	f := startTestFleet(t, Config{Profile: prof, TimeScale: 1})
	pod := f.Pods[0]
	prompt := map[string]any{"prompt": tokenRange(0, 200), "max_tokens": 1, "stream": true}
	ttft := func() time.Duration {
		start := time.Now()
		resp := streamPost(t, context.Background(), pod.URL()+"/v1/completions", prompt)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		if !sc.Scan() {
			t.Fatal("no first chunk")
		}
		el := time.Since(start)
		for sc.Scan() {
		}
		return el
	}
	miss := ttft()
	if want := prof.StepTime(200, 0); miss < want {
		t.Fatalf("wall TTFT of a miss %v, want ≥ %v", miss, want)
	}
	ttft() // 192 of 200 tokens cached
	sum, n := ttftSum(t, pod)
	want := (prof.StepTime(200, 0) + prof.StepTime(8, 0)).Seconds()
	if n != 2 || math.Abs(sum-want) > 1e-9 {
		t.Fatalf("TTFT histogram: %d observations summing to %vs, want 2 summing to %vs", n, sum, want)
	}
}
