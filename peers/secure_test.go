package peers

import (
	"errors"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// rawPub binds a PUB socket on addr as a process that is no replica: a
// CURVE server with key when given (admitted through a ZAP domain of its
// own, as a replica's), else in the clear.
func rawPub(t *testing.T, addr string, key *Key) *zmq.Socket {
	t.Helper()
	s, err := zmq.NewSocket(zmq.PUB)
	if err != nil {
		t.Fatal(err)
	}
	_ = s.SetLinger(0)
	if key != nil {
		domain, release, err := zapAdmit(key.Public, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(release)
		if err := errors.Join(s.SetCurveServer(1), s.SetCurvePublickey(key.Public), s.SetCurveSecretkey(key.Secret),
			s.SetZapDomain(domain)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Bind(addr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// rawSub connects a SUB socket to addr: a CURVE client presenting own
// and expecting the server's key server when own is given, else in the
// clear.
func rawSub(t *testing.T, addr string, server string, own *Key) *zmq.Socket {
	t.Helper()
	s, err := zmq.NewSocket(zmq.SUB)
	if err != nil {
		t.Fatal(err)
	}
	_ = s.SetLinger(0)
	if own != nil {
		if err := errors.Join(s.SetCurveServerkey(server), s.SetCurvePublickey(own.Public), s.SetCurveSecretkey(own.Secret)); err != nil {
			t.Fatal(err)
		}
	}
	if err := errors.Join(s.SetSubscribe(""), s.Connect(addr)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// drain counts the messages waiting on s.
func drain(s *zmq.Socket) (n int) {
	for {
		if _, err := s.RecvBytes(zmq.DONTWAIT); err != nil {
			return n
		}
		n++
	}
}

func encode(t *testing.T, m Message) []byte {
	t.Helper()
	b, err := Encode(nil, &m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func otherKey(t *testing.T) Key {
	t.Helper()
	k, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

var (
	rogueTarget = targetid.ID{Endpoint: "http://pod-a:8000"}
	rogueKeys   = func() []kvindex.Key {
		k := make([]kvindex.Key, 64)
		for i := range k {
			k[i] = kvindex.Key(i + 1)
		}
		return k
	}()
)

// rogueMessages are what the finding's rogue sent: a pod's queue blown up
// and 64 predicted blocks on another, and plausible values that a mesh
// in the clear takes.
func rogueMessages(t *testing.T, seq *uint64, queued int64) [][]byte {
	t.Helper()
	now := time.Now()
	*seq += 2
	return [][]byte{
		encode(t, Message{Origin: "rogue", Sent: now, Seq: *seq - 1, Kind: KindFlights,
			Flights: []TargetFlights{{Target: rogueTarget, InFlight: 64, Prefilling: 64, QueuedUncachedTokens: queued}}}),
		encode(t, Message{Origin: "rogue", Sent: now, Seq: *seq, Kind: KindPrediction, Prediction: Prediction{
			Placement: *seq, Target: targetid.ID{Endpoint: "http://pod-b:8000"}, Deadline: now.Add(2 * time.Second),
			Model: "m", BlockSize: 16, Keys: rogueKeys}}),
	}
}

func (r *recorder) heardOf(id targetid.ID) (flights TargetFlights, predictions int) {
	r.read(func() { flights, predictions = r.flights[id], len(r.predictions) })
	return flights, predictions
}

// TestRoguePublisherChangesNothing: a process at a --peers address that
// does not hold the key, publishing in the clear or as a CURVE server of
// its own, never reaches the mesh's state, while a replica with the key
// is heard and a mesh in the clear (the control) takes the rogue's
// messages.
func TestRoguePublisherChangesNothing(t *testing.T) {
	clearAddr, curveAddr, addrA, addrB, addrC := freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t)
	clear := rawPub(t, clearAddr, nil)
	own := otherKey(t)
	curve := rawPub(t, curveAddr, &own)
	a := startReplica(t, "router-a", addrA, nil, clearAddr, curveAddr, addrB)
	b := startReplica(t, "router-b", addrB, nil, addrA)
	cfg := DefaultConfig()
	cfg.ID, cfg.Listen, cfg.Peers, cfg.Insecure = "router-c", addrC, []string{clearAddr}, true
	cfg.ResolveInterval, cfg.FlightsInterval = 100*time.Millisecond, 20*time.Millisecond
	c := startReplicaConfig(t, cfg, nil)

	legit := targetid.ID{Endpoint: "http://pod-c:8000"}
	b.rec.read(func() {
		b.rec.own = []TargetFlights{{Target: legit, InFlight: 1, Prefilling: 1, QueuedUncachedTokens: 100}}
	})
	var seq uint64
	waitFor(t, "the rogue heard by the mesh in the clear, and B by A", func() bool {
		for _, q := range []int64{1 << 60, 1 << 30} {
			for _, msg := range rogueMessages(t, &seq, q) {
				for _, s := range []*zmq.Socket{clear, curve} {
					if _, err := s.SendBytes(msg, zmq.DONTWAIT); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		cf, cp := c.rec.heardOf(rogueTarget)
		af, _ := a.rec.heardOf(legit)
		return cf.QueuedUncachedTokens == 1<<30 && cp > 0 && af.QueuedUncachedTokens == 100
	})
	f, p := a.rec.heardOf(rogueTarget)
	if !f.isZero() || p != 0 {
		t.Fatalf("the rogue reached the keyed mesh: flights %+v, %d predictions", f, p)
	}
	for _, addr := range []string{clearAddr, curveAddr} {
		if v := a.peer(t, addr); v.Messages != 0 || v.Origin != "" || v.Connected {
			t.Fatalf("the rogue at %s is heard: %+v", addr, v)
		}
	}
	if v := a.m.View(); v.Security != "curve" {
		t.Fatalf("security %q", v.Security)
	}
}

// TestRogueSubscriberReadsNothing: a subscriber without the key reads
// nothing of what a replica publishes, in the clear or as a CURVE client
// of its own keypair that knows the replica's public key (refused by the
// ZAP handler, counted); one holding the key reads it.
func TestRogueSubscriberReadsNothing(t *testing.T) {
	addrA := freeAddr(t)
	a := startReplica(t, "router-a", addrA, nil)
	key, own := testKey(), otherKey(t)
	legit := rawSub(t, addrA, key.Public, &key)
	clear := rawSub(t, addrA, "", nil)
	curve := rawSub(t, addrA, key.Public, &own)
	read := 0
	waitFor(t, "the key holder reading, and the stranger refused", func() bool {
		a.m.Publish(Prediction{Placement: 1, Target: rogueTarget, Deadline: time.Now().Add(time.Second), Model: "m", BlockSize: 16, Keys: rogueKeys})
		read += drain(legit)
		return read >= 3 && a.m.View().HandshakesRefused > 0
	})
	if n := drain(clear) + drain(curve); n != 0 {
		t.Fatalf("subscribers without the key read %d messages", n)
	}
	if n := gathered(t, a.reg, "prefixrouter_peer_handshakes_refused_total", nil); n < 1 {
		t.Fatalf("refused handshakes counted %v", n)
	}
}

// TestClearSubscriberIsCounted: a subscriber in the clear is refused by
// libzmq before the ZAP handler is asked; the handshake watch counts it.
func TestClearSubscriberIsCounted(t *testing.T) {
	addr := freeAddr(t)
	a := startReplica(t, "router-a", addr, nil)
	clear := rawSub(t, addr, "", nil)
	waitFor(t, "the subscriber in the clear refused and counted", func() bool { return a.m.View().HandshakesRefused > 0 })
	if n := drain(clear); n != 0 {
		t.Fatalf("a subscriber in the clear read %d messages", n)
	}
}

// TestTwoMeshesInOneProcess: two deployments' replicas with different
// keys in one process never hear each other, and a client holding the
// other deployment's keypair (which the process's ZAP handler also
// admits, on that deployment's domain) is refused.
func TestTwoMeshesInOneProcess(t *testing.T) {
	addrA, addrB, addrC := freeAddr(t), freeAddr(t), freeAddr(t)
	other := otherKey(t)
	a := startReplica(t, "router-a", addrA, nil, addrB, addrC)
	c := startReplica(t, "router-c", addrC, nil, addrA)
	cfg := DefaultConfig()
	cfg.ID, cfg.Listen, cfg.Peers, cfg.KeyFile = "router-b", addrB, []string{addrA}, keyFile(t, other)
	cfg.ResolveInterval, cfg.FlightsInterval = 100*time.Millisecond, 20*time.Millisecond
	b := startReplicaConfig(t, cfg, nil)
	cross := rawSub(t, addrA, testKey().Public, &other)
	waitFor(t, "A and C connected, and B's key refused at A", func() bool {
		return a.peer(t, addrC).Connected && c.peer(t, addrA).Connected && a.m.View().HandshakesRefused > 0
	})
	if v := a.peer(t, addrB); v.Messages != 0 {
		t.Fatalf("A heard the other deployment's B: %+v", v)
	}
	if v := b.peer(t, addrA); v.Messages != 0 {
		t.Fatalf("B heard the other deployment's A: %+v", v)
	}
	if n := drain(cross); n != 0 {
		t.Fatalf("the other deployment's keypair read %d messages from A", n)
	}
}

// gathered is the value of the series name with labels in reg (0 when
// absent).
func gathered(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue next
				}
			}
			return value(m)
		}
	}
	return 0
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	return math.NaN()
}

// TestImplausiblePeerIsRejected: a publisher holding the key whose
// messages are beyond what a replica reports (the finding's 2^60 queued
// tokens among them) changes nothing; each is counted by its reason and
// the peer shows the fault rejected with it. A plausible message from it
// is then applied, and the fault stays for the hold.
func TestImplausiblePeerIsRejected(t *testing.T) {
	pod := targetid.ID{Endpoint: "http://pod:8000"}
	flights := func(f ...TargetFlights) Message { return Message{Kind: KindFlights, Flights: f} }
	many := make([]TargetFlights, maxPeerTargets+1)
	for i := range many {
		many[i] = TargetFlights{Target: targetid.ID{Endpoint: "http://pod:8000", Rank: i}, InFlight: 1}
	}
	pred := func(blockSize, keys int, ahead time.Duration) func(time.Time) Message {
		return func(now time.Time) Message {
			return Message{Kind: KindPrediction, Prediction: Prediction{Placement: 1, Target: pod, Deadline: now.Add(ahead),
				Model: "m", BlockSize: blockSize, Keys: make([]kvindex.Key, keys)}}
		}
	}
	for _, tc := range []struct {
		reason string
		msg    func(now time.Time) Message
		raw    []byte // instead of msg
	}{
		{reason: "queued_tokens", msg: func(time.Time) Message {
			return flights(TargetFlights{Target: pod, InFlight: 1, Prefilling: 1, QueuedUncachedTokens: 1 << 60})
		}},
		{reason: "in_flight", msg: func(time.Time) Message { return flights(TargetFlights{Target: pod, InFlight: 1 << 40}) }},
		{reason: "targets", msg: func(time.Time) Message { return flights(many...) }},
		{reason: "keys", msg: pred(4096, 1<<13, time.Second)},
		{reason: "deadline", msg: pred(16, 4, 24*time.Hour)},
		{reason: "clock", msg: func(time.Time) Message { return Message{Kind: KindBye, Sent: time.Unix(0, 0)} }},
		{reason: "malformed", raw: []byte{0x96, 0x01, 0xa1, 'r'}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			addrP, addrA := freeAddr(t), freeAddr(t)
			key := testKey()
			pub := rawPub(t, addrP, &key)
			a := startReplica(t, "router-a", addrA, nil, addrP)
			var seq uint64
			send := func(m Message) {
				seq++
				m.Origin, m.Seq = "router-p", seq
				if m.Sent.IsZero() {
					m.Sent = time.Now()
				}
				if _, err := pub.SendBytes(encode(t, m), zmq.DONTWAIT); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, "the message rejected", func() bool {
				if tc.raw != nil {
					if _, err := pub.SendBytes(tc.raw, zmq.DONTWAIT); err != nil {
						t.Fatal(err)
					}
				} else {
					send(tc.msg(time.Now()))
				}
				return a.peer(t, addrP).Rejected[tc.reason] > 0
			})
			v := a.peer(t, addrP)
			if v.State != stateRejected || v.Fault != stateRejected || !strings.HasPrefix(v.Reason, tc.reason+": ") {
				t.Fatalf("peer %+v", v)
			}
			var n, predictions int
			a.rec.read(func() { n, predictions = len(a.rec.flights), len(a.rec.predictions) })
			if n != 0 || predictions != 0 {
				t.Fatalf("a rejected message was applied: %d targets' flights, %d predictions", n, predictions)
			}
			if got := gathered(t, a.reg, "prefixrouter_peer_messages_rejected_total", map[string]string{"peer": addrP, "reason": tc.reason}); got < 1 {
				t.Fatalf("rejected_total{reason=%q} %v", tc.reason, got)
			}
			if got := gathered(t, a.reg, "prefixrouter_peer_wiring_fault", map[string]string{"peer": addrP, "fault": stateRejected}); got != 1 {
				t.Fatalf("wiring_fault{fault=rejected} %v", got)
			}

			// A plausible report is taken; the fault holds.
			waitFor(t, "a plausible report applied", func() bool {
				send(flights(TargetFlights{Target: pod, InFlight: 2, Prefilling: 1, QueuedUncachedTokens: 3000}))
				f, _ := a.rec.heardOf(pod)
				return f.QueuedUncachedTokens == 3000
			})
			if v := a.peer(t, addrP); v.Fault != stateRejected || !v.Connected {
				t.Fatalf("after a plausible report: %+v", v)
			}
		})
	}
}

// TestRejectHold: the fault clears once a peer sent nothing rejected for
// the hold.
func TestRejectHold(t *testing.T) {
	now := time.Unix(1000, 0)
	m := &Mesh{cfg: Config{FlightsInterval: time.Hour}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	p := &peer{addr: "tcp://10.0.0.9:5571", state: stateConnected, lastMessage: now}
	p.reject(now, rejectQueuedTokens, "too many")
	p.lastMessage = now.Add(rejectHold)
	p.judge(now.Add(rejectHold), m)
	if p.fault() != stateRejected {
		t.Fatalf("cleared within the hold: %s", p.state)
	}
	p.judge(now.Add(rejectHold+time.Millisecond), m)
	if p.fault() != "" || p.state != stateConnected {
		t.Fatalf("after the hold: %s %q", p.state, p.reason)
	}
}

// TestMeshNeedsAKey: a mesh refuses to start without --peer-key-file
// unless --peer-insecure says so, and a key file is checked.
func TestMeshNeedsAKey(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	k, k2 := testKey(), otherKey(t)
	for _, tc := range []struct {
		name     string
		keyFile  string
		insecure bool
		wantErr  string // "" starts
	}{
		{name: "neither", wantErr: "--peer-listen needs --peer-key-file"},
		{name: "insecure", insecure: true},
		{name: "key", keyFile: write("ok", string(k.Format()))},
		{name: "secret alone", keyFile: write("secret", "secret="+k.Secret+"\n")},
		{name: "both", keyFile: write("both", string(k.Format())), insecure: true, wantErr: "give one"},
		{name: "missing file", keyFile: filepath.Join(dir, "nope"), wantErr: "--peer-key-file " + filepath.Join(dir, "nope")},
		{name: "empty", keyFile: write("empty", "# nothing\n"), wantErr: "no secret= line"},
		{name: "mismatched pair", keyFile: write("pair", "public="+k2.Public+"\nsecret="+k.Secret+"\n"), wantErr: "different keypairs"},
		{name: "not z85", keyFile: write("bad", "secret="+strings.Repeat("~", 40)+"\n"), wantErr: "not a 40-character Z85 key"},
		{name: "short", keyFile: write("short", "secret=abc\n"), wantErr: "not a 40-character Z85 key"},
		{name: "unknown line", keyFile: write("junk", "secret="+k.Secret+"\nkey "+k.Public+"\n"), wantErr: "line 2: want public=KEY or secret=KEY"},
		{name: "too long", keyFile: write("long", strings.Repeat("#\n", maxKeyFile)), wantErr: "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.ID, cfg.Listen, cfg.KeyFile, cfg.Insecure = "r", "tcp://127.0.0.1:5571", tc.keyFile, tc.insecure
			m, err := New(cfg, Handlers{}, Deps{})
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatal(err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
			case tc.wantErr == "" && tc.keyFile != "" && m.key.Public != k.Public:
				t.Fatalf("public key %q, want %q", m.key.Public, k.Public)
			}
		})
	}
	cfg := DefaultConfig()
	cfg.KeyFile = "x"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "need --peer-listen") {
		t.Fatalf("a key without a mesh: %v", err)
	}
}

// TestZapAnswer: what the handler says to each request.
func TestZapAnswer(t *testing.T) {
	k := testKey()
	var denied []string
	domain, release, err := zapAdmit(k.Public, func(addr string) { denied = append(denied, addr) })
	if err != nil {
		t.Fatal(err)
	}
	req := func(domain, mech string, creds ...string) [][]byte {
		r := [][]byte{[]byte("1.0"), []byte("7"), []byte(domain), []byte("10.0.0.9"), nil, []byte(mech)}
		for _, c := range creds {
			r = append(r, []byte(c))
		}
		return r
	}
	raw, other := zmq.Z85decode(k.Public), zmq.Z85decode(otherKey(t).Public)
	for _, tc := range []struct {
		name string
		req  [][]byte
		code string
	}{
		{"the key", req(domain, "CURVE", raw), "200"},
		{"another key", req(domain, "CURVE", other), "400"},
		{"another domain", req(domain+"x", "CURVE", raw), "400"},
		{"no credentials", req(domain, "CURVE"), "400"},
		{"plain", req(domain, "PLAIN", "u", "p"), "400"},
		{"in the clear on a mesh's domain", req(domain, "NULL"), "400"},
		{"in the clear elsewhere", req("", "NULL"), "200"},
		{"CURVE elsewhere", req("", "CURVE", raw), "400"},
		{"short", [][]byte{[]byte("1.0"), []byte("7")}, "500"},
		{"other version", append([][]byte{[]byte("2.0")}, req(domain, "CURVE", raw)[1:]...), "500"},
	} {
		got := zapAnswer(tc.req)
		if len(got) != 6 || string(got[2]) != tc.code {
			t.Errorf("%s: %q, want %s", tc.name, got, tc.code)
		}
	}
	if len(denied) != 4 {
		t.Errorf("denials heard: %v", denied)
	}
	release()
	if got := zapAnswer(req(domain, "CURVE", raw)); string(got[2]) != "400" {
		t.Errorf("a released domain still admits: %q", got)
	}
}

// TestImplausibleBounds: each bound at its edge, and an update judged by
// what the origin's work would span once applied.
func TestImplausibleBounds(t *testing.T) {
	now := time.Unix(1000, 0)
	pod := targetid.ID{Endpoint: "http://pod:8000"}
	known := map[targetid.ID]TargetFlights{}
	for i := range maxPeerTargets {
		id := targetid.ID{Endpoint: "http://pod:8000", Rank: i}
		known[id] = TargetFlights{Target: id, InFlight: 1}
	}
	fl := func(kind Kind, f ...TargetFlights) Message { return Message{Sent: now, Kind: kind, Flights: f} }
	pr := func(bs, keys int, deadline time.Time) Message {
		return Message{Sent: now, Kind: KindPrediction, Prediction: Prediction{Target: pod, BlockSize: bs, Keys: make([]kvindex.Key, keys), Deadline: deadline}}
	}
	for _, tc := range []struct {
		name  string
		msg   Message
		known map[targetid.ID]TargetFlights
		want  int
	}{
		{"queued at the bound", fl(KindFlights, TargetFlights{Target: pod, QueuedUncachedTokens: maxPeerQueuedTokens}), nil, -1},
		{"queued past it", fl(KindFlights, TargetFlights{Target: pod, QueuedUncachedTokens: maxPeerQueuedTokens + 1}), nil, rejectQueuedTokens},
		{"in flight at the bound", fl(KindFlightsUpdate, TargetFlights{Target: pod, InFlight: maxPeerInFlight, Prefilling: maxPeerInFlight}), nil, -1},
		{"prefilling past it", fl(KindFlightsUpdate, TargetFlights{Target: pod, Prefilling: maxPeerInFlight + 1}), nil, rejectInFlight},
		{"an update of a known target when full", fl(KindFlightsUpdate, TargetFlights{Target: targetid.ID{Endpoint: "http://pod:8000", Rank: 3}, InFlight: 2}), known, -1},
		{"an update ending work when full", fl(KindFlightsUpdate, TargetFlights{Target: pod}), known, -1},
		{"an update adding a target when full", fl(KindFlightsUpdate, TargetFlights{Target: targetid.ID{Endpoint: "http://other:8000"}, InFlight: 1}), known, rejectTargets},
		{"a full report replaces what is known", fl(KindFlights, TargetFlights{Target: targetid.ID{Endpoint: "http://other:8000"}, InFlight: 1}), known, -1},
		{"tokens predicted at the bound", pr(16, maxPredictedTokens/16, now.Add(time.Second)), nil, -1},
		{"past it", pr(16, maxPredictedTokens/16+1, now.Add(time.Second)), nil, rejectKeys},
		{"deadline at the horizon", pr(16, 1, now.Add(maxPredictionAhead)), nil, -1},
		{"past it", pr(16, 1, now.Add(maxPredictionAhead+1)), nil, rejectDeadline},
		{"deadline long past", pr(16, 1, now.Add(-maxPeerSkew-1)), nil, rejectDeadline},
		{"sent in the future", Message{Sent: now.Add(maxPeerSkew + 1), Kind: KindBye}, nil, rejectClock},
	} {
		if got, detail := implausible(&tc.msg, now, tc.known); got != tc.want {
			t.Errorf("%s: %d %q, want %d", tc.name, got, detail, tc.want)
		}
	}
}
