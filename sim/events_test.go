package sim

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/sim/publish/publishtest"
)

// eventShape lists, per event of a payload, its map keys in order (map
// encoding) or its item count (array encoding).
func eventShape(t *testing.T, payload []byte) []string {
	t.Helper()
	d := msgpack.NewDecoder(bytes.NewReader(payload))
	n, err := d.DecodeArrayLen()
	if err != nil || n < 2 {
		t.Fatalf("batch: %v (%d items)", err, n)
	}
	if _, err := d.DecodeFloat64(); err != nil {
		t.Fatal(err)
	}
	ne, err := d.DecodeArrayLen()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for i := 0; i < ne; i++ {
		code, err := d.PeekCode()
		if err != nil {
			t.Fatal(err)
		}
		if m, err := d.DecodeMapLen(); err == nil {
			keys := ""
			for j := 0; j < m; j++ {
				k, err := d.DecodeString()
				if err != nil {
					t.Fatal(err)
				}
				keys += k + ","
				if err := d.Skip(); err != nil {
					t.Fatal(err)
				}
			}
			out = append(out, "map:"+keys)
			continue
		}
		_ = code
		t.Fatalf("event %d is not a map", i)
	}
	return out
}

func arrayShape(t *testing.T, payload []byte) []int {
	t.Helper()
	var v []any
	if err := msgpack.Unmarshal(payload, &v); err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, ev := range v[1].([]any) {
		out = append(out, len(ev.([]any)))
	}
	return out
}

func TestEventsMatchVLLMVectors(t *testing.T) {
	vec := loadVectors(t)
	tests := []struct {
		name     string
		vector   string
		encoding events.Encoding
		model    string // "" base model, else the LoRA adapter
		salt     string
		nTokens  int
	}{
		{"map, two blocks", "stored_2blocks_map", events.EncodingMap, "", "", 33},
		{"array, two blocks", "stored_2blocks_array", events.EncodingArray, "", "", 33},
		{"map, lora and salt", "stored_lora_salt_map", events.EncodingMap, "sql-lora", "salt-1", 17},
		{"array, lora and salt", "stored_lora_salt_array", events.EncodingArray, "sql-lora", "salt-1", 17},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := vec.Vectors[tc.vector]
			f := startTestFleet(t, Config{
				HashAlgo: kvindex.AlgoSHA256CBOR, HashSeed: "0", LoRAs: []string{"sql-lora"},
				EventEncoding: tc.encoding, Topic: want.Topic,
			})
			pod := f.Pods[0]
			sub := publishtest.Subscribe(t, pod.EventsAddr(0))
			warmUp(t, sub, pod)
			body := map[string]any{"prompt": vec.BaseTokens[:tc.nTokens], "max_tokens": 1}
			if tc.model != "" {
				body["model"] = tc.model
			}
			if tc.salt != "" {
				body["cache_salt"] = tc.salt
			}
			if code, _, out := post(t, pod.URL()+"/v1/completions", body); code != 200 {
				t.Fatalf("%d %s", code, out)
			}
			got := sub.MustRecv()
			if got.Topic != want.Topic {
				t.Fatalf("topic %q, want %q", got.Topic, want.Topic)
			}
			gb, err := events.Decode(got.Payload)
			if err != nil {
				t.Fatal(err)
			}
			wb, err := events.Decode(want.Payload)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(gb.Events, wb.Events) {
				t.Fatalf("events\n got %+v\nwant %+v", gb.Events, wb.Events)
			}
			if !gb.HasDPRank || gb.DPRank != 0 {
				t.Fatalf("data_parallel_rank %v/%d, want 0", gb.HasDPRank, gb.DPRank)
			}
			if tc.encoding == events.EncodingMap {
				if g, w := eventShape(t, got.Payload), eventShape(t, want.Payload); !slices.Equal(g, w) {
					t.Fatalf("map keys\n got %v\nwant %v", g, w)
				}
			} else if g, w := arrayShape(t, got.Payload), arrayShape(t, want.Payload); !slices.Equal(g, w) {
				t.Fatalf("array lengths %v, want %v", g, w)
			}
			// The hashes are what kvindex computes for the same request.
			h, err := kvindex.NewHasher(kvindex.AlgoSHA256CBOR, "0", 16)
			if err != nil {
				t.Fatal(err)
			}
			keys, err := h.Keys(nil, vec.BaseTokens[:tc.nTokens], kvindex.RequestExtras{LoRAName: tc.model, CacheSalt: tc.salt})
			if err != nil {
				t.Fatal(err)
			}
			for i, k := range keys {
				if gb.Events[0].BlockHashes[i] != uint64(k) {
					t.Fatalf("block %d hash %d, kvindex %d", i, gb.Events[0].BlockHashes[i], k)
				}
			}
		})
	}
}

