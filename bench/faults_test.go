package bench

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/bench/report"
	"github.com/prefixrouter/prefixrouter/bench/workload"
	"github.com/prefixrouter/prefixrouter/sim"
)

func TestFaultOutcomesSortEveryRequest(t *testing.T) {
	recs := []report.Record{
		{Status: 200},
		{Status: 200},
		{Status: 503, Err: "HTTP 503", APIError: "service_unavailable"},
		{Status: 200, Err: errStream, APIError: "InternalServerError"},
		{Status: 200, Err: errCut},
		{Status: 502, Err: "HTTP 502"}, // a body that is no OpenAI error
		{Err: errNoAnswer},
		{Err: errUnfinished},
	}
	f := faultOutcomes(recs)
	if f.Responses != 2 || f.Unfinished != 1 || f.APIErrorCount() != 2 || f.LostCount() != 3 {
		t.Fatalf("outcomes %+v", f)
	}
	if f.APIErrors["HTTP 503 service_unavailable"] != 1 || f.APIErrors["stream InternalServerError"] != 1 {
		t.Fatalf("OpenAI errors by kind: %v", f.APIErrors)
	}
	if f.Lost[errCut] != 1 || f.Lost["HTTP 502"] != 1 || f.Lost[errNoAnswer] != 1 {
		t.Fatalf("lost by kind: %v", f.Lost)
	}
}

func TestOpenAIErrorType(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{`{"error":{"message":"no pod","type":"service_unavailable","code":503}}`, "service_unavailable"},
		{`{"error":{"message":"","type":"BadRequestError"}}`, "BadRequestError"},
		{`{"error":{"type":"x"}}`, ""},       // no message
		{`{"error":{"message":"m"}}`, ""},    // no type
		{`{"error":"upstream down"}`, ""},    // not an object
		{`<html>502 Bad Gateway</html>`, ""}, // a proxy's page
		{`{"choices":[{"text":"hi"}]}`, ""},  // a completion
		{``, ""},
	} {
		if got := openAIErrorType([]byte(tc.body)); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.body, got, tc.want)
		}
	}
}

func TestSinceIfKeepsTheLastStreak(t *testing.T) {
	var since *float64
	for _, step := range []struct {
		ok   bool
		now  float64
		want float64 // -1: none
	}{{false, 0, -1}, {true, 1, 1}, {true, 2, 1}, {false, 3, -1}, {true, 4, 4}, {true, 5, 4}} {
		since = sinceIf(step.ok, since, step.now)
		if (since == nil) != (step.want < 0) || (since != nil && *since != step.want) {
			t.Fatalf("at %v: %v, want %v", step.now, since, step.want)
		}
	}
}

