package engine

import "math/bits"

// hashIndex maps block hashes to block numbers: an open-addressing table
// with linear probing. Entries are deleted lazily: an evicted block only
// forgets its hash, and kvCache checks every entry it finds against the
// block (which it reads anyway to touch it). A stale entry is reused when
// its hash comes back; when stale entries fill half the table, kvCache
// rebuilds it from the live blocks. Compared with a Go map (or eager
// deletion) this saves one cache miss per evicted block, the simulator's
// hottest path. Key 0 marks an empty slot; the hash 0 is stored as 1 (the
// check against the block then treats it as a miss: harmless, probability
// 2^-64).
type hashIndex struct {
	slots []slot // key and value side by side: one cache line per probe
	shift uint   // 64 - log2(len(slots))
	mask  uint64
	used  int // occupied slots, live or stale
	limit int // rebuild when used reaches it
}

type slot struct {
	key uint64
	val int32
}

// newHashIndex returns a table for up to max live entries that can take at
// least max more (stale) entries before it needs a rebuild.
func newHashIndex(max int) *hashIndex {
	size := 16
	for size < 4*max {
		size *= 2
	}
	return &hashIndex{
		slots: make([]slot, size),
		shift: uint(64 - bits.TrailingZeros(uint(size))),
		mask:  uint64(size - 1),
		limit: size / 2,
	}
}

func (h *hashIndex) home(k uint64) uint64 { return (k * 0x9e3779b97f4a7c15) >> h.shift }

func fixKey(k uint64) uint64 {
	if k == 0 {
		return 1
	}
	return k
}

// find returns the slot holding k (found) or the empty slot where k would
// go.
func (h *hashIndex) find(k uint64) (s *slot, found bool) {
	k = fixKey(k)
	for i := h.home(k); ; i = (i + 1) & h.mask {
		switch s := &h.slots[i]; s.key {
		case k:
			return s, true
		case 0:
			return s, false
		}
	}
}

// fill stores k -> v in an empty slot returned by find.
func (h *hashIndex) fill(s *slot, k uint64, v int32) {
	*s = slot{fixKey(k), v}
	h.used++
}

// full reports whether the next new key needs a rebuild first.
func (h *hashIndex) full() bool { return h.used >= h.limit }

// reset empties the table.
func (h *hashIndex) reset() {
	clear(h.slots)
	h.used = 0
}
