package eventplane

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex"
)

// FaultKind names a wiring mistake the event plane sees on a target's
// event stream: something an operator must fix in a flag or in vLLM's
// settings, as opposed to a stream that is briefly stale. The kinds are
// few and fixed: they label metrics.
type FaultKind string

// Fault kinds, most severe first.
const (
	// FaultNoBlockKeys: the pod serves, but the fleet's block size (or, in
	// exact mode, hash algorithm) is unknown, so no subscriber runs.
	FaultNoBlockKeys FaultKind = "block_keys_unknown"
	// FaultEventsDisconnected: the pod answers HTTP, but its event stream
	// has been disconnected (never connected, or lost) for longer than
	// disconnectedGrace.
	FaultEventsDisconnected FaultKind = "events_disconnected"
	// FaultKeyMismatch: the router's block keys disagree with the pod's
	// (hash seed, algorithm or block size).
	FaultKeyMismatch FaultKind = "key_mismatch"
	// FaultUnchained: in token-derived mode, the pod's stored blocks keep
	// arriving with parents the router never saw, so they cannot be keyed.
	FaultUnchained FaultKind = "unchained_blocks"
	// FaultEventsRefused: batches under the pod's stream were refused in
	// the last refusedFaultFor: from an address or a connection that is
	// not the pod's, under a second topic, or beyond the stream's bounds
	// (clears, resets, gaps, sizes). Refused batches are never applied.
	FaultEventsRefused FaultKind = "events_refused"
)

// FaultKinds lists every kind, most severe first.
var FaultKinds = []FaultKind{FaultNoBlockKeys, FaultEventsDisconnected, FaultKeyMismatch, FaultUnchained, FaultEventsRefused}

// DistrustsCache reports whether the fault makes the target's confirmed
// runs worthless: keys that disagree with the pod's, or blocks that cannot
// be keyed, say nothing reliable about what the pod holds.
func (k FaultKind) DistrustsCache() bool { return k == FaultKeyMismatch || k == FaultUnchained }

// Fault is one wiring fault on a target's stream.
type Fault struct {
	Kind FaultKind `json:"fault"`
	// Detail says what was seen and which flag or vLLM setting to check.
	// It may name internal addresses: admin views and logs only.
	Detail string    `json:"detail"`
	Since  time.Time `json:"since"`
}

const (
	// disconnectedGrace is how long a serving pod's stream may stay
	// disconnected before it is a fault: a subscriber reconnects within
	// libzmq's backoff (at most kvtransport.SubscriberConfig.ReconnectMax,
	// 5 s by default) once the publisher is back.
	disconnectedGrace = 6 * time.Second
	// faultLogEvery bounds how often a lasting fault is logged again, and
	// how soon a fault that cleared is logged when it comes back.
	faultLogEvery = time.Minute
	// keyTrustRestoredAfter is how many verifications must pass after a
	// key mismatch before the keys are trusted again: a pod restarted with
	// the right settings earns trust back, a mixed stream does not.
	keyTrustRestoredAfter = 16
	// unchainedMin and unchainedShare: a token-derived stream is unchained
	// when at least unchainedMin of its recent stored blocks, and at least
	// unchainedShare times as many as were chained, could not be keyed. A
	// router that joined late sees some orphans, then chains.
	unchainedMin   = 16
	unchainedShare = 8
	// refusedFaultFor is how long a refused batch keeps the
	// events_refused fault up.
	refusedFaultFor = time.Minute
)

// faultRecord remembers one kind of fault on a stream for logging.
type faultRecord struct {
	active bool
	since  time.Time
	// logged is when the fault was last logged; loggedEpisode says the
	// current episode's start was logged (so its end is too).
	logged        time.Time
	loggedEpisode bool
}

