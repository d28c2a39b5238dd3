package router

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/sim"
	"github.com/prefixrouter/prefixrouter/speculative"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// specRig is a router with the speculative policy in front of simulated
// pods (real HTTP and ZMQ on loopback) whose event batches the tests
// delay, so that a prediction's life can be watched from dispatch to its
// event.
type specRig struct {
	t *testing.T
	f *sim.Fleet
	r *Router
}

// specPrefix is the prompt every request of a rig shares: 2,000 bytes, 125
// blocks of the tiny profile's 16 tokens (the bytes tokenizer: a token a
// byte).
var specPrefix = strings.Repeat("An agent fans out over one long shared context. ", 42)[:2000]

const specPrefixBlocks = 2000 / 16

// startSpecRig starts pods with faults and a router with the speculative
// policy, no holdback (every request in the speculative arm) and a short
// stale window, so that cohorts mature within seconds; tune changes the
// config before the router starts.
func startSpecRig(t *testing.T, pods int, faults sim.Faults, tune func(*Config)) *specRig {
	t.Helper()
	f := startFleet(t, pods, faults)
	cfg := specConfig(f)
	cfg.Speculative.MaxStale = time.Second
	if tune != nil {
		tune(&cfg)
	}
	r := startRouter(t, cfg, "sim-tiny=bytes")
	waitFor(t, "fresh pods", func() bool { return freshCount(r, "sim-tiny") == pods })
	waitFor(t, "block keys learned from the pods", r.KeysReady)
	return &specRig{t: t, f: f, r: r}
}

// specConfig is a speculative router's config in front of f: debug
// headers on, vLLM-exact keys (the pods' seed), fast health, no holdback
// (every request in the speculative arm).
func specConfig(f *sim.Fleet) Config {
	cfg := DefaultConfig()
	cfg.Policy = brain.PolicySpeculative
	cfg.DebugHeaders = true
	cfg.Events.HashSeed, cfg.Events.HasHashSeed = "0", true
	cfg.Health = fastHealth(f.Endpoints()...)
	cfg.Speculative.Holdback = 0
	return cfg
}

// body is a completion of the rig's prefix behind head (a prompt of its
// own from the first block on, unless empty), with a suffix of its own.
func (g *specRig) body(head string, n int) string {
	return fmt.Sprintf(`{"model":"sim-tiny","max_tokens":1,"prompt":%q}`, head+specPrefix+fmt.Sprintf(" Task %d.", n))
}

// routed is what a request's answer says of its route.
type routed struct {
	target string // the debug header
	reason string // why the router chose it
	cached int    // usage.prompt_tokens_details.cached_tokens
}

// onPrediction says the choice counted predicted blocks.
func (r routed) onPrediction() bool { return strings.Contains(r.reason, "predicted") }

// send posts a completion; sendTo any routed endpoint.
func (g *specRig) send(body string) routed {
	g.t.Helper()
	return g.sendTo("/v1/completions", body)
}

func (g *specRig) sendTo(path, body string) routed {
	g.t.Helper()
	code, hdr, b := post(g.t, "http://"+g.r.Addr()+path, body)
	if code != 200 {
		g.t.Fatalf("status %d: %s", code, b)
	}
	var c completion
	if err := json.Unmarshal(b, &c); err != nil {
		g.t.Fatal(err)
	}
	return routed{hdr.Get("X-Prefixrouter-Target"), hdr.Get("X-Prefixrouter-Reason"), c.Usage.PromptTokensDetails.CachedTokens}
}

// view is a target's predictions as GET /debug/speculative shows them.
func (g *specRig) view(name string) speculative.TargetView {
	g.t.Helper()
	for _, v := range g.r.spec.View().Targets {
		if v.Target == name {
			return v
		}
	}
	g.t.Fatalf("no target %s in the speculative view", name)
	return speculative.TargetView{}
}

// mature waits until every prediction on the target has ended and its
// cohort matured, and returns the outcomes.
func (g *specRig) mature(name string) speculative.CohortView {
	g.t.Helper()
	waitFor(g.t, "every prediction on "+name+" to end and mature", func() bool {
		p := g.view(name).Pending
		return p.Live == 0 && p.Inserted == 0
	})
	return g.view(name).MatureTotal
}

// waitPredicted waits until the target has at least n live predictions:
// the first request's prompt tail has keyed the rest of its prompt, which
// takes the router's own time, not the pod's.
func (g *specRig) waitPredicted(name string, n int64) {
	g.t.Helper()
	waitFor(g.t, "the prompt's predictions on "+name, func() bool { return g.view(name).Pending.Live >= n })
}

