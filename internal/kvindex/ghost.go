package kvindex

// ghosts remembers the last blocks that left the whole index (evicted from
// the last replica holding them), so the index can tell how often an
// evicted block is asked for again: the chance that the blocks a full cache
// evicts for new ones would have been worth keeping. A block found among the
// ghosts when a prompt is matched is such a regret.
//
// The set of ghosts is a flag in the block table's slots (slot.ghost), so
// that a block leaving the index becomes a ghost in the slot it already
// has; the ring remembers their order.
type ghosts struct {
	ring []uint64 // FIFO of ghost hashes (0: empty slot)
	// rep and ord say, per ring position, which replica's eviction made
	// the ghost (none: a block no replica held, or one of a removed
	// replica) and that replica's evictions before it (replica.evictions).
	rep   []int32
	ord   []uint32
	next  int
	added float64
	hits  float64
	since int // additions since the last halving of added and hits
}

// ghostCapacity bounds the ghosts (512 KiB of ring).
const ghostCapacity = 1 << 16

// ghostHalfLife is the number of additions after which the counts halve, so
// the reuse rate follows the traffic.
const ghostHalfLife = ghostCapacity / 4

// addGhost makes h a ghost (and frees its slot's node, if any: freed says
// it had one), evicted by replica rep (none if by no replica) after ord of
// its evictions; the oldest ghost, if the ring is full, stops being one.
func (x *Index) addGhost(h uint64, freed bool, rep int32, ord uint32) {
	g := &x.ghosts
	if g.ring == nil {
		g.ring = make([]uint64, ghostCapacity)
		g.rep = make([]int32, ghostCapacity)
		g.ord = make([]uint32, ghostCapacity)
	}
	if old := g.ring[g.next]; old != 0 {
		x.unghost(old)
	}
	t := &x.nodes
	h = fixKey(h)
	pos := g.next
	g.ring[pos] = h
	g.rep[pos] = rep
	if rep != none {
		r := &x.reps[rep]
		g.ord[pos] = ord
		r.margAdded++
		if r.margSince++; r.margSince >= max(r.cap, 64) {
			r.margSince = 0
			r.margAdded /= 2
			r.margHits /= 2
		}
	}
	g.next = (g.next + 1) & (len(g.ring) - 1)
	t.reserve()
	i, ok := t.find(h)
	if !ok {
		t.fill(i, h, none)
	}
	t.slots[i].ghost = true
	t.slots[i].ring = uint16(pos)
	if freed {
		t.slots[i].val = none
		x.live--
	}
	g.added++
	if g.since++; g.since >= ghostHalfLife {
		g.since = 0
		g.added /= 2
		g.hits /= 2
	}
}

// unghost makes h no ghost; its slot goes if it holds no node either.
func (x *Index) unghost(h uint64) {
	t := &x.nodes
	i, ok := t.find(h)
	if !ok || !t.slots[i].ghost {
		return
	}
	t.clearGhost(i)
}

// clearGhost makes slot i's block no ghost; the slot goes if it holds no
// node either.
func (t *table) clearGhost(i uint64) {
	t.slots[i].ghost = false
	if t.slots[i].val == none {
		t.delAt(i)
	}
}

// Reuse is the recent share of blocks that left the index and were then
// asked for again, in [0, 1]; 0 until blocks have left.
func (x *Index) Reuse() float64 {
	g := &x.ghosts
	if g.added < 1 {
		return 0
	}
	return min(1, g.hits/g.added)
}

// countGhosts counts the run of ghosts at the start of blocks (the part of
// a prompt no replica holds), each counted once: a found ghost stops being
// one, so a repeated prompt does not count it again.
func (x *Index) countGhosts(blocks []uint64) {
	t := &x.nodes
	if x.ghosts.ring == nil {
		return
	}
	for j, h := range blocks {
		if j == 1 || j&7 == 0 && j > 0 { // a run: load the next slots at once
			var sink uint64
			for _, h := range blocks[j:min(j+8, len(blocks))] {
				sink += t.peek(h)
			}
			x.sink += sink
		}
		i, ok := t.find(h)
		if !ok || !t.slots[i].ghost {
			return
		}
		x.ghosts.hits++
		if pos := t.slots[i].ring; x.ghosts.rep[pos] != none {
			r := &x.reps[x.ghosts.rep[pos]]
			if float64(r.evictions-x.ghosts.ord[pos]) <= x.margin*float64(r.cap) {
				r.margHits++
			}
		}
		t.clearGhost(i)
	}
}

// SetMargin sets the share of each replica's capacity past its edge within
// which an evicted block asked for again counts towards MarginalReuse (0,
// the default, counts none).
func (x *Index) SetMargin(share float64) { x.margin = max(share, 0) }

// MarginalReuse is the recent share of the blocks replica rep evicted that
// were asked for again while a cache larger by the margin (SetMargin, a
// share of its capacity) would still have held them: divided by the margin,
// the hits one more block of its cache would have kept per block it
// evicts, the marginal utility that cache partitioning measures with
// shadow tags (Qureshi and Patt, "Utility-Based Cache Partitioning", MICRO
// 2006). It tells a replica whose evictions cost hits from one whose
// evicted blocks were not coming back soon (its cache already keeps what
// its traffic reuses, or too little of it to matter). Only blocks that left
// the whole index count: one still held elsewhere is not lost to the fleet.
// ok is false until the replica has evicted 32 blocks.
func (x *Index) MarginalReuse(rep int32) (reuse float64, ok bool) {
	if int(rep) >= len(x.reps) {
		return 0, false
	}
	r := &x.reps[rep]
	if r.margAdded < 32 {
		return 0, false
	}
	return min(1, r.margHits/r.margAdded), true
}
