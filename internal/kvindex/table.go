package kvindex

// table is an open-addressing hash map from a block hash to a node index,
// with linear probing and backward-shift deletion. The index inserts and
// deletes a block for nearly every block it evicts, and Go's built-in map
// slows down under such churn (deleted slots lengthen its probe sequences
// until it grows); backward-shift deletion leaves no such slots.
type table struct {
	keys  []uint64 // 0 = empty; key 0 is stored as zeroKey
	vals  []int32
	n     int
	mask  uint64
	shift uint // 64 - log2(len(keys)): slot takes the product's top bits
}

// zeroKey stands for block hash 0, since 0 marks an empty slot.
const zeroKey = 0x9e3779b97f4a7c15

func newTable() table {
	const initial = 1024
	return table{keys: make([]uint64, initial), vals: make([]int32, initial), mask: initial - 1, shift: 64 - 10}
}

func fixKey(h uint64) uint64 {
	if h == 0 {
		return zeroKey
	}
	return h
}

// slot is the home slot of key k (a multiplicative mix of k).
func (t *table) slot(k uint64) uint64 { return k * 0x9e3779b97f4a7c15 >> t.shift }

func (t *table) get(h uint64) (int32, bool) {
	k := fixKey(h)
	for i := t.slot(k); ; i = (i + 1) & t.mask {
		switch t.keys[i] {
		case k:
			return t.vals[i], true
		case 0:
			return 0, false
		}
	}
}

func (t *table) put(h uint64, v int32) {
	if 2*(t.n+1) > len(t.keys) {
		t.grow()
	}
	k := fixKey(h)
	for i := t.slot(k); ; i = (i + 1) & t.mask {
		switch t.keys[i] {
		case k:
			t.vals[i] = v
			return
		case 0:
			t.keys[i], t.vals[i] = k, v
			t.n++
			return
		}
	}
}

func (t *table) del(h uint64) {
	k := fixKey(h)
	i := t.slot(k)
	for ; t.keys[i] != k; i = (i + 1) & t.mask {
		if t.keys[i] == 0 {
			return
		}
	}
	// Backward shift: move later entries of the probe run into the hole
	// when their home slot is not after it.
	for j := (i + 1) & t.mask; t.keys[j] != 0; j = (j + 1) & t.mask {
		home := t.slot(t.keys[j])
		if (j-home)&t.mask >= (j-i)&t.mask {
			t.keys[i], t.vals[i] = t.keys[j], t.vals[j]
			i = j
		}
	}
	t.keys[i], t.vals[i] = 0, 0
	t.n--
}

func (t *table) grow() {
	old, oldVals := t.keys, t.vals
	t.keys = make([]uint64, 2*len(old))
	t.vals = make([]int32, 2*len(old))
	t.mask = uint64(len(t.keys) - 1)
	t.shift--
	t.n = 0
	for i, k := range old {
		if k != 0 {
			t.put(k, oldVals[i]) // k is already fixed; put maps only 0
		}
	}
}