// specHold is how long the rigs whose tests watch predictions before
// their events hold the pods' batches back: beyond any test's life, so
// that no event can overtake what the test does next however slow the
// machine, and the predictions' TTL, the stale window and the plane's
// stale threshold as long, so that no prediction expires meanwhile and
// the streams stay fresh. The timing itself (what happens at which delay
// and TTL) is the model-time tests' in brain; these check that the real
// HTTP and ZMQ paths wire it.
const specHold = 10 * time.Minute

// holdEvents is the config of a rig whose pods hold their batches back
// specHold (tune for startSpecRig).
func holdEvents(c *Config) {
	c.Speculative.TTL, c.Speculative.MaxStale = specHold, specHold
	c.Events.StaleAfter = specHold
}

// TestSimSpeculativeFollowerFindsThePrediction: a request that shares a
// prefix with one just answered, whose events the pod holds back, goes to
// the holder on its predicted run (the reason header says so) and the pod
// serves the prefix from cache; the funnel counts the follower with the
// cached tokens its answer reported, no route was false-warm, and the
// admin listener serves the view. The confirmation by the events and its
// latency are TestModelSpeculativeFollowerFindsThePrediction's (brain, on
// model time), and the confirmation over ZMQ
// TestSimSpeculativeClientCancelKeepsPredictions'.
func TestSimSpeculativeFollowerFindsThePrediction(t *testing.T) {
	t.Parallel()
	g := startSpecRig(t, 3, sim.Faults{EventDelay: specHold}, holdEvents)
	first := g.send(g.body("", 0))
	g.waitPredicted(first.target, specPrefixBlocks)
	second := g.send(g.body("", 1))
	if second.target != first.target || !second.onPrediction() {
		t.Fatalf("follower routed to %s (%s); the prefix was just computed on %s", second.target, second.reason, first.target)
	}
	if second.cached < (specPrefixBlocks-1)*16 {
		t.Fatalf("follower served %d cached tokens, want the %d-token prefix", second.cached, specPrefixBlocks*16)
	}
	v := g.view(first.target)
	if v.FalseWarm.Routes != 0 || v.Funnel.FollowerRoutes != 1 || v.Funnel.FollowerCachedTokens != uint64(second.cached) {
		t.Fatalf("funnel %+v, false warm %+v: want one follower with its %d cached tokens", v.Funnel, v.FalseWarm, second.cached)
	}
	if p := v.Pending; p.Live < specPrefixBlocks || p.Confirmed != 0 || p.Ended != 0 {
		t.Fatalf("pending %+v, want the prefix's predictions live, none ended: the events are held back", p)
	}
	// The admin listener shows every target, those without predictions too.
	resp, err := http.Get("http://" + g.r.AdminAddr() + "/debug/speculative")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var served speculative.View
	if err := json.NewDecoder(resp.Body).Decode(&served); err != nil || len(served.Targets) != 3 || served.Overall.Funnel.FollowerRoutes != 1 {
		t.Fatalf("GET /debug/speculative: %v, %d targets, funnel %+v", err, len(served.Targets), served.Overall.Funnel)
	}
}

// TestSimSpeculativeClientCancelKeepsPredictions: a client that goes away
// after its stream's first chunk leaves the prompt's predictions live (the
// pod computed and stores the blocks; the events will say so), where a
// rejection withdraws them. The pods hold their batches back for
// specHold, so no event can confirm anything before the router has ended
// the request; the confirmation after a cancel, on model time, is
// TestModelSpeculativeClientCancelKeepsPredictions' (brain).
func TestSimSpeculativeClientCancelKeepsPredictions(t *testing.T) {
	t.Parallel()
	g := startSpecRig(t, 2, sim.Faults{EventDelay: specHold}, holdEvents)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body := strings.Replace(g.body("", 0), `"max_tokens":1`, `"max_tokens":4000,"stream":true`, 1)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+g.r.Addr()+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	holder := resp.Header.Get("X-Prefixrouter-Target")
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatalf("first chunk: %v", err)
	}
	cancel()
	resp.Body.Close()
	canceled := g.r.met.requests.WithLabelValues("sim-tiny", brain.PolicySpeculative.String(), "canceled")
	waitFor(t, "the router to end the canceled request", func() bool { return testutil.ToFloat64(canceled) == 1 })
	if v := g.view(holder); v.Pending.Live < specPrefixBlocks || v.Pending.Ended != 0 {
		t.Fatalf("predictions after a client cancel %+v, want the prompt's %d blocks live, none ended", v.Pending, specPrefixBlocks)
	}
}

