package kvindex

import (
	"math/bits"
	"slices"
	"sync"

	"github.com/prefixrouter/prefixrouter/internal/flatmap"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// Tier is where a placement lives. vLLM's offloading connectors publish the
// medium of each stored block; a GPU hit saves the most prefill, a CPU or
// storage hit saves less because the block must be loaded first.
type Tier uint8

// Tiers in order of preference.
const (
	TierGPU Tier = iota
	TierCPU
	TierStorage
	numTiers
)

func (t Tier) String() string {
	return [...]string{"GPU", "CPU", "STORAGE"}[t]
}

// TierOf maps an event's medium to a tier. A missing medium is GPU (plain
// prefix caching); an unknown one is treated as the slowest tier rather than
// dropped, so a new offloading backend still counts for something.
func TierOf(medium string) Tier {
	switch medium {
	case "", events.MediumGPU:
		return TierGPU
	case events.MediumCPU:
		return TierCPU
	}
	return TierStorage
}

// DefaultTierWeights value a CPU- or storage-resident block relative to a GPU
// one when scoring a target's run.
var DefaultTierWeights = [numTiers]float64{TierGPU: 1, TierCPU: 0.8, TierStorage: 0.5}

// IndexConfig bounds and tunes the index.
type IndexConfig struct {
	// MaxPlacementsPerTarget caps the placements kept per target; past it
	// the oldest are evicted and counted. 0 means DefaultMaxPlacementsPerTarget.
	MaxPlacementsPerTarget int
	// TierWeights scores a block by the best tier a target holds it in.
	// Zero value means DefaultTierWeights.
	TierWeights [numTiers]float64
}

// DefaultMaxPlacementsPerTarget leaves room for a large pod's GPU cache plus
// CPU offloading (a TP2 H100 pod holds about 19k blocks of 16 tokens).
const DefaultMaxPlacementsPerTarget = 1 << 20

// Index is the confirmed placement index: which target holds which block
// key, in which tier, with reference counts because vLLM may store the same
// hash twice and remove either copy. Reads (Lookup) run concurrently with
// each other; writes are applied one event batch at a time.
//
// Layout: targets get dense slots; slots are grouped 64 to a word so one map
// lookup per key answers "which of these 64 targets hold it" as a bitmask.
// Each tier has its own maps, so a GPU-only fleet pays for one.
type Index struct {
	mu      sync.RWMutex
	cfg     IndexConfig
	slots   map[targetid.ID]int
	targets []*targetState // by slot; nil when free
	// masks[tier][group] maps a key to the bitmask of the group's 64 slots
	// that hold it in that tier.
	masks [numTiers][]*maskMap
}

// maskMap maps a key to a group's bitmask: a flat map, because every event
// and every lookup probes it once per key and it outgrows the CPU caches.
// A key whose mask becomes zero is deleted.
type maskMap = flatmap.Map[uint64]

// mask is m's bitmask for k, zero when absent.
func mask(m *maskMap, k Key) uint64 {
	v, _ := m.Get(uint64(k))
	return v
}

type placementRef struct {
	key  Key
	tier Tier
}

// refCounts counts something per placement, one map per tier, so that a
// probe hashes a plain key rather than a (key, tier) struct. The zero
// value is empty.
type refCounts [numTiers]map[Key]uint32

func (r *refCounts) add(k Key, t Tier) {
	if r[t] == nil {
		r[t] = make(map[Key]uint32)
	}
	r[t][k]++
}

// take drops one count of (k, t) and reports whether it had one. An empty
// tier costs no probe.
func (r *refCounts) take(k Key, t Tier) bool {
	m := r[t]
	if len(m) == 0 {
		return false
	}
	switch n := m[k]; n {
	case 0:
		return false
	case 1:
		delete(m, k)
	default:
		m[k] = n - 1
	}
	return true
}

// forget drops every count of (k, t).
func (r *refCounts) forget(k Key, t Tier) { delete(r[t], k) }

func (r *refCounts) len() int {
	n := 0
	for _, m := range r {
		n += len(m)
	}
	return n
}

func (r *refCounts) reset() {
	for t := range r {
		clear(r[t])
	}
}

type targetState struct {
	id   targetid.ID
	slot int
	// count is the number of distinct (tier, key) placements.
	count     int
	tierCount [numTiers]int
	// order remembers insertion order for cap eviction. Removed entries are
	// dropped lazily; compaction keeps it within a constant factor of count.
	order fifo
	// placed counts every new placement ever pushed to order, and history
	// changes whenever order is rewritten (compaction, clear): while it
	// has not, the last placed-n entries of order are the placements made
	// since placed was n. LookupAsOf relies on it.
	placed  uint64
	history uint32
	// extraRefs holds reference counts above one; almost every placement
	// has exactly one reference, so this map stays tiny.
	extraRefs refCounts
	// stale counts, per placement, queue entries left behind by a removal:
	// if the placement is stored again its old entry must not evict it
	// early. Compaction resets it. Only evictions read it, so it is kept
	// only once the target has reached its cap (staleTracked): before,
	// the first eviction compacts the order instead. A pod's removals
	// keep its placements below the cap, and a map with an entry per
	// removed block (a quarter of a gigabyte over 256 pods) was what
	// that cost.
	stale        refCounts
	staleTracked bool
	// maxPlacements overrides the index-wide cap (0: use the default).
	maxPlacements int
	evicted       uint64
	// unknownRemovals counts removals of placements the index never saw
	// (joined after they were stored and before replay reached them).
	unknownRemovals uint64
}

// NewIndex makes an empty index.
func NewIndex(cfg IndexConfig) *Index {
	if cfg.MaxPlacementsPerTarget <= 0 {
		cfg.MaxPlacementsPerTarget = DefaultMaxPlacementsPerTarget
	}
	if cfg.TierWeights == ([numTiers]float64{}) {
		cfg.TierWeights = DefaultTierWeights
	}
	return &Index{cfg: cfg, slots: make(map[targetid.ID]int)}
}

// AddTarget registers a target; placements for unknown targets are added
// implicitly, so calling it is optional.
func (ix *Index) AddTarget(id targetid.ID) {
	ix.mu.Lock()
	ix.slotFor(id)
	ix.mu.Unlock()
}

func (ix *Index) slotFor(id targetid.ID) *targetState {
	if s, ok := ix.slots[id]; ok {
		return ix.targets[s]
	}
	slot := -1
	for i, t := range ix.targets {
		if t == nil {
			slot = i
			break
		}
	}
	if slot < 0 {
		slot = len(ix.targets)
		ix.targets = append(ix.targets, nil)
	}
	if g := slot / 64; g >= len(ix.masks[TierGPU]) {
		for t := range ix.masks {
			ix.masks[t] = append(ix.masks[t], &maskMap{})
		}
	}
	ts := &targetState{id: id, slot: slot}
	ix.targets[slot] = ts
	ix.slots[id] = slot
	return ts
}

// RemoveTarget drops a target and every placement it had.
func (ix *Index) RemoveTarget(id targetid.ID) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	s, ok := ix.slots[id]
	if !ok {
		return
	}
	ix.clearLocked(ix.targets[s])
	ix.targets[s] = nil
	delete(ix.slots, id)
}