func TestEvictionPublishesBlockRemoved(t *testing.T) {
	prof := testProfile()
	prof.NumGPUBlocks = 4
	f := startTestFleet(t, Config{Profile: prof})
	pod := f.Pods[0]
	sub := publishtest.Subscribe(t, pod.EventsAddr(0))
	warmUp(t, sub, pod)
	// Fill the cache with A (3 blocks stored), then B needs every block and
	// must evict A's tail before A's head.
	send := func(ids []uint32) {
		if code, _, out := post(t, pod.URL()+"/v1/completions", map[string]any{"prompt": ids, "max_tokens": 1}); code != 200 {
			t.Fatalf("%d %s", code, out)
		}
	}
	h, _ := kvindex.NewHasher(kvindex.AlgoSHA256, "0", 16)
	a := tokenRange(0, 49)
	aKeys, _ := h.Keys(nil, a, kvindex.RequestExtras{})
	send(a)
	stored, err := events.Decode(sub.MustRecv().Payload)
	if err != nil {
		t.Fatal(err)
	}
	var storedA []uint64
	for _, ev := range stored.Events {
		if ev.Kind == events.KindBlockStored {
			storedA = append(storedA, ev.BlockHashes...)
		}
	}
	if len(storedA) != 3 || storedA[0] != uint64(aKeys[0]) || storedA[2] != uint64(aKeys[2]) {
		t.Fatalf("stored %v, want A's keys %v", storedA, aKeys)
	}
	send(tokenRange(5000, 49))
	b, err := events.Decode(sub.MustRecv().Payload)
	if err != nil {
		t.Fatal(err)
	}
	var removed []uint64
	for _, ev := range b.Events {
		if ev.Kind == events.KindBlockRemoved {
			if ev.Medium != events.MediumGPU {
				t.Fatalf("medium %q", ev.Medium)
			}
			removed = append(removed, ev.BlockHashes...)
		}
	}
	// 4 blocks: A took all four (evicting the warm-up's block in its own
	// batch) and freed them tail first: its unhashed partial block, then
	// A2, A1, A0. B takes all four again.
	want := []uint64{uint64(aKeys[2]), uint64(aKeys[1]), uint64(aKeys[0])}
	if !slices.Equal(removed, want) {
		t.Fatalf("removed %v, want %v", removed, want)
	}
}

// replay asks a pod's replay socket for every batch from start; the
// framing, end marker included, is checked by publishtest.
func replay(t *testing.T, addr string, start uint64, legacy bool) (seqs []uint64, payloads [][]byte) {
	t.Helper()
	for _, m := range publishtest.Replay(t, addr, start, legacy) {
		seqs = append(seqs, m.Seq)
		payloads = append(payloads, m.Payload)
	}
	return seqs, payloads
}

