package eventplane

import (
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// TestDisconnectedStreamIsAWiringFault: a pod that answers HTTP while
// nothing answers at its events address (the bare pod URL given, vLLM
// started without --kv-events-config) is a wiring fault from the first
// judgement past the reconnect grace: logged at once with the setting to
// check, again once a minute while it lasts, and once when it clears. A
// pod still starting (not serving) is no fault, nor is a stream that
// connects within the grace.
func TestDisconnectedStreamIsAWiringFault(t *testing.T) {
	for _, tc := range []struct {
		name          string
		everConnected bool
		want          []string
	}{
		{"never connected", false, []string{`nothing answers at tcp://10.0.0.7:5557`, `--kv-events-config`, `"endpoint":"tcp://*:5557"`, `events=`}},
		{"lost", true, []string{`stream from tcp://10.0.0.7:5557 was lost`, `--kv-events-config`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := newTestPlane(t, Config{BlockSize: 16})
			id := podID(0)
			env.events.set(id, func(st *kvindex.SubscriberStatus) {
				st.Connected, st.EverConnected, st.ConnectionChanged = false, tc.everConnected, env.clock.Now()
			})
			env.p.SetTarget(id, Source{Events: "tcp://10.0.0.7:5557"})
			// Starting: not serving yet, however long it takes.
			env.clock.Advance(time.Minute)
			env.p.evaluate()
			if fs := env.p.Freshness(id).Faults; len(fs) != 0 {
				t.Fatalf("a pod that does not serve yet: faults %+v", fs)
			}
			env.p.SetCaches(map[targetid.ID]Cache{id: {Serving: true}})
			env.p.evaluate()
			if fs := env.p.Freshness(id).Faults; len(fs) != 0 {
				t.Fatalf("within the grace: faults %+v", fs)
			}
			env.clock.Advance(disconnectedGrace)
			env.p.evaluate()
			requireFault(t, env.p, id, FaultEventsDisconnected, tc.want...)
			logged := env.logs.Lines("level=WARN", "event stream wiring fault", "fault=events_disconnected", "target="+id.String())
			if len(logged) != 1 {
				t.Fatalf("%d log lines at the first judgement, want 1: %q", len(logged), env.logs.Lines())
			}
			// Bounded repetition while it lasts.
			for range 10 {
				env.clock.Advance(5 * time.Second)
				env.p.evaluate()
			}
			if n := len(env.logs.Lines("event stream wiring fault", "fault=events_disconnected")); n != 1 {
				t.Fatalf("%d lines within a minute, want 1", n)
			}
			env.clock.Advance(15 * time.Second)
			env.p.evaluate()
			if again := env.logs.Lines("event stream wiring fault", "fault=events_disconnected", "for="); len(again) != 1 {
				t.Fatalf("after a minute: %q, want one repeat saying for how long", again)
			}
			// The stream connects: the fault clears, once.
			env.events.set(id, func(st *kvindex.SubscriberStatus) { st.Connected, st.ConnectionChanged = true, env.clock.Now() })
			env.p.evaluate()
			env.p.evaluate()
			if fs := env.p.Freshness(id).Faults; len(fs) != 0 {
				t.Fatalf("connected: faults %+v", fs)
			}
			if n := len(env.logs.Lines("level=INFO", "wiring fault cleared", "fault=events_disconnected")); n != 1 {
				t.Fatalf("%d cleared lines, want 1", n)
			}
		})
	}
}

// TestKeyMismatchDistrustsTheCache: block keys that disagree with the
// pod's (hash seed, algorithm, block size) are a wiring fault naming the
// flag, and the target's confirmed runs count for nothing until the keys
// verify again.
func TestKeyMismatchDistrustsTheCache(t *testing.T) {
	tokens := make([]uint32, 64)
	for i := range tokens {
		tokens[i] = uint32(i*7 + 3)
	}
	for _, tc := range []struct {
		name      string
		podSeed   string
		podBlock  int
		want      []string
		wantCause string
	}{
		{"wrong --hash-seed", "0", 16, []string{"--hash-seed must be the pods' PYTHONHASHSEED", "--hash-algo", "the pod published"}, "hash"},
		{"wrong --block-size", "1", 32, []string{"--block-size must be the pods' vLLM --block-size (the router uses 16", "publishes block_size 32"}, "block_size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := newTestPlane(t, Config{BlockSize: 16, HashAlgo: "sha256", HashSeed: "1", HasHashSeed: true})
			id := podID(0)
			env.events.set(id, func(st *kvindex.SubscriberStatus) { st.LastEvent = env.clock.Now() })
			env.p.SetTarget(id, Source{Events: "tcp://10.0.0.7:5557"})
			store := func(seed string, bs int) {
				h, err := kvindex.NewHasher(kvindex.AlgoSHA256, seed, bs)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := storedBatch(t, h, tokens)
				env.p.ingestor.Apply(id, &b)
			}
			store(tc.podSeed, tc.podBlock)
			env.p.evaluate()
			requireFault(t, env.p, id, FaultKeyMismatch, tc.want...)
			tr := env.p.Trust(id)
			if tr.Verdict != VerdictFresh || tr.Confirmed != 0 || tr.Predictions || tr.DistrustedBy != FaultKeyMismatch {
				t.Fatalf("trust %+v: want a fresh stream whose cache counts for nothing", tr)
			}
			if n := len(env.logs.Lines("level=ERROR", "event stream wiring fault", "fault=key_mismatch")); n != 1 {
				t.Fatalf("%d error lines, want 1: %q", n, env.logs.Lines())
			}
			if iv := env.p.IndexView(); len(iv) != 1 || iv[0].HashMismatches == 0 || iv[0].HashChecks < iv[0].HashMismatches {
				t.Fatalf("index view %+v: every mismatch is a check", iv)
			}
			// The pod restarted with the router's settings: trust returns.
			for range keyTrustRestoredAfter {
				store("1", 16)
			}
			env.p.evaluate()
			if tr := env.p.Trust(id); tr.Confirmed != 1 || !tr.Predictions {
				t.Fatalf("after matching keys: trust %+v, faults %+v", tr, env.p.Freshness(id).Faults)
			}
		})
	}
}