// Store adds one reference per key in the given tier.
func (ix *Index) Store(id targetid.ID, tier Tier, keys []Key) {
	ix.mu.Lock()
	ix.storeLocked(ix.slotFor(id), tier, keys)
	ix.mu.Unlock()
}

// Remove drops one reference per key in the given tier.
func (ix *Index) Remove(id targetid.ID, tier Tier, keys []Key) {
	ix.mu.Lock()
	ix.removeLocked(ix.slotFor(id), tier, keys)
	ix.mu.Unlock()
}

// Clear drops every placement of the target (AllBlocksCleared, restart).
func (ix *Index) Clear(id targetid.ID) {
	ix.mu.Lock()
	if s, ok := ix.slots[id]; ok {
		ix.clearLocked(ix.targets[s])
	}
	ix.mu.Unlock()
}

// Update applies several operations for one target under a single write
// lock, in order. Ingestion uses it to apply a whole event batch at once.
func (ix *Index) Update(id targetid.ID, fn func(w *IndexWriter)) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	w := IndexWriter{ix: ix, ts: ix.slotFor(id)}
	fn(&w)
}

// IndexWriter applies operations for one target inside Index.Update.
type IndexWriter struct {
	ix *Index
	ts *targetState
}

// Store adds one reference per key.
func (w *IndexWriter) Store(tier Tier, keys []Key) { w.ix.storeLocked(w.ts, tier, keys) }

