package router

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/kvtransport"
	"github.com/prefixrouter/prefixrouter/sim"
	"github.com/prefixrouter/prefixrouter/sim/publish/publishtest"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// TestSimEventBus: pods publishing into the router's bus and a pod with a
// socket of its own feed one router together. A batch the bus never saw
// comes back through the pod's replay socket, a restarted pod's placements
// go, and a publisher whose topic names no target is listed in GET
// /debug/targets and counted, never routed to.
func TestSimEventBus(t *testing.T) {
	t.Parallel()
	bus := publishtest.FreeAddr(t, 2)
	onBus := startFleetWith(t, sim.Config{Pods: 2, DP: 2, EventsConnect: bus})
	own := startFleetWith(t, sim.Config{Pods: 1})
	stranger := startFleetWith(t, sim.Config{Pods: 1, EventsConnect: bus, Topic: "kv@10.255.0.1:8000@sim-tiny"})
	cfg := DefaultConfig()
	cfg.Policy = brain.PolicyPrecise
	cfg.Events.HashSeed, cfg.Events.HasHashSeed = "0", true
	cfg.Events.EventsListen = []string{bus}
	cfg.Health = fastHealth(append(onBus.Endpoints(), own.Endpoints()...)...)
	r := startRouter(t, cfg, "sim-tiny=bytes")
	waitFor(t, "5 fresh targets", func() bool { return freshCount(r, "sim-tiny") == 5 })
	waitFor(t, "block keys learned from the pods", func() bool { return r.ev.Keys() != nil })

	pod := onBus.Pods[0]
	holder := targetName(pod.URL())
	prompt := func(what string) string {
		return `{"model":"sim-tiny","max_tokens":1,"prompt":"` + strings.Repeat(what+" is held by one pod only. ", 12) + `"}`
	}
	confirmed := func(body string) int {
		return candidateByName(dryRun(t, r, "/v1/completions", body), holder).ConfirmedBlocks
	}
	direct := func(p *sim.Pod, body string) {
		t.Helper()
		if code, _, b := post(t, p.URL()+"/v1/completions", body); code != 200 {
			t.Fatalf("%s: %d %s", p.URL(), code, b)
		}
	}
	// The pods connect before the router subscribes: what the bus missed
	// of their first batches is replayed.
	direct(pod, prompt("the first prompt"))
	waitFor(t, "the first prompt confirmed on its pod", func() bool { return confirmed(prompt("the first prompt")) > 0 })
	direct(own.Pods[0], prompt("a per-pod prompt"))
	waitFor(t, "the per-pod prompt confirmed", func() bool {
		return candidateByName(dryRun(t, r, "/v1/completions", prompt("a per-pod prompt")), targetName(own.Pods[0].URL())).ConfirmedBlocks > 0
	})

	// Rank 1 publishes to the bus port + 1, under the same topic. A batch
	// sent before the bus's subscription reached the publisher is lost
	// until the next one reveals the gap: send until one arrives.
	rank1 := targetid.ID{Endpoint: pod.URL(), Rank: 1}.String()
	rank1Prompt := ""
	waitFor(t, "rank 1's prompts confirmed on rank 1", func() bool {
		rank1Prompt = prompt(fmt.Sprintf("rank 1's prompt %d", len(rank1Prompt)))
		req, _ := http.NewRequest(http.MethodPost, pod.URL()+"/v1/completions", strings.NewReader(rank1Prompt))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-data-parallel-rank", "1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("rank 1: %v %v", resp, err)
		}
		resp.Body.Close()
		time.Sleep(50 * time.Millisecond)
		return candidateByName(dryRun(t, r, "/v1/completions", rank1Prompt), rank1).ConfirmedBlocks > 0
	})
	if tp := busTopic(t, r, "kv@"+strings.TrimPrefix(pod.URL(), "http://")+"@sim-tiny", 1); tp.Target != rank1 || tp.Unrecovered != 0 {
		t.Fatalf("rank 1's topic: %+v", tp)
	}

	// A batch lost on the way is replayed when the next one shows the gap.
	ctx := context.Background()
	if err := pod.SetFaults(ctx, sim.Faults{DropEvents: 1}); err != nil {
		t.Fatal(err)
	}
	droppedBatches := func() (n uint64) {
		for _, st := range pod.Stats() {
			n += st.EventBatchesDropped
		}
		return n
	}
	dropped := droppedBatches()
	direct(pod, prompt("the lost batch"))
	// The batch leaves after the answer: clear the fault only once it was
	// dropped, or it may go out whole and leave no gap to repair.
	waitFor(t, "the pod to drop the batch", func() bool { return droppedBatches() > dropped })
	if err := pod.SetFaults(ctx, sim.Faults{}); err != nil {
		t.Fatal(err)
	}
	direct(pod, prompt("the batch after it"))
	waitFor(t, "the lost batch's blocks replayed", func() bool { return confirmed(prompt("the lost batch")) > 0 })
	topic := busTopic(t, r, "kv@"+strings.TrimPrefix(pod.URL(), "http://")+"@sim-tiny", 0)
	if topic.Target != holder || topic.Gaps == 0 || topic.Replayed == 0 || topic.Unrecovered != 0 {
		t.Fatalf("after a lost batch: %+v", topic)
	}
	if v, ok := metricSeries(t, r, `prefixrouter_kv_bus_sequence_gaps_total{bus="`+bus+`",target="`+holder+`"}`); !ok || v == 0 {
		t.Fatalf("bus gaps metric %v (exported %v)", v, ok)
	}

	// The stranger: listed by topic, counted, never a target.
	waitFor(t, "the stranger's topic listed", func() bool {
		direct(stranger.Pods[0], prompt("a stranger's prompt"))
		for _, b := range debugBuses(t, r) {
			for _, u := range b.UnknownTopics {
				if u.Topic == "kv@10.255.0.1:8000@sim-tiny" && strings.Contains(u.Why, "no target's endpoint is 10.255.0.1:8000") {
					return true
				}
			}
		}
		return false
	})
	if v, _ := metricSeries(t, r, `prefixrouter_kv_bus_unknown_batches_total{bus="`+bus+`"}`); v == 0 {
		t.Fatal("the stranger's batches are not counted")
	}
	for _, tg := range r.mon.Snapshot().Targets {
		if strings.Contains(tg.ID.Endpoint, "10.255.0.1") {
			t.Fatalf("the stranger became a target: %v", tg.ID)
		}
	}

	// A restart: what the old process held is gone.
	if err := pod.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the old process's placements dropped", func() bool { return confirmed(prompt("the first prompt")) == 0 })
	direct(pod, prompt("the new process's prompt"))
	waitFor(t, "the new process's blocks confirmed", func() bool { return confirmed(prompt("the new process's prompt")) > 0 })
	waitFor(t, "the restart judged on the pod's bus stream", func() bool {
		f := r.ev.Freshness(targetid.ID{Endpoint: pod.URL()})
		return f.Source == "bus" && f.Bus == bus && f.Topic == topic.Topic && f.Restarts > 0 && f.Verdict == eventplane.VerdictFresh
	})
}

// debugBuses reads event_buses from GET /debug/targets.
func debugBuses(t *testing.T, r *Router) []kvtransport.BusStatus {
	t.Helper()
	var v struct {
		EventBuses []kvtransport.BusStatus `json:"event_buses"`
	}
	adminDebugTargets(t, r, &v)
	return v.EventBuses
}

// busTopic is the entry of a topic's rank in GET /debug/targets.
func busTopic(t *testing.T, r *Router, topic string, rank int) kvtransport.BusTopicStatus {
	t.Helper()
	for _, b := range debugBuses(t, r) {
		for _, tp := range b.Topics {
			if tp.Topic == topic && tp.Rank == rank {
				return tp
			}
		}
	}
	t.Fatalf("topic %q is not followed", topic)
	return kvtransport.BusTopicStatus{}
}
