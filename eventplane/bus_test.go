package eventplane

import (
	"context"
	"strings"
	"testing"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvtransport"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// TestTopicRouting: which target a topic on a bus's rank socket feeds, and
// why one feeds none (the bus lists the reason beside the topic).
func TestTopicRouting(t *testing.T) {
	env := newTestPlane(t, Config{BlockSize: 16, EventsListen: []string{"tcp://*:5557"}, ReplayPort: 5600})
	p := env.p
	bus := func(ep string, rank int) targetid.ID { return targetid.ID{Endpoint: ep, Rank: rank} }
	p.SetTarget(bus("http://10.0.0.7:8000", 0), Source{Events: "tcp://10.0.0.7:5557", EventsImplied: true})
	p.SetTarget(bus("http://10.0.0.7:8000", 1), Source{Events: "tcp://10.0.0.7:5558", EventsImplied: true, Replay: "tcp://10.0.0.7:7001"})
	p.SetTarget(bus("http://pod-b.ns:9000", 0), Source{Events: "tcp://pod-b.ns:5557", EventsImplied: true, Topic: "kv@pod-b@m"})
	p.SetTarget(bus("http://10.0.0.9:8000", 0), Source{Events: "tcp://10.0.0.9:5557"}) // its own subscriber
	p.SetTarget(bus("http://10.0.0.8:8000", 0), Source{Events: "tcp://10.0.0.8:5557", EventsImplied: true})
	p.SetTarget(bus("http://10.0.0.8:8001", 0), Source{Events: "tcp://10.0.0.8:5557", EventsImplied: true})
	p.SetTarget(bus("http://Host-C", 0), Source{Events: "tcp://host-c:5557", EventsImplied: true})

	if _, err := p.routeTopic(0, "kv@10.0.0.7:8000@m"); err != kvtransport.ErrRouteDeferred {
		t.Fatalf("before Run: %v, want the batch deferred", err)
	}
	p.mu.Lock()
	p.ctx = context.Background()
	p.mu.Unlock()

	for _, tt := range []struct {
		rank   int
		topic  string
		target targetid.ID
		replay string
		err    string
	}{
		{rank: 0, topic: "kv@10.0.0.7:8000@Qwen/Qwen3-8B", target: bus("http://10.0.0.7:8000", 0), replay: "tcp://10.0.0.7:5600"},
		{rank: 1, topic: "kv@10.0.0.7:8000@Qwen/Qwen3-8B", target: bus("http://10.0.0.7:8000", 1), replay: "tcp://10.0.0.7:7001"},
		{rank: 0, topic: "kv@10.0.0.7@m", target: bus("http://10.0.0.7:8000", 0), replay: "tcp://10.0.0.7:5600"},
		{rank: 0, topic: "kv@pod-b@m", target: bus("http://pod-b.ns:9000", 0), replay: "tcp://pod-b.ns:5600"},
		{rank: 0, topic: "kv@host-c:80@m", target: bus("http://Host-C", 0), replay: "tcp://host-c:5600"},
		{rank: 2, topic: "kv@10.0.0.7:8000@m", err: "has no rank 2"},
		{rank: 1, topic: "kv@pod-b@m", err: "has no rank 1"},
		{rank: 0, topic: "kv@10.0.0.7:9999@m", err: "no target's endpoint is 10.0.0.7:9999"},
		{rank: 0, topic: "kv@10.0.0.9:8000@m", err: "names events= and is followed there"},
		{rank: 0, topic: "kv@10.0.0.8@m", err: "matches 2 endpoints"},
		{rank: 0, topic: "kv@pod-b.ns:9000@m", err: "no target's endpoint"}, // it named its own topic
		{rank: 0, topic: "", err: "does not name a pod"},
		{rank: 0, topic: "kv", err: "does not name a pod"},
	} {
		r, err := p.routeTopic(tt.rank, tt.topic)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("rank %d topic %q: routed to %v (%v), want an error containing %q", tt.rank, tt.topic, r.Target, err, tt.err)
			}
			continue
		}
		if err != nil || r.Target != tt.target || r.Replay != tt.replay || r.Handle == nil || r.Restarted == nil {
			t.Errorf("rank %d topic %q: %v replay %q, %v; want %v replay %q", tt.rank, tt.topic, r.Target, r.Replay, err, tt.target, tt.replay)
		}
	}
}

// TestBusFedTargetWaitsForItsFirstBatch: a target expected on a bus is not
// disconnected for having no subscriber of its own; it is fresh while it
// idles, stale once answered requests go without an event, and a serving
// pod that computed blocks and never published on the bus is a wiring
// fault naming the --kv-events-config to give vLLM.
func TestBusFedTargetWaitsForItsFirstBatch(t *testing.T) {
	env := newTestPlane(t, Config{BlockSize: 16, EventsListen: []string{"tcp://*:5557"}})
	id := podID(0)
	env.p.SetTarget(id, Source{Events: "tcp://10.0.0.7:5557", EventsImplied: true})
	env.p.SetCaches(map[targetid.ID]Cache{id: {Serving: true}})
	env.p.evaluate()
	f := env.p.Freshness(id)
	if f.Verdict != VerdictFresh || f.Source != "bus" || !strings.Contains(f.Detail, "kv@10.0.0.7:8000@MODEL") || len(f.Faults) != 0 {
		t.Fatalf("idle bus-fed target: %+v", f)
	}
	e := env.p.Dispatch(id)
	e.FirstByte(1000, 1000)
	env.clock.Advance(disconnectedGrace)
	env.p.evaluate()
	requireFault(t, env.p, id, FaultEventsDisconnected, `no batch of this pod's reached the bus (tcp://*:5557)`, `"topic":"kv@10.0.0.7:8000@MODEL"`, `events=`)
	env.clock.Advance(DefaultConfig().StaleAfter)
	env.p.evaluate()
	if v := env.p.Verdict(id); v != VerdictStale {
		t.Fatalf("answered requests and no event: %s", v)
	}
	// Its batches arrive: the fault clears.
	env.events.set(id, func(st *kvindex.SubscriberStatus) {
		st.Batches, st.LastEvent, st.EverConnected = 1, env.clock.Now(), true
	})
	env.p.evaluate()
	if f := env.p.Freshness(id); f.Verdict != VerdictFresh || len(f.Faults) != 0 {
		t.Fatalf("after its first batch: %+v", f)
	}

	// Without a bus, the same endpoint has a subscriber of its own.
	plain := newTestPlane(t, Config{BlockSize: 16})
	plain.p.SetTarget(id, Source{Events: "tcp://10.0.0.7:5557", EventsImplied: true})
	plain.p.evaluate()
	if f := plain.p.Freshness(id); f.Source != "subscriber" || f.Verdict != VerdictDisconnected {
		t.Fatalf("no bus: %+v", f)
	}
}
