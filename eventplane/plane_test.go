package eventplane

import (
	"context"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixrouter/prefixrouter/internal/poll"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/sim/publish"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// TestConfigErrorsNameTheFlag: every rejected value says which flag.
func TestConfigErrorsNameTheFlag(t *testing.T) {
	tests := []struct {
		cfg  Config
		flag string
	}{
		{Config{StaleAfter: -time.Second}, "--events-stale-after"},
		{Config{EvalInterval: -time.Second}, "--events-eval-interval"},
		{Config{RoutingWindow: -time.Second}, "--health-routing-window"},
		{Config{MinUncachedTokens: -1}, "--events-min-uncached-tokens"},
		{Config{MaxQueueDepth: -1}, "--events-max-queue-depth"},
		{Config{BlockSize: -16}, "--block-size"},
		{Config{BlockSize: kvindex.MaxBlockSize + 1}, "--block-size"},
		{Config{HashAlgo: "md5"}, "--hash-algo"},
		{Config{EventsListen: []string{"tcp://*:5557", "5558"}}, "--events-listen"},
		{Config{EventsListen: []string{"tcp://*:5557", "tcp://*:5557"}}, "--events-listen"},
		{Config{EventsListen: []string{"tcp://*:5557"}, ReplayPort: 70000}, "--replay-port"},
		{Config{ReplayPort: 5600}, "--replay-port"},
	}
	for _, tt := range tests {
		_, err := New(tt.cfg, Deps{Logger: quietLogger()})
		if err == nil || !strings.Contains(err.Error(), tt.flag) {
			t.Errorf("%+v: error %v, want one naming %s", tt.cfg, err, tt.flag)
		}
	}
	p, err := New(Config{}, Deps{Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(p.cfg, DefaultConfig()) {
		t.Fatalf("zero config filled as %+v, want the defaults %+v", p.cfg, DefaultConfig())
	}
}

// TestVerdictTrust: what each verdict lets routing lean on.
func TestVerdictTrust(t *testing.T) {
	tests := []struct {
		v       Verdict
		weight  float64
		trusted bool
	}{
		{VerdictFresh, 1, true},
		{VerdictReplaying, 1, false},
		{VerdictStale, 0.5, false},
		{VerdictDisconnected, 0, false},
		{"", 0, false},
	}
	for _, tt := range tests {
		if got := tt.v.ConfirmedWeight(); got != tt.weight {
			t.Errorf("%q.ConfirmedWeight() = %v, want %v", tt.v, got, tt.weight)
		}
		if got := tt.v.Trusted(); got != tt.trusted {
			t.Errorf("%q.Trusted() = %v, want %v", tt.v, got, tt.trusted)
		}
	}
}

// TestKeysLearnedFromThePods: block keys are configured from the
// configuration when it says enough, else from what most pods report; exact
// mode also needs the algorithm.
func TestKeysLearnedFromThePods(t *testing.T) {
	rep := func(bs int, algo string) Cache { return Cache{Reported: true, BlockSize: bs, HashAlgo: algo} }
	tests := []struct {
		name   string
		cfg    Config
		caches map[targetid.ID]Cache
		want   *Keys // Keyer not compared
	}{
		{name: "configured block size, token-derived: at once", cfg: Config{BlockSize: 32},
			want: &Keys{Mode: kvindex.ModeTokenDerived, BlockSize: 32, Algo: "token-derived"}},
		{name: "configured block size wins over the pods", cfg: Config{BlockSize: 32},
			caches: map[targetid.ID]Cache{podID(0): rep(16, "sha256")},
			want:   &Keys{Mode: kvindex.ModeTokenDerived, BlockSize: 32, Algo: "token-derived"}},
		{name: "nothing known: not configured"},
		{name: "unreported pods do not count", caches: map[targetid.ID]Cache{podID(0): {BlockSize: 16}}},
		{name: "the majority's block size",
			caches: map[targetid.ID]Cache{podID(0): rep(16, "sha256"), podID(1): rep(32, "sha256"), podID(2): rep(32, "sha256")},
			want:   &Keys{Mode: kvindex.ModeTokenDerived, BlockSize: 32, Algo: "token-derived"}},
		{name: "a tie goes to the smaller block size",
			caches: map[targetid.ID]Cache{podID(0): rep(64, "sha256"), podID(1): rep(16, "sha256")},
			want:   &Keys{Mode: kvindex.ModeTokenDerived, BlockSize: 16, Algo: "token-derived"}},
		{name: "exact mode takes the pods' algorithm", cfg: Config{HashSeed: "0", HasHashSeed: true},
			caches: map[targetid.ID]Cache{podID(0): rep(16, "xxhash")},
			want:   &Keys{Mode: kvindex.ModeExact, BlockSize: 16, Algo: "xxhash"}},
		{name: "exact mode: the configured algorithm wins", cfg: Config{HashSeed: "0", HasHashSeed: true, HashAlgo: "sha256_cbor"},
			caches: map[targetid.ID]Cache{podID(0): rep(16, "xxhash")},
			want:   &Keys{Mode: kvindex.ModeExact, BlockSize: 16, Algo: "sha256_cbor"}},
		{name: "exact mode without any algorithm waits", cfg: Config{HashSeed: "0", HasHashSeed: true, BlockSize: 16}},
		{name: "exact mode: an algorithm nobody knows is not used", cfg: Config{HashSeed: "0", HasHashSeed: true},
			caches: map[targetid.ID]Cache{podID(0): rep(16, "md5")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newTestPlane(t, tt.cfg)
			if tt.caches != nil {
				env.p.SetCaches(tt.caches)
			}
			got := env.p.Keys()
			switch {
			case tt.want == nil && got != nil:
				t.Fatalf("configured %+v, want nothing yet", *got)
			case tt.want == nil:
				if v := env.p.KeysView(); v.Configured {
					t.Fatalf("keys view %+v", v)
				}
			case got == nil:
				t.Fatalf("not configured, want %+v", *tt.want)
			case got.Keyer == nil || got.Mode != tt.want.Mode || got.BlockSize != tt.want.BlockSize || got.Algo != tt.want.Algo:
				t.Fatalf("keys %+v, want %+v", *got, *tt.want)
			case env.p.KeysView() != KeysView{Configured: true, Mode: tt.want.Mode.String(), BlockSize: tt.want.BlockSize, Algo: tt.want.Algo}:
				t.Fatalf("keys view %+v", env.p.KeysView())
			}
		})
	}

	// Once configured, later reports change nothing: the index has one key
	// space for the process's life.
	env := newTestPlane(t, Config{})
	env.p.SetCaches(map[targetid.ID]Cache{podID(0): rep(16, "sha256")})
	env.p.SetCaches(map[targetid.ID]Cache{podID(0): rep(64, "sha256"), podID(1): rep(64, "sha256")})
	if ks := env.p.Keys(); ks == nil || ks.BlockSize != 16 {
		t.Fatalf("keys after a later report: %+v", ks)
	}
}

// TestExpectedBlockSize: a request's expected blocks are counted in the
// pod's own block size, else the configured one, else the one its model's
// pods agree on, else vLLM's default.
func TestExpectedBlockSize(t *testing.T) {
	tests := []struct {
		name     string
		cfgBS    int
		cache    Cache
		wantSize int
	}{
		{name: "nothing known: default", wantSize: 16},
		{name: "the model's agreement", cache: Cache{BlockSize: 32}, wantSize: 32},
		{name: "configured over the model's agreement", cfgBS: 64, cache: Cache{BlockSize: 32}, wantSize: 64},
		{name: "the pod's own report over everything", cfgBS: 64, cache: Cache{Reported: true, BlockSize: 128}, wantSize: 128},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newTestPlane(t, Config{BlockSize: tt.cfgBS})
			id := podID(0)
			env.p.SetTarget(id, Source{})
			env.p.SetCaches(map[targetid.ID]Cache{id: tt.cache})
			e := env.p.Dispatch(id)
			e.FirstByte(1024, 1024)
			env.p.evaluate()
			if got := env.p.Freshness(id).ExpectedBlocksSinceEvent; got != int64(1024/tt.wantSize) {
				t.Fatalf("expected %d blocks, want %d (block size %d)", got, 1024/tt.wantSize, tt.wantSize)
			}
		})
	}
}

// TestPrefixCachingDisabledIsStale: a pod running without prefix caching
// publishes no events, so nothing predicted on it can be confirmed: its
// stream is stale, and says why, until the pod reports prefix caching on.
func TestPrefixCachingDisabledIsStale(t *testing.T) {
	env := newTestPlane(t, Config{})
	id := podID(0)
	env.events.set(id, func(*kvindex.SubscriberStatus) {})
	env.p.SetTarget(id, Source{Events: "tcp://127.0.0.1:5557"})
	env.p.SetCaches(map[targetid.ID]Cache{id: {Reported: true, BlockSize: 16, PrefixCachingDisabled: true, PrefixCaching: "False"}})
	env.p.evaluate()
	if f := env.p.Freshness(id); f.Verdict != VerdictStale || !strings.Contains(f.Detail, "prefix caching is disabled on the pod (enable_prefix_caching=False)") {
		t.Fatalf("verdict %s (%s), want stale saying why", f.Verdict, f.Detail)
	}
	env.p.SetCaches(map[targetid.ID]Cache{id: {Reported: true, BlockSize: 16, PrefixCaching: "True"}})
	env.p.evaluate()
	if f := env.p.Freshness(id); f.Verdict != VerdictFresh {
		t.Fatalf("after enabling: %s (%s)", f.Verdict, f.Detail)
	}
}

// TestPlacementCap: a pod's placements are bounded by its GPU block count
// (with room for offloading tiers), so that missed removals cannot make
// the index claim far more than the pod holds.
func TestPlacementCap(t *testing.T) {
	env := newTestPlane(t, Config{BlockSize: 16})
	id := podID(0)
	keys := make([]kvindex.Key, 3000)
	for i := range keys {
		keys[i] = kvindex.Key(i + 1)
	}
	env.p.Index().Store(id, kvindex.TierGPU, keys)
	env.p.SetCaches(map[targetid.ID]Cache{id: {Reported: true, BlockSize: 16, NumGPUBlocks: 100}})
	st, _ := env.p.Index().StatsFor(id)
	if want := placementCap(100); want != 1424 || st.Placements != want || st.Evicted != uint64(len(keys)-want) {
		t.Fatalf("placements %d, evicted %d; want cap %d", st.Placements, st.Evicted, want)
	}
	if placementCap(0) != 0 {
		t.Fatal("an unknown GPU block count must not cap")
	}
}

// TestMetrics: the plane's series keep their health_ names, label only by
// target and verdict, and vanish with a removed target.
func TestMetrics(t *testing.T) {
	env := newTestPlane(t, Config{})
	id := podID(0)
	env.events.set(id, func(st *kvindex.SubscriberStatus) { st.LastEvent = env.clock.Now(); st.QueueDepth = 3 })
	env.p.SetTarget(id, Source{Events: "tcp://127.0.0.1:5557"})
	env.p.Dispatch(id)
	env.clock.Advance(time.Second)
	env.p.evaluate()
	env.verdictMetric(t, id, VerdictFresh)
	fams, err := env.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		if !strings.HasPrefix(f.GetName(), "prefixrouter_health_") {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() != "target" && l.GetName() != "verdict" {
					t.Errorf("%s has label %s", f.GetName(), l.GetName())
				}
			}
			got[f.GetName()] = m.GetGauge().GetValue()
		}
	}
	want := map[string]float64{
		"prefixrouter_health_events_verdict":          1,
		"prefixrouter_health_events_last_age_seconds": 1,
		"prefixrouter_health_events_queue_depth":      3,
		"prefixrouter_health_routed_in_window":        1,
	}
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s = %v, want %v", name, got[name], v)
		}
	}
	env.p.RemoveTarget(id)
	if n, err := testutilCount(env.reg, "prefixrouter_health_events_verdict"); err != nil || n != 0 {
		t.Fatalf("%d verdict series after removal (%v)", n, err)
	}
	if _, err := New(Config{}, Deps{Registerer: env.reg}); err == nil {
		t.Fatal("second registration accepted")
	}
}

