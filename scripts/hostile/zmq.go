package main

import (
	"fmt"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// monitored is a ZeroMQ socket of the harness with libzmq's monitor on
// it, so that the harness knows when a connection's handshake finished
// (a PUB socket drops what it sends before that) and when the other side
// dropped it.
type monitored struct {
	sock *zmq.Socket
	mon  *zmq.Socket
}

var monitors atomic.Uint64

// newMonitored makes a socket of type t, configured by setup before it
// connects to or binds (bind true) addr.
func newMonitored(t zmq.Type, addr string, bind bool, setup func(*zmq.Socket) error) (*monitored, error) {
	s, err := zmq.NewSocket(t)
	if err != nil {
		return nil, err
	}
	_ = s.SetLinger(0)
	if setup != nil {
		if err := setup(s); err != nil {
			s.Close()
			return nil, err
		}
	}
	name := fmt.Sprintf("inproc://hostile-monitor-%d", monitors.Add(1))
	if err := s.Monitor(name, zmq.EVENT_ALL); err != nil {
		s.Close()
		return nil, fmt.Errorf("monitor: %w", err)
	}
	mon, err := zmq.NewSocket(zmq.PAIR)
	if err != nil {
		s.Close()
		return nil, err
	}
	_ = mon.SetLinger(0)
	if err := mon.Connect(name); err != nil {
		mon.Close()
		s.Close()
		return nil, fmt.Errorf("monitor: %w", err)
	}
	if bind {
		err = s.Bind(addr)
	} else {
		err = s.Connect(addr)
	}
	if err != nil {
		mon.Close()
		s.Close()
		return nil, fmt.Errorf("%s: %w", addr, err)
	}
	return &monitored{sock: s, mon: mon}, nil
}

// events counts the monitor's events by kind until one in until arrives or
// timeout passes; it reports the events seen and whether until came.
func (m *monitored) wait(until zmq.Event, timeout time.Duration) (map[zmq.Event]int, bool) {
	seen := map[zmq.Event]int{}
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return seen, false
		}
		_ = m.mon.SetRcvtimeo(left)
		ev, _, _, err := m.mon.RecvEvent(0)
		if err != nil {
			return seen, false
		}
		seen[ev]++
		if ev&until != 0 {
			return seen, true
		}
	}
}

// drain counts the monitor events already queued.
func (m *monitored) drain() map[zmq.Event]int {
	seen := map[zmq.Event]int{}
	for {
		ev, _, _, err := m.mon.RecvEvent(zmq.DONTWAIT)
		if err != nil {
			return seen
		}
		seen[ev]++
	}
}

func (m *monitored) close() {
	_ = m.sock.Monitor("", 0)
	m.sock.Close()
	m.mon.Close()
}

// handshakeFailures counts the failed handshakes among seen.
func handshakeFailures(seen map[zmq.Event]int) int {
	return seen[zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL] + seen[zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL] + seen[zmq.EVENT_HANDSHAKE_FAILED_AUTH]
}
