package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prefixrouter/prefixrouter/bench/des"
	"github.com/prefixrouter/prefixrouter/bench/report"
	"github.com/prefixrouter/prefixrouter/bench/workload"
	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/sim"
)

// Engine names.
const (
	EngineLive   = "live"
	EngineTarget = "target"
)

// TargetPolicy names the one row of a run against --target-url.
const TargetPolicy = "target"

// Options is one benchmark run.
type Options struct {
	Workload *workload.Workload
	// Policies run one after another, each on a fresh fleet (live engine).
	Policies []string
	Seed     uint64
	// Fleet is the simulated pods of the live engine: every policy gets a
	// fleet started from it. Its TimeScale is the run's.
	Fleet sim.Config
	// TargetURL, when set, is the engine: an OpenAI-compatible base URL
	// (http://host:port, with or without /v1) serving Model.
	TargetURL string
	Model     string
	// Drain bounds (wall time) how long requests may still run once the
	// last session has started; those still running are cancelled and
	// counted as unfinished errors.
	Drain time.Duration
	// Progress receives the progress display (nil: none); Terminal makes
	// it a bar, otherwise a line every ProgressEvery.
	Progress      io.Writer
	Terminal      bool
	ProgressEvery time.Duration
	// Logger receives the pods' and the router's logs and the first detail
	// of each error kind.
	Logger  *slog.Logger
	Command string
	// Speculative configures the speculative policy's router.
	Speculative SpeculativeOptions
	// Cost is the routers' cost model (nil: serve's default).
	Cost *brain.CostConfig
	// Settle bounds (wall time) how long the speculative policy's run waits
	// after its last answer for its predictions' cohorts to mature, so
	// that the confirmation rates cover the whole run (0: no wait).
	Settle time.Duration
	// Engine is EngineLive (default) or EngineDES: the same pods and
	// routing code in virtual time (package des). Drain is then model
	// time Drain × Fleet.TimeScale, as a live run's would be.
	Engine string
	// Routers are the router replica counts each policy runs with (des
	// engine; nil: one).
	Routers []int
	// SharePredictions has the des engine's router replicas share their
	// predictions and in-flight work (des.Config.SharePredictions).
	SharePredictions bool
	// Delivery is the des engine's model of requests' and KV events' way
	// (nil: des.DefaultDelivery).
	Delivery *des.Delivery
	// FlowControl are the arms each router policy runs with on the des
	// engine: true through flow control (Admission), false with every
	// request dispatched at once; nil: without flow control, and without
	// its classes' figures.
	FlowControl []bool
	// Admission is flow control's line (classes, shares, bounds) and
	// budget for the arms that have it; the arms without it still read
	// each request's class from its line (FlowConfig makes one).
	Admission brain.AdmissionConfig
}

// SpeculativeOptions are the speculative policy's settings a run may
// change from serve's defaults.
type SpeculativeOptions struct {
	// TTL fixes the predictions' lifetime, in model time (0: auto, each
	// target's controller sizes it).
	TTL time.Duration
	// Holdback is the fraction of conversations routed without
	// predictions (nil: serve's default).
	Holdback *float64
}

// routerSettings are what a run changes in the routers it starts.
type routerSettings struct {
	Speculative SpeculativeOptions
	Cost        *brain.CostConfig
}

func (o *Options) routerSettings() routerSettings {
	return routerSettings{Speculative: o.Speculative, Cost: o.Cost}
}

// PolicyNames lists the policies the live engine knows, in the order a
// run takes them by default: the router's, then the oracle.
func PolicyNames() []string { return append(brain.PolicyNames(), Oracle) }

// ParsePolicies reads --policies: names of the router's policies or
// "oracle", each once; an unknown name is refused with the router's word
// for it.
func ParsePolicies(s string) ([]string, error) {
	var out []string
	for name := range strings.SplitSeq(s, ",") {
		name = strings.TrimSpace(name)
		if name != Oracle {
			if _, err := brain.ParsePolicy(name); err != nil {
				return nil, err
			}
		}
		if slices.Contains(out, name) {
			return nil, fmt.Errorf("policy %q named twice", name)
		}
		out = append(out, name)
	}
	return out, nil
}

