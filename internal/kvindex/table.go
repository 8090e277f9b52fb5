package kvindex

// table is an open-addressing hash map from a block hash to a node index,
// a ghost flag and the ghost's place in the ring (ghost.go),
// with linear probing and backward-shift deletion. The index inserts and
// deletes a block for nearly every block it evicts, and Go's built-in map
// slows down under such churn (deleted slots lengthen its probe sequences
// until it grows); backward-shift deletion leaves no such slots. A key and
// its value share a slot, so a probe touches one cache line.
type table struct {
	slots []slot // key 0 = empty; key 0 is stored as zeroKey
	n     int
	mask  uint64
	shift uint // 64 - log2(len(slots)): home takes the product's top bits
}

type slot struct {
	key   uint64
	val   int32 // node index; none in a slot kept only for a ghost
	ghost bool
	ring  uint16 // the ghost's position in the ring (ghostCapacity is 1<<16)
}

// zeroKey stands for block hash 0, since 0 marks an empty slot.
const zeroKey = 0x9e3779b97f4a7c15

func newTable() table {
	const initial = 1024
	return table{slots: make([]slot, initial), mask: initial - 1, shift: 64 - 10}
}

func fixKey(h uint64) uint64 {
	if h == 0 {
		return zeroKey
	}
	return h
}

// home is the first slot probed for key k (a multiplicative mix of k).
func (t *table) home(k uint64) uint64 { return k * 0x9e3779b97f4a7c15 >> t.shift }

// get returns the node of h, if it has one.
func (t *table) get(h uint64) (int32, bool) {
	k := fixKey(h)
	for i := t.home(k); ; i = (i + 1) & t.mask {
		switch s := &t.slots[i]; s.key {
		case k:
			return s.val, s.val != none
		case 0:
			return 0, false
		}
	}
}

func (t *table) put(h uint64, v int32) {
	if 2*(t.n+1) > len(t.slots) {
		t.grow()
	}
	k := fixKey(h)
	for i := t.home(k); ; i = (i + 1) & t.mask {
		switch s := &t.slots[i]; s.key {
		case k:
			s.val = v
			return
		case 0:
			s.key, s.val = k, v
			t.n++
			return
		}
	}
}

// peek loads the first slot probed for h, so that a later lookup finds it
// in the cache; it returns the slot's key (for the caller to keep the load).
func (t *table) peek(h uint64) uint64 {
	if t.slots == nil {
		return 0
	}
	return t.slots[t.home(fixKey(h))].key
}

// reserve grows the table if one more key would fill it over half, so that
// the empty slot find returns can take a key.
func (t *table) reserve() {
	if 2*(t.n+1) > len(t.slots) {
		t.grow()
	}
}

// find returns the slot holding h, or the empty slot where h would go, and
// whether h is there.
func (t *table) find(h uint64) (uint64, bool) {
	k := fixKey(h)
	for i := t.home(k); ; i = (i + 1) & t.mask {
		switch t.slots[i].key {
		case k:
			return i, true
		case 0:
			return i, false
		}
	}
}

// fill stores h -> v in the empty slot i that find returned for h.
func (t *table) fill(i, h uint64, v int32) {
	t.slots[i] = slot{key: fixKey(h), val: v}
	t.n++
}

func (t *table) del(h uint64) {
	if i, ok := t.find(h); ok {
		t.delAt(i)
	}
}

// delAt empties slot i.
func (t *table) delAt(i uint64) {
	// Backward shift: move later entries of the probe run into the hole
	// when their home slot is not after it.
	for j := (i + 1) & t.mask; t.slots[j].key != 0; j = (j + 1) & t.mask {
		h := t.home(t.slots[j].key)
		if (j-h)&t.mask >= (j-i)&t.mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = slot{}
	t.n--
}

func (t *table) grow() {
	old := t.slots
	t.slots = make([]slot, 2*len(old))
	t.mask = uint64(len(t.slots) - 1)
	t.shift--
	t.n = 0
	for _, s := range old {
		if s.key != 0 {
			i, _ := t.find(s.key) // the key is already fixed; find maps only 0
			t.slots[i] = s
			t.n++
		}
	}
}
