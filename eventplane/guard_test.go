package eventplane

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/sim/publish"
	"github.com/prefixrouter/prefixrouter/sim/publish/publishtest"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// busPlane is a running plane with one bus on loopback, a pod at
// http://127.0.0.1:8000 expected on it (its publishers connect from
// 127.0.0.1, the host its topic names) and the hasher the pods use.
type busPlane struct {
	p      *Plane
	reg    *prometheus.Registry
	h      *kvindex.Hasher
	listen string
	port   int
	id     targetid.ID
}

const podTopic = "kv@127.0.0.1:8000@m"

func newBusPlane(t *testing.T, cfg Config) *busPlane {
	t.Helper()
	listen := publishtest.FreeAddr(t, 1)
	_, port, err := kvindex.ParseListenAddr(listen)
	if err != nil {
		t.Fatal(err)
	}
	cfg.BlockSize, cfg.HashAlgo, cfg.HashSeed, cfg.HasHashSeed = 4, "sha256", "0", true
	cfg.EvalInterval, cfg.EventsListen = 10*time.Millisecond, []string{listen}
	reg := prometheus.NewRegistry()
	p, err := New(cfg, Deps{Logger: quietLogger(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	h, err := kvindex.NewHasher(kvindex.AlgoSHA256, "0", 4)
	if err != nil {
		t.Fatal(err)
	}
	id := targetid.ID{Endpoint: "http://127.0.0.1:8000"}
	p.SetTarget(id, Source{Events: "tcp://127.0.0.1:5557", EventsImplied: true})
	ctx, cancel := context.WithCancel(context.Background())
	if err := p.Listen(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = p.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return &busPlane{p: p, reg: reg, h: h, listen: listen, port: port, id: id}
}

// publisher connects to the bus under topic, from source (an address of
// the loopback network; empty: the kernel's choice, 127.0.0.1).
func (e *busPlane) publisher(t *testing.T, source, topic string) *publish.Publisher {
	t.Helper()
	connect := e.listen
	if source != "" {
		connect = "tcp://" + source + ":0;127.0.0.1:" + strconv.Itoa(e.port)
	}
	pub, err := publish.New(publish.Config{Connect: connect, ReplayBind: "tcp://127.0.0.1:*", Topic: topic, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	return pub
}

// prompt is n blocks of tokens starting at from, as a pod stores them.
func prompt(from uint32, n int) []uint32 {
	tokens := make([]uint32, 4*n)
	for i := range tokens {
		tokens[i] = from + uint32(i)
	}
	return tokens
}

// storeUntil publishes the BlockStored batch of tokens from pub until
// done holds (a connecting publisher's first batches go nowhere until
// the bus's subscription reaches it), and returns the blocks' keys.
func (e *busPlane) storeUntil(t *testing.T, pub *publish.Publisher, tokens []uint32, what string, done func(keys []kvindex.Key) bool) []kvindex.Key {
	t.Helper()
	b, keys := storedBatch(t, e.h, tokens)
	waitFor(t, what, func() bool {
		if _, err := pub.Publish(&b, events.EncodingMap); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
		return done(keys)
	})
	return keys
}

// confirmed is how many of keys, from the first, the index holds on the
// pod: what the dry run shows as confirmed blocks.
func (e *busPlane) confirmed(keys []kvindex.Key) int {
	for _, m := range e.p.Index().Lookup(nil, keys) {
		if m.Target == e.id {
			return m.Blocks
		}
	}
	return 0
}

// refused is prefixrouter_kv_refused_total of the pod for reason r.
func (e *busPlane) refused(r kvindex.Refusal) float64 {
	mfs, err := e.reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "prefixrouter_kv_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["target"] == e.id.String() && labels["reason"] == r.String() {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// requireRefusedFault waits for the events_refused fault and checks its
// detail.
func (e *busPlane) requireRefusedFault(t *testing.T, wants ...string) {
	t.Helper()
	waitFor(t, "the events_refused fault", func() bool {
		for _, f := range e.p.Freshness(e.id).Faults {
			if f.Kind == FaultEventsRefused {
				return true
			}
		}
		return false
	})
	e.p.Evaluate()
	requireFault(t, e.p, e.id, FaultEventsRefused, wants...)
}

// TestBusRefusesEventsFromAnotherAddress: a publisher connecting from
// 127.0.0.2 under the pod's own topic (whose host is 127.0.0.1) is
// refused, before and after the pod's own stream exists: none of its 64
// blocks is confirmed, the pod's are, and the pod shows the
// events_refused fault naming what to check.
func TestBusRefusesEventsFromAnotherAddress(t *testing.T) {
	e := newBusPlane(t, DefaultConfig())
	forger := e.publisher(t, "127.0.0.2", podTopic)
	forged := e.storeUntil(t, forger, prompt(1000, 64), "the forger's first batch refused", func([]kvindex.Key) bool {
		return e.refused(kvindex.RefusedSource) > 0
	})
	if n := e.confirmed(forged); n != 0 {
		t.Fatalf("%d forged blocks confirmed before the pod published", n)
	}
	pod := e.publisher(t, "", podTopic)
	own := e.storeUntil(t, pod, prompt(1, 8), "the pod's blocks confirmed", func(keys []kvindex.Key) bool { return e.confirmed(keys) == 8 })
	before := e.refused(kvindex.RefusedSource)
	e.storeUntil(t, forger, prompt(1000, 64), "the forger refused once the pod's stream runs", func([]kvindex.Key) bool {
		return e.refused(kvindex.RefusedSource) > before
	})
	if n := e.confirmed(forged); n != 0 {
		t.Fatalf("%d forged blocks confirmed", n)
	}
	if n := e.confirmed(own); n != 8 {
		t.Fatalf("the pod's own blocks: %d of 8 confirmed", n)
	}
	e.requireRefusedFault(t, "source_address", "from 127.0.0.2", "arrive from an address that is not the pod's")
	if v := e.p.Buses()[0]; len(v.Topics) != 1 || v.Topics[0].From != "127.0.0.1" || v.Topics[0].Refused["source_address"] == 0 {
		t.Fatalf("bus view %+v", v)
	}
}

// TestBusConnectionOwnsItsTopic: a second connection from the pod's own
// address cannot take its topic over while the first lives; once health
// sees the pod restart (TargetRestarted) the new connection, the
// restarted process's, may.
func TestBusConnectionOwnsItsTopic(t *testing.T) {
	cfg := DefaultConfig()
	cfg.OwnerIdle = time.Hour
	e := newBusPlane(t, cfg)
	pod := e.publisher(t, "", podTopic)
	own := e.storeUntil(t, pod, prompt(1, 8), "the pod's blocks confirmed", func(keys []kvindex.Key) bool { return e.confirmed(keys) == 8 })
	other := e.publisher(t, "", podTopic)
	forged := e.storeUntil(t, other, prompt(1000, 64), "the second connection refused", func([]kvindex.Key) bool {
		return e.refused(kvindex.RefusedConnection) > 0
	})
	// The owner keeps publishing: still its stream.
	e.storeUntil(t, pod, prompt(100, 4), "the owner's next blocks", func(keys []kvindex.Key) bool { return e.confirmed(keys) == 4 })
	if n := e.confirmed(forged); n != 0 {
		t.Fatalf("%d blocks of the second connection confirmed", n)
	}
	e.requireRefusedFault(t, "other_connection", "a second connection publishes under this pod's topic")

	// Health sees the pod's process restart: the new process connects anew.
	e.p.TargetRestarted(e.id)
	e.storeUntil(t, other, prompt(1000, 64), "the restarted process's connection takes over", func(keys []kvindex.Key) bool { return e.confirmed(keys) == 64 })
	if n := e.confirmed(own); n != 0 {
		t.Fatalf("the old process's blocks survive its restart: %d", n)
	}
}

// TestBusTakeoverStartsOver: a connection that takes over a topic its
// owner left silent does not inherit what the owner stored (the owner may
// have been a process that published first under the pod's topic from the
// pod's host): the stream starts over, as after a restart.
func TestBusTakeoverStartsOver(t *testing.T) {
	cfg := DefaultConfig()
	cfg.OwnerIdle = 200 * time.Millisecond
	e := newBusPlane(t, cfg)
	first := e.publisher(t, "", podTopic)
	firsts := e.storeUntil(t, first, prompt(1, 8), "the first connection's blocks confirmed", func(keys []kvindex.Key) bool { return e.confirmed(keys) == 8 })
	time.Sleep(2 * cfg.OwnerIdle) // the owner falls silent
	pod := e.publisher(t, "", podTopic)
	e.storeUntil(t, pod, prompt(100, 4), "the new connection's blocks confirmed", func(keys []kvindex.Key) bool { return e.confirmed(keys) == 4 })
	waitFor(t, "the old owner's blocks cleared", func() bool { return e.confirmed(firsts) == 0 })
}

// TestBusSecondTopicKeepsTheFirst: another topic naming the same pod
// (same host:port, another model) does not replace the stream the pod
// publishes: it is refused and counted, the first topic stays followed.
func TestBusSecondTopicKeepsTheFirst(t *testing.T) {
	e := newBusPlane(t, DefaultConfig())
	pod := e.publisher(t, "", podTopic)
	e.storeUntil(t, pod, prompt(1, 8), "the pod's blocks confirmed", func(keys []kvindex.Key) bool { return e.confirmed(keys) == 8 })
	second := e.publisher(t, "", "kv@127.0.0.1:8000@other")
	forged := e.storeUntil(t, second, prompt(1000, 64), "the second topic refused", func([]kvindex.Key) bool {
		return e.refused(kvindex.RefusedSecondTopic) > 0
	})
	if _, _, topic, ok := e.p.busStatus(e.p.streams[e.id]); !ok || topic != podTopic {
		t.Fatalf("the pod is followed under %q (ok %v), want %q", topic, ok, podTopic)
	}
	e.storeUntil(t, pod, prompt(100, 4), "the first topic's next blocks", func(keys []kvindex.Key) bool { return e.confirmed(keys) == 4 })
	if n := e.confirmed(forged); n != 0 {
		t.Fatalf("%d blocks of the second topic confirmed", n)
	}
	e.requireRefusedFault(t, "second_topic", `"kv@127.0.0.1:8000@other"`)
}

// TestBusClearFloodIsRateLimited: AllBlocksCleared beyond the per-minute
// limit is refused: the pod's picture survives the flood, and the fault
// names the flag.
func TestBusClearFloodIsRateLimited(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ClearsPerMinute = 2
	e := newBusPlane(t, cfg)
	pod := e.publisher(t, "", podTopic)
	clear := events.Batch{TS: 1, Events: []events.Event{{Kind: events.KindAllBlocksCleared}}}
	clearOnce := func(what string, done func() bool) {
		t.Helper()
		if _, err := pod.Publish(&clear, events.EncodingMap); err != nil {
			t.Fatal(err)
		}
		waitFor(t, what, done)
	}
	for i := range cfg.ClearsPerMinute {
		keys := e.storeUntil(t, pod, prompt(uint32(100*i), 8), "blocks stored", func(keys []kvindex.Key) bool { return e.confirmed(keys) == 8 })
		clearOnce("a clear within the limit applied", func() bool { return e.confirmed(keys) == 0 })
	}
	kept := e.storeUntil(t, pod, prompt(5000, 8), "blocks stored before the flood", func(keys []kvindex.Key) bool { return e.confirmed(keys) == 8 })
	for range 20 {
		if _, err := pod.Publish(&clear, events.EncodingMap); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the flood refused", func() bool { return e.refused(kvindex.RefusedClearRate) == 20 })
	if n := e.confirmed(kept); n != 8 {
		t.Fatalf("after a flood of clears beyond the limit the pod holds %d of 8 blocks", n)
	}
	e.requireRefusedFault(t, "clear_rate 20", "--events-max-clears-per-minute")
}

// TestBusRefusesTokensBeyondTheBlocks: a BlockStored whose token_ids
// exceed its blocks × block size is refused whole.
func TestBusRefusesTokensBeyondTheBlocks(t *testing.T) {
	e := newBusPlane(t, DefaultConfig())
	pod := e.publisher(t, "", podTopic)
	e.storeUntil(t, pod, prompt(1, 2), "the pod's blocks confirmed", func(keys []kvindex.Key) bool { return e.confirmed(keys) == 2 })
	b, keys := storedBatch(t, e.h, prompt(500, 1))
	b.Events[0].TokenIDs = prompt(500, 10000) // 40,000 token ids for 1 block of 4
	if _, err := pod.Publish(&b, events.EncodingMap); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the batch refused", func() bool { return e.refused(kvindex.RefusedTokens) == 1 })
	if n := e.confirmed(keys); n != 0 {
		t.Fatalf("the oversized event's block confirmed")
	}
	e.requireRefusedFault(t, "tokens_cap 1", "40000 tokens exceed the bound of 4")
	if f := e.p.Freshness(e.id); f.Verdict != VerdictFresh || !strings.Contains(e.p.Buses()[0].Topics[0].Target, "127.0.0.1:8000") {
		t.Fatalf("after a refused batch: %+v", f)
	}
}