// Run runs the workload under every policy and summarizes each.
//
// When a policy's run fails (the context's deadline, a fleet that would
// not start), Run returns the results of the policies that finished
// before it with the error, so that a long run keeps what it measured.
func Run(ctx context.Context, o Options) (*report.Results, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.ProgressEvery <= 0 {
		o.ProgressEvery = 5 * time.Second
	}
	w := o.Workload
	res := &report.Results{
		Workload: map[string]any{"name": w.Name}, Seed: o.Seed, Policies: map[string]*report.Policy{},
		Command: o.Command, Date: time.Now().UTC().Format(time.RFC3339), Notes: slices.Clone(w.Notes),
	}
	for k, v := range w.Params {
		res.Workload[k] = v
	}
	res.Workload["requests"] = w.Requests()
	var base time.Duration
	for _, st := range w.Stages {
		res.Stages = append(res.Stages, report.StageSpan{Rate: st.Rate, Start: base.Seconds(), End: (base + st.Duration).Seconds()})
		base += st.Duration
	}
	prog := newProgress(o.Progress, o.Terminal, o.ProgressEvery)
	if o.TargetURL != "" {
		res.Engine, res.TimeScale = EngineTarget, 1
		res.Fleet = map[string]any{"url": o.TargetURL, "model": o.Model}
		res.Order = []string{TargetPolicy}
		c := newClient(o.Model)
		defer c.close()
		url := completionsURL(o.TargetURL)
		d := &driver{w: w, scale: 1, client: c, drain: o.Drain, prog: prog,
			route: func(context.Context, string) (dest, error) { return dest{url: url}, nil },
			podOf: func(a answer, _ dest) string { return a.target }}
		prog.begin(TargetPolicy, w.Requests())
		recs := d.run(ctx)
		prog.end()
		o.logErrors(TargetPolicy, prog)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		res.Policies[TargetPolicy] = report.Summarize(recs)
		res.Notes = append(res.Notes, unfinishedNote(TargetPolicy, res.Policies[TargetPolicy])...)
		return res, nil
	}

	fc := o.Fleet
	res.Engine, res.TimeScale = EngineLive, fc.TimeScale
	prof := fc.Profile
	res.Fleet = map[string]any{
		"pods": fc.Pods, "profile": prof.Name, "model": fc.Model, "kv_tokens_per_pod": prof.KVTokens(),
		"block_size": prof.BlockSize, "max_num_batched_tokens": prof.MaxNumBatchedTokens, "max_num_seqs": prof.MaxNumSeqs,
		"stream_interval_s": fc.StreamInterval.Seconds(), "tokenizer": "bytes", "event_delay_s": fc.Faults.EventDelay.Seconds(),
	}
	if fc.PrefillPods > 0 {
		res.Fleet["prefill_pods"] = fc.PrefillPods
		res.Notes = append(res.Notes, fmt.Sprintf("prefill/decode: %d of the %d pods compute prompts and the others decode, loading the prompts' blocks; a request counts for the prefill pod that computed its prompt, and the cache hit rate is the prefill pods' (the decode pods report the blocks they load as cached)",
			fc.PrefillPods, fc.Pods))
	}
	if slices.Contains(o.Policies, "speculative") {
		res.Fleet["speculative_ttl"] = "auto"
		if o.Speculative.TTL > 0 {
			res.Fleet["speculative_ttl"] = o.Speculative.TTL.String()
		}
		if o.Speculative.Holdback != nil {
			res.Fleet["holdback"] = *o.Speculative.Holdback
		}
	}
	var tm pairTiming
	if w.Name == workload.KindPairedGap {
		if len(w.Cells) == 0 {
			return nil, errNoCells
		}
		prompt := len(w.Sessions[0].Prompt(0, nil)) + 1 // the bytes model adds a BOS token
		if o.Speculative.TTL == 0 {
			o.Speculative.TTL = pairTTL(fc, prompt)
			res.Fleet["speculative_ttl"] = o.Speculative.TTL.String()
			res.Notes = append(res.Notes, fmt.Sprintf("paired-gap fixes the speculative TTL at %s (2.5 × the known confirmation latency) so that its cells sit at known offsets from it; --speculative-ttl changes it",
				report.Seconds(o.Speculative.TTL.Seconds())))
		}
		if o.Speculative.Holdback == nil {
			// A pair's second request drawn into the holdback arm would
			// read as a cell where predictions failed.
			none := 0.0
			o.Speculative.Holdback = &none
			res.Fleet["holdback"] = none
			res.Notes = append(res.Notes, "paired-gap turns the holdback arm off so that every cell's second request may use predictions; --holdback changes it")
		}
		tm = newPairTiming(fc, prompt, o.Speculative.TTL)
		gaps := map[string]float64{}
		for k, g := range tm.gaps {
			gaps[k] = g.Seconds()
		}
		res.Workload["gaps_s"] = gaps
		res.Workload["confirmation_latency_s"] = tm.latency.Seconds()
		res.Workload["event_delay_s"] = tm.eventDelay.Seconds()
		res.Workload["delayed_event_delay_s"] = tm.delayed.Seconds()
	}
	if w.Name == workload.KindFaults {
		res.Workload["faults"] = faultScheduleParams(w)
	}
	if o.Engine == EngineDES {
		return o.runDES(ctx, res, tm, prog)
	}
	for _, pol := range o.Policies {
		var (
			run    *liveRun
			pairs  []report.Pair
			faults *report.Faults
			err    error
		)
		switch w.Name {
		case workload.KindPairedGap:
			run, pairs, err = o.runPairs(ctx, pol, tm, prog)
		case workload.KindFaults:
			run, faults, err = o.runFaults(ctx, pol, prog)
		default:
			run, err = o.runLive(ctx, pol, prog)
		}
		if err != nil {
			return res, fmt.Errorf("%s: %w", pol, err)
		}
		p := report.Summarize(run.recs)
		p.Pairs = pairs
		p.Faults = faults
		if w.Name == workload.KindBurst {
			p.Holder = report.HolderOf(run.recs)
		}
		p.SimLagMaxS = run.lag.Seconds() * fc.TimeScale
		p.Preemptions = run.preemptions
		if fc.PrefillPods > 0 && run.prefillQueries > 0 {
			// A decode pod's cached_tokens count the blocks it loaded from
			// the prefill pod: the cache a policy earns is the prefill
			// pods'.
			p.PromptTokens, p.CachedTokens = run.prefillQueries, run.prefillHits
			p.CacheHitRate = float64(run.prefillHits) / float64(run.prefillQueries)
		}
		p.Speculative = run.spec
		res.Policies[pol] = p
		res.Order = append(res.Order, pol)
		res.Notes = append(res.Notes, unfinishedNote(pol, p)...)
		if f := p.Faults; f != nil && f.LostCount() > 0 {
			res.Notes = append(res.Notes, fmt.Sprintf("%s: %d requests ended in neither a response nor an OpenAI error (lost silently)", pol, f.LostCount()))
		}
		if p.Speculative != nil {
			res.Notes = append(res.Notes, speculativeNote(pol, p.Speculative))
		}
		if h := p.Holder; h != nil {
			res.Notes = append(res.Notes, fmt.Sprintf("%s: %d of %d followers (a burst's requests after its first) reached the pod of their burst's first request",
				pol, h.OnHolder, h.Followers))
		}
		if p.SimLagMaxS > 0.05*max(p.TTFT.P50, 0.1) {
			res.Notes = append(res.Notes, fmt.Sprintf("%s: the simulated pods' clock fell up to %s (model time) behind the wall clock; latencies that small are the machine's, not the policy's: lower --time-scale",
				pol, report.Seconds(p.SimLagMaxS)))
		}
	}
	return res, nil
}

