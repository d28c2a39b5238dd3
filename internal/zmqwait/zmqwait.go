// Package zmqwait owns waiting for a ZeroMQ socket through Go's network
// poller. A goroutine blocked in a cgo call such as zmq_poll keeps its
// processor until the runtime's monitor takes it back, which can take
// milliseconds: on a two-core router, one subscriber waiting for events
// left requests and responses to queue behind whatever else was running.
// Waiting on the socket's ZMQ_FD in the poller holds no processor.
package zmqwait

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// Waiter waits for one socket to have a message to receive. Like the
// socket, it belongs to one goroutine at a time.
type Waiter struct {
	sock *zmq.Socket
	f    *os.File
	rc   syscall.RawConn
}

// New prepares a Waiter for sock; Close it before the socket.
func New(sock *zmq.Socket) (*Waiter, error) {
	fd, err := sock.GetFd()
	if err != nil {
		return nil, fmt.Errorf("zmq socket fd: %w", err)
	}
	// A copy of the descriptor, so that closing the File leaves ZeroMQ's
	// own open. ZeroMQ keeps it non-blocking already; the poller needs it so.
	dup, err := syscall.Dup(fd)
	if err != nil {
		return nil, fmt.Errorf("zmq socket fd: %w", err)
	}
	syscall.CloseOnExec(dup)
	if err := syscall.SetNonblock(dup, true); err != nil {
		syscall.Close(dup)
		return nil, fmt.Errorf("zmq socket fd: %w", err)
	}
	f := os.NewFile(uintptr(dup), "zmq")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("zmq socket fd: %w", err)
	}
	return &Waiter{sock: sock, f: f, rc: rc}, nil
}

// Close releases the Waiter's copy of the descriptor.
func (w *Waiter) Close() error { return w.f.Close() }

var aLongTimeAgo = time.Unix(1, 0)

// Wait returns true once the socket has a message to receive, false when
// timeout passed first (timeout <= 0 waits without one), and ctx's error
// when it ended first.
func (w *Waiter) Wait(ctx context.Context, timeout time.Duration) (bool, error) {
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	if err := w.f.SetReadDeadline(deadline); err != nil {
		return false, fmt.Errorf("zmq wait: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = w.f.SetReadDeadline(aLongTimeAgo) })
	defer stop()
	var eventsErr error
	// ZMQ_FD is edge-triggered and says only that the socket's state may
	// have changed: ZMQ_EVENTS is the answer, asked before every wait.
	err := w.rc.Read(func(uintptr) bool {
		ev, err := w.sock.GetEvents()
		if err != nil {
			eventsErr = err
			return true
		}
		return ev&zmq.POLLIN != 0
	})
	switch {
	case eventsErr != nil:
		return false, fmt.Errorf("zmq events: %w", eventsErr)
	case err == nil:
		return true, nil
	case ctx.Err() != nil:
		return false, ctx.Err()
	case errors.Is(err, os.ErrDeadlineExceeded):
		return false, nil
	}
	return false, fmt.Errorf("zmq wait: %w", err)
}
