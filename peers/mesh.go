package peers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixrouter/prefixrouter/internal/zmqwait"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// Config is what the serve command's --peer-* flags set.
type Config struct {
	// ID names this replica on the wire (the origin of its predictions,
	// the origin label on the others). Flag --replica-id.
	ID string
	// Listen is the PUB address the other replicas subscribe to,
	// tcp://ADDR:PORT. Flag --peer-listen.
	Listen string
	// Peers are the other replicas (ParseSpec); this replica's own
	// address among them is skipped. Flag --peers.
	Peers []string
	// ResolveInterval is how often names are resolved again. Flag
	// --peers-resolve-interval.
	ResolveInterval time.Duration
	// FlightsInterval is how often this replica sends its in-flight work
	// (and so the heartbeat). Flag --peer-flights-interval.
	FlightsInterval time.Duration
	// KeyFile holds the CURVE keypair the replicas share (LoadKey): only
	// processes holding it can publish to this replica or read what it
	// publishes. Flag --peer-key-file.
	KeyFile string
	// Insecure runs the mesh without a key: in the clear, and believing
	// any process at a --peers address. Flag --peer-insecure.
	Insecure bool
}

// DefaultConfig is the serve command's defaults: off.
func DefaultConfig() Config {
	return Config{ResolveInterval: 10 * time.Second, FlightsInterval: 100 * time.Millisecond}
}

// Enabled reports whether the replica shares with peers.
func (c Config) Enabled() bool { return c.Listen != "" }

// Validate reports every problem in c at once, naming the flags.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Listen != "" {
		if _, _, err := kvindex.ParseListenAddr(c.Listen); err != nil {
			bad("--peer-listen %v", err)
		}
	}
	for _, p := range c.Peers {
		if _, err := ParseSpec(p); err != nil {
			bad("--peers %v", err)
		}
	}
	if len(c.Peers) > 0 && c.Listen == "" {
		bad("--peers needs --peer-listen: replicas share with each other, so each must publish too")
	}
	switch {
	case c.KeyFile != "" && c.Insecure:
		bad("--peer-key-file and --peer-insecure: give one")
	case c.Listen == "" && (c.KeyFile != "" || c.Insecure):
		bad("--peer-key-file and --peer-insecure need --peer-listen: there is no mesh without it")
	case c.Listen != "" && c.KeyFile == "" && !c.Insecure:
		bad("--peer-listen needs --peer-key-file PATH, the CURVE keypair the replicas share (`prefixrouter peer-keygen` writes one), or --peer-insecure to let anyone who reaches the port read the mesh and any process at a --peers address steer it")
	}
	if len(c.ID) > maxOrigin {
		bad("--replica-id: %d bytes, at most %d", len(c.ID), maxOrigin)
	}
	if c.ResolveInterval <= 0 {
		bad("--peers-resolve-interval %s: want a positive duration", c.ResolveInterval)
	}
	if c.FlightsInterval <= 0 {
		bad("--peer-flights-interval %s: want a positive duration", c.FlightsInterval)
	}
	return errors.Join(errs...)
}

// Handlers are what the router does with what peers say. Each is called
// from one of the mesh's goroutines, never with its lock held.
type Handlers struct {
	// Prediction: a peer recorded predicted placements.
	Prediction func(origin string, p Prediction)
	// Withdrawal: the pod rejected the peer's request before computing
	// anything.
	Withdrawal func(origin string, placement uint64)
	// Flights receives, for the targets whose sum may have changed (a
	// peer's report, a peer gone silent or saying bye), the sum of the
	// in-flight work of every live peer (zero included). Calls do not
	// overlap, and the last one for a target holds its latest sum.
	Flights func(map[targetid.ID]TargetFlights)
	// Own is this replica's in-flight work on every target that has some,
	// sent every flights interval; OwnOf its work on one target, sent
	// after Changed. Both are called by the sending goroutine.
	Own   func() []TargetFlights
	OwnOf func(targetid.ID) TargetFlights
}

