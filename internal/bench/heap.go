package bench

import "math"

// never is the key of a source with nothing scheduled.
const never = math.MaxInt64

// eventHeap is an indexed binary min-heap over a fixed set of event sources
// (each engine, the end-of-window mark, each replica's scrape, the balancer
// tick and the workload's next arrival). A source's key is the virtual time of
// its next event in nanoseconds since the epoch; re-keying one source costs
// O(log sources), so only the sources an event touched are re-keyed.
//
// Ties are broken by source index, which the driver orders so that at one
// instant engine events (finishes release their reservations) come before
// scrapes, the tick and arrivals: deterministic and causally sensible.
type eventHeap struct {
	key  []int64 // by source
	pos  []int   // by source: its index in heap
	heap []int   // sources, heap-ordered
}

func newEventHeap(sources int) *eventHeap {
	h := &eventHeap{
		key:  make([]int64, sources),
		pos:  make([]int, sources),
		heap: make([]int, sources),
	}
	for i := range sources {
		h.key[i] = never
		h.pos[i] = i
		h.heap[i] = i
	}
	return h
}

func (h *eventHeap) less(a, b int) bool {
	ka, kb := h.key[a], h.key[b]
	return ka < kb || (ka == kb && a < b)
}

// min returns the source with the earliest event and its key.
func (h *eventHeap) min() (source int, key int64) {
	s := h.heap[0]
	return s, h.key[s]
}

// set re-keys source s.
func (h *eventHeap) set(s int, key int64) {
	old := h.key[s]
	if old == key {
		return
	}
	h.key[s] = key
	i := h.pos[s]
	if key < old {
		h.up(i)
	} else {
		h.down(i)
	}
}

func (h *eventHeap) swap(i, j int) {
	h.heap[i], h.heap[j] = h.heap[j], h.heap[i]
	h.pos[h.heap[i]] = i
	h.pos[h.heap[j]] = j
}

func (h *eventHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(h.heap[i], h.heap[p]) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h *eventHeap) down(i int) {
	n := len(h.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && h.less(h.heap[r], h.heap[l]) {
			m = r
		}
		if !h.less(h.heap[m], h.heap[i]) {
			return
		}
		h.swap(i, m)
		i = m
	}
}
