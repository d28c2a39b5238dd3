package main

import (
	"errors"
	"fmt"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/prefixrouter/prefixrouter/peers"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// roguePeers: a process at a --peers address publishing in the peer wire
// format without the key, then one holding the key (a broken replica)
// claiming what no replica can, then rogue subscribers on the router's
// --peer-listen.
func (e *eventRun) roguePeers(rogue, keyed *monitored) error {
	fmt.Println("rogue peers (--peer-key-file on; --peers names two addresses where the harness publishes):")
	probe := e.prompt("load probe")
	d, err := route(e.admin, probe)
	if err != nil {
		return err
	}
	tgt := targetid.ID{Endpoint: d.Candidates[0].Target, Rank: d.Candidates[0].Rank}
	fmt.Printf("  before: the dry run's load on the pod: queued_uncached_tokens %d, in_flight %d, cost %.0f\n",
		d.Candidates[0].Load.QueuedUncachedTokens, d.Candidates[0].Load.InFlight, d.Candidates[0].Cost)
	ss, err := scrape(e.admin)
	if err != nil {
		return err
	}
	refused0 := sumOf(ss, "prefixrouter_peer_handshakes_refused_total")

	const huge = int64(1) << 60
	rogueAddr := fmt.Sprintf("tcp://127.0.0.1:%d", e.roguePort)
	keyedAddr := fmt.Sprintf("tcp://127.0.0.1:%d", e.keyedPort)

	// Without the key.
	early := rogue.drain()
	got, seen, err := e.claim(rogue, "rogue-replica", tgt, huge, 30)
	if err != nil {
		return err
	}
	fmt.Printf("  without the key, from %s: 30 flights messages claiming 2^60 queued tokens on the pod over 3 s\n", rogueAddr)
	fmt.Printf("    the router's SUB connected to it %d times since the router started (%d handshakes succeeded, %d failed), %d times while it published (%d, %d)\n",
		early[zmq.EVENT_ACCEPTED], early[zmq.EVENT_HANDSHAKE_SUCCEEDED], handshakeFailures(early),
		seen[zmq.EVENT_ACCEPTED], seen[zmq.EVENT_HANDSHAKE_SUCCEEDED], handshakeFailures(seen))
	fmt.Printf("    the dry run's queued_uncached_tokens on the pod meanwhile: at most %d (goal: 0)\n", got)
	if err := e.printPeer(rogueAddr); err != nil {
		return err
	}

	// Holding the key, beyond what a replica reports.
	early = keyed.drain()
	got, _, err = e.claim(keyed, "broken-replica", tgt, huge, 30)
	if err != nil {
		return err
	}
	fmt.Printf("  holding the key, from %s: the same 30 messages (2^60 queued tokens, beyond the 2^32 a replica may report)\n", keyedAddr)
	fmt.Printf("    the router's SUB connected to it %d times since the router started (%d handshakes succeeded, %d failed)\n",
		early[zmq.EVENT_ACCEPTED], early[zmq.EVENT_HANDSHAKE_SUCCEEDED], handshakeFailures(early))
	fmt.Printf("    the dry run's queued_uncached_tokens on the pod meanwhile: at most %d (goal: 0)\n", got)
	if err := e.printPeer(keyedAddr); err != nil {
		return err
	}

	// The measurement's control: the key holder within the bounds is
	// believed, as a replica is; its work leaves once it falls silent.
	const plausible = int64(1) << 30
	got, _, err = e.claim(keyed, "broken-replica", tgt, plausible, 10)
	if err != nil {
		return err
	}
	fmt.Printf("  control, holding the key, 10 messages claiming 2^30 queued tokens (within the bounds): the dry run showed at most %d\n", got)
	var left int64 = -1
	if _, err := poll(5*time.Second, 200*time.Millisecond, func() (bool, error) {
		d, err := route(e.admin, probe)
		if err != nil {
			return false, err
		}
		left = d.Candidates[0].Load.QueuedUncachedTokens
		return left == 0, nil
	}); err != nil {
		return err
	}
	fmt.Printf("    once it fell silent: %d\n", left)

	// Subscribers on the router's --peer-listen.
	const window = 3 * time.Second
	type reader struct {
		name  string
		setup func(*zmq.Socket) error
	}
	readers := []reader{
		{"a SUB in the clear (no CURVE)", nil},
		{"a CURVE SUB with a key of its own and the router's public key", func(s *zmq.Socket) error {
			pub, sec, err := zmq.NewCurveKeypair()
			if err != nil {
				return err
			}
			return errors.Join(s.SetCurveServerkey(e.key.Public), s.SetCurvePublickey(pub), s.SetCurveSecretkey(sec))
		}},
		{"control: a CURVE SUB holding the key", func(s *zmq.Socket) error {
			return errors.Join(s.SetCurveServerkey(e.key.Public), s.SetCurvePublickey(e.key.Public), s.SetCurveSecretkey(e.key.Secret))
		}},
	}
	fmt.Printf("  subscribers on the router's %s, one after another, each reading for %s:\n", e.peerListen, window)
	for i, r := range readers {
		before, err := metricSum(e.admin, "prefixrouter_peer_handshakes_refused_total")
		if err != nil {
			return err
		}
		res := readFor(e.peerListen, r.setup, window)
		if res.err != nil {
			return fmt.Errorf("%s: %w", r.name, res.err)
		}
		after, err := metricSum(e.admin, "prefixrouter_peer_handshakes_refused_total")
		if err != nil {
			return err
		}
		goal := " (goal: 0)"
		if i == len(readers)-1 {
			goal = " (the router publishes: more than 0)"
		}
		fmt.Printf("    %s: %d messages%s; its handshakes succeeded %d, failed %d; prefixrouter_peer_handshakes_refused_total +%g\n",
			r.name, res.msgs, goal, res.seen[zmq.EVENT_HANDSHAKE_SUCCEEDED], handshakeFailures(res.seen), after-before)
	}
	ss, err = scrape(e.admin)
	if err != nil {
		return err
	}
	fmt.Printf("  prefixrouter_peer_handshakes_refused_total: +%g; prefixrouter_peer_messages_rejected_total by reason: %s; prefixrouter_peer_wiring_fault by fault: %s\n",
		sumOf(ss, "prefixrouter_peer_handshakes_refused_total")-refused0,
		byLabel(ss, "prefixrouter_peer_messages_rejected_total", "reason"), byLabel(ss, "prefixrouter_peer_wiring_fault", "fault"))
	for _, line := range e.routerLog.lines(2, "peer") {
		fmt.Printf("  router log: %s\n", line)
	}
	fmt.Println()
	return nil
}

// claim publishes n flights messages from pub as origin, one per 100 ms,
// claiming queued uncached tokens on tgt, and returns the most the dry
// run showed queued on the pod meanwhile (and for 300 ms after), and the
// socket's monitor events.
func (e *eventRun) claim(pub *monitored, origin string, tgt targetid.ID, queued int64, n int) (int64, map[zmq.Event]int, error) {
	probe := e.prompt("load probe")
	var most int64
	look := func() error {
		d, err := route(e.admin, probe)
		if err != nil {
			return err
		}
		most = max(most, d.Candidates[0].Load.QueuedUncachedTokens)
		return nil
	}
	for i := range n {
		msg := peers.Message{Origin: origin, Sent: time.Now(), Seq: uint64(i + 1), Kind: peers.KindFlights,
			Flights: []peers.TargetFlights{{Target: tgt, InFlight: 1, Prefilling: 1, QueuedUncachedTokens: queued}}}
		b, err := peers.Encode(nil, &msg)
		if err != nil {
			return 0, nil, err
		}
		if _, err := pub.sock.SendBytes(b, zmq.DONTWAIT); err != nil {
			return 0, nil, err
		}
		time.Sleep(50 * time.Millisecond)
		if err := look(); err != nil {
			return 0, nil, err
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	if err := look(); err != nil {
		return 0, nil, err
	}
	return most, pub.drain(), nil
}

// printPeer prints the peers view of /debug/targets for addr.
func (e *eventRun) printPeer(addr string) error {
	v, err := debugTargets(e.admin)
	if err != nil {
		return err
	}
	if v.Peers == nil {
		return errors.New("/debug/targets has no peers view")
	}
	for _, p := range v.Peers.Peers {
		if p.Peer != addr {
			continue
		}
		fmt.Printf("    /debug/targets peers: state %s, connected %v, messages %d, rejected %v, its queued_uncached_tokens %d",
			p.State, p.Connected, p.Messages, p.Rejected, p.Flights.QueuedUncachedTokens)
		if p.Reason != "" {
			fmt.Printf(", reason %q", p.Reason)
		}
		fmt.Println()
		return nil
	}
	return fmt.Errorf("/debug/targets shows no peer %s", addr)
}

// readResult is what a subscriber read: messages, its monitor's events.
type readResult struct {
	msgs int
	seen map[zmq.Event]int
	err  error
}

// readFor subscribes to addr (setup configures the socket's security)
// and counts the messages it reads within d.
func readFor(addr string, setup func(*zmq.Socket) error, d time.Duration) (res readResult) {
	m, err := newMonitored(zmq.SUB, addr, false, func(s *zmq.Socket) error {
		if setup != nil {
			if err := setup(s); err != nil {
				return err
			}
		}
		return s.SetSubscribe("")
	})
	if err != nil {
		res.err = err
		return res
	}
	defer m.close()
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		_ = m.sock.SetRcvtimeo(min(left, 200*time.Millisecond))
		if _, err := m.sock.RecvBytes(0); err == nil {
			res.msgs++
		}
	}
	res.seen = m.drain()
	return res
}
