package engine

import "math/bits"

// hashIndex maps block hashes to block numbers: an open-addressing table
// with linear probing and backward-shift deletion (no tombstones, so heavy
// insert/evict churn does not slow lookups down, which it does for a Go map
// here). Key 0 marks an empty slot; the hash 0 is stored as 1 (a collision
// with probability 2^-64).
type hashIndex struct {
	keys  []uint64
	vals  []int32
	shift uint // 64 - log2(len(keys))
	mask  uint64
	n     int
}

// newHashIndex returns a table for up to max entries at load <= 1/2.
func newHashIndex(max int) *hashIndex {
	size := 16
	for size < 2*max {
		size *= 2
	}
	return &hashIndex{
		keys:  make([]uint64, size),
		vals:  make([]int32, size),
		shift: uint(64 - bits.TrailingZeros(uint(size))),
		mask:  uint64(size - 1),
	}
}

func (h *hashIndex) slot(k uint64) uint64 { return (k * 0x9e3779b97f4a7c15) >> h.shift }

func fixKey(k uint64) uint64 {
	if k == 0 {
		return 1
	}
	return k
}

// get returns the value stored under k.
func (h *hashIndex) get(k uint64) (int32, bool) {
	k = fixKey(k)
	for i := h.slot(k); ; i = (i + 1) & h.mask {
		switch h.keys[i] {
		case k:
			return h.vals[i], true
		case 0:
			return 0, false
		}
	}
}

// put stores v under k unless k is present; it reports whether it stored.
func (h *hashIndex) put(k uint64, v int32) bool {
	k = fixKey(k)
	for i := h.slot(k); ; i = (i + 1) & h.mask {
		switch h.keys[i] {
		case k:
			return false
		case 0:
			h.keys[i], h.vals[i] = k, v
			h.n++
			return true
		}
	}
}

// del removes k if it maps to v.
func (h *hashIndex) del(k uint64, v int32) {
	k = fixKey(k)
	i := h.slot(k)
	for ; ; i = (i + 1) & h.mask {
		if h.keys[i] == 0 {
			return
		}
		if h.keys[i] == k {
			break
		}
	}
	if h.vals[i] != v {
		return
	}
	// Backward-shift: move later entries of the cluster into the hole when
	// their home slot does not lie cyclically in (hole, j].
	h.n--
	for j := (i + 1) & h.mask; h.keys[j] != 0; j = (j + 1) & h.mask {
		home := h.slot(h.keys[j])
		if (j-home)&h.mask >= (j-i)&h.mask {
			h.keys[i], h.vals[i] = h.keys[j], h.vals[j]
			i = j
		}
	}
	h.keys[i], h.vals[i] = 0, 0
}