// liveRun is what one policy's run on its fleet measured.
type liveRun struct {
	recs []report.Record
	// lag is the pods' worst model-clock lag, preemptions theirs.
	lag         time.Duration
	preemptions int64
	spec        *report.Speculative
	// prefillQueries and prefillHits are a disaggregated fleet's prefill
	// pods' prefix-cache lookups and hits, in prompt tokens.
	prefillQueries, prefillHits int64
}

func (o *Options) runLive(ctx context.Context, policy string, prog *progress) (*liveRun, error) {
	fr, err := startFleetRun(ctx, o.Fleet, policy, o.Seed, o.routerSettings(), "", o.Logger)
	if err != nil {
		return nil, err
	}
	defer fr.close()
	c := newClient(fr.fleet.Config().Model)
	defer c.close()
	d := &driver{w: o.Workload, scale: o.Fleet.TimeScale, route: fr.route, client: c, podOf: fr.podOf, drain: o.Drain, prog: prog}
	prog.begin(policy, o.Workload.Requests())
	recs := d.run(ctx)
	prog.end()
	o.logErrors(policy, prog)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	run := &liveRun{recs: recs, spec: fr.speculativeSummary(ctx, o.Settle)}
	run.lag, run.preemptions = fr.stats()
	run.prefillQueries, run.prefillHits = fr.prefillCache()
	return run, ctx.Err()
}

func (o *Options) logErrors(policy string, prog *progress) {
	for kind, err := range prog.firstErrors() {
		o.Logger.Warn("requests failed", "policy", policy, "kind", kind, "first", err)
	}
}

func unfinishedNote(policy string, p *report.Policy) []string {
	if n := p.ErrorKinds[errUnfinished]; n > 0 {
		return []string{fmt.Sprintf("%s: %d requests were still running at the drain bound and count as errors; their latencies are missing from the percentiles (raise --drain)", policy, n)}
	}
	return nil
}

// completionsURL is the completions endpoint under a base URL given with
// or without /v1.
func completionsURL(base string) string {
	base = strings.TrimRight(base, "/")
	if strings.HasSuffix(base, "/v1/completions") {
		return base
	}
	if !strings.HasSuffix(base, "/v1") {
		base += "/v1"
	}
	return base + "/completions"
}

// FirstModel asks a target's /v1/models for the first model it serves.
func FirstModel(ctx context.Context, base string) (string, error) {
	url := strings.TrimSuffix(completionsURL(base), "/completions") + "/models"
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("models: %w", err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("models: %s answered %d", url, resp.StatusCode)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list); err != nil {
		return "", fmt.Errorf("models: %w", err)
	}
	if len(list.Data) == 0 {
		return "", fmt.Errorf("models: %s lists none", url)
	}
	return list.Data[0].ID, nil
}
