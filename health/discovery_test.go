package health

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/targetid"
)

// recorder collects registry changes as "kind name" strings.
type recorder struct {
	mu  sync.Mutex
	got []string
}

func (r *recorder) fn(c Change) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := string(c.Kind) + " " + c.Target.ID.String()
	if c.Kind == Updated {
		s += " " + c.Previous.Events + "->" + c.Target.Events
	}
	r.got = append(r.got, s)
}

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.got
	r.got = nil
	slices.Sort(out)
	return out
}

func snapshotNames(m *Monitor) []string {
	var out []string
	for _, t := range m.Snapshot().Targets {
		out = append(out, t.Name+"="+string(t.State))
	}
	return out
}

// TestDNSDiscovery: records that change add and remove targets; a failing
// resolution keeps the previous set; a removed target with requests in
// flight drains, then disappears.
func TestDNSDiscovery(t *testing.T) {
	res := &fakeResolver{addrs: map[string][]string{}}
	res.set("vllm.default.svc", "10.1.0.1", "10.1.0.2")
	env := newTestMonitor(t, Config{DiscoverDNS: []string{"vllm.default.svc:8000?replay-port=5558&dp=2"}}, Deps{Resolver: res})
	var rec recorder
	cancel := env.m.Subscribe(rec.fn)
	defer cancel()

	env.m.resolveAll(env.ctx)
	if got, want := rec.take(), []string{
		"added http://10.1.0.1:8000#0", "added http://10.1.0.1:8000#1",
		"added http://10.1.0.2:8000#0", "added http://10.1.0.2:8000#1",
	}; !slices.Equal(got, want) {
		t.Fatalf("changes %v, want %v", got, want)
	}
	tg := env.target(t, targetid.ID{Endpoint: "http://10.1.0.1:8000", Rank: 1})
	if tg.Spec.Events != "tcp://10.1.0.1:5558" || tg.Spec.Replay != "tcp://10.1.0.1:5559" || tg.Source != SourceDNS {
		t.Fatalf("dns target spec %+v source %s", tg.Spec, tg.Source)
	}

	// One pod replaced by another; the removed one has a request in flight.
	flight := tg.Dispatch(10, 10)
	res.set("vllm.default.svc", "10.1.0.2", "10.1.0.3")
	env.m.resolveAll(env.ctx)
	if got, want := rec.take(), []string{
		"added http://10.1.0.3:8000#0", "added http://10.1.0.3:8000#1",
		"removed http://10.1.0.1:8000#0", "removed http://10.1.0.1:8000#1",
	}; !slices.Equal(got, want) {
		t.Fatalf("changes %v, want %v", got, want)
	}
	env.m.evaluate()
	old := env.target(t, tg.ID)
	if old.State != StateDraining || old.CanRoute() {
		t.Fatalf("removed target %s routable=%v", old.State, old.CanRoute())
	}
	if _, ok := env.m.Snapshot().Target(targetid.ID{Endpoint: "http://10.1.0.1:8000"}); ok {
		t.Fatal("removed target without requests in flight still listed")
	}
	for _, tg := range env.m.Snapshot().ForModel("x") {
		if tg.State == StateDraining {
			t.Fatal("draining target listed for a model")
		}
	}
	flight.Finish(OutcomeSuccess)
	env.m.evaluate()
	if _, ok := env.m.Snapshot().Target(tg.ID); ok {
		t.Fatal("drained target still listed")
	}

	// A DNS failure keeps what we had; the error is visible.
	res.mu.Lock()
	res.err = &net.DNSError{Err: "server misbehaving", Name: "vllm.default.svc", IsTemporary: true}
	res.mu.Unlock()
	before := snapshotNames(env.m)
	env.m.resolveAll(env.ctx)
	if got := rec.take(); len(got) != 0 {
		t.Fatalf("changes on DNS failure: %v", got)
	}
	if after := snapshotNames(env.m); !slices.Equal(before, after) {
		t.Fatalf("targets changed on DNS failure: %v -> %v", before, after)
	}
	if v, _ := env.gauge(t, "prefixrouter_health_discovery_errors_total", map[string]string{"source": "dns"}); v != 1 {
		t.Fatalf("discovery errors %v", v)
	}
	if dv := env.m.Debug(); len(dv.Sources) != 1 || !strings.Contains(dv.Sources[0].LastError, "misbehaving") {
		t.Fatalf("debug sources %+v", dv.Sources)
	}

	// An empty successful answer removes everything.
	res.set("vllm.default.svc")
	env.m.resolveAll(env.ctx)
	if got := rec.take(); len(got) != 4 || !strings.HasPrefix(got[0], "removed") {
		t.Fatalf("changes %v", got)
	}
	env.m.evaluate()
	if n := len(env.m.Snapshot().Targets); n != 0 {
		t.Fatalf("%d targets left", n)
	}

	// A late subscriber starts with the current targets.
	res.set("vllm.default.svc", "10.1.0.9")
	env.m.resolveAll(env.ctx)
	var late recorder
	env.m.Subscribe(late.fn)
	if got := late.take(); !slices.Equal(got, []string{"added http://10.1.0.9:8000#0", "added http://10.1.0.9:8000#1"}) {
		t.Fatalf("late subscriber got %v", got)
	}
}

