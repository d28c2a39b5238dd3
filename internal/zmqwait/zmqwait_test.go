package zmqwait

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

var pairSeq atomic.Int64

// pair returns two connected PAIR sockets over inproc.
func pair(t *testing.T) (recv, send *zmq.Socket) {
	t.Helper()
	addr := fmt.Sprintf("inproc://zmqwait-%d", pairSeq.Add(1))
	recv, err := zmq.NewSocket(zmq.PAIR)
	if err != nil {
		t.Fatal(err)
	}
	send, err = zmq.NewSocket(zmq.PAIR)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { send.Close(); recv.Close() })
	_ = recv.SetLinger(0)
	_ = send.SetLinger(0)
	if err := recv.Bind(addr); err != nil {
		t.Fatal(err)
	}
	if err := send.Connect(addr); err != nil {
		t.Fatal(err)
	}
	return recv, send
}

func TestWait(t *testing.T) {
	recv, send := pair(t)
	w, err := New(recv)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	start := time.Now()
	if ok, err := w.Wait(context.Background(), 20*time.Millisecond); ok || err != nil {
		t.Fatalf("nothing sent: %v %v", ok, err)
	}
	if time.Since(start) < 20*time.Millisecond {
		t.Fatal("returned before the timeout")
	}

	if _, err := send.Send("hello", 0); err != nil {
		t.Fatal(err)
	}
	if ok, err := w.Wait(context.Background(), 5*time.Second); !ok || err != nil {
		t.Fatalf("message sent: %v %v", ok, err)
	}
	if m, err := recv.Recv(zmq.DONTWAIT); m != "hello" || err != nil {
		t.Fatalf("received %q %v", m, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	if ok, err := w.Wait(ctx, 0); ok || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v %v", ok, err)
	}
	// A cancelled wait leaves the Waiter usable.
	if _, err := send.Send("again", 0); err != nil {
		t.Fatal(err)
	}
	if ok, err := w.Wait(context.Background(), 5*time.Second); !ok || err != nil {
		t.Fatalf("after a cancelled wait: %v %v", ok, err)
	}
}

// Every message arrives whether the receiver takes one per wait or drains
// the socket: ZMQ_FD only signals changes, so a missed edge would hang.
func TestWaitLosesNoMessage(t *testing.T) {
	for _, drain := range []bool{false, true} {
		t.Run(fmt.Sprintf("drain=%v", drain), func(t *testing.T) {
			recv, send := pair(t)
			w, err := New(recv)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			const n = 5000
			go func() {
				rng := rand.New(rand.NewPCG(1, 2))
				for i := range n {
					if _, err := send.Send(fmt.Sprint(i), 0); err != nil {
						return
					}
					if rng.IntN(100) == 0 {
						time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
					}
				}
			}()
			got := 0
			for got < n {
				ok, err := w.Wait(context.Background(), 5*time.Second)
				if err != nil || !ok {
					t.Fatalf("after %d messages: %v %v", got, ok, err)
				}
				for {
					m, err := recv.Recv(zmq.DONTWAIT)
					if err != nil {
						break
					}
					if m != fmt.Sprint(got) {
						t.Fatalf("message %d is %q", got, m)
					}
					got++
					if !drain {
						break
					}
				}
			}
		})
	}
}
