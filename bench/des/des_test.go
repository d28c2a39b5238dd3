package des

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/bench/report"
	"github.com/prefixrouter/prefixrouter/bench/workload"
	"github.com/prefixrouter/prefixrouter/sim"
)

// smallRun is a shared-prefix or multi-turn workload on three small pods,
// a few hundred requests: a run takes milliseconds.
func smallRun(t *testing.T, kind, policy string, routers int) (*Result, *workload.Workload) {
	t.Helper()
	cfg := smallConfig(t, kind, policy, routers)
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return res, cfg.Workload
}

// smallConfig is smallRun's run.
func smallConfig(t *testing.T, kind, policy string, routers int) Config {
	t.Helper()
	prof, err := sim.LookupProfile("h100x2-32b")
	if err != nil {
		t.Fatal(err)
	}
	prof.NumGPUBlocks = 600
	spec := workload.Spec{Kind: kind, Seed: 3, Vocab: workload.Bytes, Rates: []float64{8, 16}, StageDuration: 3 * time.Second,
		Arrival: workload.Poisson, Groups: 6, Users: 4, SystemTokens: 2000, QuestionTokens: 100, OutputTokens: 20,
		Turns: 3, Think: time.Second}
	w, err := workload.Build(spec, workload.Limits{KVTokens: 3 * prof.KVTokens(), MaxContext: prof.KVTokens()})
	if err != nil {
		t.Fatal(err)
	}
	return Config{Workload: w, Fleet: sim.Config{Pods: 3, Profile: prof}, Policy: policy,
		Routers: routers, Seed: 1, Delivery: DefaultDelivery(), Drain: time.Minute}
}

func TestRunAnswersEveryRequest(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{workload.KindSharedPrefix, workload.KindMultiTurn} {
		for _, policy := range []string{"round-robin", "least-load", "approximate", "precise", "speculative", Oracle} {
			t.Run(kind+"/"+policy, func(t *testing.T) {
				t.Parallel()
				res, w := smallRun(t, kind, policy, 1)
				p := report.Summarize(res.Records)
				if p.Requests != w.Requests() || p.Errors != 0 {
					t.Fatalf("%d records, %d errors (%v); want %d answered", p.Requests, p.Errors, p.ErrorKinds, w.Requests())
				}
				if p.TTFT.P50 <= 0 || p.OutputTokensPerS <= 0 || res.Steps == 0 {
					t.Errorf("TTFT %+v, %v tokens/s, %d steps: nothing ran", p.TTFT, p.OutputTokensPerS, res.Steps)
				}
				if policy != Oracle && res.Delivered == 0 {
					t.Error("no KV-event batch reached the router")
				}
				if policy == "speculative" && (len(res.Speculative) != 1 || res.Speculative[0].Overall.Funnel.Confirmed == 0) {
					t.Error("the speculative router confirmed no prediction")
				}
			})
		}
	}
}

// Every policy repeats run to run: the routers break cost ties from the
// run's seed (speculative: ties, predictions and the holdback's draws),
// and the oracle from its own.
func TestRunIsDeterministic(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"least-load", "speculative", Oracle} {
		a, _ := smallRun(t, workload.KindMultiTurn, policy, 2)
		b, _ := smallRun(t, workload.KindMultiTurn, policy, 2)
		if !reflect.DeepEqual(a.Records, b.Records) {
			t.Errorf("%s: two runs of the same seed differ", policy)
		}
	}
}

func TestCacheAwarePoliciesHitMore(t *testing.T) {
	hit := map[string]float64{}
	for _, policy := range []string{"round-robin", "precise", "speculative"} {
		res, _ := smallRun(t, workload.KindSharedPrefix, policy, 1)
		hit[policy] = report.Summarize(res.Records).CacheHitRate
	}
	if hit["precise"] < hit["round-robin"]+0.2 || hit["speculative"] < hit["round-robin"]+0.2 {
		t.Errorf("cache hits %v: the prefix-aware policies should hit far more than round-robin", hit)
	}
}

func TestRoutersSpreadSessions(t *testing.T) {
	one, _ := smallRun(t, workload.KindSharedPrefix, "precise", 1)
	four, _ := smallRun(t, workload.KindSharedPrefix, "precise", 4)
	if four.Published*4 != four.Delivered || four.Published == 0 {
		t.Errorf("%d batches published, %d delivered to four routers: every router receives every batch", four.Published, four.Delivered)
	}
	if len(four.Records) != len(one.Records) {
		t.Errorf("%d records with four routers, %d with one", len(four.Records), len(one.Records))
	}
}

func TestDrainBoundCountsUnfinished(t *testing.T) {
	prof, _ := sim.LookupProfile("h100x2-32b")
	w, err := workload.Build(workload.Spec{Kind: workload.KindRandom, Seed: 1, Vocab: workload.Bytes, Rates: []float64{20}, StageDuration: time.Second,
		Arrival: workload.Constant, InputTokens: 1000, OutputTokens: 5000}, workload.Limits{KVTokens: prof.KVTokens(), MaxContext: prof.KVTokens()})
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(context.Background(), Config{Workload: w, Fleet: sim.Config{Pods: 1, Profile: prof}, Policy: "round-robin",
		Delivery: DefaultDelivery(), Drain: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	p := report.Summarize(res.Records)
	if p.Requests != w.Requests() || p.ErrorKinds[ErrUnfinished] == 0 {
		t.Errorf("%d records, errors %v; want all %d, the long ones unfinished", p.Requests, p.ErrorKinds, w.Requests())
	}
}

func TestPodNameOf(t *testing.T) {
	if got := PodNameOf(TargetOf(12)); got != "pod-12" {
		t.Errorf("PodNameOf(TargetOf(12)) = %q", got)
	}
}

// TestRunLeavesNothingInFlight checks that a run whose every request ended
// holds nothing of them: no request at a pod, no event but the routers'
// pending deliveries in the queue, no in-flight work in any router's
// ledger. What a finished request left behind would grow with a long run.
func TestRunLeavesNothingInFlight(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"precise", "speculative"} {
		t.Run(policy, func(t *testing.T) {
			cfg := smallConfig(t, workload.KindMultiTurn, policy, 2)
			cfg.SharePredictions = true
			w := cfg.Workload
			r, err := newRun(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := r.loop(context.Background()); err != nil {
				t.Fatal(err)
			}
			if p := report.Summarize(r.recs); p.Requests != w.Requests() || p.Errors != 0 {
				t.Fatalf("%d records, %d errors (%v); want %d answered", p.Requests, p.Errors, p.ErrorKinds, w.Requests())
			}
			for _, p := range r.pods {
				if n := len(p.rank.Pending()); n != 0 {
					t.Errorf("%s holds %d requests", PodName(p.i), n)
				}
			}
			for _, it := range r.q.items {
				if it.req != nil || it.sess != nil {
					t.Errorf("an event of kind %d still holds a request or session", it.kind)
				}
			}
			for ri, rt := range r.rts {
				for _, p := range r.pods {
					if f := rt.v.Flights(p.id); !f.IsZero() {
						t.Errorf("%s counts %+v in flight on %s", routerName(ri), f, PodName(p.i))
					}
				}
			}
		})
	}
}