// Mesh is this replica's side of prediction sharing: a PUB socket the
// other replicas subscribe to, a SUB socket per peer address, the peer
// list resolved and re-resolved, and what each peer said. Create it with
// New, bind with Listen, then Run until its context ends.
type Mesh struct {
	cfg   Config
	h     Handlers
	log   *slog.Logger
	now   func() time.Time
	res   Resolver
	specs []Spec

	pub *zmq.Socket
	// key is the deployment's keypair (nil: --peer-insecure); release
	// withdraws the ZAP domain that admits its holders to pub.
	key     *Key
	release func()
	// handshakes hears of the handshakes libzmq refuses before the ZAP
	// handler is asked (a client in the clear); nil without a key. Run
	// owns its goroutine.
	handshakes *handshakeWatch
	// refusedN counts the handshakes refused, refusedLogged is when one
	// was last logged (Unix nanoseconds).
	refusedN      atomic.Uint64
	refusedLogged atomic.Int64
	out           chan Message
	// fout is what is due to be sent of this replica's flights.
	fout    *flightsOut
	seq     atomic.Uint64
	dropped atomic.Uint64
	sent    [numKinds]atomic.Uint64
	self    map[string]bool // this replica's own addresses

	mu      sync.Mutex
	sources map[string]*source // by spec text
	peers   map[string]*peer   // by address
	// flights are each origin's last known in-flight work.
	flights map[string]*originFlights
	// handMu serializes handing the sum over, so that the last sum handed
	// over is the latest.
	handMu sync.Mutex
	wg     sync.WaitGroup
}

type source struct {
	spec    Spec
	addrs   []string
	lastOK  time.Time
	lastErr string
	errAt   time.Time
	logged  time.Time
	errors  uint64
}

// Deps are the mesh's collaborators; every field is optional.
type Deps struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	Resolver   Resolver
	Now        func() time.Time
}

// New checks cfg; nothing is bound until Listen.
func New(cfg Config, h Handlers, deps Deps) (*Mesh, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.ID == "" {
		return nil, errors.New("peers: no replica id")
	}
	m := &Mesh{cfg: cfg, h: h, log: deps.Logger, now: deps.Now, res: deps.Resolver,
		out: make(chan Message, 4096), fout: newFlightsOut(), sources: map[string]*source{}, peers: map[string]*peer{},
		flights: map[string]*originFlights{}}
	if m.log == nil {
		m.log = slog.Default()
	}
	m.log = m.log.With("replica", cfg.ID)
	if m.now == nil {
		m.now = time.Now
	}
	if m.res == nil {
		m.res = net.DefaultResolver
	}
	for _, p := range cfg.Peers {
		s, _ := ParseSpec(p) // validated
		m.specs = append(m.specs, s)
		m.sources[s.Text] = &source{spec: s}
	}
	if cfg.KeyFile != "" {
		k, err := LoadKey(cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("--peer-key-file %s: %w", cfg.KeyFile, err)
		}
		m.key = &k
	}
	if deps.Registerer != nil {
		if err := deps.Registerer.Register(&collector{m}); err != nil {
			return nil, fmt.Errorf("peers: metrics: %w", err)
		}
	}
	return m, nil
}

// ID is the replica's id.
func (m *Mesh) ID() string { return m.cfg.ID }

// Listen binds the PUB socket; an address that cannot be bound is an
// error the replica should not start with.
func (m *Mesh) Listen(ctx context.Context) error {
	self, err := localAddrs(ctx, m.cfg.Listen, m.res)
	if err != nil {
		return fmt.Errorf("--peer-listen %s: %w", m.cfg.Listen, err)
	}
	pub, err := zmq.NewSocket(zmq.PUB)
	if err != nil {
		return fmt.Errorf("--peer-listen %s: %w", m.cfg.Listen, err)
	}
	_ = pub.SetLinger(0)
	_ = pub.SetSndhwm(100000)
	// What a PUB socket reads is its subscribers' subscriptions (ours
	// subscribe to everything: one byte) and their handshakes.
	_ = pub.SetMaxmsgsize(pubMaxMessage)
	release := func() {}
	if m.key != nil {
		domain, rel, err := zapAdmit(m.key.Public, m.refused)
		if err == nil {
			err = errors.Join(pub.SetCurveServer(1), pub.SetCurvePublickey(m.key.Public),
				pub.SetCurveSecretkey(m.key.Secret), pub.SetZapDomain(domain))
			release = rel
		}
		if err == nil {
			m.handshakes, err = watchHandshakes(pub)
		}
		if err != nil {
			release()
			pub.Close()
			return fmt.Errorf("--peer-key-file: %w", err)
		}
	}
	if err := pub.Bind(m.cfg.Listen); err != nil {
		release()
		m.handshakes.close()
		m.handshakes = nil
		pub.Close()
		return fmt.Errorf("--peer-listen: bind %s: %w", m.cfg.Listen, err)
	}
	m.pub, m.self, m.release = pub, self, release
	if m.key == nil {
		m.log.Warn("sharing predictions with peer replicas WITHOUT a key (--peer-insecure): anyone who reaches the port reads them, and any process at a --peers address steers routing",
			"listen", m.cfg.Listen, "peers", m.cfg.Peers)
	} else {
		m.log.Info("sharing predictions with peer replicas", "listen", m.cfg.Listen, "peers", m.cfg.Peers, "key_file", m.cfg.KeyFile)
	}
	return nil
}