// TestAlertableCountersExistFromTheStart: an alert on the rate of hash
// mismatches or of batches lost for good needs the series before the first
// occurrence: a target's kvindex counters exist at zero from when it is
// added, for every reason, and vanish when it is removed.
func TestAlertableCountersExistFromTheStart(t *testing.T) {
	env := newTestPlane(t, Config{})
	id := podID(0)
	env.p.SetTarget(id, Source{Events: "tcp://127.0.0.1:5557"})
	series := map[string][]string{
		"prefixrouter_kv_hash_mismatches_total":     {`reason="hash"`, `reason="block_size"`, `reason="extra_keys"`},
		"prefixrouter_kv_unrecovered_batches_total": {""},
		"prefixrouter_kv_sequence_gaps_total":       {""},
		"prefixrouter_kv_restarts_total":            {""},
		"prefixrouter_kv_decode_errors_total":       {""},
		"prefixrouter_kv_rank_mismatches_total":     {""},
		"prefixrouter_kv_unchained_blocks_total":    {""},
		"prefixrouter_kv_hash_checks_total":         {""},
		"prefixrouter_kv_event_batches_total":       {""},
	}
	fams, err := env.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]int{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["target"] != id.String() {
				continue
			}
			if v := m.GetCounter().GetValue(); f.GetType().String() == "COUNTER" && v != 0 {
				t.Errorf("%s%v = %v before any event", f.GetName(), labels, v)
			}
			for _, want := range series[f.GetName()] {
				if want == "" || strings.Contains(want, `"`+labels["reason"]+`"`) {
					found[f.GetName()]++
				}
			}
		}
	}
	for name, want := range series {
		if found[name] != len(want) {
			t.Errorf("%s: %d series for the new target, want %d (%v)", name, found[name], len(want), want)
		}
	}
	env.p.RemoveTarget(id)
	fams, err = env.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "target" && l.GetValue() == id.String() {
					t.Errorf("%s still has the removed target", f.GetName())
				}
			}
		}
	}
}

