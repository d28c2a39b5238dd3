package sim

import (
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
)

// blockPool mirrors vLLM v1's BlockPool for one KV-cache group: a fixed set
// of blocks with reference counts, a free queue ordered for eviction (head is
// evicted first), and a table from block hash to the cached blocks holding it.
// vLLM may cache the same hash in two blocks (two requests filling the same
// block concurrently); both are kept and each eviction reports its own copy.
//
// A freed block keeps its hash and stays a cache hit until it is reallocated.
// Requests free their blocks tail first, so the end of a prompt is evicted
// before its beginning, as in vLLM. The pool is owned by one engine goroutine.
type blockPool struct {
	blocks     []block
	head, tail int32 // free queue; -1 when empty
	numFree    int
	// cached maps a hash's wire form (its last 8 bytes, a cheap key) to
	// the first block caching a hash of that wire form; the others follow
	// through block.sameNext in the order they were cached, and first
	// picks the one whose whole hash matches. Probing it is the
	// simulator's hottest memory access, hence a flat table rather than a
	// map of slices.
	cached wireTable
	// pending collects the events of the current step.
	pending []events.Event
	// group is the KV-cache group index the pool's events carry (0 unless
	// the pod models a hybrid model's second group).
	group int
	// onEvict, when set, receives every hash the pool evicts: the CPU
	// offloading tier keeps what the GPU drops.
	onEvict func(kvindex.Digest)
}

type block struct {
	ref        int32
	prev, next int32
	// sameNext is the next block caching a hash of the same wire form
	// (noBlock at the end of the chain or when not hashed).
	sameNext int32
	inFree   bool
	hashed   bool
	hash     kvindex.Digest
}

const noBlock = -1

func newBlockPool(n int) *blockPool {
	p := &blockPool{blocks: make([]block, n), cached: newWireTable(n)}
	p.head, p.tail = noBlock, noBlock
	for i := range p.blocks {
		p.blocks[i].sameNext = noBlock
		p.pushTail(int32(i))
	}
	return p
}

// usage is vLLM's kv_cache_usage_perc: the fraction of blocks in use.
func (p *blockPool) usage() float64 {
	if len(p.blocks) == 0 {
		return 0
	}
	return 1 - float64(p.numFree)/float64(len(p.blocks))
}

func (p *blockPool) pushTail(id int32) {
	b := &p.blocks[id]
	b.prev, b.next, b.inFree = p.tail, noBlock, true
	if p.tail != noBlock {
		p.blocks[p.tail].next = id
	} else {
		p.head = id
	}
	p.tail = id
	p.numFree++
}

func (p *blockPool) unlink(id int32) {
	b := &p.blocks[id]
	if b.prev != noBlock {
		p.blocks[b.prev].next = b.next
	} else {
		p.head = b.next
	}
	if b.next != noBlock {
		p.blocks[b.next].prev = b.prev
	} else {
		p.tail = b.prev
	}
	b.prev, b.next, b.inFree = noBlock, noBlock, false
	p.numFree--
}

// lookup returns the cached blocks of the longest run of hashes from block 0,
// at most maxBlocks long.
func (p *blockPool) lookup(dst []int32, hashes []kvindex.Digest, maxBlocks int) []int32 {
	return p.lookupFrom(dst, hashes, maxBlocks, nil)
}

// lookupFrom is lookup given memo, an earlier lookup of the same hashes:
// the run starts with memo's blocks that still cache their hash, checked
// in the block array instead of the map. A request waiting for memory is
// looked up again every step, and its run rarely changes.
func (p *blockPool) lookupFrom(dst []int32, hashes []kvindex.Digest, maxBlocks int, memo []int32) []int32 {
	i := 0
	for ; i < len(memo) && i < len(hashes) && i < maxBlocks; i++ {
		if b := &p.blocks[memo[i]]; !b.hashed || b.hash != hashes[i] {
			break
		}
		dst = append(dst, memo[i])
	}
	for ; i < len(hashes) && i < maxBlocks; i++ {
		id := p.first(hashes[i])
		if id == noBlock {
			break
		}
		dst = append(dst, id)
	}
	return dst
}

// evictable counts the blocks among ids that sit in the free queue: touching
// them takes them out of it.
func (p *blockPool) evictable(ids []int32) int {
	n := 0
	for _, id := range ids {
		if p.blocks[id].ref == 0 {
			n++
		}
	}
	return n
}

// touch takes a reference on cache-hit blocks.
func (p *blockPool) touch(ids []int32) {
	for _, id := range ids {
		b := &p.blocks[id]
		if b.ref == 0 && b.inFree {
			p.unlink(id)
		}
		b.ref++
	}
}

// allocate pops n blocks from the head of the free queue, evicting the
// cached hash each one still holds. The caller checks numFree first.
func (p *blockPool) allocate(dst []int32, n int) []int32 {
	for ; n > 0 && p.head != noBlock; n-- {
		id := p.head
		p.unlink(id)
		p.evict(id)
		p.blocks[id].ref = 1
		dst = append(dst, id)
	}
	return dst
}

