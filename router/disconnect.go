package router

import (
	"net"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// fasthttp does not read a connection while its handler runs, so it cannot
// tell the handler that the client went away. A vLLM pod keeps computing a
// request until its connection closes, so a client that gives up must close
// the upstream request at once — most of all before the first byte, when the
// router is silently waiting on a prefill.
//
// watchDisconnect waits (in the runtime poller, no busy loop) until the client
// connection becomes readable and then peeks at it without consuming: EOF or
// an error means the client is gone and onGone runs; data (a pipelined next
// request) ends the watch, since the client is evidently still there.

var longAgo = time.Unix(1, 0)

type disconnectWatch struct {
	c    net.Conn
	done chan struct{}
	once sync.Once
}

func watchDisconnect(c net.Conn, onGone func()) *disconnectWatch {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	w := &disconnectWatch{c: c, done: make(chan struct{})}
	// A read deadline fasthttp armed for reading the request must not end
	// the watch of a long generation.
	_ = c.SetReadDeadline(time.Time{})
	go func() {
		defer close(w.done)
		var buf [1]byte
		gone := false
		err := rc.Read(func(fd uintptr) bool {
			n, _, err := unix.Recvfrom(int(fd), buf[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
			switch {
			case err == unix.EAGAIN || err == unix.EINTR:
				return false // not readable yet: wait in the poller
			case err != nil || n == 0:
				gone = true
			}
			return true
		})
		if err == nil && gone {
			onGone()
		}
	}()
	return w
}

// stop ends the watch and restores the connection for fasthttp's next read.
// Safe on a nil watch and idempotent.
func (w *disconnectWatch) stop() {
	if w == nil {
		return
	}
	w.once.Do(func() {
		_ = w.c.SetReadDeadline(longAgo)
		<-w.done
		_ = w.c.SetReadDeadline(time.Time{})
	})
}