// Remove drops one reference per key.
func (w *IndexWriter) Remove(tier Tier, keys []Key) { w.ix.removeLocked(w.ts, tier, keys) }

// Clear drops every placement of the target.
func (w *IndexWriter) Clear() { w.ix.clearLocked(w.ts) }

// Holds reports whether the target holds key in any tier.
func (w *IndexWriter) Holds(key Key) bool { return w.ix.holdsLocked(w.ts.slot, key) }

func (ix *Index) storeLocked(ts *targetState, tier Tier, keys []Key) {
	m := ix.masks[tier][ts.slot/64]
	bit := uint64(1) << (ts.slot % 64)
	for _, k := range keys {
		held, _ := m.Upsert(uint64(k))
		if *held&bit != 0 {
			ts.extraRefs.add(k, tier)
			continue
		}
		*held |= bit
		ts.count++
		ts.tierCount[tier]++
		ts.order.push(k, tier)
		ts.placed++
	}
	if ts.count > ix.capOf(ts) {
		ix.evictLocked(ts)
	}
	if ts.order.len() > 2*ts.count+1024 {
		ix.compactLocked(ts)
	}
}

func (ix *Index) removeLocked(ts *targetState, tier Tier, keys []Key) {
	m := ix.masks[tier][ts.slot/64]
	bit := uint64(1) << (ts.slot % 64)
	for _, k := range keys {
		held := m.Ptr(uint64(k))
		if held == nil || *held&bit == 0 {
			ts.unknownRemovals++
			continue
		}
		if ts.extraRefs.take(k, tier) {
			continue
		}
		ix.dropLocked(ts, m, k, tier, held, bit)
	}
}

// SetTargetCap bounds one target's placements, typically from the pod's
// reported cache size (num_gpu_blocks plus any offloading tiers), so that
// missed removals cannot make the index claim far more than the pod holds.
// n <= 0 restores the index-wide default.
func (ix *Index) SetTargetCap(id targetid.ID, n int) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ts := ix.slotFor(id)
	ts.maxPlacements = n
	if ts.count > ix.capOf(ts) {
		ix.evictLocked(ts)
	}
}

func (ix *Index) capOf(ts *targetState) int {
	if ts.maxPlacements > 0 {
		return ts.maxPlacements
	}
	return ix.cfg.MaxPlacementsPerTarget
}

// dropLocked removes a placement entirely (all references); held is k's
// mask in m. Its queue entry stays behind, marked stale once the target evicts.
func (ix *Index) dropLocked(ts *targetState, m *maskMap, k Key, tier Tier, held *uint64, bit uint64) {
	if ts.staleTracked {
		ts.stale.add(k, tier)
	}
	if *held &^= bit; *held == 0 {
		m.Delete(uint64(k))
	}
	ts.count--
	ts.tierCount[tier]--
}

