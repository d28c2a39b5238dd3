package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

const (
	maxHealthBody  = 64 << 10
	maxModelsBody  = 4 << 20
	maxMetricsBody = 32 << 20
)

// errUnauthorized marks a 401 or 403 answer to one of the monitor's calls.
var errUnauthorized = errors.New("unauthorized")

// get performs one bounded GET and returns the body of a 2xx answer.
func (m *Monitor) get(ctx context.Context, url string, timeout time.Duration, accept string, limit int64) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	req.Header.Set("User-Agent", "prefixrouter-health")
	if m.authz != nil {
		if a := m.authz(); a != "" {
			req.Header.Set("Authorization", a)
		}
	}
	resp, err := m.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: reading body: %w", url, err)
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		// A pod started with --api-key: the operator's fix is a flag.
		return nil, fmt.Errorf("GET %s: status %d: the pod wants a credential (--upstream-api-key-file): %w", url, resp.StatusCode, errUnauthorized)
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return nil, fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	if int64(len(body)) > limit {
		return nil, fmt.Errorf("GET %s: body larger than %d bytes", url, limit)
	}
	return body, nil
}

// activeEndpoints lists endpoints with at least one non-draining rank.
func (m *Monitor) activeEndpoints() []*endpoint {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*endpoint
	for _, ep := range m.sortedEndpointsLocked() {
		if ep.active() {
			out = append(out, ep)
		}
	}
	return out
}

// forEachActive runs fn on every active endpoint concurrently, waits for
// all, and rebuilds the snapshot once, so a round of probes or scrapes
// publishes one snapshot rather than one per endpoint. Nothing is published
// when ctx ended: the results of an interrupted round are not the targets'
// fault.
func (m *Monitor) forEachActive(ctx context.Context, fn func(context.Context, *endpoint)) {
	var wg sync.WaitGroup
	for _, ep := range m.activeEndpoints() {
		wg.Go(func() { fn(ctx, ep) })
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	m.mu.Lock()
	m.rebuildLocked()
	m.mu.Unlock()
}

// probeAll probes every active endpoint (GET /health).
func (m *Monitor) probeAll(ctx context.Context) { m.forEachActive(ctx, m.probe) }

// ProbeRun is one endpoint's probe results in a row and what they make of
// it: the one rule a probe follows, for the monitor's endpoints and for a
// router's virtual fleet alike. FailureThreshold failed probes in a row
// take an up endpoint down and SuccessThreshold good ones bring it back; an
// endpoint never seen up is up on its first good probe (a pod starting).
type ProbeRun struct {
	Up, EverUp bool
	// OK and Failed are the good and failed probes in a row.
	OK, Failed int
}

// Observe applies one probe's result under cfg's thresholds and reports
// whether it changed Up.
func (r *ProbeRun) Observe(ok bool, cfg Config) bool {
	was := r.Up
	if ok {
		r.OK, r.Failed = r.OK+1, 0
		if !r.Up && (!r.EverUp || r.OK >= cfg.SuccessThreshold) {
			r.Up, r.EverUp = true, true
		}
	} else {
		r.Failed, r.OK = r.Failed+1, 0
		if r.Up && r.Failed >= cfg.FailureThreshold {
			r.Up = false
		}
	}
	return r.Up != was
}

// probe runs GET /health on one endpoint, applies the thresholds, and
// refreshes the model list of an up endpoint when due.
func (m *Monitor) probe(ctx context.Context, ep *endpoint) {
	m.mu.Lock()
	base := ep.spec.Endpoint
	m.mu.Unlock()
	start := m.now()
	_, err := m.get(ctx, base+"/health", m.cfg.ProbeTimeout, "", maxHealthBody)
	if ctx.Err() != nil {
		return // shutting down: not the target's fault
	}
	now := m.now()

	m.mu.Lock()
	ep.probed = true
	ep.lastProbe = now
	ep.probeLatency = now.Sub(start)
	wasUp := ep.run.Up
	if err == nil {
		ep.probeErr = ""
		ep.lastUp = now
	} else {
		ep.probeErr = err.Error()
		for _, t := range ep.targets {
			t.live.probeFailures.Add(1)
		}
	}
	if ep.run.Observe(err == nil, m.cfg) {
		m.log.Info("probe transition", "endpoint", base, "up", ep.run.Up, "err", err)
	}
	needModels := ep.run.Up && (!ep.modelsOK || now.Sub(ep.modelsAt) >= m.cfg.ModelsInterval || !wasUp)
	m.mu.Unlock()

	if needModels {
		m.fetchModels(ctx, ep, base)
	}
}

// fetchModels reads GET /v1/models; on failure the previous list is kept.
func (m *Monitor) fetchModels(ctx context.Context, ep *endpoint, base string) {
	body, err := m.get(ctx, base+"/v1/models", m.cfg.ProbeTimeout, "application/json", maxModelsBody)
	var models []string
	if err == nil {
		models, err = parseModels(body)
		if err != nil {
			err = fmt.Errorf("GET %s/v1/models: %w", base, err)
		}
	}
	if ctx.Err() != nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	ep.authErr = ""
	if errors.Is(err, errUnauthorized) {
		ep.authErr = err.Error()
	}
	if err != nil {
		ep.modelsErr = err.Error()
		m.log.Warn("model discovery failed", "endpoint", base, "err", err)
		return
	}
	if !slices.Equal(models, ep.models) {
		m.log.Info("models discovered", "endpoint", base, "models", models)
	}
	ep.models, ep.modelsOK, ep.modelsAt, ep.modelsErr = models, true, m.now(), ""
}

// parseModels reads the ids of an OpenAI model list, sorted and deduplicated.
func parseModels(body []byte) ([]string, error) {
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("decoding model list: %w", err)
	}
	var out []string
	for _, d := range list.Data {
		if checkModelName(d.ID) != nil {
			continue
		}
		out = append(out, d.ID)
	}
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) == 0 {
		return nil, fmt.Errorf("model list is empty")
	}
	return out, nil
}