// refused hears of a handshake refused: a client without the key, told by
// the ZAP handler (a CURVE key not the mesh's) or libzmq's monitor (no
// CURVE at all). Logged at the first, then at most once a minute.
func (m *Mesh) refused(address string) {
	n := m.refusedN.Add(1)
	now := m.now().UnixNano()
	last := m.refusedLogged.Load()
	if now-last < int64(time.Minute) || !m.refusedLogged.CompareAndSwap(last, now) {
		return
	}
	m.log.Warn("refused a peer connection: it does not hold this replica's --peer-key-file (another deployment's replica, or not a replica)",
		"address", address, "refused", n)
}

// Socket bounds. A legitimate message is at most a prediction of maxKeys
// keys (9 bytes each) or a flights message of maxPeerTargets targets, far
// below subMaxMessage; a larger one makes libzmq drop the connection (and
// reconnect), which the receiver sees as lost messages. A peer's queue is
// bounded by subQueue messages: past it libzmq stops reading the
// connection and the sender's PUB drops, again counted as lost.
const (
	subMaxMessage = 2 << 20
	subQueue      = 1000
	pubMaxMessage = 4096
)

// Run resolves the peers, subscribes to them, sends what Publish and
// Withdraw queue and the flights every interval, until ctx ends; then it
// says bye, and closes every socket. Listen first.
func (m *Mesh) Run(ctx context.Context) error {
	if m.pub == nil {
		return errors.New("peers: Run before Listen")
	}
	defer m.wg.Wait()
	if h := m.handshakes; h != nil {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			h.run(ctx, m.refused)
		}()
	}
	sendDone := make(chan struct{})
	go func() {
		defer close(sendDone)
		m.send(ctx)
	}()
	m.resolve(ctx)
	resolve := time.NewTicker(m.cfg.ResolveInterval)
	defer resolve.Stop()
	flights := time.NewTicker(m.cfg.FlightsInterval)
	defer flights.Stop()
	for {
		select {
		case <-ctx.Done():
			<-sendDone
			m.stopPeers()
			return nil
		case <-resolve.C:
			m.resolve(ctx)
		case <-flights.C:
			m.dueFull()
			m.sweep()
		}
	}
}

// send owns the PUB socket: it stamps, encodes and sends queued messages
// in order until ctx ends, then a bye, and closes it. Stamping here keeps
// the sequence in the order the messages leave: a gap at a receiver is a
// lost message, never two callers racing.
func (m *Mesh) send(ctx context.Context) {
	defer func() {
		m.pub.Close()
		m.release()
	}()
	var buf []byte
	send := func(msg *Message) {
		msg.Origin, msg.Sent, msg.Seq = m.cfg.ID, m.now(), m.seq.Add(1)
		var err error
		if buf, err = Encode(buf[:0], msg); err != nil {
			m.log.Error("peer message not sent", "kind", msg.Kind.String(), "err", err)
			return
		}
		// A PUB socket never blocks: past its high-water mark it drops,
		// and the receiver counts the gap. ZeroMQ copies buf.
		if _, err := m.pub.SendBytes(buf, zmq.DONTWAIT); err != nil {
			m.dropped.Add(1)
			return
		}
		if int(msg.Kind) < len(m.sent) {
			m.sent[msg.Kind].Add(1)
		}
	}
	for {
		select {
		case <-ctx.Done():
			// A moment for the bye to leave: closing with linger 0 would
			// discard it.
			_ = m.pub.SetLinger(byeLinger)
			send(&Message{Kind: KindBye})
			return
		case msg := <-m.out:
			send(&msg)
		case <-m.fout.kick:
			if msg := m.flightsDue(); msg != nil {
				send(msg)
			}
		}
	}
}

// queue hands a message to the sender without waiting: a full queue drops
// it (counted).
func (m *Mesh) queue(msg Message) {
	select {
	case m.out <- msg:
	default:
		m.dropped.Add(1)
	}
}

// Publish shares a prediction this replica recorded. Safe for concurrent
// use; it never waits on the network.
func (m *Mesh) Publish(p Prediction) {
	if m == nil {
		return
	}
	m.queue(Message{Kind: KindPrediction, Prediction: p})
}

