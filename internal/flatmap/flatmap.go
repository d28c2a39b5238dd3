// Package flatmap owns the project's one hash map for hot paths keyed by
// 64-bit hashes: open addressing with linear probing in a single slice, so a
// probe of a large map costs one cache miss where a Go map's costs two or
// three (its control word, its slot, its table). Keys are already hashes
// (block hashes, engine hashes) or small integers in tests; a multiplicative
// mix spreads both.
package flatmap

// Map maps uint64 keys to values of V. The zero value is an empty map ready
// to use. It is not safe for concurrent use.
type Map[V any] struct {
	slots []slot[V]
	n     int
	shift uint // 64 - log2(len(slots))
}

type slot[V any] struct {
	key  uint64
	val  V
	used bool
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
func (m *Map[V]) Len() int { return m.n }

func (m *Map[V]) home(k uint64) int {
	return int((k * 0x9E3779B97F4A7C15) >> m.shift)
}

// find returns the slot holding k and true, or the free slot where k would
// go and false. The table must not be empty.
func (m *Map[V]) find(k uint64) (int, bool) {
	mask := len(m.slots) - 1
	for i := m.home(k); ; i = (i + 1) & mask {
		s := &m.slots[i]
		if !s.used {
			return i, false
		}
		if s.key == k {
			return i, true
		}
	}
}

// Get returns k's value and whether k is present.
func (m *Map[V]) Get(k uint64) (V, bool) {
	if m.n == 0 {
		var zero V
		return zero, false
	}
	i, ok := m.find(k)
	return m.slots[i].val, ok
}

// Ptr returns a pointer to k's value, or nil when k is absent. It is valid
// until the next Put, Upsert or Delete.
func (m *Map[V]) Ptr(k uint64) *V {
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
	if (m.n+1)*maxLoadD > len(m.slots)*maxLoadN {
		m.grow()
	}
	i, ok := m.find(k)
	if !ok {
		m.slots[i] = slot[V]{key: k, used: true}
		m.n++
	}
	return &m.slots[i].val, ok
}

func (m *Map[V]) grow() {
	old := m.slots
	m.alloc(max(minSlots, 2*len(old)))
	mask := len(m.slots) - 1
	for _, s := range old {
		if !s.used {
			continue
		}
		i := m.home(s.key)
		for m.slots[i].used {
			i = (i + 1) & mask
		}
		m.slots[i] = s
	}
}

// Delete removes k and reports whether it was present. The entries after
// it that would no longer be found past the hole move back into it (no
// tombstones, so probes stay short however many keys come and go).
func (m *Map[V]) Delete(k uint64) bool {
	if m.n == 0 {
		return false
	}
	i, ok := m.find(k)
	if !ok {
		return false
	}
	mask := len(m.slots) - 1
	for j := (i + 1) & mask; m.slots[j].used; j = (j + 1) & mask {
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
}
