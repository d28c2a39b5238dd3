package des

import "time"

// queue is the engine's event queue: a binary min-heap by time, events of
// the same time in the order they were pushed, so that a run is
// deterministic.
type queue struct {
	items []item
	n     uint64
}

func (q *queue) len() int { return len(q.items) }

func (q *queue) push(it item) {
	q.n++
	it.order = q.n
	q.items = append(q.items, it)
	i := len(q.items) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !q.less(i, p) {
			break
		}
		q.items[i], q.items[p] = q.items[p], q.items[i]
		i = p
	}
}

func (q *queue) pop() item {
	top := q.items[0]
	last := len(q.items) - 1
	q.items[0] = q.items[last]
	q.items[last] = item{}
	q.items = q.items[:last]
	i := 0
	for {
		l, m := 2*i+1, i
		if l < len(q.items) && q.less(l, m) {
			m = l
		}
		if r := l + 1; r < len(q.items) && q.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		q.items[i], q.items[m] = q.items[m], q.items[i]
		i = m
	}
	return top
}

func (q *queue) less(i, j int) bool {
	a, b := &q.items[i], &q.items[j]
	return a.at < b.at || (a.at == b.at && a.order < b.order)
}

// peek is the next event's time.
func (q *queue) peek() time.Duration { return q.items[0].at }