// Withdraw shares the withdrawal of a placement this replica published.
func (m *Mesh) Withdraw(placement uint64) {
	if m == nil {
		return
	}
	m.queue(Message{Kind: KindWithdrawal, Withdrawal: placement})
}

// silentAfter is how long a peer may say nothing before it counts as
// lost: its in-flight work is dropped and it shows silent.
func (m *Mesh) silentAfter() time.Duration { return max(3*m.cfg.FlightsInterval, time.Second) }

// byeLinger bounds how long closing the PUB socket waits for the bye.
const byeLinger = 100 * time.Millisecond

// connectGrace is how long a new peer may take to send its first message
// before it shows as a fault.
const connectGrace = 6 * time.Second

// sweep drops the in-flight work of peers gone silent and judges every
// peer's state.
func (m *Mesh) sweep() {
	now := m.now()
	var ids []targetid.ID
	m.mu.Lock()
	for origin, f := range m.flights {
		if now.Sub(f.at) > m.silentAfter() {
			ids = append(ids, m.dropOriginLocked(origin)...)
		}
	}
	for _, p := range m.peers {
		p.judge(now, m)
	}
	m.mu.Unlock()
	m.handOver(ids)
}

// resolve resolves every spec and follows the union of their addresses,
// this replica's own left out. A name that fails to resolve keeps its
// previous addresses (a DNS outage must not cut the replicas apart).
func (m *Mesh) resolve(ctx context.Context) {
	want := map[string]string{} // address → spec text
	for _, s := range m.specs {
		rctx, cancel := context.WithTimeout(ctx, min(m.cfg.ResolveInterval, 5*time.Second))
		addrs, err := s.resolve(rctx, m.res)
		cancel()
		if ctx.Err() != nil {
			return
		}
		now := m.now()
		m.mu.Lock()
		src := m.sources[s.Text]
		if err != nil {
			src.lastErr, src.errAt = err.Error(), now
			if now.Sub(src.logged) >= time.Minute {
				src.logged = now
				m.log.Warn("a --peers entry cannot be resolved: keeping its previous addresses", "peers", s.Text, "addresses", len(src.addrs), "err", err)
			}
			src.errors++
		} else {
			if src.lastErr != "" {
				m.log.Info("a --peers entry resolves again", "peers", s.Text, "addresses", len(addrs))
			}
			slices.Sort(addrs)
			src.addrs, src.lastOK, src.lastErr, src.logged = slices.Compact(addrs), now, "", time.Time{}
		}
		for _, a := range src.addrs {
			if _, dup := want[a]; !dup {
				want[a] = s.Text
			}
		}
		m.mu.Unlock()
	}
	m.follow(ctx, want)
}

// follow subscribes to every address in want not followed yet and stops
// following those no longer in it.
func (m *Mesh) follow(ctx context.Context, want map[string]string) {
	var dropped []targetid.ID
	defer func() { m.handOver(dropped) }()
	m.mu.Lock()
	defer m.mu.Unlock()
	for addr, p := range m.peers {
		if _, ok := want[addr]; !ok {
			p.stop()
			delete(m.peers, addr)
			if p.origin != "" {
				dropped = append(dropped, m.dropOriginLocked(p.origin)...)
			}
			m.log.Info("peer replica left the --peers list", "peer", addr)
		}
	}
	for _, addr := range slices.Sorted(maps.Keys(want)) {
		if m.peers[addr] != nil {
			continue
		}
		p := &peer{addr: addr, source: want[addr], since: m.now(), lag: newLagStats()}
		m.peers[addr] = p
		if m.self[addr] {
			p.state, p.reason = stateSelf, "this replica's own --peer-listen address"
			continue
		}
		if err := m.subscribe(ctx, p); err != nil {
			p.state, p.reason = stateFailed, err.Error()
			m.log.Warn("cannot subscribe to a peer replica", "peer", addr, "err", err)
			continue
		}
		p.state, p.reason = stateConnecting, "subscribed; no message yet"
	}
}

// stopPeers ends every peer's subscription and waits for them.
func (m *Mesh) stopPeers() {
	m.mu.Lock()
	for _, p := range m.peers {
		p.stop()
	}
	m.mu.Unlock()
	m.wg.Wait()
}

