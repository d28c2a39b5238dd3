package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
)

// prefillParams are the kv_transfer_params vLLM's reference proxy
// (toy_proxy_server.py) sends with the prefill request.
func prefillParams() map[string]any {
	return map[string]any{
		"do_remote_decode": true, "do_remote_prefill": false,
		"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil,
	}
}

// kvAnswerBody is a prefill response's kv_transfer_params, decoded
// strictly enough to see every member's JSON type.
type kvAnswerBody struct {
	KVTransferParams *struct {
		DoRemotePrefill *bool   `json:"do_remote_prefill"`
		DoRemoteDecode  *bool   `json:"do_remote_decode"`
		RemoteBlockIDs  []int   `json:"remote_block_ids"`
		RemoteEngineID  *string `json:"remote_engine_id"`
		RemoteHost      *string `json:"remote_host"`
		RemotePort      *int    `json:"remote_port"`
		TPSize          *int    `json:"tp_size"`
	} `json:"kv_transfer_params"`
}

// prefill sends ids to pod as the proxy's prefill request (max_tokens 1,
// not streamed) and returns the raw kv_transfer_params it answers with.
func prefill(t *testing.T, pod *Pod, path string, body map[string]any, hdr ...string) (json.RawMessage, completionBody) {
	t.Helper()
	body["max_tokens"], body["stream"], body["kv_transfer_params"] = 1, false, prefillParams()
	code, _, raw := post(t, pod.URL()+path, body, hdr...)
	if code != 200 {
		t.Fatalf("prefill: %d %s", code, raw)
	}
	var r struct {
		KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(raw, &r); err != nil || isNull(r.KVTransferParams) {
		t.Fatalf("prefill answered without kv_transfer_params (%v): %s", err, raw)
	}
	return r.KVTransferParams, decodeBody(t, raw)
}

// ttftSum reads rank 0's TTFT histogram sum (model seconds) and count.
func ttftSum(t *testing.T, pod *Pod) (float64, int) {
	t.Helper()
	_, raw := get(t, pod.URL()+"/metrics")
	var sum float64
	var n int
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, `vllm:time_to_first_token_seconds_sum{engine="0",model_name="sim-test"} `); ok {
			if _, err := fmt.Sscan(v, &sum); err != nil {
				t.Fatal(err)
			}
		}
		if v, ok := strings.CutPrefix(l, `vllm:time_to_first_token_seconds_count{engine="0",model_name="sim-test"} `); ok {
			if _, err := fmt.Sscan(v, &n); err != nil {
				t.Fatal(err)
			}
		}
	}
	return sum, n
}

// storedGPU replays rank's batches and returns the hashes of every
// BlockStored event with medium GPU, in order.
func storedGPU(t *testing.T, pod *Pod, rank int) []uint64 {
	t.Helper()
	waitPublished(t, pod, rank)
	_, payloads := replay(t, pod.ReplayAddr(rank), 0, false)
	var out []uint64
	for _, p := range payloads {
		b, err := events.Decode(p)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, hashesOf(b.Events, events.KindBlockStored, events.MediumGPU, 0)...)
	}
	return out
}

func promptWires(t *testing.T, ids []uint32) []uint64 {
	t.Helper()
	h, err := kvindex.NewHasher(kvindex.AlgoSHA256, "0", 16)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := h.Digests(nil, ids, kvindex.RequestExtras{})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]uint64, len(ds))
	for i, d := range ds {
		out[i] = d.Wire()
	}
	return out
}

