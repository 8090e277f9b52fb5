package kvindex

// The index as it was before the leaf-only LRU (commit bb4ea5c: index.go,
// ghost.go, table.go), kept unexported as the reference model the
// differential tests drive beside Index. Names changed, and one fix (marked
// "fix"): its Touch reused the nodes a Match of the same slice had found
// unless nodes were freed during the Touch, so nodes freed between the two
// (RemoveReplica, a smaller SetCapacity) were used after being freed. Policy
// cost always matches right before it touches, so it never did that;
// FuzzIndexMatchesReference found it.

// refNone marks the end of a list in the arenas.
const refNone int32 = -1

// refIndex maps prompt block hashes to the replicas believed to hold them.
// Replicas are small dense ids chosen by the caller (0, 1, 2, ...).
type refIndex struct {
	nodes    refTable // block hash -> refNode
	refNode  []refNode
	freeNode int32

	ent     []refEntry
	freeEnt int32

	reps []refReplicaLRU // by replica id

	clock   uint32 // Touch calls so far
	evicted int    // older blocks the current Touch evicted
	freed   uint64 // nodes freed so far (their indices may be reused)

	refGhosts refGhosts // blocks that recently left the index (ghost.go)

	// path holds the nodes of the last Match's blocks (path[d] for block
	// d), so that a Touch of the same blocks right after skips the lookups.
	path       []int32
	pathBlocks []uint64
	pathFreed  uint64 // fix: x.freed at the Match
}

// refNode is one block hash and the replicas holding it.
type refNode struct {
	hash    uint64
	holders []refHolder
}

// refHolder is one replica holding a refNode, with its refEntry in that replica's LRU.
type refHolder struct {
	rep, ent int32
}

// refEntry is one (block, replica) pair in the replica's LRU list.
type refEntry struct {
	refNode    int32
	prev, next int32  // towards the most / least recently used; refNone at the ends
	stamp      uint32 // Touch call that last used it (wraps after 2^32 calls)
	pins       int32  // requests in flight holding it: not evicted (added with Pin)
}

// refReplicaLRU is one replica's list: head is the most recently used refEntry.
type refReplicaLRU struct {
	head, tail int32
	n, cap     int
	epoch      int // RemoveReplica calls: voids the refPins taken before
	phantom    int // unnamed blocks, counted in n, evicted first (Forget)
}

// refPin is what one refIndex.Pin marked: every pair of the prompt's
// leading run that the replica held.
type refPin struct {
	rep     int32
	epoch   int
	entries []int32
}

// Pin marks the leading run of the prompt's blocks that rep holds as held
// by a request in flight: none of those pairs is evicted until Unpin. A
// full replica then evicts its least recently used unpinned pair, and with
// none left it grows past its capacity.
func (x *refIndex) Pin(rep int32, blocks []uint64) *refPin {
	if int(rep) >= len(x.reps) {
		return nil
	}
	p := &refPin{rep: rep, epoch: x.reps[rep].epoch}
	for _, h := range blocks {
		ei := x.entryOf(rep, h)
		if ei == refNone {
			break
		}
		x.ent[ei].pins++
		p.entries = append(p.entries, ei)
	}
	return p
}

// Unpin releases a refPin taken since the replica was last removed.
func (x *refIndex) Unpin(p *refPin) {
	if p == nil || x.reps[p.rep].epoch != p.epoch {
		return
	}
	for _, ei := range p.entries {
		x.ent[ei].pins--
	}
	p.entries = nil
}

func (x *refIndex) entryOf(rep int32, h uint64) int32 {
	ni, ok := x.nodes.get(h)
	if !ok {
		return refNone
	}
	for _, hd := range x.refNode[ni].holders {
		if hd.rep == rep {
			return hd.ent
		}
	}
	return refNone
}

// victim is replica rep's least recently used unpinned pair, or refNone.
func (x *refIndex) victim(rep int32) int32 {
	ei := x.reps[rep].tail
	for ei != refNone && x.ent[ei].pins > 0 {
		ei = x.ent[ei].prev
	}
	return ei
}

// New returns an empty index.
func newRefIndex() *refIndex {
	return &refIndex{nodes: newRefTable(), freeNode: refNone, freeEnt: refNone}
}

// grow makes sure replica id rep exists (capacity 0 until SetCapacity).
func (x *refIndex) grow(rep int32) {
	for int32(len(x.reps)) <= rep {
		x.reps = append(x.reps, refReplicaLRU{head: refNone, tail: refNone})
	}
}

// SetCapacity bounds replica rep's share of the index to blocks entries,
// evicting its least recently used blocks if it now holds more. A capacity
// of 0 or less holds nothing.
func (x *refIndex) SetCapacity(rep int32, blocks int) {
	x.grow(rep)
	r := &x.reps[rep]
	r.cap = max(blocks, 0)
	for r.n > r.cap && (r.phantom > 0 || x.victim(rep) != refNone) {
		x.evict(rep)
	}
}

