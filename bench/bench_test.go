package bench

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/bench/report"
	"github.com/prefixrouter/prefixrouter/bench/workload"
	"github.com/prefixrouter/prefixrouter/sim"
)

// smallRun is a live run small enough for `make test` under -race: two
// groups on two tiny pods, round-robin, precise and the oracle. It runs
// once for the tests that read it.
func smallRun(t *testing.T) *report.Results {
	t.Helper()
	small.once.Do(func() { small.res, small.err = runSmall() })
	if small.err != nil {
		t.Fatal(small.err)
	}
	return small.res
}

var small struct {
	once sync.Once
	res  *report.Results
	err  error
}

func runSmall() (*report.Results, error) {
	prof, err := sim.LookupProfile("tiny")
	if err != nil {
		return nil, err
	}
	w, err := workload.SharedPrefix{Common: workload.Common{Seed: 1, Vocab: workload.Bytes}, Groups: 2, Users: 3,
		SystemTokens: 600, QuestionTokens: 40, OutputTokens: 8,
		Stages: workload.Ladder([]float64{40, 80}, 500*time.Millisecond), Arrival: workload.Poisson}.Generate()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return Run(ctx, Options{
		Workload: w, Policies: []string{"round-robin", "precise", "speculative", Oracle}, Seed: 1,
		Fleet: sim.Config{Pods: 2, Profile: prof, Tokenizer: "bytes", TimeScale: 10, StreamInterval: 10 * time.Millisecond},
		Drain: time.Minute, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
}

func TestLiveRunComparesPoliciesOnTheSameWorkload(t *testing.T) {
	res := smallRun(t)
	if res.Engine != EngineLive || res.TimeScale != 10 || strings.Join(res.Order, ",") != "round-robin,precise,speculative,oracle" {
		t.Fatalf("run %s at %v: %v", res.Engine, res.TimeScale, res.Order)
	}
	want := res.Workload["requests"].(int)
	for _, name := range res.Order {
		p := res.Policies[name]
		if p.Requests != want || p.Errors != 0 {
			t.Fatalf("%s: %d requests (%d errors: %v), want %d without errors", name, p.Requests, p.Errors, p.ErrorKinds, want)
		}
		// Every pod answers in usage what it served from cache: the second
		// request of a group on the pod that has its system prompt hits.
		if p.CachedTokens == 0 || p.PromptTokens < int64(want*600) || p.TTFT.P50 <= 0 || p.E2E.P50 < p.TTFT.P50 {
			t.Fatalf("%s: %+v", name, p)
		}
		if (name == "speculative") != (p.Speculative != nil) {
			t.Fatalf("%s: speculative section %+v", name, p.Speculative)
		}
		if s := p.Speculative; s != nil && (s.Funnel.Inserted == 0 || len(s.Pods) != 2 || len(s.Arms) != 2 || s.Pods[0].TTLS <= 0) {
			t.Fatalf("%s: the router's predictions did not reach the results: %+v", name, s)
		}
		share := 0.0
		for pod, f := range p.PodShare {
			if pod != "pod-0" && pod != "pod-1" {
				t.Fatalf("%s: pod %q", name, pod)
			}
			share += f
		}
		if share < 0.999 || share > 1.001 {
			t.Fatalf("%s: pod shares add up to %v", name, share)
		}
	}
}

// TestLiveRunOnPrefillAndDecodePods: on a disaggregated fleet every
// request is split, counts for the prefill pod that computed its prompt,
// and the cache hit rate is the prefill pods' own (a decode pod reports
// the blocks it loads as cached: nearly the whole prompt).
func TestLiveRunOnPrefillAndDecodePods(t *testing.T) {
	t.Parallel()
	prof, err := sim.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	w, err := workload.SharedPrefix{Common: workload.Common{Seed: 1, Vocab: workload.Bytes}, Groups: 2, Users: 3,
		SystemTokens: 600, QuestionTokens: 40, OutputTokens: 8,
		Stages: workload.Ladder([]float64{40}, 500*time.Millisecond), Arrival: workload.Poisson}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := Run(ctx, Options{
		Workload: w, Policies: []string{"round-robin"}, Seed: 1,
		Fleet: sim.Config{Pods: 3, PrefillPods: 2, Profile: prof, Tokenizer: "bytes", TimeScale: 10, StreamInterval: 10 * time.Millisecond},
		Drain: time.Minute, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	p := res.Policies["round-robin"]
	want := res.Workload["requests"].(int)
	if p.Requests != want || p.Errors != 0 {
		t.Fatalf("%d requests (%d errors: %v), want %d without errors", p.Requests, p.Errors, p.ErrorKinds, want)
	}
	if len(p.PodShare) != 2 || p.PodShare["pod-0"] == 0 || p.PodShare["pod-1"] == 0 {
		t.Fatalf("pod shares %v: want the two prefill pods", p.PodShare)
	}
	// Round-robin over two prefill pods: each group's system prompt is
	// computed on both, so fewer than 5 of 6 requests' system prompts hit
	// (the decode pods report about 97% of every prompt as cached).
	if p.CacheHitRate <= 0 || p.CacheHitRate > 0.85 || p.PromptTokens < int64(want*600) || res.Fleet["prefill_pods"] != 2 {
		t.Fatalf("cache hit %.3f (%d of %d tokens): want the prefill pods' own", p.CacheHitRate, p.CachedTokens, p.PromptTokens)
	}
}

func TestTargetEngineDrivesAnyEndpoint(t *testing.T) {
	prof, err := sim.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	f, err := sim.StartFleet(context.Background(), sim.Config{Pods: 1, Profile: prof, TimeScale: 1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := workload.MultiTurn{Common: workload.Common{Seed: 2, Vocab: workload.Words}, Turns: 3, SystemTokens: 100,
		QuestionTokens: 10, OutputTokens: 4, Think: 10 * time.Millisecond,
		Stages: workload.Ladder([]float64{20}, 200*time.Millisecond), Arrival: workload.Constant}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	model, err := FirstModel(context.Background(), f.Pods[0].URL())
	if err != nil || model != prof.Model {
		t.Fatalf("model %q: %v", model, err)
	}
	res, err := Run(context.Background(), Options{Workload: w, TargetURL: f.Pods[0].URL() + "/v1", Model: model, Drain: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	p := res.Policies[TargetPolicy]
	if res.Engine != EngineTarget || p.Requests != 12 || p.Errors != 0 || len(p.PodShare) != 0 {
		t.Fatalf("%s run: %+v", res.Engine, p)
	}
	// Later turns resend the conversation: the pod serves it from cache.
	if p.CacheHitRate < 0.4 {
		t.Fatalf("multi-turn cache-hit rate %.2f: later turns did not reuse the conversation", p.CacheHitRate)
	}
}

func TestParsePolicies(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{"precise,oracle", "precise,oracle", ""},
		{" round-robin , least-load", "round-robin,least-load", ""},
		{"speculative,precise", "speculative,precise", ""},
		{"precise,precise", "", "named twice"},
		{"random", "", "unknown policy"},
	} {
		got, err := ParsePolicies(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || strings.Join(got, ",") != tc.want {
			t.Errorf("%q: %v %v", tc.in, got, err)
		}
	}
}

func TestCompletionsURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://h:8000":                 "http://h:8000/v1/completions",
		"http://h:8000/":                "http://h:8000/v1/completions",
		"http://h:8000/v1":              "http://h:8000/v1/completions",
		"http://h:8000/v1/completions":  "http://h:8000/v1/completions",
		"https://gw.example/openai/v1/": "https://gw.example/openai/v1/completions",
	} {
		if got := completionsURL(in); got != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
}

// TestReportRendersInChromium writes a live run's report and opens it in
// headless Chromium: no console error, no request beyond the file, and
// every chart an SVG of real size drawing every series it names.
func TestReportRendersInChromium(t *testing.T) {
	res := smallRun(t)
	dir := t.TempDir()
	path, err := res.Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil || !json.Valid(raw) {
		t.Fatalf("results.json: %v", err)
	}
	got := renderInChromium(t, path)
	if len(got.Problems) > 0 {
		t.Fatalf("the page logged or requested:\n%s", strings.Join(got.Problems, "\n"))
	}
	// Every chart draws every policy but the speculative policy's own,
	// which draw its funnel's stages and its holdback arms.
	wantCharts := map[string]string{"ttft-cdf": "", "cache-hit": "", "throughput": "", "pod-share": "", "ttft-over-time": "",
		"speculative-funnel": "inserted,confirmed,referenced,followed", "speculative-holdback": "speculative,holdback"}
	if len(got.Charts) != len(wantCharts) {
		t.Fatalf("charts %+v, want %v", got.Charts, wantCharts)
	}
	for i, c := range got.Charts {
		want, ok := wantCharts[c.ID]
		if want == "" {
			want = strings.Join(res.Order, ",")
		}
		if !ok || c.Width < 200 || c.Height < 100 {
			t.Fatalf("chart %d: %+v", i, c)
		}
		if strings.Join(c.Expect, ",") != want {
			t.Fatalf("chart %s expects %v, want %v", c.ID, c.Expect, want)
		}
		if len(c.Drawn) != len(c.Expect) {
			t.Fatalf("chart %s drew %v of %v", c.ID, c.Drawn, c.Expect)
		}
	}
}

// cancelOnLine cancels a run once its progress names policy: the run is
// then inside that policy's part.
type cancelOnLine struct {
	policy string
	cancel context.CancelFunc
}

func (c *cancelOnLine) Write(p []byte) (int, error) {
	if strings.Contains(string(p), c.policy+":") {
		c.cancel()
	}
	return len(p), nil
}

// A run stopped inside a policy's part returns the policies finished
// before it with the error: a long run keeps what it measured. The run
// is the quick shared-prefix ladder's first two stages (firstStages);
// precise finishes first, its cache hits making it the cheaper part, and
// round-robin's is stopped.
func TestRunKeepsFinishedPolicies(t *testing.T) {
	o := quickOptions(t, workload.KindSharedPrefix)
	o.Workload = firstStages(o.Workload, 2)
	o.Engine, o.Policies = EngineDES, []string{"precise", "round-robin"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o.Progress, o.ProgressEvery = &cancelOnLine{policy: "round-robin", cancel: cancel}, time.Microsecond
	res, err := Run(ctx, o)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want the cancellation", err)
	}
	if res == nil || !slices.Equal(res.Order, []string{"precise"}) || res.Policies["precise"].Requests == 0 {
		t.Fatalf("results %+v: want precise's alone", res)
	}
}

// firstStages is w cut to the sessions that start in its ladder's first n
// stages. The quick shared-prefix ladder's first two hold 207 of its 380
// requests; on the des engine round-robin's part of them is some 8,000
// events and the engine looks at its context every 4,096, so a cancel
// that lands as that part begins is seen inside it.
func firstStages(w *workload.Workload, n int) *workload.Workload {
	cut := *w
	var end time.Duration
	for _, st := range w.Stages[:n] {
		end += st.Duration
	}
	cut.Stages = w.Stages[:n]
	cut.Sessions = slices.DeleteFunc(slices.Clone(w.Sessions), func(s workload.Session) bool { return s.Start >= end })
	return &cut
}
