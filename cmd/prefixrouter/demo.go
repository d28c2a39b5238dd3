package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/prefixrouter/prefixrouter/bench/sim"
	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/router"
	"github.com/prefixrouter/prefixrouter/target"
	"github.com/prefixrouter/prefixrouter/tokenize"
)

// The demo is the README's first command: simulated pods on loopback, the
// router in front, the same shared-prefix workload under two policies, one
// table. Everything runs in this process and stops with it.

// demoSettings is what the demo command's flags set.
type demoSettings struct {
	Pods, Groups, Requests, PrefixTokens, Concurrency int
	Policies                                          string
	Timeout                                           time.Duration
}

func demoCommand() *cli.Command {
	s := demoSettings{Pods: 4, Groups: 16, Requests: 16, PrefixTokens: 2000, Concurrency: 8,
		Policies: "precise,round-robin", Timeout: 2 * time.Minute}
	t := newFlagTable("demo")
	b := t.group("")
	return t.command(&cli.Command{
		Name:  "demo",
		Usage: "route a shared-prefix workload over simulated pods with precise and round-robin, print a table",
		Description: "Starts simulated vLLM pods (bench/sim, loopback only) and the router in front of them,\n" +
			"sends the same workload (groups of users sharing a long system prompt) under each policy\n" +
			"on a fresh fleet, and prints requests per pod, cached prompt tokens and TTFT.",
		Flags: []cli.Flag{
			b.int("pods", "simulated pods", &s.Pods),
			b.int("groups", "groups of users sharing one system prompt", &s.Groups),
			b.int("requests", "requests per group", &s.Requests),
			b.int("prefix-tokens", "shared system prompt length (bytes model: one token a byte)", &s.PrefixTokens),
			b.int("concurrency", "requests in flight", &s.Concurrency),
			b.checked("policies", "policies to compare, comma-separated: "+strings.Join(router.PolicyNames(), ", "), &s.Policies,
				func(v string) error { _, err := parsePolicies(v); return err }),
			b.dur("timeout", "bound on the whole demo", &s.Timeout),
		},
		Action: func(ctx context.Context, cmd *cli.Command) error { return runDemo(ctx, cmd.Root().Writer, &s) },
	})
}

// parsePolicies reads --policies.
func parsePolicies(v string) ([]router.Policy, error) {
	var policies []router.Policy
	for p := range strings.SplitSeq(v, ",") {
		pol, err := router.ParsePolicy(strings.TrimSpace(p))
		if err != nil {
			return nil, err
		}
		policies = append(policies, pol)
	}
	return policies, nil
}

type demoResult struct {
	policy       string
	perPod       []int
	promptTokens int
	cachedTokens int
	ttft         []time.Duration
	failed       int
	wall         time.Duration
}

func runDemo(ctx context.Context, out io.Writer, s *demoSettings) error {
	pods, groups, per := s.Pods, s.Groups, s.Requests
	prefixLen, conc := s.PrefixTokens, s.Concurrency
	if pods < 1 || groups < 1 || per < 1 || prefixLen < 16 || conc < 1 {
		return usageError("--pods, --groups, --requests, --concurrency must be positive and --prefix-tokens at least 16")
	}
	if s.Timeout <= 0 {
		return usageError("--timeout must be positive, got %v", s.Timeout)
	}
	policies, err := parsePolicies(s.Policies)
	if err != nil {
		return usageError("--policies: %v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.Timeout)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	prof, err := sim.LookupProfile("tiny")
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "demo: %d simulated pods (%s: %d KV blocks of %d tokens each), %d groups x %d requests, %d-token shared prefix\n",
		pods, prof.Name, prof.NumGPUBlocks, prof.BlockSize, groups, per, prefixLen)

	var results []demoResult
	for _, pol := range policies {
		res, err := demoRun(ctx, pol, prof, pods, groups, per, prefixLen, conc, quiet)
		if err != nil {
			return cli.Exit(fmt.Sprintf("demo (%s): %v", pol, err), exitFailure)
		}
		results = append(results, res)
	}

	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "policy\trequests per pod\tcached prompt tokens\tTTFT p50\tTTFT p90\tfailed\twall")
	for _, r := range results {
		counts := make([]string, len(r.perPod))
		for i, n := range r.perPod {
			counts[i] = fmt.Sprint(n)
		}
		pct := 0.0
		if r.promptTokens > 0 {
			pct = 100 * float64(r.cachedTokens) / float64(r.promptTokens)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d / %d (%.0f%%)\t%s\t%s\t%d\t%s\n", r.policy, strings.Join(counts, " "),
			r.cachedTokens, r.promptTokens, pct, pctl(r.ttft, 0.5), pctl(r.ttft, 0.9), r.failed, r.wall.Round(time.Millisecond))
	}
	return tw.Flush()
}

func pctl(xs []time.Duration, q float64) string {
	if len(xs) == 0 {
		return "-"
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))].Round(100 * time.Microsecond).String()
}