// Capacity returns replica rep's bound in blocks.
func (x *refIndex) Capacity(rep int32) int {
	if int(rep) >= len(x.reps) {
		return 0
	}
	return x.reps[rep].cap
}

// Len returns the number of blocks replica rep holds in the index.
func (x *refIndex) Len(rep int32) int {
	if int(rep) >= len(x.reps) {
		return 0
	}
	return x.reps[rep].n
}

// Match writes into depth[rep], for every replica id below len(depth), the
// number of leading blocks of the prompt that replica holds. depth must be
// zeroed by the caller; replicas without a match keep 0. It returns the
// deepest match. The walk stops at the first block no replica continues.
func (x *refIndex) Match(blocks []uint64, depth []int32) (deepest int) {
	x.path, x.pathBlocks = x.path[:0], blocks
	x.pathFreed = x.freed // fix
	for d, h := range blocks {
		ni, ok := x.nodes.get(h)
		if !ok {
			break
		}
		x.path = append(x.path, ni)
		advanced := false
		for _, hd := range x.refNode[ni].holders {
			if int(hd.rep) < len(depth) && depth[hd.rep] == int32(d) {
				depth[hd.rep] = int32(d + 1)
				advanced = true
			}
		}
		if !advanced {
			break
		}
		deepest = d + 1
	}
	x.countGhosts(blocks[len(x.path):])
	return deepest
}

// Touch records that replica rep was sent a prompt with these blocks: each
// becomes its most recently used, the first block last, so that the prompt's
// tail is evicted before its shared head (vLLM frees a request's blocks in
// reverse order). New blocks beyond the replica's capacity evict its least
// recently used ones.
func (x *refIndex) Touch(rep int32, blocks []uint64) Touched {
	x.grow(rep)
	if x.reps[rep].cap == 0 {
		return Touched{Stamp: x.clock}
	}
	x.clock++
	x.evicted = 0
	// Nodes the last Match found for these very blocks need no lookup, as
	// long as no refNode was freed in between (its index may be reused).
	known := 0
	if len(x.pathBlocks) == len(blocks) && len(blocks) > 0 && &x.pathBlocks[0] == &blocks[0] && x.freed == x.pathFreed { // fix: freed since the Match
		known = len(x.path)
	}
	path := x.path
	x.path, x.pathBlocks = x.path[:0], nil
	freedBefore := x.freed
	for i := len(blocks) - 1; i >= 0; i-- {
		ni := refNone
		if i < known && x.freed == freedBefore {
			ni = path[i]
		}
		x.touch(rep, blocks[i], ni)
	}
	return Touched{Stamp: x.clock, Evicted: x.evicted}
}

// Forget removes replica rep's pairs of the prompt past the first keep,
// deepest first, while each was last used by the Touch that returned stamp
// and no request in flight holds it; they leave no ghosts. (Added with
// Index.Forget: in a plain LRU list of pairs a later Touch through a pair
// restamps it, so the stamp alone tells a pair no later prompt used.)
func (x *refIndex) Forget(rep int32, blocks []uint64, keep int, t Touched) {
	if int(rep) >= len(x.reps) {
		return
	}
	forgot := 0
	for d := len(blocks) - 1; d >= max(keep, 0); d-- {
		ei := x.entryOf(rep, blocks[d])
		if ei == refNone {
			continue
		}
		if x.ent[ei].stamp != t.Stamp || x.ent[ei].pins > 0 {
			break
		}
		x.unlink(rep, ei)
		x.removeHolder(rep, ei, false)
		forgot++
	}
	r := &x.reps[rep]
	back := min(forgot, t.Evicted)
	r.phantom += back
	r.n += back
}

func (x *refIndex) touch(rep int32, h uint64, ni int32) {
	if ni == refNone {
		var ok bool
		if ni, ok = x.nodes.get(h); !ok {
			ni = x.newNode(h)
		}
	}
	n := &x.refNode[ni]
	for _, hd := range n.holders {
		if hd.rep == rep {
			x.moveToFront(rep, hd.ent)
			return
		}
	}
	r := &x.reps[rep]
	for r.n >= r.cap && (r.phantom > 0 || x.victim(rep) != refNone) { // none: pins fill it, and it grows
		x.evict(rep) // may not free ni: it has no refHolder rep yet
	}
	ei := x.newEntry(ni)
	x.ent[ei].stamp = x.clock
	x.refNode[ni].holders = append(x.refNode[ni].holders, refHolder{rep: rep, ent: ei})
	x.pushFront(rep, ei)
}