// judgeFaults returns the stream's wiring faults now, most severe first,
// and logs them: at the first judgement that finds one, then every
// faultLogEvery while it lasts, and when it clears. Called with p.mu held.
//
// awaitDue is the dispatch time (unix nanoseconds, 0: none) of the earliest
// answered request whose KV event has not arrived: a bus-fed pod is known
// to be miswired only when it computed blocks and none of its batches ever
// reached the bus.
func (p *Plane) judgeFaults(t *stream, status kvindex.SubscriberStatus, running bool, awaitDue int64, now time.Time) []Fault {
	var found []Fault
	add := func(k FaultKind, detail string) { found = append(found, Fault{Kind: k, Detail: detail}) }
	serving := !t.servingSince.IsZero()
	switch {
	case !running && serving && p.ingestor == nil && now.Sub(t.servingSince) >= disconnectedGrace:
		add(FaultNoBlockKeys, p.missingKeysDetail())
	case t.onBus && serving && status.Batches == 0 && status.Replayed == 0 && awaitDue != 0 && now.Sub(time.Unix(0, awaitDue)) >= disconnectedGrace:
		add(FaultEventsDisconnected, p.busSilentDetail(t, now.Sub(time.Unix(0, awaitDue)).Round(time.Second).String()))
	case running && serving && !status.Connected:
		down := status.ConnectionChanged
		if t.servingSince.After(down) {
			down = t.servingSince
		}
		if now.Sub(down) >= disconnectedGrace {
			add(FaultEventsDisconnected, disconnectedDetail(t.src, status, now))
		}
	}
	if p.ingestor != nil && running {
		kh := p.ingestor.KeyHealth(t.id)
		if kh.Mismatches > 0 && kh.PassedSinceMismatch < keyTrustRestoredAfter {
			add(FaultKeyMismatch, p.keyMismatchDetail(kh))
		}
		if kh.RecentUnchained >= unchainedMin && kh.RecentUnchained >= unchainedShare*kh.RecentChained {
			add(FaultUnchained, unchainedDetail(kh, t.src))
		}
	}
	// Refusals: a counter that grew since the last judgement (or belongs to
	// a new stream counting from zero) is refusing now.
	ref := p.refusedOf(t, status)
	if total := ref.Total(); total != t.lastRefused {
		if total > t.lastRefused || total > 0 {
			t.refusedAt = now
		}
		t.lastRefused = total
	}
	if !t.refusedAt.IsZero() && now.Sub(t.refusedAt) < refusedFaultFor && ref.Total() > 0 {
		add(FaultEventsRefused, p.refusedDetail(ref))
	}

	if t.faults == nil {
		t.faults = make(map[FaultKind]*faultRecord)
	}
	present := make(map[FaultKind]bool, len(found))
	for i := range found {
		f := &found[i]
		present[f.Kind] = true
		r := t.faults[f.Kind]
		if r == nil {
			r = &faultRecord{}
			t.faults[f.Kind] = r
		}
		if !r.active {
			r.active, r.since, r.loggedEpisode = true, now, false
			if r.logged.IsZero() || now.Sub(r.logged) >= faultLogEvery {
				p.logFault(t, f, 0)
				r.logged, r.loggedEpisode = now, true
			}
		} else if now.Sub(r.logged) >= faultLogEvery {
			p.logFault(t, f, now.Sub(r.since))
			r.logged, r.loggedEpisode = now, true
		}
		f.Since = r.since
	}
	for k, r := range t.faults {
		if r.active && !present[k] {
			r.active = false
			if r.loggedEpisode {
				p.log.Info("event stream wiring fault cleared", "target", t.id.String(), "fault", string(k),
					"lasted", now.Sub(r.since).Round(time.Millisecond))
			}
		}
	}
	return found
}

// logFault logs a wiring fault: a disconnected stream as a warning (the
// pod's publisher may come back on its own), the others as errors (routing
// on the target's cache cannot work until someone fixes a setting).
func (p *Plane) logFault(t *stream, f *Fault, lasting time.Duration) {
	lvl := slog.LevelError
	if f.Kind == FaultEventsDisconnected {
		lvl = slog.LevelWarn
	}
	args := []any{"target", t.id.String(), "fault", string(f.Kind), "detail", f.Detail}
	if lasting > 0 {
		args = append(args, "for", lasting.Round(time.Second), "repeats_every", faultLogEvery)
	}
	p.log.Log(context.Background(), lvl, "event stream wiring fault", args...)
}

// disconnectedDetail says what to check when a serving pod's stream is
// disconnected.
func disconnectedDetail(src Source, status kvindex.SubscriberStatus, now time.Time) string {
	if status.EverConnected {
		return fmt.Sprintf("the KV-event stream from %s was lost %s ago while the pod answers HTTP: is its publisher still running (vLLM --kv-events-config), and can the router reach that port?",
			src.Events, now.Sub(status.ConnectionChanged).Round(time.Second))
	}
	port := "5557"
	if _, p, err := net.SplitHostPort(hostPort(src.Events)); err == nil {
		port = p
	}
	return fmt.Sprintf(`nothing answers at %s: is vLLM started with --kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:%s"}'? If the pod publishes elsewhere, set events= (and replay=) in its --endpoint`,
		src.Events, port)
}

// hostPort strips a ZMQ address's transport prefix.
func hostPort(addr string) string {
	if _, hp, ok := strings.Cut(addr, "://"); ok {
		return hp
	}
	return addr
}

// keyMismatchDetail names the flags that must agree with the pods.
func (p *Plane) keyMismatchDetail(kh kvindex.KeyHealth) string {
	ks := p.Keys()
	seen := fmt.Sprintf("%d of %d checks of the router's block keys against the pod's events failed; the last: %s", kh.Mismatches, kh.Checks, kh.MismatchDetail)
	switch kh.MismatchReason {
	case kvindex.MismatchBlockSize:
		return fmt.Sprintf("%s. --block-size must be the pods' vLLM --block-size (the router uses %d; 0 learns it from the pods' vllm:cache_config_info)", seen, ks.BlockSize)
	case kvindex.MismatchExtraKeys:
		return seen + ". The pod's extra keys (LoRA name, multimodal hashes, cache_salt) cannot be hashed as this router does: check that the pods' vLLM version is supported"
	}
	return fmt.Sprintf(`%s. --hash-seed must be the pods' PYTHONHASHSEED and --hash-algo their --prefix-caching-hash-algo (the router uses %s); if the pods run without PYTHONHASHSEED, leave --hash-seed unset for token-derived keys`,
		seen, ks.Algo)
}

