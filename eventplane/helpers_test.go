package eventplane

import (
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixrouter/prefixrouter/internal/logbuf"
	"github.com/prefixrouter/prefixrouter/internal/manualclock"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// fakeEvents is a settable subscriber status per target, standing in for
// the subscribers (Plane.statusFn).
type fakeEvents struct {
	mu sync.Mutex
	st map[targetid.ID]kvindex.SubscriberStatus
}

func (f *fakeEvents) status(id targetid.ID) (kvindex.SubscriberStatus, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.st[id]
	return s, ok
}

// set edits id's status, creating a connected one first.
func (f *fakeEvents) set(id targetid.ID, fn func(*kvindex.SubscriberStatus)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.st[id]
	if !ok {
		s = kvindex.SubscriberStatus{Target: id, Connected: true}
	}
	fn(&s)
	f.st[id] = s
}

type testEnv struct {
	p      *Plane
	clock  *manualclock.Clock
	events *fakeEvents
	reg    *prometheus.Registry
	logs   *logbuf.Buffer
}

// quietLogger discards logs.
func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newTestPlane builds a plane that is not Run (no subscriber starts) with a
// manual clock and fake subscriber statuses; evaluate judges on demand.
func newTestPlane(t testing.TB, cfg Config) *testEnv {
	t.Helper()
	env := &testEnv{clock: manualclock.New(), events: &fakeEvents{st: map[targetid.ID]kvindex.SubscriberStatus{}}, reg: prometheus.NewRegistry(),
		logs: &logbuf.Buffer{}}
	log := slog.New(slog.NewTextHandler(env.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	p, err := New(cfg, Deps{Registerer: env.reg, Logger: log, Now: env.clock.Now})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	p.statusFn = env.events.status
	env.p = p
	return env
}

// podID is a target id for tests.
func podID(rank int) targetid.ID { return targetid.ID{Endpoint: "http://10.0.0.7:8000", Rank: rank} }

// verdictMetric checks that prefixrouter_health_events_verdict reports
// exactly v for id.
func (e *testEnv) verdictMetric(t *testing.T, id targetid.ID, v Verdict) {
	t.Helper()
	want := `# HELP prefixrouter_health_events_verdict 1 for the current verdict on the target's KV-event stream.
# TYPE prefixrouter_health_events_verdict gauge
prefixrouter_health_events_verdict{target="` + id.String() + `",verdict="` + string(v) + `"} 1
`
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(want), "prefixrouter_health_events_verdict"); err != nil {
		t.Fatal(err)
	}
}

// storedBatch is the BlockStored batch a pod hashing with h publishes for
// the full blocks of tokens, with the keys it stores.
func storedBatch(t testing.TB, h *kvindex.Hasher, tokens []uint32) (events.Batch, []kvindex.Key) {
	t.Helper()
	keys, err := h.Keys(nil, tokens, kvindex.RequestExtras{})
	if err != nil {
		t.Fatal(err)
	}
	hashes := make([]uint64, len(keys))
	for i, k := range keys {
		hashes[i] = uint64(k)
	}
	bs := h.BlockSize()
	return events.Batch{TS: 1, Events: []events.Event{{Kind: events.KindBlockStored, BlockHashes: hashes, Medium: events.MediumGPU,
		TokenIDs: tokens[:len(keys)*bs], BlockSize: bs}}}, keys
}

// requireFault returns id's fault of kind k and checks that its detail
// says every one of wants.
func requireFault(t *testing.T, p *Plane, id targetid.ID, k FaultKind, wants ...string) Fault {
	t.Helper()
	for _, f := range p.Freshness(id).Faults {
		if f.Kind != k {
			continue
		}
		for _, w := range wants {
			if !strings.Contains(f.Detail, w) {
				t.Errorf("%s detail %q lacks %q", k, f.Detail, w)
			}
		}
		return f
	}
	t.Fatalf("no %s fault: %+v", k, p.Freshness(id))
	return Fault{}
}
