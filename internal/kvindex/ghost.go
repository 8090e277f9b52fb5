package kvindex

// ghosts remembers the last blocks that left the whole index (evicted from
// the last replica holding them), so the index can tell how often an
// evicted block is asked for again: the chance that the blocks a full cache
// evicts for new ones would have been worth keeping. A block found among the
// ghosts when a prompt is matched is such a regret.
type ghosts struct {
	ring  []uint64 // FIFO of ghost hashes (0: empty slot)
	next  int
	set   table // hash -> 1 while in the ring
	added float64
	hits  float64
	since int // additions since the last halving of added and hits
}

// ghostCapacity bounds the ghosts (about 1 MiB with its table).
const ghostCapacity = 1 << 16

// ghostHalfLife is the number of additions after which the counts halve, so
// the reuse rate follows the traffic.
const ghostHalfLife = ghostCapacity / 4

func (g *ghosts) add(h uint64) {
	if g.ring == nil {
		g.ring = make([]uint64, ghostCapacity)
		g.set = newTable()
	}
	if old := g.ring[g.next]; old != 0 {
		g.set.del(old)
	}
	h = fixKey(h)
	g.ring[g.next] = h
	g.next = (g.next + 1) % len(g.ring)
	g.set.put(h, 1)
	g.added++
	if g.since++; g.since >= ghostHalfLife {
		g.since = 0
		g.added /= 2
		g.hits /= 2
	}
}

// has reports whether h is a ghost.
func (g *ghosts) has(h uint64) bool {
	if g.ring == nil {
		return false
	}
	_, ok := g.set.get(fixKey(h))
	return ok
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
// a prompt no replica holds), each counted once: a found ghost is removed
// from the set so a repeated prompt does not count it again.
func (x *Index) countGhosts(blocks []uint64) {
	g := &x.ghosts
	for _, h := range blocks {
		if !g.has(h) {
			return
		}
		g.set.del(fixKey(h))
		g.hits++
	}
}