// TestConvergenceReadsTheRouterAndThePod checks the measurement itself on
// one tiny pod behind the precise policy: the router's index matches the
// pod after a request, stops matching while the pod's events are dropped,
// matches again (with nothing cached) after a restart, again after its
// subscriber was severed and reconnected, and again once the pod, taken
// out of the endpoints file, is listed anew.
func TestConvergenceReadsTheRouterAndThePod(t *testing.T) {
	prof, err := sim.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := sim.Config{Pods: 1, Profile: prof, Tokenizer: "bytes", TimeScale: 10, StreamInterval: 10 * time.Millisecond}
	fr, err := startFleetRun(ctx, cfg, "precise", 1, routerSettings{}, t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer fr.close()
	c := newClient(fr.fleet.Config().Model)
	defer c.close()
	pod := fr.fleet.Pods[0]
	fi := &faultInjector{fr: fr, scale: cfg.TimeScale}
	send := func(prompt string) {
		t.Helper()
		to, err := fr.route(ctx, prompt)
		if err != nil {
			t.Fatal(err)
		}
		if a := c.do(ctx, to, prompt, 4, false); a.err != "" {
			t.Fatalf("request: %s: %v", a.err, a.detail)
		}
		ids, err := pod.Encode(prompt)
		if err != nil {
			t.Fatal(err)
		}
		fi.probes = [][]uint32{ids}
	}
	converged := func(what string) {
		t.Helper()
		f := report.Fault{}
		fi.converge(ctx, 0, time.Now(), &f)
		if f.ConvergedAfterS == nil || f.RoutableAfterS == nil || f.FreshAfterS == nil {
			t.Fatalf("%s: did not converge: %+v", what, f)
		}
	}

	send(strings.Repeat("a shared system prompt. ", 20))
	converged("after a request")
	first := fi.probes

	base := pod.Faults()
	drop := base
	drop.DropEvents = 1
	if err := pod.SetFaults(ctx, drop); err != nil {
		t.Fatal(err)
	}
	send(strings.Repeat("another prompt, its events dropped. ", 20))
	if ok, why := fi.matches(ctx, pod, 1); ok || !strings.Contains(why, "router 0 blocks") {
		t.Fatalf("the index matched a pod whose events were dropped (%q)", why)
	}
	if err := pod.SetFaults(ctx, base); err != nil {
		t.Fatal(err)
	}

	// The router holds the first prompt as the pod does; once the pod
	// restarts, neither may.
	fi.probes = first
	if ok, why := fi.matches(ctx, pod, 1); !ok {
		t.Fatalf("before the restart: %s", why)
	}
	if truth, err := pod.Probe(ctx, first[0]); err != nil || truth[0].CachedTokens == 0 {
		t.Fatalf("the pod does not cache the first prompt: %+v, %v", truth, err)
	}
	if err := pod.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	converged("after a restart")

	// Severed, the router's subscriber sees its stream go; a prompt
	// cached meanwhile comes back through replay once it reconnects.
	fr.relays[0].sever()
	f := report.Fault{}
	for deadline := time.Now().Add(10 * time.Second); !slices.Contains(f.RouterSaw, "disconnected"); {
		fi.observe(0, &f)
		if time.Now().After(deadline) || !sleepCtx(ctx, convergePoll) {
			t.Fatalf("the router did not see its subscriber severed (it saw %v)", f.RouterSaw)
		}
	}
	send(strings.Repeat("a prompt cached while the subscriber is cut off. ", 20))
	if ok, why := fi.matches(ctx, pod, 1); ok || !strings.Contains(why, "router 0 blocks") {
		t.Fatalf("the index matched while its subscriber was severed (%q)", why)
	}
	fr.relays[0].mend()
	converged("after the subscriber reconnected")

	send(strings.Repeat("a prompt cached before the pod is unlisted. ", 20))
	if err := fr.listEndpoints(0); err != nil {
		t.Fatal(err)
	}
	f = report.Fault{}
	for deadline := time.Now().Add(10 * time.Second); !slices.Contains(f.RouterSaw, "removed"); {
		fi.observe(0, &f)
		if time.Now().After(deadline) || !sleepCtx(ctx, convergePoll) {
			t.Fatalf("the router kept an unlisted pod (it saw %v)", f.RouterSaw)
		}
	}
	if err := fr.listEndpoints(-1); err != nil {
		t.Fatal(err)
	}
	converged("after the pod was listed again")
}

func TestFaultsReportRendersInChromium(t *testing.T) {
	res := &report.Results{Workload: map[string]any{"name": "faults"}, Engine: EngineLive, TimeScale: 5,
		Order: []string{"precise", Oracle}, Policies: map[string]*report.Policy{}}
	converged := 2.5
	for _, pol := range res.Order {
		recs := []report.Record{
			{Sent: 0, TTFT: 0.1, E2E: 0.2, PromptTokens: 2000, Pod: "pod-0", Status: 200},
			{Sent: 1, Status: 200, Err: errCut},
		}
		p := report.Summarize(recs)
		p.Faults = faultOutcomes(recs)
		for _, plan := range faultSchedule {
			f := report.Fault{Kind: plan.kind, Pod: podName(plan.pod), StartS: plan.start * 20, EndS: plan.end * 20}
			if pol != Oracle {
				f.Probes, f.ConvergedAfterS = 12, &converged
			}
			p.Faults.Injected = append(p.Faults.Injected, f)
		}
		p.Faults.Injected[1].ConvergedAfterS = nil // one that never converged
		res.Policies[pol] = p
	}
	path, err := res.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	checkChartInChromium(t, path, "faults", "precise")
}

// TestFaultsOnDES runs the faults workload on the des engine: every
// request ends in a response or an OpenAI error, the router sees each
// fault for what it is, and its view of every faulted pod converges back
// to the pod's true state after the fault ends.
func TestFaultsOnDES(t *testing.T) {
	o, res := runQuickDES(t, workload.KindFaults, "precise", "speculative")
	saw := map[string]string{
		FaultDead: "circuit_open", FaultDropEvents: "stale", FaultUnlisted: "removed", FaultSevered: "disconnected",
	}
	for _, pol := range o.Policies {
		f := res.Policies[pol].Faults
		if f == nil {
			t.Fatalf("%s: no faults accounting", pol)
		}
		if got := f.Responses + f.APIErrorCount() + f.LostCount() + f.Unfinished; got != o.Workload.Requests() {
			t.Errorf("%s: %d requests accounted for, want %d", pol, got, o.Workload.Requests())
		}
		if f.LostCount() > 0 || f.Responses < o.Workload.Requests()*9/10 {
			t.Errorf("%s: %d responses, %d lost silently", pol, f.Responses, f.LostCount())
		}
		if len(f.Injected) != len(faultSchedule) {
			t.Fatalf("%s: %d faults injected, want %d", pol, len(f.Injected), len(faultSchedule))
		}
		for _, in := range f.Injected {
			if in.ConvergedAfterS == nil {
				t.Errorf("%s: %s on %s did not converge (%s)", pol, in.Kind, in.Pod, in.Mismatch)
			}
			if want := saw[in.Kind]; want != "" && !slices.Contains(in.RouterSaw, want) {
				t.Errorf("%s: during %s the router saw %v, not %s", pol, in.Kind, in.RouterSaw, want)
			}
		}
	}
}