// TestDisaggregatedPrefillThenDecode runs one request the way vLLM's
// reference P/D proxy does: the prefill on a prefill pod, the decode on
// a decode pod with the prefill's kv_transfer_params.
func TestDisaggregatedPrefillThenDecode(t *testing.T) {
	prof := testProfile()
	// The h100-8b profile's step costs, room for a 2000-token prompt.
	prof.StepFixed, prof.PrefillPerToken = 7*time.Millisecond, 22981*time.Nanosecond
	prof.MaxNumBatchedTokens, prof.NumGPUBlocks = 2048, 256
	f := startTestFleet(t, Config{Profile: prof, Pods: 3, PrefillPods: 1})
	pre, dec, fresh := f.Pods[0], f.Pods[1], f.Pods[2]
	// 125 full blocks: all 125 are the prefill's, but the decode pulls 124
	// and computes the last block, whose last token vLLM always computes.
	ids := tokenRange(0, 2000)
	wires := promptWires(t, ids)

	raw, pb := prefill(t, pre, "/v1/completions", map[string]any{"prompt": ids})
	var ans kvAnswerBody
	if err := json.Unmarshal([]byte(`{"kv_transfer_params":`+string(raw)+`}`), &ans); err != nil {
		t.Fatal(err)
	}
	kp := ans.KVTransferParams
	if kp.DoRemotePrefill == nil || !*kp.DoRemotePrefill || kp.DoRemoteDecode == nil || *kp.DoRemoteDecode ||
		kp.RemoteEngineID == nil || *kp.RemoteEngineID != pre.EngineID(0) || *kp.RemoteEngineID == "" ||
		kp.RemoteHost == nil || *kp.RemoteHost != "127.0.0.1" || kp.RemotePort == nil || *kp.RemotePort != portOf(t, pre.URL()) ||
		kp.TPSize == nil || *kp.TPSize != 1 {
		t.Fatalf("prefill kv_transfer_params %s", raw)
	}
	if len(kp.RemoteBlockIDs) != 125 || len(slices.Compact(slices.Sorted(slices.Values(kp.RemoteBlockIDs)))) != 125 {
		t.Fatalf("remote_block_ids %v: want 125 distinct block ids, one per full prompt block", kp.RemoteBlockIDs)
	}
	if u := pb.Usage; u.PromptTokens != 2000 || u.CompletionTokens != 1 || u.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("prefill usage %+v", u)
	}
	if got := storedGPU(t, pre, 0); !slices.Equal(got, wires) {
		t.Fatalf("prefill pod stored %d blocks, want the prompt's 125", len(got))
	}

	// The decode: the client's own body, with what the prefill answered.
	code, _, body := post(t, dec.URL()+"/v1/completions", map[string]any{"prompt": ids, "max_tokens": 4, "kv_transfer_params": raw})
	if code != 200 {
		t.Fatalf("decode: %d %s", code, body)
	}
	db := decodeBody(t, body)
	if db.Usage.CompletionTokens != 4 || db.Usage.PromptTokensDetails.CachedTokens != 1984 {
		t.Fatalf("decode usage %s: want 4 tokens and 1984 cached (124 transferred blocks)", body)
	}
	if strings.Contains(string(body), "kv_transfer_params") {
		t.Fatalf("decode answered kv_transfer_params: %s", body)
	}
	// The pulled blocks and the computed last one.
	if got := storedGPU(t, dec, 0); !slices.Equal(got, wires) {
		t.Fatalf("decode pod stored %d blocks, want the prompt's 125", len(got))
	}
	st := dec.Stats()[0]
	if st.PrefixHits != 0 || st.KVTransferHits != 1984 || st.KVTransferFailures != 0 {
		t.Fatalf("decode stats: prefix hits %d, transferred %d, failures %d; want 0, 1984, 0", st.PrefixHits, st.KVTransferHits, st.KVTransferFailures)
	}
	_, m := get(t, dec.URL()+"/metrics")
	for _, want := range []string{
		`vllm:prefix_cache_hits_total{engine="0",model_name="sim-test"} 0`,
		`vllm:external_prefix_cache_hits_total{engine="0",model_name="sim-test"} 1984`,
		`prefixrouter_sim_kv_transfer_failures_total{engine="0"} 0`,
	} {
		if !strings.Contains(string(m), want) {
			t.Errorf("decode metrics lack %q", want)
		}
	}

	// Model-time TTFT: the last 16 tokens computed plus 124 pulled
	// blocks, against the whole prompt's prefill on a pod without the
	// params.
	pulled, n := ttftSum(t, dec)
	wantPulled := (prof.StepTime(16, 0) + 124*DefaultKVTransferPerBlock(16)).Seconds()
	if n != 1 || math.Abs(pulled-wantPulled) > 1e-9 {
		t.Fatalf("decode TTFT %vs over %d requests, want %vs", pulled, n, wantPulled)
	}
	post(t, fresh.URL()+"/v1/completions", map[string]any{"prompt": ids, "max_tokens": 4})
	computed, _ := ttftSum(t, fresh)
	if want := prof.StepTime(2000, 0).Seconds(); math.Abs(computed-want) > 1e-9 || pulled > computed/2 {
		t.Fatalf("TTFT %vs with the transfer, %vs computing the prompt (want %vs)", pulled, computed, want)
	}

	// A prefill whose prompt is partly cached on the decode pod: the
	// local hit is used, the rest pulled.
	ids2 := append(tokenRange(0, 64), tokenRange(5000, 1936)...) // shares 4 blocks with ids
	raw2, _ := prefill(t, pre, "/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": "hi"}}})
	if !strings.Contains(string(raw2), `"remote_engine_id":"`+pre.EngineID(0)+`"`) {
		t.Fatalf("chat prefill kv_transfer_params %s", raw2)
	}
	raw3, _ := prefill(t, pre, "/v1/completions", map[string]any{"prompt": ids2})
	_, _, body = post(t, dec.URL()+"/v1/completions", map[string]any{"prompt": ids2, "max_tokens": 2, "kv_transfer_params": raw3})
	if got := cachedTokens(t, body); got != 1984 {
		t.Fatalf("decode with a 4-block local hit cached %d tokens, want 1984 (64 local + 1920 pulled)", got)
	}
	if st := dec.Stats()[0]; st.PrefixHits != 64 || st.KVTransferHits != 1984+1920 {
		t.Fatalf("prefix hits %d, transferred %d; want 64 and 3904", st.PrefixHits, st.KVTransferHits)
	}
}

