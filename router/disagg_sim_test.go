package router

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/sim"
)

// TestSimDisaggregatedPredictsThePrefillPod: on simulated pods split into
// prefill and decode roles (vLLM's NIXL protocol, real HTTP and ZMQ), the
// speculative policy places a request's predictions on the prefill pod
// that computes its prompt; a follower sent before that pod's events can
// arrive is prefilled there on the predictions and served from its cache,
// its decode pod loads the prompt's blocks instead of computing them, and
// the prefill pod's events confirm every prediction. The decode pods get
// none.
func TestSimDisaggregatedPredictsThePrefillPod(t *testing.T) {
	t.Parallel()
	// The first request's two stages take longer than a whole request's
	// one (more so under -race on a loaded machine): its events are held
	// back long enough that the follower still decides before they come.
	f := startFleetWith(t, sim.Config{Pods: 5, PrefillPods: 3, Faults: sim.Faults{EventDelay: time.Second}})
	cfg := specConfig(f)
	cfg.Speculative.MaxStale = 3 * time.Second
	r := startRouter(t, cfg, "sim-tiny=bytes")
	waitFor(t, "fresh pods", func() bool { return freshCount(r, "sim-tiny") == 5 })
	waitFor(t, "block keys learned from the pods", r.KeysReady)
	g := &specRig{t: t, f: f, r: r}

	prefillPods, decodePods := map[string]bool{}, map[string]bool{}
	for _, p := range f.Pods {
		name := targetName(p.URL())
		if p.Role() == "prefill" {
			prefillPods[name] = true
		} else {
			decodePods[name] = true
		}
	}
	type split struct{ prefill, decode, reason string }
	send := func(n int) (split, completion) {
		t.Helper()
		code, hdr, b := post(t, "http://"+r.Addr()+"/v1/completions", g.body("", n))
		if code != 200 {
			t.Fatalf("request %d: status %d: %s", n, code, b)
		}
		var c completion
		if err := json.Unmarshal(b, &c); err != nil {
			t.Fatal(err)
		}
		s := split{hdr.Get("X-Prefixrouter-Prefill-Target"), hdr.Get("X-Prefixrouter-Target"), hdr.Get("X-Prefixrouter-Reason")}
		if !prefillPods[s.prefill] || !decodePods[s.decode] {
			t.Fatalf("request %d prefilled on %q, decoded on %q: want a prefill pod and a decode pod", n, s.prefill, s.decode)
		}
		return s, c
	}
	reported := func(target string) float64 {
		return metricValue(t, r, `prefixrouter_reported_cached_tokens_total{model="sim-tiny",policy="speculative",target="`+target+`"}`)
	}

	first, c := send(0)
	if c.Usage.PromptTokensDetails.CachedTokens < (specPrefixBlocks-1)*16 {
		t.Fatalf("the decode pod reported %d cached tokens: it did not load the prompt's blocks from the prefill pod", c.Usage.PromptTokensDetails.CachedTokens)
	}
	g.waitPredicted(first.prefill, specPrefixBlocks)
	before := reported(first.prefill)
	second, _ := send(1)
	if second.prefill != first.prefill || !(routed{reason: second.reason}).onPrediction() {
		t.Fatalf("follower prefilled on %s (%s); the prefix was just computed on %s", second.prefill, second.reason, first.prefill)
	}
	if got := reported(first.prefill) - before; got < (specPrefixBlocks-1)*16 {
		t.Fatalf("the follower's prefill served %v cached tokens, want the %d-token prefix", got, specPrefixBlocks*16)
	}
	out := g.mature(first.prefill)
	if out.Confirmed < specPrefixBlocks || out.Expired != 0 || out.Withdrawn != 0 {
		t.Fatalf("prefill pod's outcomes %+v, want every prediction confirmed by its events", out)
	}
	for name := range decodePods {
		if v := g.view(name); v.Pending.Inserted != 0 || v.Pending.Live != 0 || v.MatureTotal.Confirmed != 0 {
			t.Fatalf("decode pod %s has predictions (%+v, %+v): they belong to the pod that computes the prompt", name, v.Pending, v.MatureTotal)
		}
	}
	if n := metricValue(t, r, `prefixrouter_disaggregation_total{model="sim-tiny",outcome="split"}`); n != 2 {
		t.Fatalf("split requests %v, want 2", n)
	}
}
