package sim

import (
	"testing"
)

// fuzzPod is a pod with no sockets: enough to run the request parsers.
func fuzzPod(t testing.TB) *Pod {
	cfg, err := (&Config{Profile: testProfile(), LoRAs: []string{"sql-lora"}}).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	return &Pod{cfg: cfg, prof: cfg.Profile, tok: BytesTokenizer(), loraIDs: map[string]int64{"sql-lora": 1}}
}

// FuzzPrepare feeds arbitrary bodies to the completions and chat parsers:
// they must answer with a prepared request or an OpenAI error, never panic,
// and never accept a request the engine could not hold.
func FuzzPrepare(f *testing.F) {
	for _, s := range []string{
		`{"model":"sim-test","prompt":"hello","max_tokens":3}`,
		`{"prompt":[1,2,3],"cache_salt":"s","stream":true,"stream_options":{"include_usage":true}}`,
		`{"prompt":[[1,2],[3]],"model":"sql-lora"}`,
		`{"prompt":["a","b"],"n":1,"max_completion_tokens":2}`,
		`{"messages":[{"role":"user","content":"hi"}],"add_generation_prompt":false,"continue_final_message":true}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"tools":[{"type":"function"}]}`,
		`{"prompt":[1,-1]}`, `{"prompt":1e99}`, `{"messages":null}`, `[]`, `null`, `{"prompt":"a"}{}`,
		`{"prompt":[1,2,3],"max_tokens":1,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}`,
		`{"prompt":"a","kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"e","remote_block_ids":[0,1,2],"tp_size":1,"x":[]}}`,
		`{"prompt":["a","b"],"kv_transfer_params":{}}`, `{"prompt":"a","kv_transfer_params":[1]}`,
		`{"prompt":"a","kv_transfer_params":{"remote_block_ids":[1,null,2.5]}}`, `{"prompt":"a","kv_transfer_params":"x"}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	p := fuzzPod(f)
	limit := min(p.prof.MaxModelLen, p.prof.KVTokens())
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		pr, aerr := p.prepare(body, chat)
		if aerr != nil {
			if aerr.status < 400 || aerr.status > 599 || aerr.msg == "" || aerr.typ == "" {
				t.Fatalf("bad error %+v", aerr)
			}
			return
		}
		if len(pr.prompts) == 0 || pr.maxTok < 1 {
			t.Fatalf("accepted an empty request: %+v", pr)
		}
		if kv := pr.req.kv; kv != nil {
			if len(pr.prompts) != 1 {
				t.Fatalf("accepted kv_transfer_params for %d prompts", len(pr.prompts))
			}
			if kv.RemoteBlockIDs != nil && len(*kv.RemoteBlockIDs) > len(body) {
				t.Fatalf("%d block ids from a %d-byte body", len(*kv.RemoteBlockIDs), len(body))
			}
		} else if !isNull(pr.req.KVTransferParams) {
			t.Fatalf("kv_transfer_params %s accepted unread", pr.req.KVTransferParams)
		}
		for _, ids := range pr.prompts {
			if len(ids) == 0 || len(ids)+pr.maxTok > limit {
				t.Fatalf("accepted %d prompt + %d output tokens (limit %d)", len(ids), pr.maxTok, limit)
			}
		}
	})
}

// FuzzFaultPatch checks the admin endpoint's body parser.
func FuzzFaultPatch(f *testing.F) {
	for _, s := range []string{`{"event_delay":"50ms","event_jitter":10,"drop_events":0.5}`, `{"dead":true}`, `{"slow":3,"fail_prefill":1}`, `{"event_delay":-1}`, `{}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var patch faultPatch
		if err := decodeStrict(body, &patch); err != nil {
			return
		}
		fl := patch.apply(Faults{})
		if fl.Validate() == nil && (fl.DropEvents < 0 || fl.DropEvents > 1 || fl.EventDelay < 0) {
			t.Fatalf("validated %+v", fl)
		}
	})
}