// TestKVTransferFailureRecomputes: a decode whose prefill engine cannot be
// read recomputes the prompt, as vLLM's kv_load_failure_policy "recompute".
func TestKVTransferFailureRecomputes(t *testing.T) {
	ids := tokenRange(0, 100) // 6 full blocks
	tests := []struct {
		name string
		// params makes the decode's kv_transfer_params from the prefill
		// pod (after a prefill of ids) and its answer.
		params  func(t *testing.T, pre *Pod, answer json.RawMessage) any
		failure bool
	}{
		{"prefill pod restarted", func(t *testing.T, pre *Pod, answer json.RawMessage) any {
			old := pre.EngineID(0)
			if err := pre.Restart(context.Background()); err != nil {
				t.Fatal(err)
			}
			if id := pre.EngineID(0); id == old || id == "" {
				t.Fatalf("engine id %q after a restart, was %q", id, old)
			}
			return answer
		}, true},
		{"unknown engine id", func(t *testing.T, _ *Pod, _ json.RawMessage) any {
			return map[string]any{"do_remote_prefill": true, "remote_engine_id": "no-such-engine", "remote_block_ids": []int{1, 2, 3}}
		}, true},
		{"no remote_engine_id", func(t *testing.T, _ *Pod, _ json.RawMessage) any {
			return map[string]any{"do_remote_prefill": true, "remote_block_ids": []int{1, 2, 3}}
		}, true},
		{"remote_block_ids null", func(t *testing.T, pre *Pod, _ json.RawMessage) any {
			return map[string]any{"do_remote_prefill": true, "remote_engine_id": pre.EngineID(0), "remote_block_ids": nil}
		}, true},
		{"nothing to pull", func(t *testing.T, pre *Pod, _ json.RawMessage) any {
			return map[string]any{"do_remote_prefill": true, "remote_engine_id": pre.EngineID(0), "remote_block_ids": []int{}}
		}, false},
		{"no remote prefill asked", func(t *testing.T, pre *Pod, answer json.RawMessage) any {
			return map[string]any{"remote_engine_id": pre.EngineID(0), "remote_block_ids": []int{1, 2, 3}, "unknown": "ignored"}
		}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := startTestFleet(t, Config{Pods: 2, PrefillPods: 1})
			pre, dec := f.Pods[0], f.Pods[1]
			answer, _ := prefill(t, pre, "/v1/completions", map[string]any{"prompt": ids})
			code, _, body := post(t, dec.URL()+"/v1/completions", map[string]any{"prompt": ids, "max_tokens": 2, "kv_transfer_params": tc.params(t, pre, answer)})
			if code != 200 {
				t.Fatalf("decode: %d %s", code, body)
			}
			if got := cachedTokens(t, body); got != 0 {
				t.Fatalf("cached %d tokens, want 0 (recomputed)", got)
			}
			want := 0
			if tc.failure {
				want = 1
			}
			st := dec.Stats()[0]
			if st.KVTransferFailures != int64(want) || st.KVTransferHits != 0 {
				t.Fatalf("failures %d, transferred %d; want %d and 0", st.KVTransferFailures, st.KVTransferHits, want)
			}
			_, m := get(t, dec.URL()+"/metrics")
			if line := fmt.Sprintf(`prefixrouter_sim_kv_transfer_failures_total{engine="0"} %d`, want); !strings.Contains(string(m), line) {
				t.Fatalf("metrics lack %q", line)
			}
		})
	}
}