func TestReplay(t *testing.T) {
	tests := []struct {
		name   string
		legacy bool
		buffer int
		start  uint64
		want   []uint64
	}{
		{"current framing, all", false, 100, 0, []uint64{0, 1, 2, 3, 4}},
		{"current framing, from 3", false, 100, 3, []uint64{3, 4}},
		{"legacy framing, all", true, 100, 0, []uint64{0, 1, 2, 3, 4}},
		{"bounded buffer keeps the newest", false, 3, 0, []uint64{2, 3, 4}},
		{"nothing newer", false, 100, 9, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := startTestFleet(t, Config{LegacyReplay: tc.legacy, ReplayBuffer: tc.buffer, Topic: "kv@sim"})
			pod := f.Pods[0]
			for i := 0; i < 5; i++ {
				post(t, pod.URL()+"/v1/completions", map[string]any{"prompt": tokenRange(i*1000, 20), "max_tokens": 1})
			}
			waitBatches(t, pod, 0, 5)
			seqs, payloads := replay(t, pod.ReplayAddr(0), tc.start, tc.legacy)
			if !slices.Equal(seqs, tc.want) {
				t.Fatalf("replayed %v, want %v", seqs, tc.want)
			}
			for _, p := range payloads {
				if _, err := events.Decode(p); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func TestRestartResetsSequence(t *testing.T) {
	f := startTestFleet(t, Config{})
	pod := f.Pods[0]
	sub := publishtest.Subscribe(t, pod.EventsAddr(0))
	last := warmUp(t, sub, pod)
	if last == 0 {
		t.Log("warm-up ended at sequence 0")
	}
	prompt := map[string]any{"prompt": tokenRange(0, 40), "max_tokens": 1}
	post(t, pod.URL()+"/v1/completions", prompt)
	before := sub.MustRecv()
	if before.Seq != last+1 {
		t.Fatalf("seq %d, want %d", before.Seq, last+1)
	}
	if err := pod.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The cache is gone: the same prompt is a miss and is stored again,
	// in a batch numbered 0.
	code, _, body := post(t, pod.URL()+"/v1/completions", prompt)
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	after := sub.MustRecv()
	if after.Seq != 0 {
		t.Fatalf("first batch after restart has seq %d, want 0", after.Seq)
	}
	if cached := cachedTokens(t, body); cached != 0 {
		t.Fatalf("cached %d tokens after restart, want 0", cached)
	}
	seqs, _ := replay(t, pod.ReplayAddr(0), 0, false)
	if !slices.Equal(seqs, []uint64{0}) {
		t.Fatalf("replay after restart %v, want [0]", seqs)
	}
}

func TestDroppedBatchesLeaveGapAndStayReplayable(t *testing.T) {
	f := startTestFleet(t, Config{})
	pod := f.Pods[0]
	sub := publishtest.Subscribe(t, pod.EventsAddr(0))
	last := warmUp(t, sub, pod)
	ctx := context.Background()
	if err := pod.SetFaults(ctx, Faults{DropEvents: 1}); err != nil {
		t.Fatal(err)
	}
	post(t, pod.URL()+"/v1/completions", map[string]any{"prompt": tokenRange(0, 40), "max_tokens": 1})
	if m, ok := sub.Recv(300 * time.Millisecond); ok {
		t.Fatalf("dropped batch arrived: seq %d", m.Seq)
	}
	if err := pod.SetFaults(ctx, Faults{}); err != nil {
		t.Fatal(err)
	}
	post(t, pod.URL()+"/v1/completions", map[string]any{"prompt": tokenRange(100, 40), "max_tokens": 1})
	if m := sub.MustRecv(); m.Seq != last+2 {
		t.Fatalf("seq %d after a drop, want %d (a gap)", m.Seq, last+2)
	}
	seqs, _ := replay(t, pod.ReplayAddr(0), last+1, false)
	if !slices.Equal(seqs, []uint64{last + 1, last + 2}) {
		t.Fatalf("replay %v, want the dropped batch too", seqs)
	}
	if st := pod.Stats()[0]; st.EventBatchesDropped != 1 {
		t.Fatalf("dropped %d, want 1", st.EventBatchesDropped)
	}
}

func TestEventDelay(t *testing.T) {
	// 20 s of model delay at scale 100 is 200 ms on the wall clock.
	f := startTestFleet(t, Config{TimeScale: 100})
	pod := f.Pods[0]
	sub := publishtest.Subscribe(t, pod.EventsAddr(0))
	warmUp(t, sub, pod)
	if err := pod.SetFaults(context.Background(), Faults{EventDelay: 20 * time.Second}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	post(t, pod.URL()+"/v1/completions", map[string]any{"prompt": tokenRange(0, 40), "max_tokens": 1})
	sub.MustRecv()
	if el := time.Since(start); el < 200*time.Millisecond {
		t.Fatalf("batch arrived after %v, want ≥ 200ms", el)
	}
}

func TestDataParallelRanks(t *testing.T) {
	f := startTestFleet(t, Config{DP: 2, Pods: 2})
	for _, pod := range f.Pods {
		want := fmt.Sprintf("%s?events=tcp://127.0.0.1:%d&replay=tcp://127.0.0.1:%d&dp=2&model=sim-test", pod.URL(), pod.EventsPort(), pod.ReplayPort())
		if pod.Endpoint() != want {
			t.Fatalf("endpoint %q, want %q", pod.Endpoint(), want)
		}
		for rank := 0; rank < 2; rank++ {
			code, _, body := post(t, pod.URL()+"/v1/completions", map[string]any{"prompt": tokenRange(rank*100, 40), "max_tokens": 1},
				"X-data-parallel-rank", fmt.Sprint(rank))
			if code != 200 {
				t.Fatalf("%d %s", code, body)
			}
			// Rank r's batch is on events port + r, replayable on replay port + r.
			waitBatches(t, pod, rank, 1)
			_, payloads := replay(t, pod.ReplayAddr(rank), 0, false)
			if len(payloads) != 1 {
				t.Fatalf("rank %d replayed %d batches, want 1", rank, len(payloads))
			}
			b, err := events.Decode(payloads[0])
			if err != nil {
				t.Fatal(err)
			}
			if b.DPRank != rank {
				t.Fatalf("batch rank %d, want %d", b.DPRank, rank)
			}
		}
		st := pod.Stats()
		if st[0].PrefixQueries != 40 || st[1].PrefixQueries != 40 {
			t.Fatalf("per-rank queries %d/%d, want 40/40", st[0].PrefixQueries, st[1].PrefixQueries)
		}
	}
	code, _, _ := post(t, f.Pods[0].URL()+"/v1/completions", map[string]any{"prompt": tokenRange(0, 4)}, "X-data-parallel-rank", "2")
	if code != 400 {
		t.Fatalf("rank out of range: %d, want 400", code)
	}
}

// TestEventsConnect: with EventsConnect the pods' publishers connect to a
// collector, rank r to its port + r, each pod under the topic
// kv@HOST:PORT@MODEL of its HTTP address; replay stays on the pod, and the
// endpoint names no events address.
func TestEventsConnect(t *testing.T) {
	addr := publishtest.FreeAddr(t, 2)
	port, _ := strconv.Atoi(addr[strings.LastIndex(addr, ":")+1:])
	collectors := []*publishtest.Subscriber{
		publishtest.Listen(t, fmt.Sprintf("tcp://127.0.0.1:%d", port)),
		publishtest.Listen(t, fmt.Sprintf("tcp://127.0.0.1:%d", port+1)),
	}
	f := startTestFleet(t, Config{DP: 2, EventsConnect: fmt.Sprintf("tcp://127.0.0.1:%d", port)})
	pod := f.Pods[0]
	topic := "kv@" + strings.TrimPrefix(pod.URL(), "http://") + "@sim-test"
	if pod.Topic() != topic || strings.Contains(pod.Endpoint(), "events=") || !strings.Contains(pod.Endpoint(), "replay=") {
		t.Fatalf("topic %q, endpoint %q", pod.Topic(), pod.Endpoint())
	}
	for rank, c := range collectors {
		// The first batches may go before the subscription reaches the
		// publisher: send until one arrives, then check it.
		var m publishtest.Message
		for i := 0; ; i++ {
			code, _, body := post(t, pod.URL()+"/v1/completions", map[string]any{"prompt": tokenRange(rank*1000+i*50, 40), "max_tokens": 1},
				"X-data-parallel-rank", fmt.Sprint(rank))
			if code != 200 {
				t.Fatalf("%d %s", code, body)
			}
			var ok bool
			if m, ok = c.Recv(200 * time.Millisecond); ok {
				break
			}
			if i == 50 {
				t.Fatalf("rank %d: nothing reached the collector", rank)
			}
		}
		b, err := events.Decode(m.Payload)
		if err != nil {
			t.Fatal(err)
		}
		if m.Topic != topic || b.DPRank != rank {
			t.Fatalf("rank %d: topic %q, batch rank %d", rank, m.Topic, b.DPRank)
		}
		if _, payloads := replay(t, pod.ReplayAddr(rank), 0, false); len(payloads) == 0 {
			t.Fatalf("rank %d: nothing to replay", rank)
		}
	}
	if err := CheckConfig(Config{EventsConnect: "tcp://*:5557"}); err == nil {
		t.Fatal("a wildcard collector address was accepted")
	}
}
