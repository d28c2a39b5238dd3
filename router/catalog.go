package router

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/prefixrouter/prefixrouter/health"
)

// catalog is the union of the targets' GET /v1/models: it answers the
// router's own /v1/models and tells LoRA adapters (entries with a parent)
// from base models, since an adapter's name is an extra key of every block.
type catalog struct {
	up  *upstream
	mon *health.Monitor

	mu       sync.RWMutex
	adapters map[string]string // adapter name → base model
}

func newCatalog(up *upstream, mon *health.Monitor) *catalog {
	return &catalog{up: up, mon: mon, adapters: map[string]string{}}
}

type modelEntry struct {
	ID     string `json:"id"`
	Parent string `json:"parent"`
	raw    json.RawMessage
}

// run refreshes the adapter map: quickly until a target answered, then on
// a slow interval.
func (c *catalog) run(ctx context.Context) {
	for {
		ok := c.refresh(ctx)
		wait := 15 * time.Second
		if !ok {
			wait = 500 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

func (c *catalog) refresh(ctx context.Context) bool {
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	entries, answered := c.fetch(cctx)
	if answered == 0 {
		return false
	}
	ad := map[string]string{}
	for _, e := range entries {
		if e.Parent != "" && e.Parent != e.ID {
			ad[e.ID] = e.Parent
		}
	}
	c.mu.Lock()
	c.adapters = ad
	c.mu.Unlock()
	return true
}

func (c *catalog) isAdapter(model string) bool { return c.parent(model) != "" }

func (c *catalog) parent(model string) string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.adapters[model]
}

// fetch asks every routable endpoint once, concurrently, and merges the
// entries by id (first answer wins, sorted by id).
func (c *catalog) fetch(ctx context.Context) ([]modelEntry, int) {
	snap := c.mon.Snapshot()
	seen := map[string]bool{}
	var eps []string
	for _, t := range snap.Targets {
		if t.CanRoute() && !seen[t.ID.Endpoint] {
			seen[t.ID.Endpoint] = true
			eps = append(eps, t.ID.Endpoint)
		}
	}
	type answer struct {
		entries []modelEntry
		err     error
	}
	res := make([]answer, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i].entries, res[i].err = c.fetchOne(ctx, ep)
		}()
	}
	wg.Wait()
	byID := map[string]modelEntry{}
	answered := 0
	for _, a := range res {
		if a.err != nil {
			continue
		}
		answered++
		for _, e := range a.entries {
			if _, ok := byID[e.ID]; !ok {
				byID[e.ID] = e
			}
		}
	}
	out := make([]modelEntry, 0, len(byID))
	for _, e := range byID {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, answered
}

func (c *catalog) fetchOne(ctx context.Context, endpoint string) ([]modelEntry, error) {
	resp, err := c.up.do(ctx, &upRequest{method: fasthttp.MethodGet, endpoint: endpoint, path: "/v1/models"})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != fasthttp.StatusOK {
		return nil, fmt.Errorf("GET %s/v1/models: status %d", endpoint, resp.StatusCode)
	}
	body, err := readAllLimit(resp.Body, nil, 8<<20)
	if err != nil {
		return nil, fmt.Errorf("GET %s/v1/models: %w", endpoint, err)
	}
	var doc struct {
		Data []json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, fmt.Errorf("GET %s/v1/models: %w", endpoint, err)
	}
	out := make([]modelEntry, 0, len(doc.Data))
	for _, raw := range doc.Data {
		var e modelEntry
		if json.Unmarshal(raw, &e) != nil || e.ID == "" {
			continue
		}
		e.raw = raw
		out = append(out, e)
	}
	return out, nil
}

// listing is the live union of the routable targets' lists, or, when none
// answers, the model names health knows.
func (c *catalog) listing(ctx context.Context) []modelEntry {
	entries, answered := c.fetch(ctx)
	if answered > 0 {
		return entries
	}
	names := c.mon.Snapshot().ModelNames()
	entries = make([]modelEntry, 0, len(names))
	for _, name := range names {
		b, _ := json.Marshal(map[string]any{"id": name, "object": "model", "owned_by": "vllm"})
		entries = append(entries, modelEntry{ID: name, raw: b})
	}
	return entries
}

// union renders the router's /v1/models from the listing.
func (c *catalog) union(ctx context.Context) []byte {
	entries := c.listing(ctx)
	data := make([]json.RawMessage, 0, len(entries))
	for _, e := range entries {
		data = append(data, e.raw)
	}
	b, _ := json.Marshal(struct {
		Object string            `json:"object"`
		Data   []json.RawMessage `json:"data"`
	}{"list", data})
	return b
}

// entry is the listing's entry of id, as GET /v1/models/{id} answers it.
func (c *catalog) entry(ctx context.Context, id string) (json.RawMessage, bool) {
	for _, e := range c.listing(ctx) {
		if e.ID == id {
			return e.raw, true
		}
	}
	return nil, false
}
