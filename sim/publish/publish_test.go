package publish

import (
	"bytes"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/sim/publish/publishtest"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newPub starts a publisher on ephemeral loopback ports, closed at the end
// of the test.
func newPub(t *testing.T, cfg Config) *Publisher {
	t.Helper()
	cfg.Bind = "tcp://127.0.0.1:*"
	if cfg.ReplayBind == "" {
		cfg.ReplayBind = "tcp://127.0.0.1:*"
	}
	cfg.Logger = quiet()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// batch encodes a batch whose timestamp identifies it.
func batch(t *testing.T, ts float64) []byte {
	t.Helper()
	b, err := events.Encode(&events.Batch{TS: ts, Events: []events.Event{{Kind: events.KindAllBlocksCleared}}}, events.EncodingMap)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func tsOf(t *testing.T, payload []byte) float64 {
	t.Helper()
	b, err := events.Decode(payload)
	if err != nil {
		t.Fatal(err)
	}
	return b.TS
}

// warmUp publishes until the subscription delivers (ZMQ's slow joiner) and
// drains what arrived; it returns the next sequence number.
func warmUp(t *testing.T, s *publishtest.Subscriber, p *Publisher) uint64 {
	t.Helper()
	for i := 0; i < 200; i++ {
		if _, err := p.PublishRaw(batch(t, -1), true); err != nil {
			t.Fatal(err)
		}
		if _, ok := s.Recv(25 * time.Millisecond); ok {
			for {
				if _, ok := s.Recv(25 * time.Millisecond); !ok {
					return p.NextSeq()
				}
			}
		}
	}
	t.Fatal("subscription never delivered")
	return 0
}

// replay asks for every buffered batch from start; publishtest checks the
// framing, the end marker included, and this the topic of current replies.
func replay(t *testing.T, addr, topic string, start uint64, legacy bool) (seqs []uint64, payloads [][]byte) {
	t.Helper()
	for _, m := range publishtest.Replay(t, addr, start, legacy) {
		if !legacy && m.Topic != topic {
			t.Fatalf("replay topic %q, want %q", m.Topic, topic)
		}
		seqs = append(seqs, m.Seq)
		payloads = append(payloads, m.Payload)
	}
	return seqs, payloads
}

func TestSequenceNumbersOnTheWire(t *testing.T) {
	p := newPub(t, Config{Topic: "kv@pod"})
	if p.NextSeq() != 0 {
		t.Fatalf("first sequence %d, want 0", p.NextSeq())
	}
	s := publishtest.Subscribe(t, p.Endpoint())
	next := warmUp(t, s, p)
	for i := 0; i < 3; i++ {
		seq, err := p.PublishRaw(batch(t, float64(i)), true)
		if err != nil {
			t.Fatal(err)
		}
		if seq != next+uint64(i) {
			t.Fatalf("PublishRaw returned %d, want %d", seq, next+uint64(i))
		}
		m := s.MustRecv()
		if m.Topic != "kv@pod" || m.Seq != seq || tsOf(t, m.Payload) != float64(i) {
			t.Fatalf("got topic %q seq %d ts %v, want kv@pod %d %d", m.Topic, m.Seq, tsOf(t, m.Payload), seq, i)
		}
	}
	// Publish encodes for the caller.
	seq, err := p.Publish(&events.Batch{TS: 7}, events.EncodingArray)
	if err != nil {
		t.Fatal(err)
	}
	if m := s.MustRecv(); m.Seq != seq || tsOf(t, m.Payload) != 7 {
		t.Fatalf("Publish: seq %d ts %v", m.Seq, tsOf(t, m.Payload))
	}
}

func TestReplayBothFramings(t *testing.T) {
	tests := []struct {
		name   string
		legacy bool
		start  uint64
		want   []uint64
	}{
		{"current, all", false, 0, []uint64{0, 1, 2, 3, 4}},
		{"current, from 3", false, 3, []uint64{3, 4}},
		{"current, nothing newer", false, 9, nil},
		{"legacy, all", true, 0, []uint64{0, 1, 2, 3, 4}},
		{"legacy, from 4", true, 4, []uint64{4}},
		{"legacy, nothing newer", true, 5, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPub(t, Config{Topic: "kv", LegacyReplay: tc.legacy})
			for i := 0; i < 5; i++ {
				if _, err := p.PublishRaw(batch(t, float64(i)), true); err != nil {
					t.Fatal(err)
				}
			}
			seqs, payloads := replay(t, p.ReplayEndpoint(), "kv", tc.start, tc.legacy)
			if !slices.Equal(seqs, tc.want) {
				t.Fatalf("replayed %v, want %v", seqs, tc.want)
			}
			for i, pl := range payloads {
				if !bytes.Equal(pl, batch(t, float64(seqs[i]))) {
					t.Fatalf("payload of seq %d differs from what was published", seqs[i])
				}
			}
			if st := p.Stats(); st.Replays != 1 || st.Sent != 5 {
				t.Fatalf("stats %+v, want 5 sent and 1 replay", st)
			}
		})
	}
}

func TestReplayBufferIsBounded(t *testing.T) {
	p := newPub(t, Config{BufferSize: 3})
	for i := 0; i < 7; i++ {
		if _, err := p.PublishRaw(batch(t, float64(i)), true); err != nil {
			t.Fatal(err)
		}
	}
	seqs, payloads := replay(t, p.ReplayEndpoint(), "", 0, false)
	if !slices.Equal(seqs, []uint64{4, 5, 6}) {
		t.Fatalf("replayed %v, want the newest three", seqs)
	}
	if tsOf(t, payloads[0]) != 4 {
		t.Fatalf("oldest kept batch has ts %v, want 4", tsOf(t, payloads[0]))
	}
}

func TestRestartResetsSequenceBufferAndQueue(t *testing.T) {
	p := newPub(t, Config{})
	for i := 0; i < 3; i++ {
		if _, err := p.PublishRaw(batch(t, float64(i)), true); err != nil {
			t.Fatal(err)
		}
	}
	// A batch still waiting in the queue dies with the process.
	if err := p.SetFaults(Faults{Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := p.Submit(events.Batch{TS: 99}, events.EncodingMap); err != nil {
		t.Fatal(err)
	}
	if p.Pending() != 1 {
		t.Fatalf("pending %d, want 1", p.Pending())
	}
	p.Restart()
	if p.NextSeq() != 0 || p.Pending() != 0 {
		t.Fatalf("after restart: next seq %d, pending %d; want 0 and 0", p.NextSeq(), p.Pending())
	}
	if seqs, _ := replay(t, p.ReplayEndpoint(), "", 0, false); len(seqs) != 0 {
		t.Fatalf("replay after restart %v, want nothing", seqs)
	}
	if err := p.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	seq, err := p.PublishRaw(batch(t, 10), true)
	if err != nil || seq != 0 {
		t.Fatalf("first batch after restart: seq %d, err %v; want 0", seq, err)
	}
	seqs, payloads := replay(t, p.ReplayEndpoint(), "", 0, false)
	if !slices.Equal(seqs, []uint64{0}) || tsOf(t, payloads[0]) != 10 {
		t.Fatalf("replay %v, want only the new batch 0", seqs)
	}
}

func TestDroppedBatchesAreReplayable(t *testing.T) {
	p := newPub(t, Config{})
	s := publishtest.Subscribe(t, p.Endpoint())
	next := warmUp(t, s, p)

	// PublishRaw(send=false): a gap on the wire, the batch in the buffer.
	gap, err := p.PublishRaw(batch(t, 1), false)
	if err != nil {
		t.Fatal(err)
	}
	live, err := p.PublishRaw(batch(t, 2), true)
	if err != nil {
		t.Fatal(err)
	}
	if gap != next || live != next+1 {
		t.Fatalf("seqs %d %d, want %d %d", gap, live, next, next+1)
	}
	if m := s.MustRecv(); m.Seq != live {
		t.Fatalf("received seq %d, want %d: the dropped batch must not be sent", m.Seq, live)
	}

	// Submit under a drop probability of 1: same outcome from the sender.
	if err := p.SetFaults(Faults{Drop: 1}); err != nil {
		t.Fatal(err)
	}
	if err := p.Submit(events.Batch{TS: 3}, events.EncodingMap); err != nil {
		t.Fatal(err)
	}
	if err := p.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	if err := p.Submit(events.Batch{TS: 4}, events.EncodingMap); err != nil {
		t.Fatal(err)
	}
	m := s.MustRecv()
	if m.Seq != live+2 || tsOf(t, m.Payload) != 4 {
		t.Fatalf("received seq %d ts %v, want seq %d ts 4 (seq %d dropped)", m.Seq, tsOf(t, m.Payload), live+2, live+1)
	}
	seqs, payloads := replay(t, p.ReplayEndpoint(), "", gap, false)
	if !slices.Equal(seqs, []uint64{gap, live, live + 1, live + 2}) {
		t.Fatalf("replay %v, want the dropped batches too", seqs)
	}
	if tsOf(t, payloads[0]) != 1 || tsOf(t, payloads[2]) != 3 {
		t.Fatal("dropped batches replayed with the wrong payload")
	}
	if st := p.Stats(); st.Dropped != 2 {
		t.Fatalf("dropped %d, want 2", st.Dropped)
	}
}

// TestSubmitKeepsOrderUnderJitter checks that delayed, jittered batches
// leave in submission order with consecutive sequence numbers.
func TestSubmitKeepsOrderUnderJitter(t *testing.T) {
	p := newPub(t, Config{Seed: 3, Faults: Faults{Delay: 2 * time.Millisecond, Jitter: 20 * time.Millisecond}})
	s := publishtest.Subscribe(t, p.Endpoint())
	if err := p.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	next := warmUp(t, s, p)
	if err := p.SetFaults(Faults{Delay: 2 * time.Millisecond, Jitter: 20 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	const n = 30
	for i := 0; i < n; i++ {
		if err := p.Submit(events.Batch{TS: float64(i)}, events.EncodingMap); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i++ {
		m := s.MustRecv()
		if m.Seq != next+uint64(i) || tsOf(t, m.Payload) != float64(i) {
			t.Fatalf("message %d: seq %d ts %v, want seq %d ts %d", i, m.Seq, tsOf(t, m.Payload), next+uint64(i), i)
		}
	}
}

func TestFaultsAndLifecycle(t *testing.T) {
	for _, f := range []Faults{{Delay: -1}, {Jitter: -1}, {Drop: -0.1}, {Drop: 1.5}} {
		if f.Validate() == nil {
			t.Fatalf("%+v accepted", f)
		}
		if _, err := New(Config{Bind: "tcp://127.0.0.1:*", Faults: f}); err == nil {
			t.Fatalf("New accepted faults %+v", f)
		}
	}
	if _, err := New(Config{Bind: "tcp://nonsense"}); err == nil {
		t.Fatal("bad bind address accepted")
	}
	p, err := New(Config{Bind: "tcp://127.0.0.1:*", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if p.ReplayEndpoint() != "" {
		t.Fatalf("replay endpoint %q without ReplayBind", p.ReplayEndpoint())
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := p.PublishRaw(batch(t, 0), true); err == nil {
		t.Fatal("PublishRaw after close succeeded")
	}
	if err := p.Submit(events.Batch{}, events.EncodingMap); err == nil {
		t.Fatal("Submit after close succeeded")
	}
}