// TestSimSpeculativeRejectionWithdraws: a request the pod turns down
// before computing anything withdraws its predictions at once — a failed
// prefill step (a 5xx before the first byte, retried on the other pod,
// whose predictions the events confirm) and a request beyond the model's
// context (a 400 relayed to the client) — and no follower is routed on
// them. The predictions' TTL is specHold, so that only the withdrawal can
// end them unconfirmed while the test runs; the outcomes at maturity are
// TestModelSpeculativeRejectionWithdraws' (brain, on model time).
func TestSimSpeculativeRejectionWithdraws(t *testing.T) {
	t.Parallel()
	g := startSpecRig(t, 2, sim.Faults{}, func(c *Config) {
		holdEvents(c)
		c.Health.BreakerFailures = 1000
	})
	bad, good := targetName(g.f.Pods[0].URL()), targetName(g.f.Pods[1].URL())
	// The failing pod stores the blocks of the step it fails in, as vLLM
	// does: their events are held back for specHold, so that they cannot
	// race the router's withdrawal (the answer's 5xx).
	if err := g.f.Pods[0].SetFaults(context.Background(), sim.Faults{FailPrefill: 1, EventDelay: specHold}); err != nil {
		t.Fatal(err)
	}
	// withdrawn says every prediction made on name so far has ended and
	// none was confirmed: with the TTL at specHold, they were withdrawn.
	withdrawn := func(name string) bool {
		v := g.view(name)
		return v.Pending.Live == 0 && v.Pending.Confirmed == 0 && v.Funnel.Inserted > 0 && uint64(v.Pending.Ended) == v.Funnel.Inserted
	}
	// Prompts of their own until one was tried on the failing pod first.
	for n := 0; g.view(bad).Funnel.Inserted == 0; n++ {
		if n == 20 {
			t.Fatal("20 requests, none tried on the failing pod")
		}
		if got := g.send(g.body(fmt.Sprintf("Prompt %d. ", n), 0)); got.target != good {
			t.Fatalf("answered by %s, want the retry on %s", got.target, good)
		}
	}
	// The failed attempt ended before the retry's answer reached the
	// client.
	if v := g.view(bad); !withdrawn(bad) {
		t.Fatalf("failing pod's predictions %+v, funnel %+v, invalidations %v: want every one withdrawn", v.Pending, v.Funnel, v.Invalidations)
	}
	waitFor(t, "the retried pod's events to confirm its predictions", func() bool {
		v := g.view(good)
		return v.Pending.Live == 0 && v.Pending.Confirmed > 0 && uint64(v.Pending.Confirmed) == v.Funnel.Inserted
	})

	// The context limit is the pods' (8,192 tokens on the tiny profile);
	// neither pod fails it in prefill.
	if err := g.f.Pods[0].SetFaults(context.Background(), sim.Faults{EventDelay: specHold}); err != nil {
		t.Fatal(err)
	}
	before := g.r.spec.View().Overall
	tooLong := strings.Replace(g.body("Too long. ", 0), `"max_tokens":1`, `"max_tokens":8000`, 1)
	if code, _, b := post(t, "http://"+g.r.Addr()+"/v1/completions", tooLong); code != http.StatusBadRequest {
		t.Fatalf("a request beyond the context: status %d: %s", code, b)
	}
	after := g.r.spec.View().Overall
	if made := after.Funnel.Inserted - before.Funnel.Inserted; made < specPrefixBlocks || after.Pending.Live != 0 ||
		uint64(after.Pending.Ended-before.Pending.Ended) != made || after.Pending.Confirmed != before.Pending.Confirmed {
		t.Fatalf("the rejected request predicted %d blocks; pending before %+v, after %+v: want every one withdrawn", made, before.Pending, after.Pending)
	}
	if follower := g.send(g.body("Too long. ", 1)); follower.onPrediction() {
		t.Fatalf("a follower of the rejected request was routed on its predictions: %s", follower.reason)
	}
}