// TestKVTransferAcrossDataParallelRanks: each rank is its own engine with
// its own id (suffixed _dp<rank>), and any decode rank may pull from any.
func TestKVTransferAcrossDataParallelRanks(t *testing.T) {
	f := startTestFleet(t, Config{Pods: 2, DP: 2, PrefillPods: 1})
	pre, dec := f.Pods[0], f.Pods[1]
	if a, b := pre.EngineID(0), pre.EngineID(1); !strings.HasSuffix(a, "_dp0") || !strings.HasSuffix(b, "_dp1") || a[:36] == b[:36] {
		t.Fatalf("engine ids %q and %q: want distinct uuids suffixed _dp0 and _dp1", a, b)
	}
	ids := tokenRange(0, 100)
	for _, id := range []string{pre.EngineID(0), pre.EngineID(1), dec.EngineID(0), dec.EngineID(1)} {
		if !liveEngines.live(id) {
			t.Fatalf("engine %s of a running pod is not registered", id)
		}
	}
	answer, _ := prefill(t, pre, "/v1/completions", map[string]any{"prompt": ids}, "X-data-parallel-rank", "1")
	if !strings.Contains(string(answer), pre.EngineID(1)) {
		t.Fatalf("prefill on rank 1 answered %s, want engine %s", answer, pre.EngineID(1))
	}
	_, _, body := post(t, dec.URL()+"/v1/completions", map[string]any{"prompt": ids, "max_tokens": 2, "kv_transfer_params": answer}, "X-data-parallel-rank", "0")
	if got := cachedTokens(t, body); got != 96 {
		t.Fatalf("decode on rank 0 cached %d tokens, want 96 (6 pulled blocks)", got)
	}
	// A streamed decode, as the client asked, on the other rank, from the
	// prefill pod's other engine.
	ids2 := tokenRange(7000, 50)
	answer2, _ := prefill(t, pre, "/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": "stream me"}}}, "X-data-parallel-rank", "0")
	if !strings.Contains(string(answer2), pre.EngineID(0)) {
		t.Fatalf("prefill on rank 0 answered %s, want engine %s", answer2, pre.EngineID(0))
	}
	answer3, _ := prefill(t, pre, "/v1/completions", map[string]any{"prompt": ids2}, "X-data-parallel-rank", "0")
	resp := streamPost(t, context.Background(), dec.URL()+"/v1/completions", map[string]any{
		"prompt": ids2, "max_tokens": 3, "stream": true, "stream_options": map[string]any{"include_usage": true}, "kv_transfer_params": answer3})
	defer resp.Body.Close()
	chunks := sse(t, resp)
	if len(chunks) < 2 || chunks[len(chunks)-1] != "[DONE]" {
		t.Fatalf("streamed decode: %q", chunks)
	}
	if got := cachedTokens(t, []byte(chunks[len(chunks)-2])); got != 48 {
		t.Fatalf("streamed decode cached %d tokens, want 48 (3 pulled blocks)", got)
	}
	// Closed pods leave the process-wide registry.
	ids0 := []string{pre.EngineID(0), pre.EngineID(1), dec.EngineID(0), dec.EngineID(1)}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids0 {
		if liveEngines.live(id) {
			t.Fatalf("engine %s still registered after its pod closed", id)
		}
	}
}