func testutilCount(reg *prometheus.Registry, name string) (int, error) {
	fams, err := reg.Gather()
	n := 0
	for _, f := range fams {
		if f.GetName() == name {
			n += len(f.GetMetric())
		}
	}
	return n, err
}

// TestWiring runs the plane against real ZMQ publishers: a target's events
// reach the index through its subscriber, a moved target is followed on its
// new address from scratch, a restart resyncs, and a removed target leaves
// nothing behind.
func TestWiring(t *testing.T) {
	newPub := func() *publish.Publisher {
		pub, err := publish.New(publish.Config{Bind: "tcp://127.0.0.1:*", ReplayBind: "tcp://127.0.0.1:*", Logger: quietLogger()})
		if err != nil {
			t.Fatalf("publisher: %v", err)
		}
		t.Cleanup(func() { pub.Close() })
		return pub
	}
	p, err := New(Config{BlockSize: 4, HashAlgo: "sha256", HashSeed: "0", HasHashSeed: true, EvalInterval: 10 * time.Millisecond},
		Deps{Logger: quietLogger(), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	h, err := kvindex.NewHasher(kvindex.AlgoSHA256, "0", 4)
	if err != nil {
		t.Fatal(err)
	}
	store := func(pub *publish.Publisher, tokens []uint32) []kvindex.Key {
		t.Helper()
		b, keys := storedBatch(t, h, tokens)
		if _, err := pub.Publish(&b, events.EncodingMap); err != nil {
			t.Fatal(err)
		}
		return keys
	}
	holds := func(id targetid.ID, keys []kvindex.Key) bool {
		for _, k := range keys {
			if !p.Index().Has(id, k) {
				return false
			}
		}
		return true
	}

	id := podID(0)
	first := newPub()
	p.SetTarget(id, Source{Events: first.Endpoint(), Replay: first.ReplayEndpoint()})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = p.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	// A late joiner loses nothing: the first connect replays from 0.
	k1 := store(first, []uint32{1, 2, 3, 4, 5, 6, 7, 8})
	waitFor(t, "first pod's blocks indexed", func() bool { return holds(id, k1) })
	waitFor(t, "stream judged fresh", func() bool { return p.Verdict(id) == VerdictFresh && p.Freshness(id).Connected })

	// Moved: the old address's placements give way to the new one's.
	second := newPub()
	p.SetTarget(id, Source{Events: second.Endpoint(), Replay: second.ReplayEndpoint()})
	waitFor(t, "old placements reset", func() bool { return !holds(id, k1[:1]) })
	k2 := store(second, []uint32{9, 10, 11, 12})
	waitFor(t, "second pod's blocks indexed", func() bool { return holds(id, k2) })

	// Restarted: resynced from the pod's replay buffer, placements kept.
	restarts := p.Freshness(id).Restarts
	p.TargetRestarted(id)
	waitFor(t, "the subscriber restarted", func() bool { return p.Freshness(id).Restarts > restarts })
	waitFor(t, "placements rebuilt after the restart", func() bool { return holds(id, k2) })

	p.RemoveTarget(id)
	if holds(id, k2[:1]) {
		t.Fatal("removed target still holds placements")
	}
	if f := p.Freshness(id); f.Verdict != VerdictDisconnected || f.Detail != "no event subscriber for this target" {
		t.Fatalf("removed target's stream: %s (%s)", f.Verdict, f.Detail)
	}
	if v := p.IndexView(); len(v) != 0 {
		t.Fatalf("index view after removal: %+v", v)
	}
}

// waitFor waits for cond (internal/poll).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, what, cond)
}