// TestSourcePrecedence: a static --endpoint wins over the same endpoint from
// DNS; when DNS drops it the static one stays.
func TestSourcePrecedence(t *testing.T) {
	res := &fakeResolver{addrs: map[string][]string{}}
	res.set("vllm", "10.1.0.1")
	env := newTestMonitor(t, Config{
		Endpoints:   []string{"http://10.1.0.1:8000?model=pinned"},
		DiscoverDNS: []string{"vllm:8000"},
	}, Deps{Resolver: res})
	env.m.resolveAll(env.ctx)
	tg := env.target(t, targetid.ID{Endpoint: "http://10.1.0.1:8000"})
	if tg.Source != SourceFlag || !slices.Equal(tg.Spec.Models, []string{"pinned"}) {
		t.Fatalf("source %s models %v", tg.Source, tg.Spec.Models)
	}
	res.set("vllm")
	env.m.resolveAll(env.ctx)
	if tg := env.target(t, tg.ID); tg.State == StateDraining {
		t.Fatal("static target drained by DNS")
	}
}

// TestEndpointsFileEdited: the file is re-read on change; edits add, update
// and remove targets; a broken or blank edit keeps the previous targets.
func TestEndpointsFileEdited(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "endpoints.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("- http://10.2.0.1:8000\n- http://10.2.0.2:8000?dp=2\n")
	env := newTestMonitor(t, Config{EndpointsFile: path}, Deps{})
	var rec recorder
	env.m.Subscribe(rec.fn)
	if got := rec.take(); len(got) != 3 {
		t.Fatalf("initial targets %v", got)
	}

	steps := []struct {
		name    string
		content string
		want    []string
		wantErr string
	}{
		{
			name:    "add one, shrink dp, change events port",
			content: "- http://10.2.0.1:8000?events=tcp://10.2.0.1:6000\n- http://10.2.0.2:8000\n- http://10.2.0.3:8000\n",
			want: []string{
				"added http://10.2.0.3:8000#0",
				"removed http://10.2.0.2:8000#1",
				"updated http://10.2.0.1:8000#0 tcp://10.2.0.1:5557->tcp://10.2.0.1:6000",
				// Rank 0 of the shrunk endpoint: its DP changed.
				"updated http://10.2.0.2:8000#0 tcp://10.2.0.2:5557->tcp://10.2.0.2:5557",
			},
		},
		{name: "unchanged content", content: "- http://10.2.0.1:8000?events=tcp://10.2.0.1:6000\n- http://10.2.0.2:8000\n- http://10.2.0.3:8000\n"},
		{name: "broken edit keeps targets", content: "- http://10.2.0.1:8000?dp=zero\n", wantErr: "dp"},
		{name: "blank file keeps targets", content: "", wantErr: "empty"},
		{name: "json works too", content: `{"endpoints": ["http://10.2.0.3:8000"]}`, want: []string{"removed http://10.2.0.1:8000#0", "removed http://10.2.0.2:8000#0"}},
		{name: "explicit empty list removes all", content: "[]", want: []string{"removed http://10.2.0.3:8000#0"}},
	}
	for _, s := range steps {
		write(s.content)
		err := env.m.reloadFile()
		if s.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), s.wantErr) {
				t.Fatalf("%s: err %v", s.name, err)
			}
		} else if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		got := rec.take()
		slices.Sort(s.want)
		if !slices.Equal(got, s.want) {
			t.Fatalf("%s: changes %v, want %v", s.name, got, s.want)
		}
	}
	// A missing file at start-up is an error; later it keeps the targets.
	if _, err := New(Config{EndpointsFile: filepath.Join(dir, "missing.yaml")}, Deps{}); err == nil {
		t.Fatal("New accepted a missing endpoints file")
	}
}

// TestRunEndToEnd runs the real loops (tickers, fsnotify) with short
// intervals against fake pods: a pod listed in the file becomes routable, an
// edit of the file adds a second pod, a pod whose /health fails goes down,
// and the context ends Run.
func TestRunEndToEnd(t *testing.T) {
	a, b := newFakePod(t, "m"), newFakePod(t, "m")
	path := filepath.Join(t.TempDir(), "endpoints.json")
	if err := os.WriteFile(path, []byte(fmt.Sprintf("[%q]", a.spec(""))), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		EndpointsFile: path, FilePollInterval: time.Hour, // fsnotify must do it
		ProbeInterval: 20 * time.Millisecond, ProbeTimeout: 20 * time.Millisecond,
		ScrapeInterval: 20 * time.Millisecond, ScrapeTimeout: 20 * time.Millisecond, LoadStaleAfter: time.Hour,
		EvalInterval: 10 * time.Millisecond, FailureThreshold: 2,
	}
	env := newTestMonitor(t, cfg, Deps{Now: time.Now})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- env.m.Run(ctx) }()

	routable := func(p *fakePod) func() bool {
		return func() bool {
			tg, ok := env.m.Snapshot().Target(p.id(0))
			return ok && tg.State == StateRoutable
		}
	}
	eventually(t, "first pod routable", routable(a))
	if err := os.WriteFile(path, []byte(fmt.Sprintf("[%q, %q]", a.spec(""), b.spec(""))), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "second pod added by the file edit and routable", routable(b))
	a.healthy.Store(false)
	eventually(t, "failing pod down", func() bool {
		tg, _ := env.m.Snapshot().Target(a.id(0))
		return tg.State == StateDown && tg.Reason == ReasonProbeFailed
	})
	cancel()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}
