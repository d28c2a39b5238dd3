package router

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/sim"
	"github.com/prefixrouter/prefixrouter/sim/publish/publishtest"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// startFleet starts simulated vLLM pods (real HTTP and ZMQ on loopback).
func startFleet(t *testing.T, pods int, faults sim.Faults, loras ...string) *sim.Fleet {
	t.Helper()
	return startFleetWith(t, sim.Config{Pods: pods, Faults: faults, LoRAs: loras})
}

// startFleetWith starts simulated pods of the tiny profile configured by
// cfg, logging nowhere.
func startFleetWith(t *testing.T, cfg sim.Config) *sim.Fleet {
	t.Helper()
	prof, err := sim.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Profile, cfg.Logger = prof, quietLogger()
	f, err := sim.StartFleet(context.Background(), cfg)
	if err != nil {
		t.Fatalf("fleet: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

type completion struct {
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// TestSimSharedPrefixLandsOnHolder: against simulated pods publishing real
// KV events, requests sharing a long prefix go to the pod that computed it,
// the pod reports the cached tokens the router predicted (or more, when an
// event is still in flight), and the dry run names the same pod — in both
// key modes, and for a LoRA adapter (whose name is an extra key of every
// block: a router that left it out would find nothing). The pods publish
// on sockets of their own the router subscribes to, or (bus) connect to
// one the router binds (--events-listen), telling pods apart by topic.
func TestSimSharedPrefixLandsOnHolder(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name   string
		seed   bool
		model  string
		tok    string // --tokenizer spec
		policy brain.Policy
		bus    bool // the pods connect to the router's --events-listen
	}{
		{"token-derived keys", false, "sim-tiny", "sim-tiny=bytes", brain.PolicyPrecise, false},
		{"vLLM-exact keys", true, "sim-tiny", "sim-tiny=bytes", brain.PolicyPrecise, false},
		{"LoRA adapter, exact keys", true, "sql-adapter", "sim-tiny=bytes", brain.PolicyPrecise, false},
		// No local tokenizer: ids come from the pods' render endpoints.
		{"remote tokenization, exact keys", true, "sim-tiny", "sim-tiny:remote=", brain.PolicyPrecise, false},
		{"remote tokenization, speculative", true, "sim-tiny", "sim-tiny:remote=", brain.PolicySpeculative, false},
		// Local ids, a sample checked against the pods in the background.
		{"auto tokenization, exact keys", true, "sim-tiny", "sim-tiny:auto=bytes", brain.PolicyPrecise, false},
		{"token-derived keys, events on a bus", false, "sim-tiny", "sim-tiny=bytes", brain.PolicyPrecise, true},
		{"LoRA adapter, exact keys, events on a bus", true, "sql-adapter", "sim-tiny=bytes", brain.PolicyPrecise, true},
	} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			fcfg := sim.Config{Pods: 3, LoRAs: []string{"sql-adapter"}}
			cfg := DefaultConfig()
			if mode.bus {
				bus := publishtest.FreeAddr(t, 1)
				fcfg.EventsConnect, cfg.Events.EventsListen = bus, []string{bus}
			}
			f := startFleetWith(t, fcfg)
			cfg.Policy = mode.policy
			cfg.DebugHeaders = true
			if mode.seed {
				cfg.Events.HashSeed, cfg.Events.HasHashSeed = "0", true // the simulator's PYTHONHASHSEED
			}
			var eps []string
			for _, ep := range f.Endpoints() {
				// The simulator's spec names only the base model; adapters
				// are listed as models of their own, as operators do.
				eps = append(eps, ep+"&model=sql-adapter")
			}
			cfg.Health = fastHealth(eps...)
			r := startRouter(t, cfg, mode.tok)
			waitFor(t, "3 fresh pods", func() bool { return freshCount(r, mode.model) == 3 })
			waitFor(t, "block keys learned from the pods", func() bool { return r.ev.Keys() != nil })
			waitFor(t, "the adapter known as one", func() bool { return r.cat.isAdapter("sql-adapter") })
			for _, p := range f.Pods {
				if src := r.ev.Freshness(targetid.ID{Endpoint: p.URL()}).Source; src != map[bool]string{true: "bus", false: "subscriber"}[mode.bus] {
					t.Fatalf("pod %s's events come from %q", p.URL(), src)
				}
			}

			prefix := strings.Repeat("You are a meticulous assistant for a fleet operator. ", 30) // 1,590 bytes
			chat := func(q int) string {
				return fmt.Sprintf(`{"model":%q,"max_tokens":2,"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}]}`, mode.model, prefix, q)
			}
			base := "http://" + r.Addr()
			code, hdr, b := post(t, base+"/v1/chat/completions", chat(0))
			if code != 200 {
				t.Fatalf("warm-up: %d %s", code, b)
			}
			holder := hdr.Get("X-Prefixrouter-Target")
			waitFor(t, "the holder's blocks to be confirmed", func() bool {
				d := dryRun(t, r, "/v1/chat/completions", chat(1))
				return decisionName(d) == holder && candidateByName(d, holder).ConfirmedBlocks >= len(prefix)/16
			})
			for q := 1; q <= 6; q++ {
				d := dryRun(t, r, "/v1/chat/completions", chat(q))
				code, hdr, b := post(t, base+"/v1/chat/completions", chat(q))
				if code != 200 {
					t.Fatalf("request %d: %d %s", q, code, b)
				}
				got := hdr.Get("X-Prefixrouter-Target")
				if got != holder || decisionName(d) != got {
					t.Fatalf("request %d: routed to %s, dry run said %s, prefix holder is %s", q, got, decisionName(d), holder)
				}
				var c completion
				if err := json.Unmarshal(b, &c); err != nil {
					t.Fatal(err)
				}
				predicted, _ := strconv.Atoi(hdr.Get("X-Prefixrouter-Predicted-Cached-Tokens"))
				cached := c.Usage.PromptTokensDetails.CachedTokens
				if cached < len(prefix)/16*16-16 || predicted > cached || predicted < len(prefix)/16*16-16 {
					t.Fatalf("request %d: pod reports %d cached tokens, router predicted %d (prefix %d bytes)", q, cached, predicted, len(prefix))
				}
			}
			// Outcomes are exported per target and model, and nothing of the
			// prompt leaks into the labels.
			resp, err := http.Get("http://" + r.AdminAddr() + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			m, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, want := range []string{
				`prefixrouter_reported_cached_tokens_total{model="` + mode.model + `",policy="` + mode.policy.String() + `",target="` + holder + `"}`,
				`prefixrouter_predicted_cached_tokens_total{model="` + mode.model + `",policy="` + mode.policy.String() + `",target="` + holder + `"}`,
				`prefixrouter_cache_predictions_total{model="` + mode.model + `",outcome="exact",policy="` + mode.policy.String() + `",target="` + holder + `"}`,
			} {
				if !strings.Contains(string(m), want) {
					t.Fatalf("/metrics lacks %s", want)
				}
			}
			if strings.Contains(string(m), "meticulous") || strings.Contains(string(m), "question 1") {
				t.Fatal("prompt text in /metrics")
			}
		})
	}
}

// TestSimDeadAndFailingPods: a dead pod is taken out of rotation, and a pod
// whose requests fail in prefill is retried elsewhere before the client sees
// a byte.
func TestSimDeadAndFailingPods(t *testing.T) {
	t.Parallel()
	t.Run("dead pod avoided", func(t *testing.T) {
		f := startFleet(t, 2, sim.Faults{})
		cfg := DefaultConfig()
		cfg.Policy = brain.PolicyRoundRobin
		cfg.DebugHeaders = true
		cfg.Health = fastHealth(f.Endpoints()...)
		r := startRouter(t, cfg, "sim-tiny=bytes")
		waitFor(t, "2 routable pods", func() bool { return routableCount(r, "sim-tiny") == 2 })
		if err := f.Pods[0].SetFaults(context.Background(), sim.Faults{Dead: true}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the dead pod to leave rotation", func() bool { return routableCount(r, "sim-tiny") == 1 })
		for i := 0; i < 6; i++ {
			code, hdr, b := post(t, "http://"+r.Addr()+"/v1/completions", `{"model":"sim-tiny","prompt":"hello","max_tokens":2}`)
			if code != 200 || hdr.Get("X-Prefixrouter-Target") != targetName(f.Pods[1].URL()) {
				t.Fatalf("request %d: %d via %s: %s", i, code, hdr.Get("X-Prefixrouter-Target"), b)
			}
		}
	})
	t.Run("prefill failures retried", func(t *testing.T) {
		f := startFleet(t, 2, sim.Faults{})
		cfg := DefaultConfig()
		cfg.Policy = brain.PolicyRoundRobin
		cfg.DebugHeaders = true
		cfg.Health = fastHealth(f.Endpoints()...)
		cfg.Health.BreakerFailures = 1000
		r := startRouter(t, cfg, "sim-tiny=bytes")
		waitFor(t, "2 routable pods", func() bool { return routableCount(r, "sim-tiny") == 2 })
		if err := f.Pods[0].SetFaults(context.Background(), sim.Faults{FailPrefill: 1}); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 6; i++ {
			stream := i%2 == 0
			code, hdr, b := post(t, "http://"+r.Addr()+"/v1/completions",
				fmt.Sprintf(`{"model":"sim-tiny","prompt":"hello %d","max_tokens":2,"stream":%v}`, i, stream))
			if code != 200 || hdr.Get("X-Prefixrouter-Target") != targetName(f.Pods[1].URL()) || strings.Contains(string(b), `"error"`) {
				t.Fatalf("request %d (stream %v): %d via %s: %s", i, stream, code, hdr.Get("X-Prefixrouter-Target"), b)
			}
		}
	})
}

// TestSimDataParallelRanks: a dp=2 pod is two targets; the router pins each
// request to the rank it chose with X-data-parallel-rank, so a prefix
// computed on one rank is found there again (without the header the pod
// would place requests itself and the hits would scatter).
func TestSimDataParallelRanks(t *testing.T) {
	t.Parallel()
	f := startFleetWith(t, sim.Config{Pods: 1, DP: 2})
	cfg := DefaultConfig()
	cfg.DebugHeaders = true
	cfg.Health = fastHealth(f.Endpoints()...)
	r := startRouter(t, cfg, "sim-tiny=bytes")
	waitFor(t, "2 fresh ranks", func() bool { return freshCount(r, "sim-tiny") == 2 })
	waitFor(t, "block keys", r.KeysReady)
	for _, salt := range []string{"a", "b", "c", "d"} {
		body := fmt.Sprintf(`{"model":"sim-tiny","max_tokens":2,"cache_salt":%q,"prompt":%q}`, salt, strings.Repeat("rank pinning matters. ", 40))
		_, hdr, _ := post(t, "http://"+r.Addr()+"/v1/completions", body)
		holder := hdr.Get("X-Prefixrouter-Target")
		// Wait for the events, not just the decision: before they arrive
		// both ranks cost the same and a random tie-break can name the
		// holder by chance.
		waitFor(t, "confirmation on "+holder, func() bool {
			d := dryRun(t, r, "/v1/completions", body)
			return decisionName(d) == holder && candidateByName(d, holder).ConfirmedBlocks > 0
		})
		code, hdr, b := post(t, "http://"+r.Addr()+"/v1/completions", body)
		var c completion
		if err := json.Unmarshal(b, &c); err != nil || code != 200 {
			t.Fatalf("status %d: %s", code, b)
		}
		if hdr.Get("X-Prefixrouter-Target") != holder || c.Usage.PromptTokensDetails.CachedTokens == 0 {
			t.Fatalf("salt %s: second request via %s (first %s) with %d cached tokens", salt, hdr.Get("X-Prefixrouter-Target"), holder, c.Usage.PromptTokensDetails.CachedTokens)
		}
	}
}

// TestSimIdleRestartDropsPlacements: a pod restarts while idle. No event
// batch follows, so the sequence numbers cannot reveal it, but the pod's
// /metrics shows a new process start time: the router must drop what the old
// process held rather than keep routing to a cold cache.
func TestSimIdleRestartDropsPlacements(t *testing.T) {
	t.Parallel()
	f := startFleet(t, 1, sim.Faults{})
	cfg := DefaultConfig()
	cfg.Policy = brain.PolicyPrecise
	cfg.Events.HashSeed, cfg.Events.HasHashSeed = "0", true
	cfg.Health = fastHealth(f.Endpoints()...)
	r := startRouter(t, cfg, "sim-tiny=bytes")
	waitFor(t, "a fresh pod", func() bool { return freshCount(r, "sim-tiny") == 1 })
	waitFor(t, "block keys learned from the pod", func() bool { return r.ev.Keys() != nil })
	body := `{"model":"sim-tiny","max_tokens":1,"prompt":"` + strings.Repeat("a restart loses the whole cache. ", 20) + `"}`
	if code, _, b := post(t, "http://"+r.Addr()+"/v1/completions", body); code != 200 {
		t.Fatalf("warm-up: %d %s", code, b)
	}
	holder := targetName(f.Pods[0].URL())
	confirmed := func() int { return candidateByName(dryRun(t, r, "/v1/completions", body), holder).ConfirmedBlocks }
	waitFor(t, "the prompt's blocks confirmed", func() bool { return confirmed() > 0 })
	if err := f.Pods[0].Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the old process's placements dropped", func() bool { return confirmed() == 0 })
}

// TestSimReadsUntilDecided: a prompt no pod has seen is looked up
// only as far as its first block no pod holds, yet the router still
// reports the whole prompt — the dry run's prompt_tokens and blocks, and
// the outcome's prompt-token count — exactly as the pod counts it. A
// prompt whose start two pods hold is read past that shared start, and
// stops once only the cheapest pod can hold the rest: the dry run and the
// outcome's prediction then count that pod's whole run.
func TestSimReadsUntilDecided(t *testing.T) {
	t.Parallel()
	f := startFleet(t, 2, sim.Faults{})
	cfg := DefaultConfig()
	cfg.Policy = brain.PolicyPrecise
	cfg.DebugHeaders = true
	cfg.Events.HashSeed, cfg.Events.HasHashSeed = "0", true
	cfg.Health = fastHealth(f.Endpoints()...)
	r := startRouter(t, cfg, "sim-tiny=bytes")
	waitFor(t, "2 fresh pods", func() bool { return freshCount(r, "sim-tiny") == 2 })
	waitFor(t, "block keys learned from the pods", func() bool { return r.ev.Keys() != nil })

	chat := func(system string, turns int) string {
		msgs := []string{fmt.Sprintf(`{"role":"system","content":%q}`, system)}
		for i := range turns {
			msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":%q}`, strings.Repeat(fmt.Sprintf("turn %d says something new. ", i), 20)))
		}
		return `{"model":"sim-tiny","max_tokens":2,"messages":[` + strings.Join(msgs, ",") + `]}`
	}
	system := strings.Repeat("Answer as a careful operator would. ", 20) // 700 bytes
	base := "http://" + r.Addr()
	promptTokens := func(name string) float64 {
		return metricValue(t, r, `prefixrouter_prompt_tokens_total{model="sim-tiny",policy="precise",target="`+name+`"}`)
	}

	fresh := chat(system, 8)
	d := dryRun(t, r, "/v1/chat/completions", fresh)
	if d.LookedUpBlocks == 0 || d.LookedUpBlocks > len(system)/16+2 || d.Blocks < 4*d.LookedUpBlocks {
		t.Fatalf("unseen prompt: looked up %d of %d blocks, want only the first message's (%d bytes)", d.LookedUpBlocks, d.Blocks, len(system))
	}
	code, hdr, b := post(t, base+"/v1/chat/completions", fresh)
	if code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	var c completion
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	holder := hdr.Get("X-Prefixrouter-Target")
	if c.Usage.PromptTokens != d.PromptTokens || d.Blocks != d.PromptTokens/16 {
		t.Fatalf("dry run counted %d tokens (%d blocks), the pod %d", d.PromptTokens, d.Blocks, c.Usage.PromptTokens)
	}
	waitFor(t, "the outcome's exact prompt count", func() bool { return promptTokens(holder) == float64(c.Usage.PromptTokens) })
	if got, _ := strconv.Atoi(hdr.Get("X-Prefixrouter-Looked-Up-Blocks")); got != d.LookedUpBlocks {
		t.Fatalf("debug header says %d blocks looked up, the dry run %d", got, d.LookedUpBlocks)
	}

	// The other pod comes to hold the system prompt too (a conversation of
	// its own, sent to it directly).
	var other string
	for _, p := range f.Pods {
		if targetName(p.URL()) != holder {
			other = targetName(p.URL())
			if code, _, b := post(t, p.URL()+"/v1/chat/completions", chat(system, 1)); code != 200 {
				t.Fatalf("other pod: %d %s", code, b)
			}
		}
	}
	systemBlocks := len(system) / 16
	next := chat(system, 9)
	waitFor(t, "both pods' blocks to be confirmed", func() bool {
		d = dryRun(t, r, "/v1/chat/completions", next)
		return decisionName(d) == holder && candidateByName(d, holder).ConfirmedBlocks >= d.Blocks*8/10 &&
			candidateByName(d, other).ConfirmedBlocks >= systemBlocks
	})
	// Asked again: the run counts of the last answer may have been looked
	// up after its decision, as events arrived.
	d = dryRun(t, r, "/v1/chat/completions", next)
	held := candidateByName(d, holder).ConfirmedBlocks
	if d.LookedUpBlocks <= candidateByName(d, other).ConfirmedBlocks || d.LookedUpBlocks >= held {
		t.Fatalf("looked up %d blocks, the other pod confirms %d, the holder %d: want past the shared start and short of the holder's run",
			d.LookedUpBlocks, candidateByName(d, other).ConfirmedBlocks, held)
	}
	if !strings.Contains(d.Decision.Reason, "catch up") {
		t.Fatalf("reason %q does not say the decision was settled early", d.Decision.Reason)
	}
	predicted := func() float64 {
		return metricValue(t, r, `prefixrouter_predicted_cached_tokens_total{model="sim-tiny",policy="precise",target="`+holder+`"}`)
	}
	before := predicted()
	code, hdr, b = post(t, base+"/v1/chat/completions", next)
	if code != 200 || hdr.Get("X-Prefixrouter-Target") != holder {
		t.Fatalf("%d from %s: %s", code, hdr.Get("X-Prefixrouter-Target"), b)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the outcome's prediction from the holder's whole run", func() bool {
		return predicted()-before == float64(c.Usage.PromptTokensDetails.CachedTokens)
	})
	if c.Usage.PromptTokensDetails.CachedTokens <= d.LookedUpBlocks*16 {
		t.Fatalf("the holder served %d cached tokens: no more than the %d blocks looked up", c.Usage.PromptTokensDetails.CachedTokens, d.LookedUpBlocks)
	}
}

func metricValue(t *testing.T, r *Router, series string) float64 {
	t.Helper()
	v, _ := metricSeries(t, r, series)
	return v
}

// metricSeries reads one series from the admin /metrics; ok is false when
// it is not exported.
func metricSeries(t *testing.T, r *Router, series string) (v float64, ok bool) {
	t.Helper()
	resp, err := http.Get("http://" + r.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f, true
		}
	}
	return 0, false
}