func (ix *Index) clearLocked(ts *targetState) {
	bit := uint64(1) << (ts.slot % 64)
	g := ts.slot / 64
	ts.order.each(func(k Key, tier Tier) {
		m := ix.masks[tier][g]
		if held := m.Ptr(uint64(k)); held != nil && *held&bit != 0 {
			ix.dropLocked(ts, m, k, tier, held, bit)
		}
	})
	ts.order.reset()
	ts.history++
	ts.extraRefs.reset()
	ts.stale.reset()
	ts.staleTracked = false
}

// evictLocked drops the oldest placements until the target is within its cap.
func (ix *Index) evictLocked(ts *targetState) {
	if !ts.staleTracked {
		// The order may hold untracked stale entries: compaction
		// leaves each placement's last entry alone, and from here on
		// removals are tracked.
		ix.compactLocked(ts)
		ts.staleTracked = true
	}
	bit := uint64(1) << (ts.slot % 64)
	g := ts.slot / 64
	for ts.count > ix.capOf(ts) {
		k, tier, ok := ts.order.pop()
		if !ok {
			return
		}
		if ts.stale.take(k, tier) {
			// Left behind by a removal; a later entry (if the placement
			// was stored again) carries its real age.
			continue
		}
		m := ix.masks[tier][g]
		held := m.Ptr(uint64(k))
		if held == nil || *held&bit == 0 {
			continue
		}
		ts.extraRefs.forget(k, tier)
		ix.dropLocked(ts, m, k, tier, held, bit)
		ts.stale.take(k, tier) // its only entry was just consumed
		ts.evicted++
	}
}

// compactLocked rewrites the insertion order without removed placements.
// A placement stored again after a removal appears more than once; its last
// entry is its real insertion, so the order is scanned from the back.
// Every held placement has an entry, so when the entries of held
// placements number exactly count there is none twice and no need to
// look for duplicates.
func (ix *Index) compactLocked(ts *targetState) {
	bit := uint64(1) << (ts.slot % 64)
	g := ts.slot / 64
	keys := make([]Key, 0, ts.count)
	tiers := make([]Tier, 0, ts.count)
	for i := len(ts.order.keys) - 1; i >= ts.order.head; i-- {
		k, tier := ts.order.keys[i], ts.order.tiers[i]
		if mask(ix.masks[tier][g], k)&bit != 0 {
			keys, tiers = append(keys, k), append(tiers, tier)
		}
	}
	if len(keys) > ts.count {
		seen := make(map[placementRef]struct{}, ts.count)
		n := 0
		for i, k := range keys {
			ref := placementRef{k, tiers[i]}
			if _, dup := seen[ref]; dup {
				continue
			}
			seen[ref] = struct{}{}
			keys[n], tiers[n] = k, tiers[i]
			n++
		}
		keys, tiers = keys[:n], tiers[:n]
	}
	slices.Reverse(keys)
	slices.Reverse(tiers)
	ts.order = fifo{keys: keys, tiers: tiers}
	ts.history++
	ts.stale.reset()
}

// Match is one target's confirmed prefix for a lookup.
type Match struct {
	Target targetid.ID
	// Blocks is the length of the longest run of consecutive keys from
	// block 0 that the target holds in any tier.
	Blocks int
	// Weighted is Blocks with each block weighted by the best tier the
	// target holds it in (GPU 1.0 by default).
	Weighted float64
	// Lost is set by LookupAsOf alone, for a target whose placements since
	// the mark are no longer known: its Blocks are its run now, and may
	// count blocks placed since.
	Lost bool
}

// Lookup appends a Match for every target holding at least block 0 of keys.
// It is the hot path: one map probe per key per tier in use per 64 targets,
// and it stops as soon as no target continues the run.
func (ix *Index) Lookup(dst []Match, keys []Key) []Match {
	if len(keys) == 0 {
		return dst
	}
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	inUse := ix.tiersInUse()
	for g := range ix.masks[TierGPU] {
		dst = ix.lookupGroup(dst, g, keys, inUse, nil)
	}
	return dst
}