func TestKVTransferParamsValidation(t *testing.T) {
	f := startTestFleet(t, Config{})
	url := f.Pods[0].URL() + "/v1/completions"
	tests := []struct {
		name   string
		params any
		status int
	}{
		{"string", "x", 400},
		{"number", 5, 400},
		{"list", []int{}, 400},
		{"boolean", true, 400},
		{"block ids not a list", map[string]any{"remote_block_ids": "1,2"}, 400},
		{"block id a float", map[string]any{"remote_block_ids": []float64{1.5}}, 400},
		{"block id null", map[string]any{"remote_block_ids": []any{1, nil}}, 400},
		{"block id a string", map[string]any{"remote_block_ids": []any{"1"}}, 400},
		{"engine id a number", map[string]any{"remote_engine_id": 5}, 400},
		{"flag a string", map[string]any{"do_remote_prefill": "yes"}, 400},
		{"null", nil, 200},
		{"empty object", map[string]any{}, 200},
		{"unknown members", map[string]any{"remote_host": "10.0.0.1", "remote_port": 5600, "tp_size": 2, "whatever": []any{}}, 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, _, raw := post(t, url, map[string]any{"prompt": "hello", "max_tokens": 1, "kv_transfer_params": tc.params})
			if code != tc.status {
				t.Fatalf("status %d, want %d: %s", code, tc.status, raw)
			}
			if tc.status == 200 {
				return
			}
			var e errorBody
			if err := json.Unmarshal(raw, &e); err != nil || e.Error.Param != "kv_transfer_params" || e.Error.Type != "BadRequestError" || e.Error.Code != 400 {
				t.Fatalf("want an OpenAI error naming kv_transfer_params: %s", raw)
			}
		})
	}
	code, _, raw := post(t, url, map[string]any{"prompt": []string{"a", "b"}, "kv_transfer_params": prefillParams()})
	if code != 400 || !strings.Contains(string(raw), "kv_transfer_params") {
		t.Fatalf("a batch with kv_transfer_params: %d %s", code, raw)
	}
}

func TestPrefillPodsRoles(t *testing.T) {
	f := startTestFleet(t, Config{Pods: 3, PrefillPods: 2})
	for i, want := range []string{"&role=prefill", "&role=prefill", "&role=decode"} {
		if ep := f.Endpoints()[i]; !strings.HasSuffix(ep, want) {
			t.Fatalf("pod %d endpoint %q, want it to end with %q", i, ep, want)
		}
	}
	plain := startTestFleet(t, Config{Pods: 2})
	for _, ep := range plain.Endpoints() {
		if strings.Contains(ep, "role=") {
			t.Fatalf("endpoint %q names a role without PrefillPods", ep)
		}
	}
	for _, c := range []Config{{Pods: 2, PrefillPods: 2}, {Pods: 1, PrefillPods: 1}, {Pods: 2, PrefillPods: -1}, {KVTransferPerBlock: -time.Microsecond}} {
		if err := CheckConfig(c); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
	c, err := (&Config{Profile: testProfile()}).withDefaults()
	if err != nil || c.KVTransferPerBlock != DefaultKVTransferPerBlock(16) || DefaultKVTransferPerBlock(16) != 83888*time.Nanosecond {
		t.Fatalf("default KV transfer per block %v (%v), want 16 × 5243ns", c.KVTransferPerBlock, err)
	}
}
