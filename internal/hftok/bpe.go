package hftok

// symbol is one token of a word being merged, in a doubly linked list over
// the word's bytes (as in tokenizers' Word).
type symbol struct {
	id         uint32
	prev, next int32
	size       int32 // bytes covered; 0 once merged into its left neighbour
}

// mergeItem is a candidate merge of the symbol at pos with its right
// neighbour.
type mergeItem struct {
	rank  uint32
	pos   int32
	newID uint32
}

func (a mergeItem) less(b mergeItem) bool {
	return a.rank < b.rank || a.rank == b.rank && a.pos < b.pos
}

// bpe appends the ids of one pre-tokenized piece (raw bytes). It follows
// tokenizers' Word::merge_all: repeatedly apply the lowest-ranked merge,
// the leftmost first among equal ranks.
func (t *Tokenizer) bpe(ids []uint32, word string, s *scratch) []uint32 {
	n := len(word)
	switch {
	case n == 0:
		return ids
	case n == 1:
		return append(ids, t.byteID[word[0]])
	}
	if t.ignoreMerges {
		if id, ok := t.vocab[word]; ok {
			return append(ids, id)
		}
	}
	if cap(s.syms) < n {
		s.syms = make([]symbol, 0, n)
		s.heap = make([]mergeItem, 0, n)
	}
	syms := s.syms[:0]
	for i := 0; i < n; i++ {
		syms = append(syms, symbol{id: t.byteID[word[i]], prev: int32(i - 1), next: int32(i + 1), size: 1})
	}
	h := s.heap[:0]
	for i := 0; i+1 < n; i++ {
		if m, ok := t.merges[uint64(syms[i].id)<<32|uint64(syms[i+1].id)]; ok {
			h = heapPush(h, mergeItem{rank: m.rank, pos: int32(i), newID: m.newID})
		}
	}
	for len(h) > 0 {
		var top mergeItem
		top, h = heapPop(h)
		cur := &syms[top.pos]
		if cur.size == 0 || cur.next >= int32(n) {
			continue
		}
		nextPos := cur.next
		right := syms[nextPos]
		m, ok := t.merges[uint64(cur.id)<<32|uint64(right.id)]
		if !ok || m.newID != top.newID {
			continue // stale
		}
		cur.id = top.newID
		cur.size += right.size
		cur.next = right.next
		syms[nextPos].size = 0
		if right.next < int32(n) {
			syms[right.next].prev = top.pos
		}
		if cur.prev >= 0 {
			p := cur.prev
			if m, ok := t.merges[uint64(syms[p].id)<<32|uint64(cur.id)]; ok {
				h = heapPush(h, mergeItem{rank: m.rank, pos: p, newID: m.newID})
			}
		}
		if cur.next < int32(n) {
			if m, ok := t.merges[uint64(cur.id)<<32|uint64(syms[cur.next].id)]; ok {
				h = heapPush(h, mergeItem{rank: m.rank, pos: top.pos, newID: m.newID})
			}
		}
	}
	for i := int32(0); i < int32(n); i = syms[i].next {
		ids = append(ids, syms[i].id)
	}
	s.syms, s.heap = syms, h
	return ids
}

func heapPush(h []mergeItem, x mergeItem) []mergeItem {
	h = append(h, x)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h[i].less(h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	return h
}

func heapPop(h []mergeItem) (mergeItem, []mergeItem) {
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	i := 0
	for {
		l := 2*i + 1
		if l >= len(h) {
			break
		}
		c := l
		if r := l + 1; r < len(h) && h[r].less(h[l]) {
			c = r
		}
		if !h[c].less(h[i]) {
			break
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
	return top, h
}