func (ix *Index) tiersInUse() (inUse [numTiers]bool) {
	for t := range ix.masks {
		for _, m := range ix.masks[t] {
			if m.Len() > 0 {
				inUse[t] = true
				break
			}
		}
	}
	return inUse
}

// StoreMark is where every target's placements stood at one moment, for
// LookupAsOf.
type StoreMark struct {
	slots []slotMark // by slot
}

type slotMark struct {
	ts      *targetState // nil: no target had the slot
	placed  uint64
	history uint32
}

// MarkStores marks where the index's placements stand now. A router that
// sends a request and looks the whole prompt up only afterwards looks it
// up as of a mark taken before sending: the blocks that very request made
// the pod store must not count as hits it found.
func (ix *Index) MarkStores() StoreMark {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	m := StoreMark{slots: make([]slotMark, len(ix.targets))}
	for s, ts := range ix.targets {
		if ts != nil {
			m.slots[s] = slotMark{ts: ts, placed: ts.placed, history: ts.history}
		}
	}
	return m
}

// LookupAsOf is Lookup as of mark m as far as stores go: a target's run
// ends at the first key that every tier it now holds the key in placed
// after m. Removals since m still shorten runs: a block evicted since is
// no hit. A target that had no slot at m held nothing then and is not
// reported. A target whose placements since m are no longer known (its
// insertion order was compacted or cleared since, or evictions consumed
// them) is reported with its run now, marked Lost.
func (ix *Index) LookupAsOf(dst []Match, keys []Key, m StoreMark) []Match {
	if len(keys) == 0 {
		return dst
	}
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	inUse := ix.tiersInUse()
	var pos map[Key]int // the first index of each key; built on first need
	for g := range ix.masks[TierGPU] {
		var since asOf
		for s := g * 64; s < min(g*64+64, len(ix.targets)); s++ {
			ts := ix.targets[s]
			if ts == nil {
				continue
			}
			bit := uint64(1) << (s % 64)
			var mk slotMark
			if s < len(m.slots) {
				mk = m.slots[s]
			}
			switch n := ts.placed - mk.placed; {
			case mk.ts != ts:
				since.cuts = append(since.cuts, cut{at: 0, slot: uint8(s % 64)})
			case mk.history != ts.history || n > uint64(ts.order.len()):
				since.lost |= bit
			case n > 0:
				if pos == nil {
					pos = make(map[Key]int, len(keys))
					for i := len(keys) - 1; i >= 0; i-- {
						pos[keys[i]] = i
					}
				}
				if at, ok := ix.firstPlacedSince(ts, int(n), pos); ok {
					since.cuts = append(since.cuts, cut{at: int32(at), slot: uint8(s % 64)})
				}
			}
		}
		slices.SortFunc(since.cuts, func(a, b cut) int { return int(a.at - b.at) })
		dst = ix.lookupGroup(dst, g, keys, inUse, &since)
	}
	return dst
}

// asOf is what LookupAsOf tells a group's lookup: where runs end because
// their blocks were placed since the mark, by key index, and which slots'
// history was lost.
type asOf struct {
	cuts []cut // by at
	lost uint64
}

type cut struct {
	at   int32
	slot uint8
}

// firstPlacedSince finds the first key of a prompt (by pos, its index of
// each key) that the target holds only in tiers placed among its last n
// placements.
func (ix *Index) firstPlacedSince(ts *targetState, n int, pos map[Key]int) (int, bool) {
	var placed map[Key]uint8 // tiers placed since, of the prompt's keys
	keys, tiers := ts.order.keys[len(ts.order.keys)-n:], ts.order.tiers[len(ts.order.tiers)-n:]
	for j, k := range keys {
		if _, ok := pos[k]; ok {
			if placed == nil {
				placed = make(map[Key]uint8)
			}
			placed[k] |= 1 << tiers[j]
		}
	}
	first, found := 0, false
	g, bit := ts.slot/64, uint64(1)<<(ts.slot%64)
	for k, newTiers := range placed {
		var heldTiers uint8
		for t := range ix.masks {
			if mask(ix.masks[t][g], k)&bit != 0 {
				heldTiers |= 1 << t
			}
		}
		if heldTiers&^newTiers != 0 {
			continue // held before the mark too, in another tier
		}
		if i := pos[k]; !found || i < first {
			first, found = i, true
		}
	}
	return first, found
}

