// Package flatmap owns the project's one hash map for hot paths keyed by
// 64-bit hashes: open addressing with linear probing in a single slice, so a
// probe of a large map costs one cache miss where a Go map's costs two or
// three (its control word, its slot, its table). Keys are already hashes
// (block hashes, engine hashes) or small integers in tests; a multiplicative
// mix spreads both.
package flatmap

import "iter"

// Map maps uint64 keys to values of V. The zero value is an empty map ready
// to use. Reads (Get, Len) may run concurrently with each other, nothing
// else may.
//
// A slot whose key is 0 is empty, so a slot is just its key and value; key
// 0 itself lives outside the table.
type Map[V any] struct {
	slots   []slot[V]
	n       int  // keys in slots
	shift   uint // 64 - log2(len(slots))
	hasZero bool
	zero    V // key 0's value
}

type slot[V any] struct {
	key uint64
	val V
}

// minSlots is the smallest table; maxLoad the share of slots in use past
// which the table doubles (linear probing stays short below it).
const (
	minSlots = 16
	maxLoadN = 3
	maxLoadD = 4
)

// New makes a map with room for hint keys before it grows.
func New[V any](hint int) *Map[V] {
	m := &Map[V]{}
	m.alloc(slotsFor(hint))
	return m
}

func slotsFor(n int) int {
	s := minSlots
	for s*maxLoadN < n*maxLoadD {
		s *= 2
	}
	return s
}

func (m *Map[V]) alloc(size int) {
	m.slots = make([]slot[V], size)
	m.shift = 64
	for s := size; s > 1; s >>= 1 {
		m.shift--
	}
}

// Len is the number of keys.
func (m *Map[V]) Len() int {
	if m.hasZero {
		return m.n + 1
	}
	return m.n
}

func (m *Map[V]) home(k uint64) int {
	return int((k * 0x9E3779B97F4A7C15) >> m.shift)
}

// find returns the slot holding k (not 0) and true, or the free slot where
// k would go and false. The table must have a free slot.
func (m *Map[V]) find(k uint64) (int, bool) {
	mask := len(m.slots) - 1
	for i := m.home(k); ; i = (i + 1) & mask {
		switch m.slots[i].key {
		case k:
			return i, true
		case 0:
			return i, false
		}
	}
}

// Get returns k's value and whether k is present.
func (m *Map[V]) Get(k uint64) (V, bool) {
	if p := m.Ptr(k); p != nil {
		return *p, true
	}
	var zero V
	return zero, false
}

// Ptr returns a pointer to k's value, or nil when k is absent. It is valid
// until the next Put, Upsert, Delete or Clear.
func (m *Map[V]) Ptr(k uint64) *V {
	if k == 0 {
		if m.hasZero {
			return &m.zero
		}
		return nil
	}
	if m.n == 0 {
		return nil
	}
	if i, ok := m.find(k); ok {
		return &m.slots[i].val
	}
	return nil
}

// Put sets k's value.
func (m *Map[V]) Put(k uint64, v V) {
	p, _ := m.Upsert(k)
	*p = v
}

// Upsert returns a pointer to k's value, adding k with the zero value when
// absent (reported by false): a read-modify-write in one probe. The pointer
// is valid until the next Put, Upsert or Delete.
func (m *Map[V]) Upsert(k uint64) (*V, bool) {
	if k == 0 {
		had := m.hasZero
		if !had {
			var zero V
			m.hasZero, m.zero = true, zero
		}
		return &m.zero, had
	}
	if (m.n+1)*maxLoadD > len(m.slots)*maxLoadN {
		m.grow()
	}
	i, ok := m.find(k)
	if !ok {
		m.slots[i] = slot[V]{key: k}
		m.n++
	}
	return &m.slots[i].val, ok
}

func (m *Map[V]) grow() {
	old := m.slots
	m.alloc(max(minSlots, 2*len(old)))
	mask := len(m.slots) - 1
	for _, s := range old {
		if s.key == 0 {
			continue
		}
		i := m.home(s.key)
		for m.slots[i].key != 0 {
			i = (i + 1) & mask
		}
		m.slots[i] = s
	}
}

// Delete removes k and reports whether it was present. The entries after
// it that would no longer be found past the hole move back into it (no
// tombstones, so probes stay short however many keys come and go).
func (m *Map[V]) Delete(k uint64) bool {
	if k == 0 {
		had := m.hasZero
		var zero V
		m.hasZero, m.zero = false, zero
		return had
	}
	if m.n == 0 {
		return false
	}
	i, ok := m.find(k)
	if !ok {
		return false
	}
	mask := len(m.slots) - 1
	for j := (i + 1) & mask; m.slots[j].key != 0; j = (j + 1) & mask {
		// The entry at j may fill the hole at i only if its home is not
		// cyclically within (i, j].
		h := m.home(m.slots[j].key)
		if (i <= j && i < h && h <= j) || (i > j && (i < h || h <= j)) {
			continue
		}
		m.slots[i] = m.slots[j]
		i = j
	}
	m.slots[i] = slot[V]{}
	m.n--
	return true
}

// Clear removes every key and keeps the table's size.
func (m *Map[V]) Clear() {
	clear(m.slots)
	m.n = 0
	var zero V
	m.hasZero, m.zero = false, zero
}

// All yields every key and value, in no particular order. The map must not
// change during the iteration.
func (m *Map[V]) All() iter.Seq2[uint64, V] {
	return func(yield func(uint64, V) bool) {
		if m.hasZero && !yield(0, m.zero) {
			return
		}
		for _, s := range m.slots {
			if s.key != 0 && !yield(s.key, s.val) {
				return
			}
		}
	}
}