// TestSimSpeculativeRestartInvalidates: a pod restarts while its
// predictions wait for events it holds back: the router learns of the new
// process and invalidates them, and a dry run of a follower no longer
// counts them. That they mature invalidated, never confirmed, is
// TestModelSpeculativeRestartInvalidates' (brain, on model time).
func TestSimSpeculativeRestartInvalidates(t *testing.T) {
	t.Parallel()
	g := startSpecRig(t, 1, sim.Faults{EventDelay: specHold}, holdEvents)
	first := g.send(g.body("", 0))
	g.waitPredicted(first.target, specPrefixBlocks)
	if d := dryRun(t, g.r, "/v1/completions", g.body("", 1)); candidateByName(d, first.target).SpeculativeBlocks < specPrefixBlocks-1 {
		t.Fatalf("before the restart the dry run counts %d predicted blocks, want the prefix", candidateByName(d, first.target).SpeculativeBlocks)
	}
	if err := g.f.Pods[0].Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the restart to invalidate the predictions", func() bool {
		v := g.view(first.target)
		return v.Pending.Live == 0 && v.Invalidations["restarted"]+v.Invalidations["cleared"] > 0
	})
	if v := g.view(first.target); v.Pending.Confirmed != 0 {
		t.Fatalf("pending %+v: the old process's predictions confirmed", v.Pending)
	}
	if d := dryRun(t, g.r, "/v1/completions", g.body("", 1)); candidateByName(d, first.target).SpeculativeBlocks != 0 {
		t.Fatalf("after the restart the dry run still counts %d predicted blocks", candidateByName(d, first.target).SpeculativeBlocks)
	}
}

// TestSimSpeculativeDisconnectedStreamPausesTrust: the pod goes away, and
// with it its event stream, while its predictions wait for the events it
// held back: the router sees the stream go and the pod's trust drops to 0.
// That the predictions then end "unknown", not expired, is
// TestModelSpeculativeDisconnectedStreamPausesTrust' (brain, on model
// time).
func TestSimSpeculativeDisconnectedStreamPausesTrust(t *testing.T) {
	t.Parallel()
	g := startSpecRig(t, 1, sim.Faults{EventDelay: specHold}, holdEvents)
	first := g.send(g.body("", 0))
	g.waitPredicted(first.target, specPrefixBlocks)
	if tr := g.view(first.target).Trust; !tr.StreamFresh || tr.Value == 0 {
		t.Fatalf("trust before the close %+v, want the fresh stream trusted", tr)
	}
	if err := g.f.Pods[0].Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "trust paused", func() bool {
		tr := g.view(first.target).Trust
		return !tr.StreamFresh && tr.Value == 0
	})
	if v := g.view(first.target); v.Pending.Confirmed != 0 {
		t.Fatalf("pending %+v: predictions confirmed by a pod that held its events", v.Pending)
	}
}

// TestSimSpeculativeHoldbackSplitsBehindASharedPrompt: every conversation
// opens with the same long system prompt, yet the holdback takes its share
// of them (by where each parts from the shared prefix, not by the prefix),
// and a session named by X-Session-Id is assigned by it.
func TestSimSpeculativeHoldbackSplitsBehindASharedPrompt(t *testing.T) {
	t.Parallel()
	g := startSpecRig(t, 2, sim.Faults{}, func(c *Config) { c.Speculative.Holdback = 0.5 })
	chat := func(user string) string {
		return fmt.Sprintf(`{"model":"sim-tiny","max_tokens":1,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, specPrefix, user)
	}
	for n := range 24 {
		g.sendTo("/v1/chat/completions", chat(fmt.Sprintf("Conversation %d asks a question of its own, long enough to fill blocks of its own.", n)))
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+g.r.Addr()+"/v1/chat/completions", strings.NewReader(chat("with a session")))
	req.Header.Set("X-Session-Id", "s-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	models := g.r.spec.View().Holdback.Models
	if len(models) != 1 {
		t.Fatalf("holdback models %+v", models)
	}
	m := models[0]
	arms := map[string]int64{}
	for _, a := range m.Arms {
		arms[a.Arm] = a.Requests
	}
	// 24 conversations at one half: both arms far from empty (a split
	// by the shared prompt would put all 24 in one).
	if arms["speculative"] < 4 || arms["holdback"] < 4 || arms["speculative"]+arms["holdback"] != 25 {
		t.Fatalf("arms %v (assigned by %v), want 25 requests split between both", arms, m.Assigned)
	}
	if m.Assigned["session"] != 1 || m.Assigned["prompt"] < 20 {
		t.Fatalf("assigned by %v, want one session and the conversations by their prompts", m.Assigned)
	}
}
