package sim

import (
	"github.com/prefixrouter/prefixrouter/internal/flatmap"
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
	cached *flatmap.Map[int32]
	// losses counts the hashes blocks have lost (evictions, clears), and
	// lostAt[id] is the count at block id's last loss: a block looked up
	// when losses was n and not lost since still caches what it did then,
	// which a memo checks in this dense array instead of the blocks'.
	losses uint64
	lostAt []uint64
	// pending collects the events of the current step.
	pending []events.Event
	// wires hands out the one-hash slices of BlockRemoved events from
	// shared chunks: one allocation per chunk instead of per eviction.
	wires []uint64
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
	p := &blockPool{blocks: make([]block, n), cached: flatmap.New[int32](n), lostAt: make([]uint64, n)}
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
	return p.lookupFrom(dst, hashes, maxBlocks, nil, 0)
}

// lookupFrom is lookup given memo, an earlier lookup of the same hashes
// made when p.losses was memoAt: the run starts with memo's blocks that
// still cache their hash, checked in the block array instead of the
// table, and only for blocks that lost a hash since. A request waiting
// for memory is looked up again every step, and its run rarely changes.
func (p *blockPool) lookupFrom(dst []int32, hashes []kvindex.Digest, maxBlocks int, memo []int32, memoAt uint64) []int32 {
	i := 0
	if memoAt == p.losses {
		// Nothing lost a hash since: the whole memo still holds.
		i = min(len(memo), len(hashes), maxBlocks)
		dst = append(dst, memo[:i]...)
	}
	for ; i < len(memo) && i < len(hashes) && i < maxBlocks; i++ {
		id := memo[i]
		if p.lostAt[id] > memoAt {
			// Lost its hash since; it may have cached the same one again.
			if b := &p.blocks[id]; !b.hashed || b.hash != hashes[i] {
				break
			}
		}
		dst = append(dst, id)
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
	if head := p.cached.Ptr(b.hash.Wire()); head != nil {
		if *head == id {
			if b.sameNext == noBlock {
				p.cached.Delete(b.hash.Wire())
			} else {
				*head = b.sameNext
			}
		} else {
			for prev := *head; prev != noBlock; prev = p.blocks[prev].sameNext {
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
		BlockHashes: p.oneWire(b.hash.Wire()),
		Medium:      events.MediumGPU,
		GroupIdx:    p.group, HasGroupIdx: true,
	})
	if p.onEvict != nil {
		p.onEvict(b.hash)
	}
	b.hashed, b.hash = false, kvindex.Digest{}
	p.losses++
	p.lostAt[id] = p.losses
}

// oneWire returns a slice holding just w, its capacity capped so that an
// append by the receiver cannot reach the chunk's next hash.
func (p *blockPool) oneWire(w uint64) []uint64 {
	if len(p.wires) == cap(p.wires) {
		p.wires = make([]uint64, 0, 256)
	}
	p.wires = append(p.wires, w)
	n := len(p.wires)
	return p.wires[n-1 : n : n]
}

// has reports whether some block caches hash h.
func (p *blockPool) has(h kvindex.Digest) bool { return p.first(h) != noBlock }

// first returns the first block caching h, or noBlock.
func (p *blockPool) first(h kvindex.Digest) int32 {
	id, ok := p.cached.Get(h.Wire())
	if !ok {
		return noBlock
	}
	for ; id != noBlock; id = p.blocks[id].sameNext {
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
	head, existed := p.cached.Upsert(h.Wire())
	if !existed {
		*head = id
		return
	}
	last := *head
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
	p.losses++
	for i := range p.blocks {
		p.blocks[i] = block{sameNext: noBlock}
		p.lostAt[i] = p.losses
		p.pushTail(int32(i))
	}
	p.cached.Clear()
	p.pending = p.pending[:0]
}

// takeEvents returns and clears the events of the current step.
func (p *blockPool) takeEvents() []events.Event {
	if len(p.pending) == 0 {
		return nil
	}
	ev := p.pending
	// The next step's events are likely as many: room for them up front
	// saves growing the slice through every power of two.
	p.pending = make([]events.Event, 0, len(ev))
	return ev
}
