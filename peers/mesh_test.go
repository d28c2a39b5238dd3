package peers

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixrouter/prefixrouter/internal/poll"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/targetid"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return "tcp://" + ln.Addr().String()
}

// fakeResolver answers names from a table; a name it does not know fails.
type fakeResolver struct {
	mu sync.Mutex
	m  map[string][]string
}

func (r *fakeResolver) LookupHost(_ context.Context, host string) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if a, ok := r.m[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func (r *fakeResolver) set(host string, addrs ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[host] = addrs
}

// recorder is a replica's handlers, recording what its peers said.
type recorder struct {
	mu          sync.Mutex
	predictions []Prediction
	origins     []string
	withdrawals []uint64
	flights     map[targetid.ID]TargetFlights
	own         []TargetFlights
}

func (r *recorder) handlers() Handlers {
	return Handlers{
		Prediction: func(origin string, p Prediction) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.predictions = append(r.predictions, p)
			r.origins = append(r.origins, origin)
		},
		Withdrawal: func(_ string, placement uint64) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.withdrawals = append(r.withdrawals, placement)
		},
		Flights: func(m map[targetid.ID]TargetFlights) {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.flights == nil {
				r.flights = map[targetid.ID]TargetFlights{}
			}
			for id, f := range m {
				if f.isZero() {
					delete(r.flights, id)
				} else {
					r.flights[id] = f
				}
			}
		},
		Own: func() []TargetFlights {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.own
		},
		OwnOf: func(id targetid.ID) TargetFlights {
			r.mu.Lock()
			defer r.mu.Unlock()
			for _, f := range r.own {
				if f.Target == id {
					return f
				}
			}
			return TargetFlights{Target: id}
		},
	}
}

func (r *recorder) read(fn func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fn()
}

type replica struct {
	m    *Mesh
	rec  *recorder
	reg  *prometheus.Registry
	stop context.CancelFunc
	done chan struct{}
}

// testKey is the keypair the tests' replicas share unless a test gives
// its own.
var testKey = sync.OnceValue(func() Key {
	k, err := GenerateKey()
	if err != nil {
		panic(err)
	}
	return k
})

