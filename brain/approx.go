package brain

import (
	"sync"

	"github.com/zeebo/xxh3"

	"github.com/prefixrouter/prefixrouter/targetid"
)

// The approximate policy is how Kubernetes inference gateways do prefix
// affinity without KV events: the prompt's characters are cut into fixed
// chunks, each chunk's hash chains on the previous one, and the router
// remembers which target it sent each chunk hash to. A later prompt is
// scored by the run of leading chunks routed to the same target. It never
// learns about evictions, and its "characters" only approximate tokens.

const (
	approxChunkChars      = 64
	defaultApproxCapacity = 1 << 20 // chunk hashes remembered (LRU by insertion)
	approxMaxChunks       = 1 << 14 // bound the work per request (1 MiB of text)
	approxMaxTargets      = 8       // targets remembered per chunk
)

type approxTable struct {
	mu    sync.Mutex
	cap   int
	m     map[uint64][]targetid.ID
	order []uint64 // ring of inserted hashes, oldest at head
	head  int
}

func newApproxTable(capacity int) *approxTable {
	return &approxTable{cap: capacity, m: make(map[uint64][]targetid.ID)}
}

// approxChunks appends the chained chunk hashes of text (full chunks only).
func approxChunks(dst []uint64, text []byte) []uint64 {
	var prev uint64
	for off := 0; off+approxChunkChars <= len(text) && len(dst) < approxMaxChunks; off += approxChunkChars {
		h := xxh3.HashSeed(text[off:off+approxChunkChars], prev)
		dst = append(dst, h)
		prev = h
	}
	return dst
}

// match sets each candidate's ApproxChunks: the leading chunks it was sent.
func (a *approxTable) match(cands []Candidate, chunks []uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range cands {
		cands[i].ApproxChunks = 0
	}
	for depth, h := range chunks {
		ts := a.m[h]
		alive := 0
		for i := range cands {
			if cands[i].ApproxChunks != depth {
				continue
			}
			for _, t := range ts {
				if t == cands[i].Target.ID {
					cands[i].ApproxChunks++
					alive++
					break
				}
			}
		}
		if alive == 0 {
			return
		}
	}
}

// record remembers that the chunks were routed to id.
func (a *approxTable) record(id targetid.ID, chunks []uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, h := range chunks {
		ts, ok := a.m[h]
		found := false
		for _, t := range ts {
			if t == id {
				found = true
				break
			}
		}
		if found {
			continue
		}
		if len(ts) >= approxMaxTargets {
			ts = ts[1:]
		}
		a.m[h] = append(ts, id)
		if ok {
			continue
		}
		if len(a.order) < a.cap {
			a.order = append(a.order, h)
			continue
		}
		delete(a.m, a.order[a.head])
		a.order[a.head] = h
		a.head = (a.head + 1) % a.cap
	}
}

// forget drops a removed target.
func (a *approxTable) forget(id targetid.ID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for h, ts := range a.m {
		out := ts[:0]
		for _, t := range ts {
			if t != id {
				out = append(out, t)
			}
		}
		a.m[h] = out
	}
}
