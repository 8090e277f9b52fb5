package engine

import "math/bits"

// hashIndex maps block hashes to block numbers: an open-addressing table
// with linear probing and backward-shift deletion (no tombstones, so heavy
// insert/evict churn does not slow lookups down, which it does for a Go map
// here). Key 0 marks an empty slot; the hash 0 is stored as 1 (a collision
// with probability 2^-64).
type hashIndex struct {
	slots []slot // key and value side by side: one cache line per probe
	shift uint   // 64 - log2(len(slots))
	mask  uint64
	n     int
}

type slot struct {
	key uint64
	val int32
}

// newHashIndex returns a table for up to max entries at load <= 1/2.
func newHashIndex(max int) *hashIndex {
	size := 16
	for size < 2*max {
		size *= 2
	}
	return &hashIndex{
		slots: make([]slot, size),
		shift: uint(64 - bits.TrailingZeros(uint(size))),
		mask:  uint64(size - 1),
	}
}

func (h *hashIndex) home(k uint64) uint64 { return (k * 0x9e3779b97f4a7c15) >> h.shift }

func fixKey(k uint64) uint64 {
	if k == 0 {
		return 1
	}
	return k
}

// get returns the value stored under k.
func (h *hashIndex) get(k uint64) (int32, bool) {
	k = fixKey(k)
	for i := h.home(k); ; i = (i + 1) & h.mask {
		switch s := &h.slots[i]; s.key {
		case k:
			return s.val, true
		case 0:
			return 0, false
		}
	}
}

// put stores v under k unless k is present; it reports whether it stored.
func (h *hashIndex) put(k uint64, v int32) bool {
	k = fixKey(k)
	for i := h.home(k); ; i = (i + 1) & h.mask {
		switch s := &h.slots[i]; s.key {
		case k:
			return false
		case 0:
			*s = slot{k, v}
			h.n++
			return true
		}
	}
}

// del removes k if it maps to v.
func (h *hashIndex) del(k uint64, v int32) {
	k = fixKey(k)
	i := h.home(k)
	for ; ; i = (i + 1) & h.mask {
		if h.slots[i].key == 0 {
			return
		}
		if h.slots[i].key == k {
			break
		}
	}
	if h.slots[i].val != v {
		return
	}
	// Backward-shift: move later entries of the cluster into the hole when
	// their home slot does not lie cyclically in (hole, j].
	h.n--
	for j := (i + 1) & h.mask; h.slots[j].key != 0; j = (j + 1) & h.mask {
		home := h.home(h.slots[j].key)
		if (j-home)&h.mask >= (j-i)&h.mask {
			h.slots[i] = h.slots[j]
			i = j
		}
	}
	h.slots[i] = slot{}
}