// keyFile writes k as a key file and returns its path.
func keyFile(t *testing.T, k Key) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "peer.key")
	if err := os.WriteFile(path, k.Format(), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// startReplica starts a mesh with id on listen, following peers, holding
// the tests' key.
func startReplica(t *testing.T, id, listen string, res Resolver, peers ...string) *replica {
	t.Helper()
	cfg := DefaultConfig()
	cfg.ID, cfg.Listen, cfg.Peers = id, listen, peers
	cfg.KeyFile = keyFile(t, testKey())
	cfg.ResolveInterval = 100 * time.Millisecond
	cfg.FlightsInterval = 20 * time.Millisecond
	return startReplicaConfig(t, cfg, res)
}

// startReplicaConfig starts a mesh of cfg.
func startReplicaConfig(t *testing.T, cfg Config, res Resolver) *replica {
	t.Helper()
	rp := &replica{rec: &recorder{}, reg: prometheus.NewRegistry(), done: make(chan struct{})}
	m, err := New(cfg, rp.rec.handlers(), Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registerer: rp.reg, Resolver: res})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := m.Listen(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	rp.m, rp.stop = m, cancel
	go func() {
		defer close(rp.done)
		if err := m.Run(ctx); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(rp.close)
	return rp
}

func (rp *replica) close() {
	rp.stop()
	<-rp.done
}

// waitFor waits for cond (internal/poll).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, what, cond)
}

func (rp *replica) peer(t *testing.T, addr string) PeerView {
	t.Helper()
	for _, p := range rp.m.View().Peers {
		if p.Peer == addr {
			return p
		}
	}
	return PeerView{}
}

// TestMeshSharesPredictionsAndFlights: two replicas that list each other
// (and themselves, as a headless Service's name does) exchange
// predictions, withdrawals and in-flight work; each skips its own
// address; a replica that stops takes its in-flight work with it.
func TestMeshSharesPredictionsAndFlights(t *testing.T) {
	addrA, addrB := freeAddr(t), freeAddr(t)
	a := startReplica(t, "router-a", addrA, nil, addrA, addrB)
	b := startReplica(t, "router-b", addrB, nil, addrA, addrB)
	waitFor(t, "both connected", func() bool {
		return a.peer(t, addrB).Connected && b.peer(t, addrA).Connected
	})
	if p := a.peer(t, addrA); p.State != stateSelf {
		t.Fatalf("own address followed as %+v", p)
	}
	if p := b.peer(t, addrA); p.Origin != "router-a" {
		t.Fatalf("peer A's origin %q", p.Origin)
	}
	pred := Prediction{Placement: 9, Target: targetid.ID{Endpoint: "http://pod:8000"}, Deadline: time.Now().Add(time.Second),
		Model: "m", BlockSize: 16, Keys: []kvindex.Key{1, 2, 3}}
	a.m.Publish(pred)
	a.m.Withdraw(9)
	waitFor(t, "the prediction and its withdrawal at B", func() bool {
		var ok bool
		b.rec.read(func() { ok = len(b.rec.predictions) == 1 && len(b.rec.withdrawals) == 1 })
		return ok
	})
	b.rec.read(func() {
		got := b.rec.predictions[0]
		if b.rec.origins[0] != "router-a" || got.Placement != 9 || len(got.Keys) != 3 || !got.Deadline.Equal(pred.Deadline) {
			t.Fatalf("B received %+v from %s", got, b.rec.origins[0])
		}
	})
	a.rec.read(func() {
		if len(a.rec.predictions) != 0 {
			t.Fatal("A received its own prediction")
		}
	})

	pod := targetid.ID{Endpoint: "http://pod:8000"}
	a.rec.read(func() {
		a.rec.own = []TargetFlights{{Target: pod, InFlight: 2, Prefilling: 1, QueuedUncachedTokens: 1500}}
	})
	waitFor(t, "A's flights at B", func() bool {
		var f TargetFlights
		b.rec.read(func() { f = b.rec.flights[pod] })
		return f.QueuedUncachedTokens == 1500 && f.InFlight == 2
	})
	if err := testutil.GatherAndCompare(b.reg, strings.NewReader(`
# HELP prefixrouter_peer_predictions_received_total Predicted placements (one per request and target) received from the peer replica.
# TYPE prefixrouter_peer_predictions_received_total counter
prefixrouter_peer_predictions_received_total{peer="`+addrA+`"} 1
`), "prefixrouter_peer_predictions_received_total"); err != nil {
		t.Fatal(err)
	}
	if v := b.peer(t, addrA); v.Lag.Samples == 0 || v.Messages < 3 {
		t.Fatalf("lag and messages not counted: %+v", v)
	}

	a.close()
	waitFor(t, "A's flights gone from B after its bye", func() bool {
		var n int
		b.rec.read(func() { n = len(b.rec.flights) })
		return n == 0
	})
	waitFor(t, "A shown silent", func() bool { return b.peer(t, addrA).Fault == stateSilent })
	if p := b.peer(t, addrA); !strings.Contains(p.Reason, "bye") {
		t.Fatalf("A silent for %q: its bye did not arrive", p.Reason)
	}
}

// TestChangedFlightsLeaveAtOnce: a replica's in-flight work on a target
// reaches its peers when it changes (Changed), not at the next flights
// interval (an hour here), and the receiver hands over that target alone.
func TestChangedFlightsLeaveAtOnce(t *testing.T) {
	addrA, addrB := freeAddr(t), freeAddr(t)
	cfg := DefaultConfig()
	cfg.ResolveInterval, cfg.FlightsInterval = 100*time.Millisecond, time.Hour
	// Insecure: the mesh works the same in the clear.
	cfg.Insecure = true
	cfg.ID, cfg.Listen, cfg.Peers = "router-a", addrA, []string{addrB}
	a := startReplicaConfig(t, cfg, nil)
	cfg.ID, cfg.Listen, cfg.Peers = "router-b", addrB, []string{addrA}
	b := startReplicaConfig(t, cfg, nil)
	pod, other := targetid.ID{Endpoint: "http://pod:8000"}, targetid.ID{Endpoint: "http://other:8000"}
	// The first update also says A is there: no heartbeat for an hour.
	a.rec.read(func() {
		a.rec.own = []TargetFlights{{Target: pod, InFlight: 1, Prefilling: 1, QueuedUncachedTokens: 2000}}
	})
	flightsAt := func(id targetid.ID) (f TargetFlights) {
		b.rec.read(func() { f = b.rec.flights[id] })
		return f
	}
	waitFor(t, "A's dispatch at B", func() bool {
		a.m.Changed(pod) // until B's subscription is up: PUB drops what no one receives
		return flightsAt(pod).QueuedUncachedTokens == 2000
	})
	a.rec.read(func() {
		a.rec.own = []TargetFlights{{Target: pod, InFlight: 1}, {Target: other, InFlight: 1, Prefilling: 1, QueuedUncachedTokens: 50}}
	})
	a.m.Changed(pod)
	waitFor(t, "A's first byte at B", func() bool { return flightsAt(pod).Prefilling == 0 && flightsAt(pod).InFlight == 1 })
	if f := flightsAt(other); !f.isZero() {
		t.Fatalf("a target A did not say changed was handed over: %+v", f)
	}
	a.rec.read(func() { a.rec.own = nil })
	a.m.Changed(pod)
	waitFor(t, "A's end at B", func() bool { return flightsAt(pod).isZero() })
}

// TestMeshWiringFaults: a name that does not resolve, then resolves; an
// address nobody publishes on; a listen address already taken.
func TestMeshWiringFaults(t *testing.T) {
	res := &fakeResolver{m: map[string][]string{}}
	addrA, nobody := freeAddr(t), freeAddr(t)
	_, nobodyPort, _ := strings.Cut(strings.TrimPrefix(nobody, "tcp://127.0.0.1"), ":")
	a := startReplica(t, "router-a", addrA, res, "dns:routers.test:"+nobodyPort)
	src := func() SourceView { return a.m.View().Sources[0] }
	waitFor(t, "the resolution error shown", func() bool { return src().Errors > 0 })
	if s := src(); !strings.Contains(s.LastError, "no such host") {
		t.Fatalf("source %+v", s)
	}
	if err := testutil.GatherAndCompare(a.reg, strings.NewReader(`
# HELP prefixrouter_peer_source_resolved 1 while the --peers entry's last resolution succeeded, else 0.
# TYPE prefixrouter_peer_source_resolved gauge
prefixrouter_peer_source_resolved{source="dns:routers.test:`+nobodyPort+`"} 0
`), "prefixrouter_peer_source_resolved"); err != nil {
		t.Fatal(err)
	}
	res.set("routers.test", "127.0.0.1")
	waitFor(t, "the name resolved", func() bool { return src().LastError == "" && len(src().Addresses) == 1 })
	if p := a.peer(t, nobody); p.State != stateConnecting {
		t.Fatalf("peer %+v", p)
	}

	// The same listen address twice: the second replica cannot start.
	cfg := DefaultConfig()
	cfg.ID, cfg.Listen, cfg.Insecure = "router-c", addrA, true
	m, err := New(cfg, Handlers{}, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Listen(context.Background()); err == nil || !strings.Contains(err.Error(), "--peer-listen") {
		t.Fatalf("binding a taken address: %v", err)
	}
}

// TestSilentAfterGrace: a peer that never says anything becomes a wiring
// fault once the connect grace passed.
func TestSilentAfterGrace(t *testing.T) {
	now := time.Unix(1000, 0)
	m := &Mesh{cfg: Config{FlightsInterval: 100 * time.Millisecond}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	p := &peer{addr: "tcp://10.0.0.9:5571", since: now, state: stateConnecting}
	p.judge(now.Add(connectGrace-time.Millisecond), m)
	if p.fault() != "" {
		t.Fatalf("fault within the grace: %s", p.state)
	}
	p.judge(now.Add(connectGrace+time.Millisecond), m)
	if p.fault() != stateSilent || !strings.Contains(p.reason, "--peer-listen") {
		t.Fatalf("state %s %q", p.state, p.reason)
	}
}

// TestParseSpec: the --peers forms.
func TestParseSpec(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Spec
		wantErr string
	}{
		{in: "tcp://10.0.0.5:5571", want: Spec{Text: "tcp://10.0.0.5:5571", Host: "10.0.0.5", Port: 5571}},
		{in: "tcp://Router-0.Peers:5571", want: Spec{Text: "tcp://Router-0.Peers:5571", Host: "router-0.peers", Port: 5571}},
		{in: "dns:prefixrouter-peers.default.svc:5571", want: Spec{Text: "dns:prefixrouter-peers.default.svc:5571", DNS: true, Host: "prefixrouter-peers.default.svc", Port: 5571}},
		{in: "dns:10.0.0.5:5571", wantErr: "give an address as tcp://"},
		{in: "10.0.0.5:5571", wantErr: "want tcp://HOST:PORT or dns:NAME:PORT"},
		{in: "tcp://10.0.0.5", wantErr: "want tcp://HOST:PORT"},
		{in: "tcp://10.0.0.5:0", wantErr: "want 1..65535"},
		{in: "tcp://bad_host!:5571", wantErr: "neither an IP address nor a host name"},
	} {
		got, err := ParseSpec(tc.in)
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: error %v, want %q", tc.in, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("%q: %v", tc.in, err)
		case got != tc.want:
			t.Errorf("%q: %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

// TestConfigValidate names the flags.
func TestConfigValidate(t *testing.T) {
	c := DefaultConfig()
	c.Peers = []string{"tcp://10.0.0.5:5571"}
	c.FlightsInterval = 0
	err := c.Validate()
	for _, want := range []string{"--peers needs --peer-listen", "--peer-flights-interval"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want one saying %q", err, want)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
}