// TestUnchainedStreamIsAWiringFault: in token-derived mode, a stream whose
// stored blocks keep arriving with parents the router never saw cannot be
// keyed; it is a fault (naming replay= and --hash-seed) that distrusts the
// target's cache, and it clears once chains arrive.
func TestUnchainedStreamIsAWiringFault(t *testing.T) {
	env := newTestPlane(t, Config{BlockSize: 4})
	id := podID(0)
	env.events.set(id, func(st *kvindex.SubscriberStatus) { st.LastEvent = env.clock.Now() })
	env.p.SetTarget(id, Source{Events: "tcp://10.0.0.7:5557"})
	block := func(parent uint64, hasParent bool, h uint64) events.Event {
		return events.Event{Kind: events.KindBlockStored, BlockHashes: []uint64{h}, ParentHash: parent, HasParentHash: hasParent,
			TokenIDs: []uint32{uint32(h), 2, 3, 4}, BlockSize: 4, Medium: events.MediumGPU}
	}
	for i := range uint64(unchainedMin) {
		env.p.ingestor.Apply(id, &events.Batch{Events: []events.Event{block(1000+i, true, 2000+i)}})
	}
	env.p.evaluate()
	requireFault(t, env.p, id, FaultUnchained, "parent block the router never saw", "replay=", "--hash-seed")
	if tr := env.p.Trust(id); tr.Confirmed != 0 || tr.DistrustedBy != FaultUnchained {
		t.Fatalf("trust %+v", tr)
	}
	if n := len(env.logs.Lines("level=ERROR", "fault=unchained_blocks")); n != 1 {
		t.Fatalf("%d error lines, want 1", n)
	}
	for i := range uint64(200) {
		env.p.ingestor.Apply(id, &events.Batch{Events: []events.Event{block(0, false, 5000+i)}})
	}
	env.p.evaluate()
	if fs := env.p.Freshness(id).Faults; len(fs) != 0 {
		t.Fatalf("chains arrive: faults %+v", fs)
	}
}

// TestUnknownBlockKeysIsAWiringFault: serving pods that report no cache
// configuration, with no --block-size, leave the plane without block keys
// and every stream without a subscriber: a fault naming the flag.
func TestUnknownBlockKeysIsAWiringFault(t *testing.T) {
	env := newTestPlane(t, Config{})
	id := podID(0)
	env.p.SetTarget(id, Source{Events: "tcp://10.0.0.7:5557"})
	env.p.statusFn = nil // no subscriber runs without keys
	env.p.SetCaches(map[targetid.ID]Cache{id: {Serving: true}})
	env.clock.Advance(disconnectedGrace)
	env.p.evaluate()
	requireFault(t, env.p, id, FaultNoBlockKeys, "set --block-size")
}

// TestStreamViewIsOneInstant: the view's detail and the last event's age
// are as of the same judgement, however late the view is read.
func TestStreamViewIsOneInstant(t *testing.T) {
	env := newTestPlane(t, Config{})
	id := podID(0)
	env.events.set(id, func(st *kvindex.SubscriberStatus) { st.LastEvent = env.clock.Now().Add(-539 * time.Millisecond) })
	env.p.SetTarget(id, Source{Events: "tcp://10.0.0.7:5557"})
	env.p.evaluate()
	env.clock.Advance(438 * time.Millisecond)
	v := env.p.StreamView(id)
	if v.Detail != "last event 539ms ago" || v.LastEventAgeS == nil || *v.LastEventAgeS != 0.539 {
		t.Fatalf("detail %q beside age %v: want both as of the judgement", v.Detail, *v.LastEventAgeS)
	}
	if !v.JudgedAt.Equal(env.clock.Now().Add(-438 * time.Millisecond)) {
		t.Fatalf("judged at %s", v.JudgedAt)
	}
}