// RemoveReplica forgets everything replica rep holds (it left the fleet or
// restarted with an empty cache); its capacity is kept.
func (x *refIndex) RemoveReplica(rep int32) {
	if int(rep) >= len(x.reps) {
		return
	}
	for ei := x.reps[rep].head; ei != refNone; ei = x.ent[ei].next {
		x.ent[ei].pins = 0
	}
	x.reps[rep].epoch++
	for x.reps[rep].n > 0 {
		x.evict(rep)
	}
}

// Idle returns how many Touch calls ago replica rep's least recently used
// block was last used, or -1 while the replica has room (nothing needs
// evicting). Between full replicas, new data costs least where Idle is
// largest: the block it evicts is the coldest.
func (x *refIndex) Idle(rep int32) int64 {
	if int(rep) >= len(x.reps) {
		return -1
	}
	r := &x.reps[rep]
	if r.n < r.cap || r.n == 0 {
		return -1
	}
	v := x.victim(rep)
	if v == refNone {
		return 0
	}
	return int64(x.clock - x.ent[v].stamp)
}

// Nodes returns the number of distinct blocks in the index.
func (x *refIndex) Nodes() int { return x.nodes.n }

func (x *refIndex) newNode(h uint64) int32 {
	var ni int32
	if x.freeNode != refNone {
		ni = x.freeNode
		x.freeNode = x.refNode[ni].holders[0].rep // free list threaded through a sentinel refHolder
		x.refNode[ni] = refNode{hash: h, holders: x.refNode[ni].holders[:0]}
	} else {
		ni = int32(len(x.refNode))
		x.refNode = append(x.refNode, refNode{hash: h})
	}
	x.nodes.put(h, ni)
	return ni
}

func (x *refIndex) freeNodeAt(ni int32, ghost bool) {
	x.freed++
	n := &x.refNode[ni]
	if ghost {
		x.refGhosts.add(n.hash)
	}
	x.nodes.del(n.hash)
	n.holders = append(n.holders[:0], refHolder{rep: x.freeNode})
	x.freeNode = ni
}

func (x *refIndex) newEntry(ni int32) int32 {
	if x.freeEnt != refNone {
		ei := x.freeEnt
		x.freeEnt = x.ent[ei].next
		x.ent[ei] = refEntry{refNode: ni, prev: refNone, next: refNone}
		return ei
	}
	x.ent = append(x.ent, refEntry{refNode: ni, prev: refNone, next: refNone})
	return int32(len(x.ent) - 1)
}

// evict drops replica rep's least recently used unpinned block, a phantom
// first, and counts it in x.evicted if it is older than the current Touch.
func (x *refIndex) evict(rep int32) {
	if r := &x.reps[rep]; r.phantom > 0 {
		r.phantom--
		r.n--
		x.evicted++
		return
	}
	ei := x.victim(rep)
	if ei == refNone {
		return
	}
	if x.ent[ei].stamp != x.clock {
		x.evicted++
	}

	x.unlink(rep, ei)
	x.removeHolder(rep, ei, true)
}

// removeHolder frees pair ei (unlinked) of replica rep; its node goes when
// no holder is left, a ghost if evicted.
func (x *refIndex) removeHolder(rep, ei int32, evicted bool) {
	ni := x.ent[ei].refNode
	n := &x.refNode[ni]
	for i, hd := range n.holders {
		if hd.rep == rep {
			last := len(n.holders) - 1
			n.holders[i] = n.holders[last]
			n.holders = n.holders[:last]
			break
		}
	}
	if len(n.holders) == 0 {
		x.freeNodeAt(ni, evicted)
	}
	x.ent[ei] = refEntry{refNode: refNone, prev: refNone, next: x.freeEnt}
	x.freeEnt = ei
}

func (x *refIndex) pushFront(rep, ei int32) {
	r := &x.reps[rep]
	e := &x.ent[ei]
	e.prev, e.next = refNone, r.head
	if r.head != refNone {
		x.ent[r.head].prev = ei
	}
	r.head = ei
	if r.tail == refNone {
		r.tail = ei
	}
	r.n++
}

func (x *refIndex) unlink(rep, ei int32) {
	r := &x.reps[rep]
	e := &x.ent[ei]
	if e.prev != refNone {
		x.ent[e.prev].next = e.next
	} else {
		r.head = e.next
	}
	if e.next != refNone {
		x.ent[e.next].prev = e.prev
	} else {
		r.tail = e.prev
	}
	e.prev, e.next = refNone, refNone
	r.n--
}

func (x *refIndex) moveToFront(rep, ei int32) {
	x.ent[ei].stamp = x.clock
	if x.reps[rep].head == ei {
		return
	}
	x.unlink(rep, ei)
	x.pushFront(rep, ei)
}