// notifyRestarts tells subscribers about pods whose process restarted.
func (m *Monitor) notifyRestarts(restarted []TargetSpec) {
	if len(restarted) == 0 {
		return
	}
	m.notifyMu.Lock()
	defer m.notifyMu.Unlock()
	for _, ts := range restarted {
		m.log.Warn("target process restarted", "target", ts.ID.String())
		c := Change{Kind: Restarted, Target: ts}
		for _, id := range slices.Sorted(maps.Keys(m.subs)) {
			m.subs[id](c)
		}
	}
}

// scrapeAll scrapes every active endpoint's GET /metrics.
func (m *Monitor) scrapeAll(ctx context.Context) { m.forEachActive(ctx, m.scrape) }

// scrape reads one endpoint's vLLM gauges and cache config and assigns them
// to its ranks. On failure the previous values stay, ageing towards stale.
func (m *Monitor) scrape(ctx context.Context, ep *endpoint) {
	m.mu.Lock()
	base := ep.spec.Endpoint
	m.mu.Unlock()
	body, err := m.get(ctx, base+"/metrics", m.cfg.ScrapeTimeout, "text/plain;version=0.0.4", maxMetricsBody)
	var pm podMetrics
	if err == nil {
		pm, err = parseVLLMMetrics(body)
		if err != nil {
			err = fmt.Errorf("GET %s/metrics: %w", base, err)
		}
	}
	if ctx.Err() != nil {
		return
	}
	now := m.now()
	restarted := m.applyScrape(ep, base, now, pm, err)
	m.notifyRestarts(restarted)
}

// applyScrape records one scrape's outcome and returns the targets whose
// process start time changed: the pod restarted, so whatever its old
// process announced is gone even if no event says so.
func (m *Monitor) applyScrape(ep *endpoint, base string, now time.Time, pm podMetrics, err error) (restarted []TargetSpec) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err == nil && len(pm.load) == 0 {
		err = fmt.Errorf("GET %s/metrics: no vllm:num_requests_running, vllm:num_requests_waiting or vllm:kv_cache_usage_perc", base)
	}
	if err != nil {
		if ep.scrapeErr != err.Error() {
			m.log.Warn("scrape failed", "endpoint", base, "err", err)
		}
		ep.scrapeErr = err.Error()
		for _, t := range ep.targets {
			t.live.scrapeFailures.Add(1)
		}
		return nil
	}
	ep.scrapeErr = ""
	ep.scrapeAt = now
	for _, t := range ep.targets {
		rank := strconv.Itoa(t.ts.ID.Rank)
		l, ok := pm.load[rank]
		podWide := false
		if !ok && len(pm.load) == 1 && pm.load[""] != nil {
			// Unlabelled gauges: they describe the whole pod.
			l, ok = pm.load[""], true
			podWide = t.ts.DP > 1
		}
		// Labelled per engine but not for this rank: no data; the old
		// values age towards stale.
		if ok {
			if old := t.load.ProcessStart; old > 0 && pm.processStart > 0 && old != pm.processStart {
				restarted = append(restarted, t.ts)
			}
			t.load = Load{
				Running:      int(l.running),
				Waiting:      int(l.waiting),
				KVUsage:      l.kv,
				At:           now,
				PodWide:      podWide,
				ProcessStart: pm.processStart,
			}
		}
		if cc, ok := pm.cache[rank]; ok {
			t.cache = cc
		} else if cc, ok := pm.cache[""]; ok {
			t.cache = cc
		} else if len(pm.cache) > 0 {
			t.cache = pm.anyCache()
		}
	}
	return restarted
}