// Reach tracks which targets hold every key of a prompt seen so far, for a
// caller that learns the keys a piece at a time. Once no target does, no
// later key can lengthen any target's run (runs start at block 0), so the
// rest of the prompt cannot change a Lookup. The zero value is ready.
type Reach struct {
	alive []uint64 // per group of 64 slots
}

// Extend narrows r by the prompt's next keys, in order, and reports whether
// some target still holds every key so far. A target added since r began
// counts as holding the earlier keys: that can only make a caller read on.
func (ix *Index) Extend(r *Reach, keys []Key) bool {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	groups := len(ix.masks[TierGPU])
	for len(r.alive) < groups {
		r.alive = append(r.alive, ^uint64(0))
	}
	for _, k := range keys {
		any := false
		for g := range groups {
			if r.alive[g] == 0 {
				continue
			}
			var held uint64
			for t := range ix.masks {
				// A tier no target of the group uses (CPU and storage,
				// in most fleets) costs no probe.
				if m := ix.masks[t][g]; m.Len() > 0 {
					held |= mask(m, k)
				}
			}
			if r.alive[g] &= held; r.alive[g] != 0 {
				any = true
			}
		}
		if !any {
			return false
		}
	}
	return true
}

// Holders appends the targets that hold every key r has been extended by:
// the only ones whose run a later key can still lengthen.
func (ix *Index) Holders(r *Reach, dst []targetid.ID) []targetid.ID {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	for slot, ts := range ix.targets {
		if ts == nil {
			continue
		}
		// A group r has not seen yet was added since: it counts as holding.
		if g := slot / 64; g >= len(r.alive) || r.alive[g]&(1<<(slot%64)) != 0 {
			dst = append(dst, ts.id)
		}
	}
	return dst
}

// lookupGroup computes the runs of one group of 64 slots; since, when not
// nil, cuts runs short as LookupAsOf asks.
func (ix *Index) lookupGroup(dst []Match, g int, keys []Key, inUse [numTiers]bool, since *asOf) []Match {
	var cuts []cut
	var lost uint64
	if since != nil {
		cuts, lost = since.cuts, since.lost
	}
	var (
		alive    = ^uint64(0)
		slowRuns [64][numTiers]int32 // per slot: run blocks held only in CPU / storage
		run      [64]int32
		started  bool
	)
	gpu, cpu, sto := ix.masks[TierGPU][g], ix.masks[TierCPU][g], ix.masks[TierStorage][g]
	i := 0
	for ; i < len(keys); i++ {
		k := keys[i]
		var mg, mc, ms uint64
		if inUse[TierGPU] {
			mg = mask(gpu, k)
		}
		if inUse[TierCPU] {
			mc = mask(cpu, k)
		}
		if inUse[TierStorage] {
			ms = mask(sto, k)
		}
		held := mg | mc | ms
		for len(cuts) > 0 && int(cuts[0].at) <= i {
			held &^= 1 << cuts[0].slot
			cuts = cuts[1:]
		}
		if !started {
			alive = held
			started = true
		}
		dropped := alive &^ held
		for dropped != 0 {
			s := bits.TrailingZeros64(dropped)
			run[s] = int32(i)
			dropped &= dropped - 1
		}
		alive &= held
		if alive == 0 {
			break
		}
		// Blocks not on the GPU count at a lower weight.
		for slow := alive &^ mg; slow != 0; slow &= slow - 1 {
			s := bits.TrailingZeros64(slow)
			if mc&(1<<s) != 0 {
				slowRuns[s][TierCPU]++
			} else {
				slowRuns[s][TierStorage]++
			}
		}
	}
	for a := alive; a != 0; a &= a - 1 {
		run[bits.TrailingZeros64(a)] = int32(i)
	}
	w := ix.cfg.TierWeights
	for s := 0; s < 64; s++ {
		if run[s] == 0 {
			continue
		}
		slot := g*64 + s
		if slot >= len(ix.targets) || ix.targets[slot] == nil {
			continue
		}
		n := int(run[s])
		cpuN, stoN := float64(slowRuns[s][TierCPU]), float64(slowRuns[s][TierStorage])
		gpuN := float64(n) - cpuN - stoN
		dst = append(dst, Match{
			Target:   ix.targets[slot].id,
			Blocks:   n,
			Weighted: gpuN*w[TierGPU] + cpuN*w[TierCPU] + stoN*w[TierStorage],
			Lost:     lost&(1<<s) != 0,
		})
	}
	return dst
}

