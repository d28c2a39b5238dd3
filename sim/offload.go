package sim

import (
	"container/list"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
)

// cpuTier is a CPU offloading tier, the model of vLLM's offloading connector
// with a CPU backend: blocks the GPU pool evicts are kept in host memory, an
// LRU of a fixed number of blocks, and a request whose GPU prefix hit stops
// short can load the following blocks from here instead of recomputing them.
//
// Events are the connector's: a block entering the tier is reported as
// BlockStored with medium "CPU", empty token_ids, no parent and block_size 0
// (the connector knows hashes, not tokens); a block leaving it as
// BlockRemoved with medium "CPU". They travel in the same batch as the
// step's GPU events. The tier is owned by the engine goroutine.
type cpuTier struct {
	capacity int
	lru      *list.List // front = most recently used; values are kvindex.Digest
	where    map[kvindex.Digest]*list.Element
	pending  []events.Event
}

func newCPUTier(capacity int) *cpuTier {
	return &cpuTier{capacity: capacity, lru: list.New(), where: make(map[kvindex.Digest]*list.Element, capacity)}
}

// put keeps a block the GPU evicted; a block already held only becomes most
// recently used (no second BlockStored, as the connector skips blocks it
// already holds). The least recently used block makes room.
func (c *cpuTier) put(h kvindex.Digest) {
	if el, ok := c.where[h]; ok {
		c.lru.MoveToFront(el)
		return
	}
	for c.lru.Len() >= c.capacity {
		old := c.lru.Back()
		oh := old.Value.(kvindex.Digest)
		c.lru.Remove(old)
		delete(c.where, oh)
		c.pending = append(c.pending, events.Event{
			Kind: events.KindBlockRemoved, BlockHashes: []uint64{oh.Wire()}, Medium: events.MediumCPU,
		})
	}
	c.where[h] = c.lru.PushFront(h)
	c.pending = append(c.pending, events.Event{
		Kind: events.KindBlockStored, BlockHashes: []uint64{h.Wire()},
		TokenIDs: []uint32{}, BlockSize: 0, Medium: events.MediumCPU,
	})
}

// run counts the blocks of hashes[from:limit] held here consecutively from
// from: the part of a prompt the tier can load after its GPU hit.
func (c *cpuTier) run(hashes []kvindex.Digest, from, limit int) int {
	n := 0
	for i := from; i < limit && i < len(hashes); i++ {
		if _, ok := c.where[hashes[i]]; !ok {
			break
		}
		n++
	}
	return n
}

// touch marks loaded blocks as recently used; they stay in the tier.
func (c *cpuTier) touch(hashes []kvindex.Digest) {
	for _, h := range hashes {
		if el, ok := c.where[h]; ok {
			c.lru.MoveToFront(el)
		}
	}
}

// len is the number of blocks held.
func (c *cpuTier) len() int { return c.lru.Len() }

// clear forgets everything without events: host memory dies with the
// process.
func (c *cpuTier) clear() {
	c.lru.Init()
	clear(c.where)
	c.pending = c.pending[:0]
}

func (c *cpuTier) takeEvents() []events.Event {
	ev := c.pending
	c.pending = nil
	return ev
}