// subscribe connects a SUB socket to p and receives on it until p is
// stopped.
func (m *Mesh) subscribe(ctx context.Context, p *peer) error {
	sub, err := zmq.NewSocket(zmq.SUB)
	if err != nil {
		return err
	}
	_ = sub.SetLinger(0)
	_ = sub.SetRcvhwm(subQueue)
	_ = sub.SetMaxmsgsize(subMaxMessage)
	if m.key != nil {
		// The same keypair as the server's: the PUB side admits clients
		// holding it, and the handshake proves it.
		if err := errors.Join(sub.SetCurveServerkey(m.key.Public), sub.SetCurvePublickey(m.key.Public),
			sub.SetCurveSecretkey(m.key.Secret)); err != nil {
			sub.Close()
			return fmt.Errorf("--peer-key-file: %w", err)
		}
	}
	if err := sub.SetSubscribe(""); err != nil {
		sub.Close()
		return fmt.Errorf("subscribe: %w", err)
	}
	if err := sub.Connect(p.addr); err != nil {
		sub.Close()
		return fmt.Errorf("connect %s: %w", p.addr, err)
	}
	w, err := zmqwait.New(sub)
	if err != nil {
		sub.Close()
		return err
	}
	pctx, cancel := context.WithCancel(ctx)
	p.cancel = cancel
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer sub.Close()
		defer w.Close()
		for {
			if _, err := w.Wait(pctx, 0); err != nil {
				if pctx.Err() == nil {
					m.log.Error("peer socket failed", "peer", p.addr, "err", err)
				}
				return
			}
			for {
				b, err := sub.RecvBytes(zmq.DONTWAIT)
				if err != nil {
					break
				}
				if !m.receive(p, b) {
					return // it is this replica
				}
			}
		}
	}()
	return nil
}

// receive handles one message from p; false when p turned out to be this
// replica (its subscription ends).
func (m *Mesh) receive(p *peer, b []byte) bool {
	now := m.now()
	msg, err := Decode(b)
	m.mu.Lock()
	if err != nil {
		p.decodeErrors++
		p.lastError = err.Error()
		if errors.Is(err, ErrVersion) {
			p.rejected[rejectVersion]++
			p.state, p.reason = stateIncompatible, err.Error()
		} else {
			// Heard, if not understood: it stays rejected, not silent.
			p.lastMessage = now
			p.reject(now, rejectMalformed, "a message could not be read: "+err.Error())
		}
		m.mu.Unlock()
		m.log.Debug("skipping a peer message", "peer", p.addr, "err", err)
		return true
	}
	if msg.Origin == m.cfg.ID {
		p.state, p.reason = stateSelf, "its messages carry this replica's --replica-id"
		m.mu.Unlock()
		return false
	}
	var changed []targetid.ID
	if p.origin != msg.Origin {
		if p.origin != "" {
			changed = m.dropOriginLocked(p.origin)
		}
		p.origin, p.lastSeq = msg.Origin, 0
	}
	switch {
	case p.lastSeq != 0 && msg.Seq > p.lastSeq+1:
		p.lost += msg.Seq - p.lastSeq - 1
	case msg.Seq <= p.lastSeq:
		p.restarts++
	}
	p.lastSeq, p.lastMessage = msg.Seq, now
	p.messages++
	p.lag.observe(now.Sub(msg.Sent))
	var known map[targetid.ID]TargetFlights
	if of := m.flights[msg.Origin]; of != nil {
		known = of.targets
	}
	if reason, detail := implausible(&msg, now, known); reason >= 0 {
		// Nothing of it is applied: its flights neither replace the
		// peer's last ones nor keep them alive.
		p.reject(now, reason, detail)
		m.mu.Unlock()
		m.handOver(changed)
		return true
	}
	if p.state != stateConnected && p.state != stateRejected {
		m.log.Info("peer replica connected", "peer", p.addr, "origin", msg.Origin)
	}
	if p.state != stateRejected || now.Sub(p.rejectedAt) > rejectHold {
		p.state, p.reason = stateConnected, ""
	}
	switch msg.Kind {
	case KindPrediction:
		p.predictions++
		p.predictedBlocks += uint64(len(msg.Prediction.Keys))
	case KindWithdrawal:
		p.withdrawals++
	case KindFlights, KindFlightsUpdate:
		changed = append(changed, m.applyFlightsLocked(msg.Origin, &msg, now)...)
	case KindBye:
		changed = append(changed, m.dropOriginLocked(msg.Origin)...)
		p.state, p.reason = stateSilent, "said bye (shutting down)"
	}
	m.mu.Unlock()
	// At once, not at the next tick: a sibling request may be on its way
	// to this replica.
	m.handOver(changed)
	switch msg.Kind {
	case KindPrediction:
		if m.h.Prediction != nil {
			m.h.Prediction(msg.Origin, msg.Prediction)
		}
	case KindWithdrawal:
		if m.h.Withdrawal != nil {
			m.h.Withdrawal(msg.Origin, msg.Withdrawal)
		}
	}
	return true
}
