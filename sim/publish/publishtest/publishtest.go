// Package publishtest reads a KV-event publisher's sockets the way a test
// wants to see them: raw three-frame messages from the PUB socket, and
// replay replies checked frame by frame, without the sequence handling of
// kvtransport's subscriber. The simulator's and the publisher's tests share it.
package publishtest

import (
	"net"
	"strconv"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/prefixrouter/prefixrouter/kvindex/events"
)

// Message is one published batch as it crossed the wire.
type Message struct {
	Topic   string
	Seq     uint64
	Payload []byte
}

// Subscriber is a SUB socket subscribed to every topic.
type Subscriber struct {
	t    testing.TB
	sock *zmq.Socket
}

// Subscribe connects a SUB socket to endpoint; it closes with the test.
func Subscribe(t testing.TB, endpoint string) *Subscriber {
	t.Helper()
	return newSubscriber(t, endpoint, false)
}

// Listen binds a SUB socket on endpoint, a collector that publishers
// connect to; it closes with the test.
func Listen(t testing.TB, endpoint string) *Subscriber {
	t.Helper()
	return newSubscriber(t, endpoint, true)
}

func newSubscriber(t testing.TB, endpoint string, bind bool) *Subscriber {
	t.Helper()
	s, err := zmq.NewSocket(zmq.SUB)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	if err := s.SetSubscribe(""); err != nil {
		t.Fatal(err)
	}
	if bind {
		if err := s.Bind(endpoint); err != nil {
			t.Fatal(err)
		}
	} else if err := s.Connect(endpoint); err != nil {
		t.Fatal(err)
	}
	return &Subscriber{t: t, sock: s}
}

// Recv waits up to d for a message; ok is false when none came. A message
// that is not topic, 8-byte sequence, payload fails the test.
func (s *Subscriber) Recv(d time.Duration) (Message, bool) {
	s.t.Helper()
	p := zmq.NewPoller()
	p.Add(s.sock, zmq.POLLIN)
	polled, err := p.Poll(d)
	if err != nil {
		s.t.Fatal(err)
	}
	if len(polled) == 0 {
		return Message{}, false
	}
	frames, err := s.sock.RecvMessageBytes(0)
	if err != nil {
		s.t.Fatal(err)
	}
	if len(frames) != 3 {
		s.t.Fatalf("event message of %d frames, want 3", len(frames))
	}
	seq, err := events.ParseSeq(frames[1])
	if err != nil {
		s.t.Fatal(err)
	}
	return Message{Topic: string(frames[0]), Seq: seq, Payload: frames[2]}, true
}

// MustRecv is Recv with a 5 s bound that fails the test when nothing comes.
func (s *Subscriber) MustRecv() Message {
	s.t.Helper()
	m, ok := s.Recv(5 * time.Second)
	if !ok {
		s.t.Fatal("no event batch within 5s")
	}
	return m
}

// Replay asks a replay socket for every buffered batch from start, as a
// DEALER does, and checks each reply's framing: an empty delimiter, then
// topic, sequence and payload (sequence and payload only when legacy), and
// the end marker with an empty topic and payload.
func Replay(t testing.TB, addr string, start uint64, legacy bool) []Message {
	t.Helper()
	d, err := zmq.NewSocket(zmq.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	if err := d.SetRcvtimeo(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := d.Connect(addr); err != nil {
		t.Fatal(err)
	}
	if _, err := d.SendMessage("", events.SeqFrame(start)); err != nil {
		t.Fatal(err)
	}
	want := 4
	if legacy {
		want = 3
	}
	var out []Message
	for {
		frames, err := d.RecvMessageBytes(0)
		if err != nil {
			t.Fatalf("replay: %v", err)
		}
		if len(frames) != want || len(frames[0]) != 0 {
			t.Fatalf("replay reply %q: want %d frames after an empty delimiter", frames, want)
		}
		seq, err := events.ParseSeq(frames[len(frames)-2])
		if err != nil {
			t.Fatal(err)
		}
		if seq == events.EndOfReplay {
			if len(frames[len(frames)-1]) != 0 || (!legacy && len(frames[1]) != 0) {
				t.Fatalf("end marker %q, want empty topic and payload", frames)
			}
			return out
		}
		m := Message{Seq: seq, Payload: frames[len(frames)-1]}
		if !legacy {
			m.Topic = string(frames[1])
		}
		out = append(out, m)
	}
}

// FreeAddr is a loopback tcp:// address whose port and the next ranks-1
// were free a moment ago: a collector's address for publishers of ranks
// ranks, which connect to its port + rank.
func FreeAddr(t testing.TB, ranks int) string {
	t.Helper()
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		free := []net.Listener{ln}
		for r := 1; r < ranks; r++ {
			if next, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+r)); err == nil {
				free = append(free, next)
			}
		}
		for _, l := range free {
			l.Close()
		}
		if len(free) == ranks {
			return "tcp://127.0.0.1:" + strconv.Itoa(port)
		}
	}
	t.Fatal("no run of free ports on loopback")
	return ""
}
