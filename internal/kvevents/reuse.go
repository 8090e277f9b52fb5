package kvevents

// Marginal reuse from the events: for each replica, the share of the
// blocks its GPU cache evicted that were computed again (stored again by
// any replica) while a cache larger by a margin would still have held
// them. It is what kvindex.MarginalReuse measures on the balancer's own
// guess of each cache, measured instead on what the engines report: every
// balancer reading the same events gets the same figure, whatever share of
// the traffic it routes.

// ghostCap bounds the evicted blocks remembered (1.5 MiB of ring).
const ghostCap = 1 << 16

// ghost is one block evicted from a replica's GPU cache.
type ghost struct {
	key uint64
	rep *repBlocks
	ord uint32 // the replica's evictions, this one counted
}

// ghostRing remembers the last ghostCap blocks that left a GPU cache, in
// order, with where each is in the ring (its latest eviction).
type ghostRing struct {
	ring []ghost
	at   map[uint64]int32
	next int
}

// margin is a replica's marginal-reuse counts.
type margin struct {
	gpu       int    // keys held in the GPU cache
	peak      int    // most keys held there at once: its capacity, once full
	evictions uint32 // keys that left the GPU cache, held elsewhere or not
	added     float64
	hits      float64
	since     int
}

// SetMargin sets the share of each replica's capacity (the most blocks
// its GPU cache has held at once) past its edge within which an evicted
// block computed again counts towards MarginalReuse; 0, the default,
// keeps no ghosts.
func (x *Index) SetMargin(share float64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.margin = max(share, 0)
}

// MarginalReuse is the recent share of the blocks replica rep's GPU cache
// evicted that were computed again, by any replica, while a cache larger
// by the margin (SetMargin) would still have held them. ok is false until
// the replica has evicted 32 blocks.
func (x *Index) MarginalReuse(rep string) (reuse float64, ok bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	r := x.reps[rep]
	if r == nil || r.marg.added < 32 {
		return 0, false
	}
	return min(1, r.marg.hits/r.marg.added), true
}

// gpuStored records that replica r's GPU cache now holds key k: a block
// computed again, if it was a ghost.
func (x *Index) gpuStored(r *repBlocks, k uint64) {
	x.computed.Add(1)
	r.risk.stored(k)
	r.marg.gpu++
	r.marg.peak = max(r.marg.peak, r.marg.gpu)
	g := &x.ghosts
	i, ok := g.at[k]
	if !ok {
		return
	}
	delete(g.at, k)
	gh := &g.ring[i]
	if o := gh.rep; o != nil && float64(o.marg.evictions-gh.ord) <= x.margin*float64(o.marg.peak) {
		o.marg.hits++
	}
	gh.rep = nil
}

// gpuLeft records that key k left replica r's GPU cache: a ghost, unless
// another replica's GPU cache still holds it (the fleet did not lose it;
// kvindex counts only blocks that left the whole index alike). That looks
// at every other replica, so a block leaving costs a map lookup per
// publishing replica.
func (x *Index) gpuLeft(r *repBlocks, k uint64) {
	r.risk.left(k)
	r.marg.gpu = max(0, r.marg.gpu-1)
	r.marg.evictions++
	if x.margin == 0 {
		return
	}
	for _, o := range x.reps {
		if o != r && o.blocks[k]&onGPU != 0 {
			return
		}
	}
	g := &x.ghosts
	if g.ring == nil {
		g.ring = make([]ghost, ghostCap)
		g.at = make(map[uint64]int32)
	}
	if old := &g.ring[g.next]; old.rep != nil {
		if i, ok := g.at[old.key]; ok && int(i) == g.next {
			delete(g.at, old.key)
		}
	}
	g.ring[g.next] = ghost{key: k, rep: r, ord: r.marg.evictions}
	if i, ok := g.at[k]; ok {
		g.ring[i].rep = nil // evicted again elsewhere: the latest counts
	}
	g.at[k] = int32(g.next)
	g.next = (g.next + 1) % ghostCap
	m := &r.marg
	m.added++
	if m.since++; m.since >= max(m.peak, 64) {
		m.since = 0
		m.added /= 2
		m.hits /= 2
	}
}