// unchainedDetail says why blocks cannot be keyed and what would fix it.
func unchainedDetail(kh kvindex.KeyHealth, src Source) string {
	replay := "set replay= in its --endpoint to the pod's replay socket (vLLM --kv-events-config replay_endpoint) so that missed events are fetched"
	if src.Replay != "" {
		replay = "check that " + src.Replay + " is the pod's replay socket (vLLM --kv-events-config replay_endpoint)"
	}
	return fmt.Sprintf("%d of the last %d stored blocks arrived with a parent block the router never saw, so token-derived keys cannot be built for them (%d such blocks in all): %s, or set --hash-seed to the pods' PYTHONHASHSEED for exact keys, which need no parents",
		kh.RecentUnchained, kh.RecentUnchained+kh.RecentChained, kh.Unchained, replay)
}

// missingKeysDetail says which flags would configure block keys.
func (p *Plane) missingKeysDetail() string {
	why := "the pods report no vllm:cache_config_info"
	if p.learnErr {
		why = "the pods' vllm:cache_config_info could not be used (see the log)"
	}
	if p.cfg.HasHashSeed {
		return why + ": set --block-size to the pods' vLLM --block-size and --hash-algo to their --prefix-caching-hash-algo"
	}
	return why + ": set --block-size to the pods' vLLM --block-size"
}

// refusedOf is what was refused of t's batches: on a bus, by the bus and
// the stream; else by its subscriber.
func (p *Plane) refusedOf(t *stream, status kvindex.SubscriberStatus) kvindex.RefusalCounts {
	if !t.onBus || p.statusFn != nil {
		return status.Refused
	}
	var c kvindex.RefusalCounts
	for _, b := range p.buses {
		c.Add(b.Refused(t.id))
	}
	return c
}

// refusedDetail says what was refused, the last refusal first, and what
// to check for it.
func (p *Plane) refusedDetail(c kvindex.RefusalCounts) string {
	var counts []string
	for _, r := range kvindex.Refusals() {
		if n := c.N[r]; n > 0 {
			counts = append(counts, fmt.Sprintf("%s %d", r, n))
		}
	}
	var check string
	switch c.Reason {
	case kvindex.RefusedSource:
		check = "KV events under this pod's topic arrive from an address that is not the pod's (its endpoint's host, or the topic's): another publisher uses the pod's topic. Find the host named in the last refusal; a pod that publishes from another address than its --endpoint host must be listed by that address"
	case kvindex.RefusedConnection:
		check = "a second connection publishes under this pod's topic while the first one lives: two publishers claim one pod (two engines with one topic, or a publisher on the pod's host that is not its engine); each engine and rank must have its own topic"
	case kvindex.RefusedSecondTopic:
		check = "a second topic names this pod while the publisher of its first topic lives: check the topic in the pods' --kv-events-config and topic= in --endpoint"
	case kvindex.RefusedClearRate:
		check = fmt.Sprintf("AllBlocksCleared arrives more than %d times a minute (--events-max-clears-per-minute): the excess is not applied", p.cfg.ClearsPerMinute)
	case kvindex.RefusedResetRate:
		check = fmt.Sprintf("the event sequence goes backwards (a restart no health check saw) more than %d times a minute (--events-max-resets-per-minute): two publishers may share the pod's topic, or the engine restarts in a loop", p.cfg.ResetsPerMinute)
	case kvindex.RefusedGapRate:
		check = fmt.Sprintf("the event sequence skips batches more than %d times a minute (--events-max-gaps-per-minute): check the network between pod and router, or two publishers sharing the topic", p.cfg.GapsPerMinute)
	case kvindex.RefusedQueueFull:
		check = "the stream's queue overflowed: batches arrive faster than the router applies them"
	case kvindex.RefusedEvents, kvindex.RefusedBlocks, kvindex.RefusedTokens:
		check = fmt.Sprintf("batches exceed the bounds (--events-max-batch-events %d, --events-max-event-blocks %d, token_ids at most blocks × block size): raise the flag if the pods' batches are this large", p.cfg.MaxBatchEvents, p.cfg.MaxEventBlocks)
	}
	return fmt.Sprintf("KV-event batches refused, not applied (%s); the last, %s: %s. %s", strings.Join(counts, ", "), c.Last.UTC().Format(time.RFC3339), c.Detail, check)
}
