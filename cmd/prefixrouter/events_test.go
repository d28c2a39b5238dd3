package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/sim/publish"
)

// syncBuffer lets the test read what the command wrote so far.
type syncBuffer struct {
	mu chan struct{}
	b  bytes.Buffer
}

func newSyncBuffer() *syncBuffer { s := &syncBuffer{mu: make(chan struct{}, 1)}; return s }
func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu <- struct{}{}
	defer func() { <-s.mu }()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string {
	s.mu <- struct{}{}
	defer func() { <-s.mu }()
	return s.b.String()
}

func TestEventsCommandPrintsEventsAndRecoversGaps(t *testing.T) {
	pub, err := publish.New(publish.Config{Bind: "tcp://127.0.0.1:*", ReplayBind: "tcp://127.0.0.1:*", Topic: "kv@pod"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	stored := events.Batch{TS: 1.5, HasDPRank: true, DPRank: 0, Events: []events.Event{{
		Kind: events.KindBlockStored, BlockHashes: []uint64{18446744073709551615, 7}, TokenIDs: []uint32{1, 2, 3, 4},
		BlockSize: 2, Medium: events.MediumGPU, LoRAName: "sql-lora", HasGroupIdx: true,
	}}}
	// Published before the command subscribes: only replay brings it.
	if _, err := pub.Publish(&stored, events.EncodingArray); err != nil {
		t.Fatal(err)
	}
	out := newSyncBuffer()
	var errOut bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(context.Background(), []string{"prefixrouter", "events", "--endpoint", pub.Endpoint(), "--replay", pub.ReplayEndpoint(),
			"--topic", "kv@", "--count", "3", "--timeout", "20s"}, nil, out, &errOut)
	}()
	// Empty batches until the subscription is live, then a gap and two events.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "BlockStored") {
		if time.Now().After(deadline) {
			t.Fatalf("replayed event never printed; stderr %q", errOut.String())
		}
		_, _ = pub.Publish(&events.Batch{TS: 2}, events.EncodingMap)
		time.Sleep(20 * time.Millisecond)
	}
	removed := events.Batch{TS: 3, Events: []events.Event{{Kind: events.KindBlockRemoved, BlockHashes: []uint64{7}, Medium: events.MediumCPU}}}
	payload, _ := events.Encode(&removed, events.EncodingMap)
	if _, err := pub.PublishRaw(payload, false); err != nil { // lost live: a gap
		t.Fatal(err)
	}
	cleared := events.Batch{TS: 4, Events: []events.Event{{Kind: events.KindAllBlocksCleared}}}
	if _, err := pub.Publish(&cleared, events.EncodingMap); err != nil {
		t.Fatal(err)
	}
	code := <-done
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("want 3 events and a summary, got %q", out.String())
	}
	want := []string{
		`{"seq":0,"ts":1.5,"dp_rank":0,"type":"BlockStored","block_hashes":["18446744073709551615","7"],"token_ids":[1,2,3,4],"block_size":2,"lora_name":"sql-lora","medium":"GPU","group_idx":0}`,
		`"type":"BlockRemoved","block_hashes":["7"],"medium":"CPU"}`,
		`"type":"AllBlocksCleared"}`,
	}
	if lines[0] != want[0] {
		t.Errorf("line 0:\n got %s\nwant %s", lines[0], want[0])
	}
	for i := 1; i < 3; i++ {
		if !strings.HasSuffix(lines[i], want[i]) {
			t.Errorf("line %d: %s", i, lines[i])
		}
	}
	var sum eventsSummary
	if err := json.Unmarshal([]byte(lines[3]), &sum); err != nil {
		t.Fatal(err)
	}
	// The removed batch was never sent live, so its line above came from a
	// replay: after the gap it left (Gaps 1) or, when the subscription's
	// catch-up on connecting ran after it was published, within that
	// catch-up (Gaps 0). Either way nothing is lost.
	if sum.Summary.Events != 3 || sum.Summary.Gaps > 1 || sum.Summary.Replayed < 2 || sum.Summary.DecodeErrors != 0 {
		t.Fatalf("summary %+v", sum.Summary)
	}
}

func TestEventsCommandTimeoutAndBadFlags(t *testing.T) {
	out, errOut, code := runCLI(t, "", "events", "--endpoint", "tcp://127.0.0.1:1", "--timeout", "200ms")
	if code != 0 || !strings.Contains(out, `{"summary":{"batches":0,"events":0,"gaps":0,"replayed":0,"decode_errors":0}}`) {
		t.Fatalf("code %d out %q err %q", code, out, errOut)
	}
	for _, args := range [][]string{
		{"events"},
		{"events", "--endpoint", "localhost:5557"},
		{"events", "--endpoint", "tcp://h:99999"},
		{"events", "--endpoint", "tcp://h:5557", "--count", "-1"},
		{"events", "--endpoint", "tcp://h:5557", "--timeout", "soon"},
	} {
		_, errOut, code := runCLI(t, "", args...)
		if code != 2 || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: code %d stderr %q", args, code, errOut)
		}
	}
}

// TestEventsTakesThePodURL: --endpoint takes the value serve's --endpoint
// takes, and reads rank 0's publisher and replay socket from it; the event
// published before the command started arrives only through that replay.
func TestEventsTakesThePodURL(t *testing.T) {
	pub, err := publish.New(publish.Config{Bind: "tcp://127.0.0.1:*", ReplayBind: "tcp://127.0.0.1:*"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	stored := events.Batch{TS: 1, Events: []events.Event{{Kind: events.KindBlockStored, BlockHashes: []uint64{42}, TokenIDs: []uint32{1, 2}, BlockSize: 2}}}
	if _, err := pub.Publish(&stored, events.EncodingMap); err != nil {
		t.Fatal(err)
	}
	pod := "http://127.0.0.1:1?events=" + pub.Endpoint() + "&replay=" + pub.ReplayEndpoint() + "&model=m"
	out, errOut, code := runCLI(t, "", "events", "--endpoint", pod, "--count", "1", "--timeout", "20s")
	if code != 0 || !strings.HasPrefix(out, `{"seq":0,"ts":1,"type":"BlockStored","block_hashes":["42"]`) {
		t.Fatalf("exit %d stdout %q stderr %q", code, out, errOut)
	}
	_, errOut, code = runCLI(t, "", "events", "--endpoint", "http://127.0.0.1:1/v1")
	if code != exitUsage || !strings.Contains(errOut, `--endpoint "http://127.0.0.1:1/v1": give the server's root URL`) {
		t.Fatalf("exit %d stderr %q", code, errOut)
	}
}