func (p *blockPool) evict(id int32) {
	b := &p.blocks[id]
	if !b.hashed {
		return
	}
	if slot, ok := p.cached.find(b.hash.Wire()); ok {
		if head := &p.cached.slots[slot]; head.id == id {
			if b.sameNext == noBlock {
				p.cached.deleteAt(slot)
			} else {
				head.id = b.sameNext
			}
		} else {
			for prev := head.id; prev != noBlock; prev = p.blocks[prev].sameNext {
				if p.blocks[prev].sameNext == id {
					p.blocks[prev].sameNext = b.sameNext
					break
				}
			}
		}
	}
	b.sameNext = noBlock
	p.pending = append(p.pending, events.Event{
		Kind:        events.KindBlockRemoved,
		BlockHashes: []uint64{b.hash.Wire()},
		Medium:      events.MediumGPU,
		GroupIdx:    p.group, HasGroupIdx: true,
	})
	if p.onEvict != nil {
		p.onEvict(b.hash)
	}
	b.hashed, b.hash = false, kvindex.Digest{}
}

// has reports whether some block caches hash h.
func (p *blockPool) has(h kvindex.Digest) bool { return p.first(h) != noBlock }

// first returns the first block caching h, or noBlock.
func (p *blockPool) first(h kvindex.Digest) int32 {
	slot, ok := p.cached.find(h.Wire())
	if !ok {
		return noBlock
	}
	for id := p.cached.slots[slot].id; id != noBlock; id = p.blocks[id].sameNext {
		if p.blocks[id].hash == h {
			return id
		}
	}
	return noBlock
}

// free drops one reference on each block, in the order given; blocks whose
// count reaches zero join the tail of the free queue. Callers pass a
// request's blocks in reverse so its tail is evicted first.
func (p *blockPool) free(ids []int32) {
	for _, id := range ids {
		if id < 0 {
			continue // a sliding-window group's skipped (null) block
		}
		b := &p.blocks[id]
		if b.ref <= 0 {
			continue
		}
		b.ref--
		if b.ref == 0 {
			p.pushTail(id)
		}
	}
}

// cache records that block id now holds the full block with hash h.
func (p *blockPool) cache(id int32, h kvindex.Digest) {
	b := &p.blocks[id]
	if b.hashed {
		return
	}
	b.hashed, b.hash, b.sameNext = true, h, noBlock
	slot, ok := p.cached.find(h.Wire())
	if !ok {
		p.cached.slots[slot] = wireSlot{wire: h.Wire(), id: id}
		return
	}
	last := p.cached.slots[slot].id
	for p.blocks[last].sameNext != noBlock {
		last = p.blocks[last].sameNext
	}
	p.blocks[last].sameNext = id
}

// reset drops every cached hash, as vLLM's reset_prefix_cache: it succeeds
// only when no block is in use, and then reports AllBlocksCleared.
func (p *blockPool) reset() bool {
	if !p.idle() {
		return false
	}
	p.clear()
	p.pending = append(p.pending, events.Event{Kind: events.KindAllBlocksCleared})
	return true
}

// idle reports whether no block is in use.
func (p *blockPool) idle() bool { return p.numFree == len(p.blocks) }

// clear forgets everything without an event: a restarted process starts
// with an empty cache and tells nobody.
func (p *blockPool) clear() {
	p.head, p.tail, p.numFree = noBlock, noBlock, 0
	for i := range p.blocks {
		p.blocks[i] = block{sameNext: noBlock}
		p.pushTail(int32(i))
	}
	p.cached.reset()
	p.pending = p.pending[:0]
}

// takeEvents returns and clears the events of the current step.
func (p *blockPool) takeEvents() []events.Event {
	if len(p.pending) == 0 {
		return nil
	}
	ev := p.pending
	p.pending = nil
	return ev
}

// wireTable is an open-addressing hash table (linear probing) from a
// hash's wire form to a block id. It holds at most one entry per block, and
// is sized to at least twice the pool, so a probe rarely leaves its first
// cache line: one memory access where a Go map takes two or three.
type wireTable struct {
	slots []wireSlot
	shift uint // 64 - log2(len(slots))
}

// wireSlot is one table entry; id is noBlock when the slot is empty.
type wireSlot struct {
	wire uint64
	id   int32
}

func newWireTable(blocks int) wireTable {
	bits := uint(4)
	for 1<<bits < 2*blocks {
		bits++
	}
	t := wireTable{slots: make([]wireSlot, 1<<bits), shift: 64 - bits}
	t.reset()
	return t
}

// home is the slot a wire form's probe starts at: Fibonacci hashing,
// because wire forms made in tests are small integers, not hash tails.
func (t *wireTable) home(wire uint64) int {
	return int((wire * 0x9E3779B97F4A7C15) >> t.shift)
}

// find returns the slot holding wire and true, or the empty slot where it
// would go and false.
func (t *wireTable) find(wire uint64) (int, bool) {
	mask := len(t.slots) - 1
	for i := t.home(wire); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.id == noBlock {
			return i, false
		}
		if s.wire == wire {
			return i, true
		}
	}
}

// deleteAt empties slot i, shifting back the entries after it that would
// no longer be found past the hole (no tombstones, so probes stay short).
func (t *wireTable) deleteAt(i int) {
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; t.slots[j].id != noBlock; j = (j + 1) & mask {
		// The entry at j may fill the hole at i only if its home is not
		// cyclically within (i, j].
		h := t.home(t.slots[j].wire)
		if (i <= j && i < h && h <= j) || (i > j && (i < h || h <= j)) {
			continue
		}
		t.slots[i] = t.slots[j]
		i = j
	}
	t.slots[i] = wireSlot{id: noBlock}
}

func (t *wireTable) reset() {
	for i := range t.slots {
		t.slots[i] = wireSlot{id: noBlock}
	}
}
