package bench

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
)

// eventRelay stands between the router and one pod's KV-event publishers
// (one loopback TCP port per data-parallel rank, consecutive as the
// endpoint syntax wants): the faults workload severs the router's
// subscriber there, as a network cut would, and the router has to notice
// the silence, reconnect and replay what it missed. ZeroMQ's ZMTP runs
// over plain TCP, so relaying bytes is transparent to both ends.
type eventRelay struct {
	listeners []net.Listener
	upstream  []string // host:port of each rank's publisher

	mu      sync.Mutex
	severed bool
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

// relayPortTries bounds the search for a run of free consecutive ports.
const relayPortTries = 20

// newEventRelay listens on loopback for each of the pod's ranks (events
// addresses tcp://HOST:PORT, rank r at index r) and forwards every
// connection to its rank's publisher.
func newEventRelay(events []string) (*eventRelay, error) {
	r := &eventRelay{conns: map[net.Conn]struct{}{}}
	for _, addr := range events {
		hp, ok := strings.CutPrefix(addr, "tcp://")
		if !ok {
			return nil, fmt.Errorf("event relay: %q is not a tcp address", addr)
		}
		r.upstream = append(r.upstream, hp)
	}
	var err error
	for range relayPortTries {
		if r.listeners, err = listenConsecutive(len(events)); err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("event relay: %w", err)
	}
	for i, l := range r.listeners {
		r.wg.Add(1)
		go r.accept(l, r.upstream[i])
	}
	return r, nil
}

// listenConsecutive listens on n consecutive loopback ports.
func listenConsecutive(n int) ([]net.Listener, error) {
	first, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ls := []net.Listener{first}
	base := first.Addr().(*net.TCPAddr).Port
	for i := 1; i < n; i++ {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(base+i)))
		if err != nil {
			for _, l := range ls {
				l.Close()
			}
			return nil, err
		}
		ls = append(ls, l)
	}
	return ls, nil
}

// addr is the relay's events address for rank 0 (rank r at port + r).
func (r *eventRelay) addr() string { return "tcp://" + r.listeners[0].Addr().String() }

// endpoint rewrites a pod's endpoint URL so that its events come through
// the relay.
func (r *eventRelay) endpoint(ep string) (string, error) {
	u, err := url.Parse(ep)
	if err != nil {
		return "", fmt.Errorf("event relay: %w", err)
	}
	q := u.Query()
	q.Set("events", r.addr())
	u.RawQuery = q.Encode()
	return u.String(), nil
}

func (r *eventRelay) accept(l net.Listener, upstream string) {
	defer r.wg.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			return // closed
		}
		r.wg.Add(1)
		go r.serve(c, upstream)
	}
}

// serve forwards one subscriber connection until either side closes or
// the relay severs it. A connection that arrives while severed is closed
// at once, as a cut network would refuse it.
func (r *eventRelay) serve(c net.Conn, upstream string) {
	defer r.wg.Done()
	defer c.Close()
	if !r.track(c) {
		return
	}
	defer r.untrack(c)
	up, err := net.Dial("tcp", upstream)
	if err != nil {
		return
	}
	defer up.Close()
	if !r.track(up) {
		return
	}
	defer r.untrack(up)
	// A direction that ends closes both connections, which ends the
	// other (the deferred closes then find them closed).
	var copies sync.WaitGroup
	pipe := func(dst, src net.Conn) {
		defer copies.Done()
		_, _ = io.Copy(dst, src)
		c.Close()
		up.Close()
	}
	copies.Add(2)
	go pipe(up, c)
	go pipe(c, up)
	copies.Wait()
}

func (r *eventRelay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.severed || r.conns == nil {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *eventRelay) untrack(c net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.conns, c)
}

// sever cuts every relayed connection and refuses new ones until mend.
func (r *eventRelay) sever() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.severed = true
	for c := range r.conns {
		c.Close()
	}
}

// mend lets subscribers connect again.
func (r *eventRelay) mend() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.severed = false
}

// close stops the relay and waits for its goroutines.
func (r *eventRelay) close() error {
	r.mu.Lock()
	var errs []error
	for _, l := range r.listeners {
		errs = append(errs, l.Close())
	}
	for c := range r.conns {
		c.Close()
	}
	r.conns = nil
	r.mu.Unlock()
	r.wg.Wait()
	return errors.Join(errs...)
}
