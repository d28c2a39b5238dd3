package kvindex

import (
	"fmt"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// KeyMode says how block keys relate to the hashes pods publish.
type KeyMode uint8

const (
	// ModeExact: keys are vLLM's own block hashes; the router knows the
	// pods' algorithm, PYTHONHASHSEED and block size.
	ModeExact KeyMode = iota
	// ModeTokenDerived: the seed is unknown, so keys are the router's own
	// chained hash of each block's tokens, rebuilt from events' token_ids.
	ModeTokenDerived
)

func (m KeyMode) String() string {
	if m == ModeTokenDerived {
		return "token-derived"
	}
	return "exact"
}

// IngestConfig configures how events become index updates.
type IngestConfig struct {
	Mode KeyMode
	// Hasher is the fleet's configured hashing (exact mode). Stored blocks
	// are recomputed from their token_ids with it, on a sample, to prove the
	// configuration matches the pods. Nil disables the check.
	Hasher *Hasher
	// TokenKeyer derives keys in token-derived mode (required there).
	TokenKeyer *TokenKeyer
	// VerifyFirst stored events per target are all checked; after that one
	// in VerifyEvery. Defaults 64 and 16.
	VerifyFirst, VerifyEvery int
	// MaxEngineKeys bounds the engine-hash map per target in token-derived
	// mode. Default 1<<20 (two generations of half that).
	MaxEngineKeys int
	// MaxVerifiedDigests bounds, per target, the digests exact mode keeps
	// to verify chained blocks whose parent it recomputed. Default 16384.
	MaxVerifiedDigests int
	Logger             *slog.Logger
	Metrics            *Metrics
}

// Observer is told about every placement change after it reaches the index;
// the speculative layer uses it to confirm or invalidate predictions. Any
// field may be nil.
type Observer struct {
	Stored  func(id targetid.ID, tier Tier, keys []Key)
	Removed func(id targetid.ID, tier Tier, keys []Key)
	Cleared func(id targetid.ID)
}

// Ingestor turns decoded event batches into index updates for each target,
// in order. Batches for different targets may be applied concurrently.
type Ingestor struct {
	ix  *Index
	cfg IngestConfig
	obs Observer
	log *slog.Logger

	mu      sync.Mutex
	targets map[targetid.ID]*ingestState
}

// ingestState is one target's translation state. Only that target's
// subscriber applies batches, but Reset may come from elsewhere, hence mu.
type ingestState struct {
	mu    sync.Mutex
	label string
	// fullGroup is the KV-cache group index of the full-attention group,
	// learned from BlockStored events that name their spec kind.
	fullGroup      int
	fullGroupKnown bool
	engine         *engineKeyMap // token-derived mode
	digests        map[uint64]Digest
	storedSeen     int
	keys           KeyHealth
	evictedSeen    uint64
	rankMismatches uint64
	metrics        *targetMetrics
}

// KeyHealth is what a target's events say about the router's block keys,
// for the event plane to judge wiring faults from.
type KeyHealth struct {
	// Checks counts verifications of the router's keys against the pod's
	// events: blocks recomputed from their token_ids (exact mode), blocks
	// whose block size was checked before deriving their keys
	// (token-derived mode), and each failed verification. Mismatches
	// counts the failed ones, so it never exceeds Checks.
	Checks, Mismatches uint64
	// MismatchReason ("hash", "block_size", "extra_keys") and
	// MismatchDetail describe the last failed verification;
	// PassedSinceMismatch counts the verifications passed since.
	MismatchReason, MismatchDetail string
	PassedSinceMismatch            uint64
	// Unchained counts stored blocks whose parent the router never saw
	// (token-derived mode): they cannot be keyed. RecentChained and
	// RecentUnchained count the most recent stored blocks (between
	// unchainedWindow and twice as many) by that outcome.
	Unchained                      uint64
	RecentChained, RecentUnchained uint64
}

// Mismatch reasons (KeyHealth.MismatchReason, the reason label of
// prefixrouter_kv_hash_mismatches_total).
const (
	// MismatchHash: a block recomputed from its tokens has another hash:
	// the seed (PYTHONHASHSEED) or the hash algorithm differ.
	MismatchHash = "hash"
	// MismatchBlockSize: the pod's blocks have another size.
	MismatchBlockSize = "block_size"
	// MismatchExtraKeys: the event's extra keys cannot be hashed.
	MismatchExtraKeys = "extra_keys"
)

// Reasons for events not indexed (prefixrouter_kv_skipped_events_total).
const (
	skipOtherGroup  = "other_group"
	skipUnknownType = "unknown_type"
	skipInvalid     = "invalid"
)

// unchainedWindow is the span of recent stored blocks KeyHealth's
// RecentChained and RecentUnchained cover: both halve when their sum
// reaches twice this, so old blocks fade out.
const unchainedWindow = 64

// targetMetrics caches one target's metric children so the per-event path
// does not hash label values.
type targetMetrics struct {
	batches                  prometheus.Counter
	stored, removed, cleared prometheus.Counter
	placements               [numTiers]prometheus.Gauge
	evictions                prometheus.Counter
	// hashChecks is made on the first check, so a target never checked
	// exports no series; verified counts every stored block.
	hashChecks prometheus.Counter
}

func (m *Metrics) forTarget(label string) *targetMetrics {
	if m == nil {
		return nil
	}
	tm := &targetMetrics{
		batches:   m.batches.WithLabelValues(label),
		stored:    m.events.WithLabelValues(label, events.KindBlockStored.String()),
		removed:   m.events.WithLabelValues(label, events.KindBlockRemoved.String()),
		cleared:   m.events.WithLabelValues(label, events.KindAllBlocksCleared.String()),
		evictions: m.evictions.WithLabelValues(label),
	}
	for t := range tm.placements {
		tm.placements[t] = m.placements.WithLabelValues(label, Tier(t).String())
	}
	return tm
}

// NewIngestor connects event ingestion to an index.
func NewIngestor(ix *Index, cfg IngestConfig, obs Observer) (*Ingestor, error) {
	if cfg.Mode == ModeTokenDerived && cfg.TokenKeyer == nil {
		return nil, fmt.Errorf("token-derived mode needs a TokenKeyer")
	}
	if cfg.VerifyFirst <= 0 {
		cfg.VerifyFirst = 64
	}
	if cfg.VerifyEvery <= 0 {
		cfg.VerifyEvery = 16
	}
	if cfg.MaxEngineKeys <= 0 {
		cfg.MaxEngineKeys = 1 << 20
	}
	if cfg.MaxVerifiedDigests <= 0 {
		cfg.MaxVerifiedDigests = 16384
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Ingestor{ix: ix, cfg: cfg, obs: obs, log: log, targets: make(map[targetid.ID]*ingestState)}, nil
}

func (in *Ingestor) state(t targetid.ID) *ingestState {
	in.mu.Lock()
	defer in.mu.Unlock()
	st, ok := in.targets[t]
	if !ok {
		st = &ingestState{label: t.String(), engine: newEngineKeyMap(in.cfg.MaxEngineKeys), digests: make(map[uint64]Digest),
			metrics: in.cfg.Metrics.forTarget(t.String())}
		in.targets[t] = st
	}
	return st
}

// Reset forgets everything about a target's placements: the pod restarted
// (its new process holds nothing the old one announced) or it was removed.
func (in *Ingestor) Reset(t targetid.ID) {
	st := in.state(t)
	st.mu.Lock()
	st.engine.reset()
	clear(st.digests)
	st.fullGroupKnown = false
	in.ix.Clear(t)
	in.updateIndexGauges(t, st)
	st.mu.Unlock()
	if in.obs.Cleared != nil {
		in.obs.Cleared(t)
	}
}

// Forget drops a removed target entirely, including its metric series.
func (in *Ingestor) Forget(t targetid.ID) {
	in.Reset(t)
	in.ix.RemoveTarget(t)
	in.mu.Lock()
	delete(in.targets, t)
	in.mu.Unlock()
	in.cfg.Metrics.forgetTarget(t.String())
}

// HashHealth reports how many verifications of a target's block keys were
// made and how many failed (see KeyHealth).
func (in *Ingestor) HashHealth(t targetid.ID) (checks, mismatches uint64) {
	kh := in.KeyHealth(t)
	return kh.Checks, kh.Mismatches
}

// KeyHealth reports what a target's events said about the router's block
// keys so far.
func (in *Ingestor) KeyHealth(t targetid.ID) KeyHealth {
	st := in.state(t)
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.keys
}

// Apply applies one batch to the index, in event order.
func (in *Ingestor) Apply(t targetid.ID, b *events.Batch) {
	st := in.state(t)
	st.mu.Lock()
	defer st.mu.Unlock()
	tm := st.metrics
	if tm != nil {
		tm.batches.Inc()
		if b.Unknown > 0 {
			in.cfg.Metrics.skipped.WithLabelValues(st.label, skipUnknownType).Add(float64(b.Unknown))
		}
		if b.Invalid > 0 {
			in.cfg.Metrics.skipped.WithLabelValues(st.label, skipInvalid).Add(float64(b.Invalid))
		}
	}
	if b.Invalid > 0 {
		in.log.Warn("skipped invalid KV events", "target", st.label, "count", b.Invalid, "first", b.FirstInvalid)
	}
	if b.HasDPRank && b.DPRank != t.Rank {
		in.rankMismatch(st, b.DPRank, t.Rank)
	}
	type change struct {
		kind Kind
		tier Tier
		keys []Key
	}
	var changes []change
	in.ix.Update(t, func(w *IndexWriter) {
		for i := range b.Events {
			ev := &b.Events[i]
			switch ev.Kind {
			case events.KindBlockStored:
				if tm != nil {
					tm.stored.Inc()
				}
				if !in.acceptStored(st, ev) {
					continue
				}
				keys := in.storedKeys(st, ev)
				if len(keys) == 0 {
					continue
				}
				tier := TierOf(ev.Medium)
				w.Store(tier, keys)
				if in.obs.Stored != nil {
					changes = append(changes, change{KindStored, tier, keys})
				}
			case events.KindBlockRemoved:
				if tm != nil {
					tm.removed.Inc()
				}
				if !in.acceptRemoved(st, ev) {
					continue
				}
				keys := in.removedKeys(st, ev)
				tier := TierOf(ev.Medium)
				w.Remove(tier, keys)
				if in.cfg.Mode == ModeTokenDerived {
					in.forgetRemoved(st, ev, w)
				}
				if in.obs.Removed != nil {
					changes = append(changes, change{KindRemoved, tier, keys})
				}
			case events.KindAllBlocksCleared:
				if tm != nil {
					tm.cleared.Inc()
				}
				w.Clear()
				if in.obs.Cleared != nil {
					changes = append(changes, change{kind: KindCleared})
				}
			}
		}
	})
	in.updateIndexGauges(t, st)
	for _, c := range changes {
		switch c.kind {
		case KindStored:
			in.obs.Stored(t, c.tier, c.keys)
		case KindRemoved:
			in.obs.Removed(t, c.tier, c.keys)
		case KindCleared:
			in.obs.Cleared(t)
		}
	}
}

func (in *Ingestor) updateIndexGauges(t targetid.ID, st *ingestState) {
	if st.metrics == nil {
		return
	}
	stats, ok := in.ix.StatsFor(t)
	if !ok {
		return
	}
	for tier, n := range stats.ByTier {
		st.metrics.placements[tier].Set(float64(n))
	}
	if stats.Evicted > st.evictedSeen {
		st.metrics.evictions.Add(float64(stats.Evicted - st.evictedSeen))
		st.evictedSeen = stats.Evicted
	}
}

// Kind names a placement change reported to an Observer.
type Kind uint8

// Placement changes.
const (
	KindStored Kind = iota
	KindRemoved
	KindCleared
)

// acceptStored keeps only one KV-cache group that holds the whole prefix.
// Hybrid models publish per group, with equal hashes in every group, and
// may split full-attention layers into several groups; indexing more than
// one would double the references. The first full-prefix group seen is
// pinned until the target resets. Without a spec kind (older publishers)
// only group 0 counts.
func (in *Ingestor) acceptStored(st *ingestState, ev *events.Event) bool {
	if !ev.IsFullPrefix() {
		in.skip(st, skipOtherGroup)
		return false
	}
	if !ev.HasGroupIdx {
		return true
	}
	if ev.SpecKind != "" && !st.fullGroupKnown {
		st.fullGroup, st.fullGroupKnown = ev.GroupIdx, true
	}
	return in.acceptGroup(st, ev.GroupIdx)
}

// acceptRemoved applies the same group rule to removals, which carry no
// spec kind: a sliding-window eviction of the same hashes must not remove
// the full-prefix placement.
func (in *Ingestor) acceptRemoved(st *ingestState, ev *events.Event) bool {
	if !ev.HasGroupIdx {
		return true
	}
	return in.acceptGroup(st, ev.GroupIdx)
}

func (in *Ingestor) acceptGroup(st *ingestState, group int) bool {
	want := 0
	if st.fullGroupKnown {
		want = st.fullGroup
	}
	if group != want {
		in.skip(st, skipOtherGroup)
		return false
	}
	return true
}

func (in *Ingestor) skip(st *ingestState, reason string) {
	if in.cfg.Metrics != nil {
		in.cfg.Metrics.skipped.WithLabelValues(st.label, reason).Inc()
	}
}

// storedKeys returns the index keys of a BlockStored event. The returned
// slice is freshly allocated: observers may keep it.
func (in *Ingestor) storedKeys(st *ingestState, ev *events.Event) []Key {
	if in.cfg.Mode == ModeExact {
		keys := make([]Key, len(ev.BlockHashes))
		for i, h := range ev.BlockHashes {
			keys[i] = Key(h)
		}
		if len(ev.TokenIDs) > 0 {
			in.maybeVerify(st, ev)
		}
		return keys
	}
	if len(ev.TokenIDs) == 0 {
		return in.resolveKeys(st, ev)
	}
	return in.deriveKeys(st, ev)
}

// resolveKeys handles a BlockStored without token_ids in token-derived mode:
// an offloading connector announcing a copy of blocks whose GPU hashes were
// published earlier, so the engine map already knows their keys.
func (in *Ingestor) resolveKeys(st *ingestState, ev *events.Event) []Key {
	keys := make([]Key, 0, len(ev.BlockHashes))
	unresolved := 0
	for _, h := range ev.BlockHashes {
		if k, ok := st.engine.get(h); ok {
			keys = append(keys, k)
		} else {
			unresolved++
		}
	}
	in.chained(st, len(keys), unresolved)
	return keys
}

// chained counts stored blocks by whether their keys could be derived.
func (in *Ingestor) chained(st *ingestState, chained, unchained int) {
	k := &st.keys
	k.RecentChained += uint64(chained)
	k.RecentUnchained += uint64(unchained)
	for k.RecentChained+k.RecentUnchained >= 2*unchainedWindow {
		k.RecentChained /= 2
		k.RecentUnchained /= 2
	}
	if unchained > 0 {
		k.Unchained += uint64(unchained)
		if in.cfg.Metrics != nil {
			in.cfg.Metrics.unchained.WithLabelValues(st.label).Add(float64(unchained))
		}
	}
}

// deriveKeys rebuilds token-derived keys from the event's token_ids, chained
// from the key its parent engine hash maps to. A block whose parent is
// unknown cannot be chained; replay is left to fill the chain.
func (in *Ingestor) deriveKeys(st *ingestState, ev *events.Event) []Key {
	tk := in.cfg.TokenKeyer
	bs := ev.BlockSize
	if bs != tk.BlockSize() || len(ev.TokenIDs) != len(ev.BlockHashes)*bs {
		in.verified(st, false, MismatchBlockSize, fmt.Sprintf("the pod publishes block_size %d (%d tokens for %d blocks), the router keys blocks of %d tokens",
			bs, len(ev.TokenIDs), len(ev.BlockHashes), tk.BlockSize()))
		return nil
	}
	parent, chained := tk.Root(), true
	if ev.HasParentHash {
		parent, chained = st.engine.get(ev.ParentHash)
	}
	if !chained {
		in.chained(st, 0, len(ev.BlockHashes))
		return nil
	}
	keys := make([]Key, 0, len(ev.BlockHashes))
	var loraTuple [1]any
	for i, h := range ev.BlockHashes {
		extra := blockExtraFromEvent(ev, i, loraTuple[:0])
		k, err := tk.KeyBlock(parent, ev.TokenIDs[i*bs:(i+1)*bs], extra)
		if err != nil {
			in.verified(st, false, MismatchExtraKeys, err.Error())
			break
		}
		in.verified(st, true, "", "")
		st.engine.put(h, k)
		keys = append(keys, k)
		parent = k
	}
	in.chained(st, len(keys), 0)
	return keys
}

// blockExtraFromEvent is the extra-key tuple vLLM hashed for block i: the
// published extra_keys when present, else the LoRA name (publishers that
// predate extra_keys cannot convey cache_salt or multimodal keys).
func blockExtraFromEvent(ev *events.Event, i int, scratch []any) []any {
	if ev.HasExtraKeys {
		return ev.ExtraKeys[i]
	}
	if ev.LoRAName != "" {
		return append(scratch, ev.LoRAName)
	}
	return nil
}

func (in *Ingestor) removedKeys(st *ingestState, ev *events.Event) []Key {
	keys := make([]Key, 0, len(ev.BlockHashes))
	for _, h := range ev.BlockHashes {
		if in.cfg.Mode == ModeExact {
			keys = append(keys, Key(h))
			if TierOf(ev.Medium) == TierGPU {
				delete(st.digests, h) // no longer a parent worth verifying from
			}
			continue
		}
		if k, ok := st.engine.get(h); ok {
			keys = append(keys, k)
		}
	}
	return keys
}

// forgetRemoved drops from the engine map the hashes of a BlockRemoved
// whose keys the target now holds in no tier, once the index has applied
// it: vLLM publishes a block again (BlockStored) before any later event
// names it as a parent, and removes each copy it stored, so nothing will
// resolve them again. Without this the map held every block the pod ever
// stored, up to its bound (a million per target), long after the pod had
// evicted them.
func (in *Ingestor) forgetRemoved(st *ingestState, ev *events.Event, w *IndexWriter) {
	for _, h := range ev.BlockHashes {
		if k, ok := st.engine.peek(h); ok && !w.Holds(k) {
			st.engine.forget(h)
		}
	}
}

// maybeVerify recomputes a sample of stored blocks from their token_ids with
// the configured hasher. A block can only be recomputed when its parent's
// full digest is known: block 0 of a chain (parent is the seed root) or a
// block whose parent this verifier computed itself.
func (in *Ingestor) maybeVerify(st *ingestState, ev *events.Event) {
	h := in.cfg.Hasher
	if h == nil {
		return
	}
	st.storedSeen++
	if st.storedSeen > in.cfg.VerifyFirst && st.storedSeen%in.cfg.VerifyEvery != 0 {
		return
	}
	bs := ev.BlockSize
	if bs != h.BlockSize() {
		in.verified(st, false, MismatchBlockSize, fmt.Sprintf("the pod publishes block_size %d, the router hashes blocks of %d tokens", bs, h.BlockSize()))
		return
	}
	if len(ev.TokenIDs) != len(ev.BlockHashes)*bs {
		return // token_ids not published for every block: nothing to check
	}
	parent := h.Root()
	if ev.HasParentHash {
		d, ok := st.digests[ev.ParentHash]
		if !ok {
			return
		}
		parent = d
	}
	var loraTuple [1]any
	for i, want := range ev.BlockHashes {
		d, err := h.HashBlock(parent, ev.TokenIDs[i*bs:(i+1)*bs], blockExtraFromEvent(ev, i, loraTuple[:0]))
		if err != nil {
			in.verified(st, false, MismatchExtraKeys, err.Error())
			return
		}
		if d.Wire() != want {
			in.verified(st, false, MismatchHash, fmt.Sprintf("recomputed block hash %d from the event's tokens, the pod published %d", d.Wire(), want))
			return
		}
		in.verified(st, true, "", "")
		if len(st.digests) >= in.cfg.MaxVerifiedDigests {
			clear(st.digests) // cheap bound; the sample refills it
		}
		st.digests[want] = d
		parent = d
	}
}

// rankMismatch reports events of one data-parallel rank arriving on another
// rank's subscription: the events ports are wired wrong, so placements land
// on the wrong target. Counted always, logged on the first occurrence.
func (in *Ingestor) rankMismatch(st *ingestState, got, want int) {
	st.rankMismatches++
	if in.cfg.Metrics != nil {
		in.cfg.Metrics.rankMismatches.WithLabelValues(st.label).Inc()
	}
	if st.rankMismatches == 1 {
		in.log.Error("KV events from the wrong data-parallel rank: check each rank's events port (base port + rank)",
			"target", st.label, "batch_rank", got, "subscribed_rank", want)
	}
}

// verified counts one verification of the router's keys against the pod's
// event; a failed one (reason and detail say how) is also a mismatch. The
// event plane judges the counts and makes a disagreement loud (log,
// debug view, trust); the first one is logged here at debug level with its
// detail.
func (in *Ingestor) verified(st *ingestState, ok bool, reason, detail string) {
	k := &st.keys
	k.Checks++
	m := in.cfg.Metrics
	if tm := st.metrics; tm != nil {
		if tm.hashChecks == nil {
			tm.hashChecks = m.hashChecks.WithLabelValues(st.label)
		}
		tm.hashChecks.Inc()
	}
	if ok {
		k.PassedSinceMismatch++
		return
	}
	k.Mismatches++
	k.MismatchReason, k.MismatchDetail, k.PassedSinceMismatch = reason, detail, 0
	if m != nil {
		m.hashMismatches.WithLabelValues(st.label, reason).Inc()
	}
	if k.Mismatches == 1 {
		in.log.Debug("block keys disagree with the pod", "target", st.label, "mode", in.cfg.Mode.String(), "reason", reason, "detail", detail)
	}
}