// refGhosts remembers the last blocks that left the whole index (evicted from
// the last replica holding them), so the index can tell how often an
// evicted block is asked for again: the chance that the blocks a full cache
// evicts for new ones would have been worth keeping. A block found among the
// refGhosts when a prompt is matched is such a regret.
type refGhosts struct {
	ring  []uint64 // FIFO of ghost hashes (0: empty refSlot)
	next  int
	set   refTable // hash -> 1 while in the ring
	added float64
	hits  float64
	since int // additions since the last halving of added and hits
}

// refGhostCapacity bounds the refGhosts (about 1 MiB with its refTable).
const refGhostCapacity = 1 << 16

// refGhostHalfLife is the number of additions after which the counts halve, so
// the reuse rate follows the traffic.
const refGhostHalfLife = refGhostCapacity / 4

func (g *refGhosts) add(h uint64) {
	if g.ring == nil {
		g.ring = make([]uint64, refGhostCapacity)
		g.set = newRefTable()
	}
	if old := g.ring[g.next]; old != 0 {
		g.set.del(old)
	}
	h = refFixKey(h)
	g.ring[g.next] = h
	g.next = (g.next + 1) % len(g.ring)
	g.set.put(h, 1)
	g.added++
	if g.since++; g.since >= refGhostHalfLife {
		g.since = 0
		g.added /= 2
		g.hits /= 2
	}
}

// has reports whether h is a ghost.
func (g *refGhosts) has(h uint64) bool {
	if g.ring == nil {
		return false
	}
	_, ok := g.set.get(refFixKey(h))
	return ok
}

// Reuse is the recent share of blocks that left the index and were then
// asked for again, in [0, 1]; 0 until blocks have left.
func (x *refIndex) Reuse() float64 {
	g := &x.refGhosts
	if g.added < 1 {
		return 0
	}
	return min(1, g.hits/g.added)
}

// countGhosts counts the run of refGhosts at the start of blocks (the part of
// a prompt no replica holds), each counted once: a found ghost is removed
// from the set so a repeated prompt does not count it again.
func (x *refIndex) countGhosts(blocks []uint64) {
	g := &x.refGhosts
	for _, h := range blocks {
		if !g.has(h) {
			return
		}
		g.set.del(refFixKey(h))
		g.hits++
	}
}

// refTable is an open-addressing hash map from a block hash to a refNode index,
// with linear probing and backward-shift deletion. The index inserts and
// deletes a block for nearly every block it evicts, and Go's built-in map
// slows down under such churn (deleted slots lengthen its probe sequences
// until it grows); backward-shift deletion leaves no such slots. A key and
// its value share a refSlot, so a probe touches one cache line.
type refTable struct {
	slots []refSlot // key 0 = empty; key 0 is stored as refZeroKey
	n     int
	mask  uint64
	shift uint // 64 - log2(len(slots)): home takes the product's top bits
}

type refSlot struct {
	key uint64
	val int32
}

// refZeroKey stands for block hash 0, since 0 marks an empty refSlot.
const refZeroKey = 0x9e3779b97f4a7c15

func newRefTable() refTable {
	const initial = 1024
	return refTable{slots: make([]refSlot, initial), mask: initial - 1, shift: 64 - 10}
}

func refFixKey(h uint64) uint64 {
	if h == 0 {
		return refZeroKey
	}
	return h
}

// home is the first refSlot probed for key k (a multiplicative mix of k).
func (t *refTable) home(k uint64) uint64 { return k * 0x9e3779b97f4a7c15 >> t.shift }

func (t *refTable) get(h uint64) (int32, bool) {
	k := refFixKey(h)
	for i := t.home(k); ; i = (i + 1) & t.mask {
		switch s := &t.slots[i]; s.key {
		case k:
			return s.val, true
		case 0:
			return 0, false
		}
	}
}

func (t *refTable) put(h uint64, v int32) {
	if 2*(t.n+1) > len(t.slots) {
		t.grow()
	}
	k := refFixKey(h)
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

func (t *refTable) del(h uint64) {
	k := refFixKey(h)
	i := t.home(k)
	for ; t.slots[i].key != k; i = (i + 1) & t.mask {
		if t.slots[i].key == 0 {
			return
		}
	}
	// Backward shift: move later entries of the probe run into the hole
	// when their home refSlot is not after it.
	for j := (i + 1) & t.mask; t.slots[j].key != 0; j = (j + 1) & t.mask {
		h := t.home(t.slots[j].key)
		if (j-h)&t.mask >= (j-i)&t.mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = refSlot{}
	t.n--
}

func (t *refTable) grow() {
	old := t.slots
	t.slots = make([]refSlot, 2*len(old))
	t.mask = uint64(len(t.slots) - 1)
	t.shift--
	t.n = 0
	for _, s := range old {
		if s.key != 0 {
			t.put(s.key, s.val) // the key is already fixed; put maps only 0
		}
	}
}