// demoRun starts a fresh fleet and router, sends the workload, and stops both.
func demoRun(ctx context.Context, pol router.Policy, prof sim.Profile, pods, groups, per, prefixLen, conc int, log *slog.Logger) (demoResult, error) {
	res := demoResult{policy: pol.String(), perPod: make([]int, pods)}
	fleet, err := sim.StartFleet(ctx, sim.Config{Pods: pods, Profile: prof, Host: "127.0.0.1", Logger: log, DefaultMaxTokens: 8})
	if err != nil {
		return res, err
	}
	defer fleet.Close()

	cfg := router.DefaultConfig()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", ""
	cfg.Policy = pol
	cfg.DebugHeaders = true // the demo attributes requests to pods by header
	cfg.Health.Endpoints = fleet.Endpoints()
	cfg.Health.ProbeInterval, cfg.Health.ProbeTimeout = 200*time.Millisecond, 200*time.Millisecond
	cfg.Health.ScrapeInterval, cfg.Health.ScrapeTimeout = 100*time.Millisecond, 100*time.Millisecond
	cfg.Health.EvalInterval = 100 * time.Millisecond
	cfg.Health.SuccessThreshold = 1
	toks := tokenize.NewRegistry(tokenize.Options{Logger: log})
	defer toks.Close()
	if _, err := toks.Add(prof.Model, "bytes", tokenize.ModeLocal); err != nil {
		return res, err
	}
	rt, err := router.New(cfg, router.Deps{Tokenizers: toks, Logger: log})
	if err != nil {
		return res, err
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	if err := rt.Start(rctx); err != nil {
		return res, err
	}
	defer func() {
		sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
		defer c()
		_ = rt.Shutdown(sctx)
	}()
	if err := waitDemoReady(ctx, rt, prof.Model, pods); err != nil {
		return res, err
	}

	podIndex := map[string]int{}
	for i, p := range fleet.Pods {
		podIndex[target.ID{Endpoint: p.URL()}.String()] = i
	}
	url := "http://" + rt.Addr() + "/v1/chat/completions"
	type job struct{ group, q int }
	jobs := make(chan job)
	var mu sync.Mutex
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 30 * time.Second}
	start := time.Now()
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				pod, prompt, cached, ttft, err := demoRequest(ctx, client, url, prof.Model, j.group, j.q, prefixLen)
				mu.Lock()
				if err != nil {
					res.failed++
				} else {
					if i, ok := podIndex[pod]; ok {
						res.perPod[i]++
					}
					res.promptTokens += prompt
					res.cachedTokens += cached
					res.ttft = append(res.ttft, ttft)
				}
				mu.Unlock()
			}
		}()
	}
	// Users of every group take turns: one round sends one question per group.
	for q := 0; q < per; q++ {
		for g := 0; g < groups; g++ {
			select {
			case jobs <- job{g, q}:
			case <-ctx.Done():
			}
		}
	}
	close(jobs)
	wg.Wait()
	res.wall = time.Since(start)
	return res, ctx.Err()
}

func waitDemoReady(ctx context.Context, rt *router.Router, model string, pods int) error {
	for {
		n := 0
		for _, t := range rt.Monitor().Snapshot().ForModel(model) {
			if t.CanRoute() && rt.EventPlane().Verdict(t.ID) == eventplane.VerdictFresh {
				n++
			}
		}
		if n == pods && rt.KeysReady() {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pods not ready: %d of %d routable with fresh events", n, pods)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// demoRequest sends one streamed chat request and returns the pod that
// served it, prompt and cached tokens from the final usage chunk, and the
// time to the first content chunk.
func demoRequest(ctx context.Context, client *http.Client, url, model string, group, q, prefixLen int) (string, int, int, time.Duration, error) {
	system := demoPrefix(group, prefixLen)
	body, _ := json.Marshal(map[string]any{
		"model": model, "stream": true, "stream_options": map[string]any{"include_usage": true}, "max_tokens": 8,
		"messages": []map[string]string{
			{"role": "system", "content": system},
			{"role": "user", "content": fmt.Sprintf("User %d asks question %d about the fleet's state.", q%5, q)},
		},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return "", 0, 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return "", 0, 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return "", 0, 0, 0, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	var ttft time.Duration
	var prompt, cached int
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []json.RawMessage `json:"choices"`
			Usage   *struct {
				PromptTokens int `json:"prompt_tokens"`
				Details      *struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(line), &chunk) != nil {
			continue
		}
		if ttft == 0 && len(chunk.Choices) > 0 {
			ttft = time.Since(t0)
		}
		if chunk.Usage != nil {
			prompt = chunk.Usage.PromptTokens
			if chunk.Usage.Details != nil {
				cached = chunk.Usage.Details.CachedTokens
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", 0, 0, 0, err
	}
	return resp.Header.Get("X-Prefixrouter-Target"), prompt, cached, ttft, nil
}

// demoPrefix is group g's shared system prompt, prefixLen bytes.
func demoPrefix(g, n int) string {
	s := fmt.Sprintf("You are assistant #%d of the operations team. Answer briefly and cite the runbook. ", g)
	return strings.Repeat(s, n/len(s)+1)[:n]
}