// TargetStats is one target's index bookkeeping.
type TargetStats struct {
	Target          targetid.ID
	Placements      int
	ByTier          [numTiers]int
	Evicted         uint64
	UnknownRemovals uint64
}

// Stats reports every target's placement counts.
func (ix *Index) Stats() []TargetStats {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := make([]TargetStats, 0, len(ix.slots))
	for _, ts := range ix.targets {
		if ts == nil {
			continue
		}
		out = append(out, TargetStats{Target: ts.id, Placements: ts.count, ByTier: ts.tierCount, Evicted: ts.evicted, UnknownRemovals: ts.unknownRemovals})
	}
	return out
}

// StatsFor reports one target's placement counts.
func (ix *Index) StatsFor(id targetid.ID) (TargetStats, bool) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	s, ok := ix.slots[id]
	if !ok {
		return TargetStats{Target: id}, false
	}
	ts := ix.targets[s]
	return TargetStats{Target: ts.id, Placements: ts.count, ByTier: ts.tierCount, Evicted: ts.evicted, UnknownRemovals: ts.unknownRemovals}, true
}

// Has reports whether the target holds key in any tier (tests and debugging).
func (ix *Index) Has(id targetid.ID, key Key) bool {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	s, ok := ix.slots[id]
	if !ok {
		return false
	}
	return ix.holdsLocked(s, key)
}

func (ix *Index) holdsLocked(slot int, key Key) bool {
	bit := uint64(1) << (slot % 64)
	for t := range ix.masks {
		if mask(ix.masks[t][slot/64], key)&bit != 0 {
			return true
		}
	}
	return false
}

// fifo is a compact insertion-order queue of placements: keys and tiers in
// parallel slices so each entry costs 9 bytes.
type fifo struct {
	keys  []Key
	tiers []Tier
	head  int
}

func (f *fifo) len() int { return len(f.keys) - f.head }

func (f *fifo) push(k Key, t Tier) {
	f.keys = append(f.keys, k)
	f.tiers = append(f.tiers, t)
}

func (f *fifo) pop() (Key, Tier, bool) {
	if f.head >= len(f.keys) {
		return 0, 0, false
	}
	k, t := f.keys[f.head], f.tiers[f.head]
	f.head++
	if f.head > 4096 && f.head*2 > len(f.keys) {
		n := copy(f.keys, f.keys[f.head:])
		copy(f.tiers, f.tiers[f.head:])
		f.keys, f.tiers, f.head = f.keys[:n], f.tiers[:n], 0
	}
	return k, t, true
}

func (f *fifo) each(fn func(Key, Tier)) {
	for i := f.head; i < len(f.keys); i++ {
		fn(f.keys[i], f.tiers[i])
	}
}

func (f *fifo) reset() { *f = fifo{} }
