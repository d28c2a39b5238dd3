package peers

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	zmq "github.com/pebbe/zmq4"

	"github.com/prefixrouter/prefixrouter/internal/zmqwait"
)

// handshakeWatch hears of the handshakes libzmq refuses on the mesh's PUB
// socket before its ZAP handler is asked: a client in the clear (or
// speaking another security mechanism) against the CURVE server. Those the
// ZAP handler refuses (a CURVE key that is not the mesh's) it reports
// itself; libzmq's monitor reports them as authentication failures, which
// the watch leaves out so that none is counted twice.
type handshakeWatch struct {
	mon *zmq.Socket
	w   *zmqwait.Waiter
}

var handshakeMonitors atomic.Uint64

// watchHandshakes starts libzmq's monitor on pub, which must not be
// bound yet so that no handshake goes unseen. It belongs to pub's owner
// until run takes it.
func watchHandshakes(pub *zmq.Socket) (*handshakeWatch, error) {
	name := fmt.Sprintf("inproc://prefixrouter-peer-handshakes-%d", handshakeMonitors.Add(1))
	if err := pub.Monitor(name, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL|zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL); err != nil {
		return nil, fmt.Errorf("handshake monitor: %w", err)
	}
	mon, err := zmq.NewSocket(zmq.PAIR)
	if err != nil {
		return nil, fmt.Errorf("handshake monitor: %w", err)
	}
	_ = mon.SetLinger(0)
	if err := mon.Connect(name); err != nil {
		mon.Close()
		return nil, fmt.Errorf("handshake monitor: %w", err)
	}
	w, err := zmqwait.New(mon)
	if err != nil {
		mon.Close()
		return nil, fmt.Errorf("handshake monitor: %w", err)
	}
	return &handshakeWatch{mon: mon, w: w}, nil
}

// run reports every refused handshake to refused until ctx ends or pub
// closes, then closes the monitor's socket. The monitor names the
// listening endpoint, not the client: libzmq does not say who it was.
func (h *handshakeWatch) run(ctx context.Context, refused func(address string)) {
	defer h.close()
	for {
		if ok, err := h.w.Wait(ctx, 0); err != nil || !ok {
			return
		}
		for {
			ev, addr, _, err := h.mon.RecvEvent(zmq.DONTWAIT)
			if errors.Is(err, zmq.ErrorNoSocket) || zmq.AsErrno(err) == zmq.Errno(zmq.ETERM) {
				return
			}
			if err != nil {
				break // nothing more queued: wait again
			}
			switch ev {
			case zmq.EVENT_MONITOR_STOPPED:
				return
			case zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
				refused(addr)
			}
		}
	}
}

// close releases the monitor's socket; safe on a nil watch.
func (h *handshakeWatch) close() {
	if h == nil {
		return
	}
	h.w.Close()
	h.mon.Close()
}
