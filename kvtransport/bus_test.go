package kvtransport

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/sim/publish"
	"github.com/prefixrouter/prefixrouter/sim/publish/publishtest"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// TestBusFollowsEachTopic: publishers connect to the bus as vLLM's do with
// a connecting endpoint. Each topic is its own stream: its first batches
// (lost while the subscription reached the publisher) and a dropped one
// come back through the pod's replay socket in order, a restarted
// publisher clears its target, rank 1 arrives on the next port, and a
// topic matching no target is listed, never applied.
func TestBusFollowsEachTopic(t *testing.T) {
	listen := publishtest.FreeAddr(t, 2)
	_, port, _ := kvindex.ParseListenAddr(listen)
	const topic = "kv@10.0.0.7:8000@m"
	pub := func(connect, topic string) *publish.Publisher {
		p, err := publish.New(publish.Config{Connect: connect, ReplayBind: "tcp://127.0.0.1:*", Topic: topic, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	rank0 := pub(listen, topic)
	rank1 := pub("tcp://127.0.0.1:"+strconv.Itoa(port+1), topic)
	stranger := pub(listen, "kv@10.0.0.9:8000@m")
	replays := []string{rank0.ReplayEndpoint(), rank1.ReplayEndpoint()}

	var mu sync.Mutex
	applied := map[targetid.ID][]uint64{}
	restarts := map[targetid.ID]int{}
	seen := func(id targetid.ID) []uint64 { mu.Lock(); defer mu.Unlock(); return slices.Clone(applied[id]) }
	route := func(rank int, topic string) (BusRoute, error) {
		tp, err := kvindex.ParseTopic(topic)
		if err != nil {
			return BusRoute{}, err
		}
		if tp.HostPort() != "10.0.0.7:8000" {
			return BusRoute{}, fmt.Errorf("no target at %s", tp.HostPort())
		}
		id := targetid.ID{Endpoint: "http://10.0.0.7:8000", Rank: rank}
		return BusRoute{Target: id, Replay: replays[rank], Sources: []string{"127.0.0.1"},
			Handle: func(seq uint64, _ *events.Batch, _ bool) {
				mu.Lock()
				applied[id] = append(applied[id], seq)
				mu.Unlock()
			},
			Restarted: func() { mu.Lock(); restarts[id]++; applied[id] = nil; mu.Unlock() },
		}, nil
	}
	bus, err := NewBus(BusConfig{Listen: listen, Route: route, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); bus.Wait() }()
	if err := bus.BindRank(1); err != nil {
		t.Fatal(err)
	}
	if err := bus.Start(ctx); err != nil {
		t.Fatal(err)
	}
	a, b := targetid.ID{Endpoint: "http://10.0.0.7:8000"}, targetid.ID{Endpoint: "http://10.0.0.7:8000", Rank: 1}
	publishUntil := func(p *publish.Publisher, what string, done func() bool) {
		t.Helper()
		waitFor(t, what, func() bool {
			if _, err := p.PublishRaw(emptyBatch(t), true); err != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond)
			return done()
		})
	}
	contiguous := func(seqs []uint64, from uint64) bool {
		for i, s := range seqs {
			if s != from+uint64(i) {
				return false
			}
		}
		return len(seqs) > 0
	}

	publishUntil(rank0, "rank 0's first batch applied", func() bool { return len(seen(a)) > 0 })
	if got := seen(a); !contiguous(got, 0) {
		t.Fatalf("rank 0's batches applied as %v: want 0, 1, ... with what the subscription missed replayed", got)
	}
	dropped, _ := rank0.PublishRaw(emptyBatch(t), false)
	publishUntil(rank0, "the batch after the dropped one", func() bool { return slices.Contains(seen(a), dropped+1) })
	if got := seen(a); !contiguous(got, 0) {
		t.Fatalf("after batch %d was dropped, applied %v: want it replayed in order", dropped, got)
	}
	st, tp, ok := bus.Status(a)
	if !ok || tp != topic || st.Gaps != 1 || st.Unrecovered != 0 || !st.Connected {
		t.Fatalf("rank 0's status %+v (ok %v): want one gap, recovered", st, ok)
	}

	rank0.Restart()
	publishUntil(rank0, "the restart noticed", func() bool { mu.Lock(); defer mu.Unlock(); return restarts[a] == 1 })
	publishUntil(rank1, "rank 1's batches", func() bool { return len(seen(b)) > 0 })
	if got := seen(b); !contiguous(got, 0) {
		t.Fatalf("rank 1's batches applied as %v", got)
	}
	publishUntil(stranger, "the stranger listed", func() bool { return len(bus.View().UnknownTopics) == 1 })

	v := bus.View()
	if !slices.Equal(v.Ranks, []int{0, 1}) || len(v.Topics) != 2 || v.UnknownBatches == 0 {
		t.Fatalf("view %+v", v)
	}
	u := v.UnknownTopics[0]
	if u.Topic != "kv@10.0.0.9:8000@m" || u.Rank != 0 || u.Batches == 0 || u.Why != "no target at 10.0.0.9:8000" {
		t.Fatalf("unknown topic %+v", u)
	}
	if v.Topics[0].Target != a.String() || v.Topics[0].Restarts != 1 || v.Topics[1].Target != b.String() {
		t.Fatalf("topics %+v", v.Topics)
	}

	// A dropped target's next batch is routed anew, here deferred.
	bus.cfg.Route = func(int, string) (BusRoute, error) { return BusRoute{}, ErrRouteDeferred }
	bus.Drop(b)
	publishUntil(rank1, "rank 1's batches deferred", func() bool { return bus.View().DeferredBatches > 0 })
	if _, _, ok := bus.Status(b); ok {
		t.Fatal("a dropped target keeps its stream")
	}
}

func TestNewBusNeedsARouter(t *testing.T) {
	if _, err := NewBus(BusConfig{Listen: "tcp://*:5557"}); err == nil {
		t.Error("a bus without a topic router was accepted")
	}
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
