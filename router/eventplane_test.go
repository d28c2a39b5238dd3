package router

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// TestCachesOf: what health scraped reaches the event plane as the plane
// needs it; a pod that did not report its block size takes the one its
// model's pods agree on, and counts for nothing in the fleet's choice.
func TestCachesOf(t *testing.T) {
	id := func(ep string) targetid.ID { return targetid.ID{Endpoint: ep} }
	snap := &health.Snapshot{
		Models: map[string]health.ModelConfig{"m": {Model: "m", BlockSize: 32, Agreed: true}},
		Targets: []*health.Target{
			{ID: id("reported"), State: health.StateDegraded, Models: []string{"m"}, Cache: health.CacheConfig{Known: true, BlockSize: 64, NumGPUBlocks: 900, HashAlgo: "xxhash", PrefixCaching: "True"}},
			{ID: id("no-block-size"), Models: []string{"m"}, Cache: health.CacheConfig{Known: true, HashAlgo: "sha256", PrefixCaching: "False"}},
			{ID: id("unknown"), State: health.StateDown, Models: []string{"other", "m"}},
			{ID: id("unknown-model"), Models: []string{"other"}},
		},
	}
	want := map[targetid.ID]eventplane.Cache{
		id("reported"):      {Serving: true, Reported: true, BlockSize: 64, HashAlgo: "xxhash", NumGPUBlocks: 900, PrefixCaching: "True"},
		id("no-block-size"): {BlockSize: 32, HashAlgo: "sha256", PrefixCachingDisabled: true, PrefixCaching: "False"},
		id("unknown"):       {BlockSize: 32},
		id("unknown-model"): {},
	}
	got := cachesOf(snap)
	if len(got) != len(want) {
		t.Fatalf("caches for %d targets, want %d: %+v", len(got), len(want), got)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: %+v, want %+v", k, got[k], w)
		}
	}
}

// TestSilentPodTurnsStale: the router tells the event plane of every
// dispatch and first byte, so a pod whose event stream is connected but
// announces nothing after computing new blocks is judged stale, and its
// confirmed run stops counting fully.
func TestSilentPodTurnsStale(t *testing.T) {
	t.Parallel()
	p := newFakePod(t, "A", 16, true)
	cfg := DefaultConfig()
	cfg.Health = fastHealth(p.endpoint())
	cfg.Events.StaleAfter = 100 * time.Millisecond
	cfg.Events.MinUncachedTokens = 1
	r := startRouter(t, cfg)
	waitFor(t, "pod routable with a fresh event stream", func() bool { return freshCount(r, "m") == 1 && r.KeysReady() })
	id := targetid.ID{Endpoint: p.srv.URL}

	_, list := tokenPrompt(64) // four full blocks, none cached anywhere
	if code, _, out := post(t, "http://"+r.Addr()+"/v1/completions", `{"model":"m","prompt":`+list+`,"max_tokens":1}`); code != 200 {
		t.Fatalf("status %d: %s", code, out)
	}
	waitFor(t, "the silent pod judged stale", func() bool { return r.ev.Verdict(id) == eventplane.VerdictStale })
	f := r.ev.Freshness(id)
	if f.ExpectedBlocksSinceEvent != 4 || f.UncachedSinceEvent != 64 || f.RoutedInWindow != 1 {
		t.Fatalf("freshness %+v: want 4 blocks and 64 uncached tokens awaited over 1 route", f)
	}
	d := dryRun(t, r, "/v1/completions", `{"model":"m","prompt":`+list+`}`)
	if len(d.Candidates) != 1 || d.Candidates[0].Load.Events != string(eventplane.VerdictStale) {
		t.Fatalf("dry run candidates %+v: want the stale verdict", d.Candidates)
	}
}

// TestDebugTargetsShape: GET /debug/targets merges health's view of each
// target with its event stream from the event plane, in the shape it has
// always had.
func TestDebugTargetsShape(t *testing.T) {
	t.Parallel()
	live := newFakePod(t, "A", 16, true)
	deaf := newFakePod(t, "B", 16, false)
	cfg := DefaultConfig()
	cfg.Health = fastHealth(live.endpoint(), deaf.endpoint())
	r := startRouter(t, cfg)
	waitFor(t, "the publishing pod fresh", func() bool { return freshCount(r, "m") == 1 && r.KeysReady() })

	var view struct {
		Policy string                     `json:"policy"`
		Keys   eventplane.KeysView        `json:"block_keys"`
		Index  json.RawMessage            `json:"index"`
		Health map[string]json.RawMessage `json:"health"`
	}
	adminDebugTargets(t, r, &view)
	if !view.Keys.Configured || view.Keys.BlockSize != 16 || view.Keys.Mode != "token-derived" || view.Index == nil {
		t.Fatalf("block keys %+v, index %s", view.Keys, view.Index)
	}
	for _, k := range []string{"generated", "snapshot_version", "ready", "sources", "models", "targets"} {
		if _, ok := view.Health[k]; !ok {
			t.Errorf("health view lacks %q", k)
		}
	}
	var targets []map[string]json.RawMessage
	if err := json.Unmarshal(view.Health["targets"], &targets); err != nil || len(targets) != 2 {
		t.Fatalf("targets %s (%v)", view.Health["targets"], err)
	}
	verdicts := map[string]string{}
	for _, tv := range targets {
		for _, k := range []string{"target", "endpoint", "rank", "source", "role", "events_address", "state", "reason",
			"since", "can_route", "models", "probe", "breaker", "load", "event_stream", "cache_config"} {
			if _, ok := tv[k]; !ok {
				t.Errorf("target view lacks %q: %v", k, tv)
			}
		}
		var es map[string]json.RawMessage
		if err := json.Unmarshal(tv["event_stream"], &es); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"verdict", "connected", "replaying", "last_seq", "have_seq", "gaps", "unrecovered_batches",
			"restarts", "queue_depth", "routed_in_window", "uncached_tokens_since_event", "expected_blocks_since_event"} {
			if _, ok := es[k]; !ok {
				t.Errorf("event stream lacks %q: %v", k, es)
			}
		}
		var name, verdict string
		_ = json.Unmarshal(tv["target"], &name)
		_ = json.Unmarshal(es["verdict"], &verdict)
		verdicts[name] = verdict
	}
	if verdicts[targetName(live.srv.URL)] != "fresh" || verdicts[targetName(deaf.srv.URL)] != "disconnected" {
		t.Fatalf("verdicts %v: want the publishing pod fresh, the other disconnected", verdicts)
	}
}
