package flowcontrol

// band is one priority class: its flows (one per tenant with requests
// queued) and its virtual time.
type band struct {
	prio  int
	v     int64 // start tag of the last request dispatched from this band
	fh    flowHeap
	byKey map[string]*flow // active flows and remembered idle flows
	n     int
	bytes int64
	hidx  int // position in Queue.bh, -1 while empty
}

// flow is one tenant's requests of one priority, first come first served.
type flow struct {
	key          string // the tenant's name
	band         *band
	head, tail   *entry
	n            int
	start        int64 // start tag of the head request
	finish       int64 // where its next start tag begins, kept while idle
	hidx         int   // position in band.fh, -1 when idle
	idle         bool  // in Queue.idleF
	iprev, inext *flow
}

// bandHeap orders non-empty bands by priority, highest first.
type bandHeap []*band

func (h bandHeap) less(i, j int) bool { return h[i].prio > h[j].prio }

func (h bandHeap) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].hidx, h[j].hidx = i, j
}

func (h *bandHeap) push(b *band) {
	b.hidx = len(*h)
	*h = append(*h, b)
	h.up(b.hidx)
}

func (h *bandHeap) remove(i int) {
	n := len(*h) - 1
	if i != n {
		h.swap(i, n)
	}
	(*h)[n] = nil
	*h = (*h)[:n]
	if i != n {
		if !h.down(i) {
			h.up(i)
		}
	}
}

func (h bandHeap) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !h.less(j, i) {
			break
		}
		h.swap(i, j)
		j = i
	}
}

func (h bandHeap) down(i0 int) bool {
	i, n := i0, len(h)
	for {
		j := 2*i + 1
		if j >= n {
			break
		}
		if j2 := j + 1; j2 < n && h.less(j2, j) {
			j = j2
		}
		if !h.less(j, i) {
			break
		}
		h.swap(i, j)
		i = j
	}
	return i > i0
}

// flowHeap orders a band's active flows by the start tag of their head
// request, ties by admission order.
type flowHeap []*flow

func (h flowHeap) less(i, j int) bool {
	a, b := h[i], h[j]
	if a.start != b.start {
		return a.start < b.start
	}
	return a.head.seq < b.head.seq
}

func (h flowHeap) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].hidx, h[j].hidx = i, j
}

func (h *flowHeap) push(f *flow) {
	f.hidx = len(*h)
	*h = append(*h, f)
	h.up(f.hidx)
}

func (h *flowHeap) remove(i int) {
	n := len(*h) - 1
	f := (*h)[i]
	if i != n {
		h.swap(i, n)
	}
	(*h)[n] = nil
	*h = (*h)[:n]
	f.hidx = -1
	if i != n {
		h.fix(i)
	}
}

func (h flowHeap) fix(i int) {
	if !h.down(i) {
		h.up(i)
	}
}

func (h flowHeap) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !h.less(j, i) {
			break
		}
		h.swap(i, j)
		j = i
	}
}

func (h flowHeap) down(i0 int) bool {
	i, n := i0, len(h)
	for {
		j := 2*i + 1
		if j >= n {
			break
		}
		if j2 := j + 1; j2 < n && h.less(j2, j) {
			j = j2
		}
		if !h.less(j, i) {
			break
		}
		h.swap(i, j)
		i = j
	}
	return i > i0
}
