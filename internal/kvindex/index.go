// Package kvindex is the balancer's picture of what each replica holds in its
// KV prefix cache: for every replica, the chained block hashes of the prompts
// the balancer sent there (the same hashing as vLLM and package engine: a
// block's hash covers its whole prefix), bounded by that replica's real KV
// capacity and evicted least-recently-used first, like vLLM's free-block
// queue, so the index stops matching what the replica has evicted.
//
// One hash table from block hash to node serves all replicas: each node lists
// the replicas that hold the block. Because hashes are chained and a prompt's
// blocks are used deepest first, head last, a block is never less recently
// used than its descendants, so LRU eviction keeps every replica's share
// closed under prefixes: a replica that holds block d of a prompt holds blocks
// 0..d-1 too. Two things follow. The number of holders is non-increasing
// along a prompt, so Match finds where it drops by bisection, a few lookups
// per prompt instead of one per block. And a replica's least recently used
// block is always a leaf of its forest of chains, so only leaves sit in the
// replica's LRU list: a hit on a prompt it holds writes one entry, not one per
// block, and an interior block's recency is derived when its last child is
// evicted (it was used with that child, one step later). The order of
// evictions, and so every match, is exactly that of a plain LRU list of
// every (block, replica) pair, which reference_test.go keeps as the model.
//
// What is left is mostly cache misses in a table of up to millions of slots:
// an evicted block leaves the table (it stays as a ghost in its slot,
// ghost.go), a new one enters it. They are done in batches, each after a
// pass that loads all the slots involved, so that the misses overlap.
//
// Entries ((block, replica) pairs) and nodes live in arenas indexed by int32
// with free lists, so a steady state allocates nothing. An Index is not safe
// for concurrent use; the policy that owns it runs under the balancer's lock.
package kvindex

// none marks the end of a list in the arenas.
const none int32 = -1

// Marks in entry.next for entries outside their replica's leaf list.
const (
	inHeap   int32 = -2 // a leaf in the replica's heap; prev is its position
	interior int32 = -3 // an entry with held children; prev counts them
	pinned   int32 = -4 // a leaf that requests in flight hold: in neither
)

// Index maps prompt block hashes to the replicas believed to hold them.
// Replicas are small dense ids chosen by the caller (0, 1, 2, ...). Block
// hashes must be chained (a hash stands for its whole prefix), as package
// tokenize makes them; otherwise matches are still safe but not exact.
type Index struct {
	nodes    table // block hash -> node
	node     []node
	freeNode int32

	ent     []entry
	freeEnt int32

	reps []replica // by replica id

	clock uint32 // Touch calls so far
	gen   uint64 // changes to the holders so far

	live     int         // nodes in the table
	ghosts   ghosts      // blocks that recently left the index (ghost.go)
	margin   float64     // share of a replica's capacity MarginalReuse looks past its edge
	removing bool        // RemoveReplica is evicting: its ghosts are no replica's
	budget   int         // most blocks all replicas together may hold (SetBudget)
	claims   int         // sum of the replicas' claims
	gone     []goneBlock // freed nodes, until flush
	sink     uint64      // keeps the loads of flush's first pass

	// drops holds the last Match's drop points, deepest first, so that a
	// Touch of the same blocks right after (no change in between) finds the
	// replica's deepest block without lookups.
	drops      []drop
	dropBlocks []uint64
	dropGen    uint64
}

// drop is a block of the matched prompt whose holders do not all hold the
// next one: some replicas' matches end there.
type drop struct {
	d, node int32
}

// node is one block hash and the replicas holding it: the first inline
// (most blocks have one holder, and evicting it then touches one line), the
// others in more. A free node has first.rep == none and threads the free
// list through first.ent.
type node struct {
	hash  uint64
	first holder
	more  []holder
}

// count returns the number of holders.
func (n *node) count() int {
	if n.first.rep == none {
		return 0
	}
	return 1 + len(n.more)
}

// entryOf returns replica rep's entry for the block, or none.
func (n *node) entryOf(rep int32) int32 {
	if n.first.rep == rep {
		return n.first.ent
	}
	for _, hd := range n.more {
		if hd.rep == rep {
			return hd.ent
		}
	}
	return none
}

func (n *node) add(hd holder) {
	if n.first.rep == none {
		n.first = hd
		return
	}
	n.more = append(n.more, hd)
}

// remove drops replica rep from the holders and reports whether none is left.
func (n *node) remove(rep int32) bool {
	last := len(n.more) - 1
	if n.first.rep == rep {
		if last < 0 {
			n.first.rep = none
			return true
		}
		n.first, n.more = n.more[last], n.more[:last]
		return false
	}
	for i, hd := range n.more {
		if hd.rep == rep {
			n.more[i] = n.more[last]
			n.more = n.more[:last]
			break
		}
	}
	return false
}

// holder is one replica holding a node, with its entry.
type holder struct {
	rep, ent int32
}

// entry is one (block, replica) pair. Leaves (no held children) sit in the
// replica's LRU list, most recent first, or, when their recency is out of
// the list's order, in its heap; interior entries sit in neither.
type entry struct {
	node   int32
	parent int32 // the entry of the block before, same replica; none at depth 0
	// stamp is the Touch call that last used a leaf. For an interior entry
	// it is the last Touch that ended at its block; its recency once it
	// becomes a leaf is the later of that and its last child's.
	stamp uint32
	// prev and next link a leaf in the list (towards the most / least
	// recently used; none at the ends); next is inHeap, interior or pinned
	// for the others, and prev their heap position or held children.
	prev, next int32
	// pins counts the requests in flight that hold the block (Pin): it is
	// not evicted, and neither are its ancestors, which it keeps interior.
	pins int32
}

// replica is one replica's share: its leaves, the oldest last.
type replica struct {
	head, tail int32 // the leaf list, in recency order
	// heap holds leaves whose recency came from a Touch that ended at an
	// interior block: when its children are gone it is more recent than
	// the list's tail, so it goes here, ordered by stamp.
	heap   []int32
	n, cap int
	// claim is the capacity the caller set (the replica's reported KV
	// capacity); cap is what the index's budget leaves of it.
	claim int
	// phantom counts blocks the replica holds that the index cannot name:
	// those a Touch evicted for a prompt that Forget then took back (the
	// replica never computed it, so it still holds what the index had
	// evicted). They are its least recently used, counted in n and evicted
	// before any other.
	phantom int
	oldest  uint32 // stamp of the least recently used leaf, when n > 0
	dirty   bool   // oldest must be recomputed
	// pinned counts the entries with pins; epoch changes when RemoveReplica
	// drops them, so that the Pins handed out before are not undone twice.
	pinned  int
	epoch   uint32
	pinList []int32 // entries pinned since RemoveReplica, some stale (pin.go)

	// evictions counts the blocks evicted for room; margAdded and margHits
	// (halved every max(cap, 64) of them) the ghosts those evictions made
	// recently and those of them asked for again within the margin
	// (MarginalReuse).
	evictions           uint32
	margSince           int
	margAdded, margHits float64
}

// goneBlock is a freed node's hash, the replica whose eviction freed it
// and that replica's evictions before it.
type goneBlock struct {
	hash uint64
	rep  int32
	ord  uint32
}

// DefaultBudgetBlocks is the default bound on the blocks the whole index
// holds, all replicas together: 2^20 blocks (16M tokens at 16 tokens a
// block, about 120 MB of index). A replica's reported KV capacity sizes its
// share; a replica that lies about it (2^32 blocks) would otherwise let the
// index grow with every unique prompt.
const DefaultBudgetBlocks = 1 << 20

// New returns an empty index with the default budget.
func New() *Index {
	return &Index{nodes: newTable(), freeNode: none, freeEnt: none, budget: DefaultBudgetBlocks}
}

// SetBudget bounds the blocks all replicas together may hold (at least 1).
// When the replicas' capacities add up to more, each gets its capacity
// scaled down in proportion, evicting its least recently used blocks.
func (x *Index) SetBudget(blocks int) {
	x.budget = max(blocks, 1)
	x.rebalance(none)
}

// Budget returns the bound on the blocks of all replicas together.
func (x *Index) Budget() int { return x.budget }

// Total returns the blocks all replicas together hold.
func (x *Index) Total() int {
	n := 0
	for i := range x.reps {
		n += x.reps[i].n
	}
	return n
}

// rebalance sets every replica's effective capacity from its claim and the
// budget, evicting where a capacity shrank, and in replica set (none: no
// replica) in any case: pins may have let it grow past its capacity.
func (x *Index) rebalance(set int32) {
	for rep := range x.reps {
		r := &x.reps[rep]
		eff := r.claim
		if x.claims > x.budget {
			eff = int(int64(r.claim) * int64(x.budget) / int64(x.claims))
		}
		if eff == r.cap && int32(rep) != set {
			continue
		}
		r.cap = eff
		for r.n > r.cap && (r.phantom > 0 || x.lru(r) != none) {
			x.evict(int32(rep))
		}
		x.flush()
		x.settle(r)
	}
}

// grow makes sure replica id rep exists (capacity 0 until SetCapacity).
func (x *Index) grow(rep int32) {
	for int32(len(x.reps)) <= rep {
		x.reps = append(x.reps, replica{head: none, tail: none})
	}
}

// SetCapacity bounds replica rep's share of the index to blocks entries
// (less when the replicas' capacities together exceed the budget),
// evicting its least recently used blocks if it now holds more. A capacity
// of 0 or less holds nothing.
func (x *Index) SetCapacity(rep int32, blocks int) {
	x.grow(rep)
	r := &x.reps[rep]
	blocks = max(blocks, 0)
	x.claims += blocks - r.claim
	r.claim = blocks
	x.rebalance(rep)
}

// Capacity returns replica rep's capacity as last set (SetCapacity).
func (x *Index) Capacity(rep int32) int {
	if int(rep) >= len(x.reps) {
		return 0
	}
	return x.reps[rep].claim
}

// EffectiveCapacity returns replica rep's bound in blocks: its capacity,
// scaled down when the replicas' capacities exceed the budget.
func (x *Index) EffectiveCapacity(rep int32) int {
	if int(rep) >= len(x.reps) {
		return 0
	}
	return x.reps[rep].cap
}

// Len returns the number of blocks replica rep holds in the index.
func (x *Index) Len(rep int32) int {
	if int(rep) >= len(x.reps) {
		return 0
	}
	return x.reps[rep].n
}

// Match writes into depth[rep], for every replica id below len(depth), the
// number of leading blocks of the prompt that replica holds. depth must be
// zeroed by the caller; replicas without a match keep 0. It returns the
// deepest match.
func (x *Index) Match(blocks []uint64, depth []int32) (deepest int) {
	x.drops, x.dropBlocks = x.drops[:0], nil
	if len(depth) < len(x.reps) {
		return x.matchWalk(blocks, depth)
	}
	x.dropBlocks, x.dropGen = blocks, x.gen
	if len(blocks) == 0 {
		return 0
	}
	c0, n0 := x.count(blocks[0])
	if c0 > 0 {
		// The holders of block d are a subset of those of block d-1, so
		// where the count stays equal nobody's match ends.
		x.bisect(blocks, 0, c0, n0, len(blocks), 0)
		deepest = int(x.drops[0].d) + 1
		for _, dp := range x.drops {
			n := &x.node[dp.node]
			if depth[n.first.rep] == 0 {
				depth[n.first.rep] = dp.d + 1
			}
			for _, hd := range n.more {
				if depth[hd.rep] == 0 {
					depth[hd.rep] = dp.d + 1
				}
			}
		}
	}
	x.countGhosts(blocks[deepest:])
	return deepest
}

// count returns the number of replicas holding block h, and its node.
func (x *Index) count(h uint64) (int, int32) {
	ni, ok := x.nodes.get(h)
	if !ok {
		return 0, none
	}
	return x.node[ni].count(), ni
}

// countOf returns the number of holders of node ni (0 if !ok).
func (x *Index) countOf(ni int32, ok bool) int {
	if !ok {
		return 0
	}
	return x.node[ni].count()
}

// peekNode loads node ni (if ok) ahead of its use, like table.peek.
func (x *Index) peekNode(ni int32, ok bool) int32 {
	if !ok {
		return 0
	}
	return x.node[ni].first.rep
}

// bisect appends the drop points in [lo, hi) to x.drops, deepest first,
// given the counts of holders at lo and hi. A long range is cut in four at
// once: the three lookups' cache misses overlap.
func (x *Index) bisect(blocks []uint64, lo, clo int, nlo int32, hi, chi int) {
	for clo != chi {
		if hi == lo+1 {
			if clo > chi { // (a count that grows: hashes that are not chained)
				x.drops = append(x.drops, drop{d: int32(lo), node: nlo})
			}
			return
		}
		if q := (hi - lo) / 4; q >= 2 {
			m1, m2, m3 := lo+q, lo+2*q, lo+3*q
			x.sink += x.nodes.peek(blocks[m1]) + x.nodes.peek(blocks[m2]) + x.nodes.peek(blocks[m3])
			n1, ok1 := x.nodes.get(blocks[m1])
			n2, ok2 := x.nodes.get(blocks[m2])
			n3, ok3 := x.nodes.get(blocks[m3])
			x.sink += uint64(x.peekNode(n1, ok1) + x.peekNode(n2, ok2) + x.peekNode(n3, ok3))
			c1, c2, c3 := x.countOf(n1, ok1), x.countOf(n2, ok2), x.countOf(n3, ok3)
			x.bisect(blocks, m3, c3, n3, hi, chi)
			x.bisect(blocks, m2, c2, n2, m3, c3)
			x.bisect(blocks, m1, c1, n1, m2, c2)
			hi, chi = m1, c1
			continue
		}
		mid := int(uint(lo+hi) / 2)
		cmid, nmid := x.count(blocks[mid])
		x.bisect(blocks, mid, cmid, nmid, hi, chi)
		hi, chi = mid, cmid
	}
}

// matchWalk is Match for a depth slice that does not cover every replica:
// the walk stops at the first block no covered replica continues.
func (x *Index) matchWalk(blocks []uint64, depth []int32) (deepest int) {
	walked := 0
	for d, h := range blocks {
		ni, ok := x.nodes.get(h)
		if !ok {
			break
		}
		walked++
		advanced := false
		n := &x.node[ni]
		for i := range n.count() {
			hd := n.first
			if i > 0 {
				hd = n.more[i-1]
			}
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
	x.countGhosts(blocks[walked:])
	return deepest
}

// Touch records that replica rep was sent a prompt with these blocks: each
// becomes its most recently used, the first block last, so that the prompt's
// tail is evicted before its shared head (vLLM frees a request's blocks in
// reverse order). New blocks beyond the replica's capacity evict its least
// recently used ones. What it returns lets Forget undo it.
func (x *Index) Touch(rep int32, blocks []uint64) (t Touched) {
	x.grow(rep)
	r := &x.reps[rep]
	t.Stamp = x.clock
	if r.cap == 0 {
		return t
	}
	x.clock++
	t.Stamp = x.clock
	cached := x.dropBlocks != nil && x.dropGen == x.gen && len(x.dropBlocks) == len(blocks) &&
		len(blocks) > 0 && &x.dropBlocks[0] == &blocks[0]
	x.dropBlocks = nil
	if len(blocks) == 0 {
		return
	}
	x.gen++
	var h int
	var e int32
	if cached {
		h, e = x.heldFromDrops(rep)
	} else {
		h, e = x.held(rep, blocks)
	}
	// Used one by one, deepest first, the m-h new blocks each evict the
	// least recently used block when full. Those are old blocks (older
	// than any new one) until none is left; one may be this prompt's own
	// deepest held block, which then is new too and evicts one more.
	m := len(blocks)
	add := m - h
	for {
		for add > 0 && r.n+add > r.cap && r.n > 0 {
			if r.phantom == 0 {
				v := x.lru(r)
				if v == none {
					break // what is left is pinned
				}
				if v == e {
					e = x.ent[e].parent
					if h > 0 {
						h--
						add++
					}
				}
			}
			x.evict(rep)
			t.Evicted++
		}
		if e != none || h == 0 {
			break
		}
		h, add = 0, m // only for hashes that are not chained
	}
	x.flush()
	if room := r.cap - r.n; add > 0 && add > room {
		// No room for all: the prompt alone overflows the capacity, or
		// pinned blocks fill it. Each new block, deepest first, would have
		// evicted the one added before it once nothing older was left,
		// leaving the first room of them (at least one: with nothing
		// evictable the share grows past its capacity until the pins go).
		keep := h + max(room, 1)
		for j := m - 1; j >= keep; j-- {
			if _, ok := x.nodes.get(blocks[j]); !ok {
				x.addGhost(blocks[j], false, none, 0)
			}
		}
		m = keep
	}
	if h == m {
		x.hit(r, e)
	} else {
		x.attach(rep, e, blocks[h:m])
	}
	x.settle(r)
	return t
}

// Touched is what a Touch did, for Forget: its stamp and how many of the
// replica's blocks it evicted.
type Touched struct {
	Stamp   uint32
	Evicted int
}

// heldFromDrops returns how many leading blocks of the last matched prompt
// replica rep holds, and its entry for the deepest of them.
func (x *Index) heldFromDrops(rep int32) (int, int32) {
	for _, dp := range x.drops {
		if ei := x.node[dp.node].entryOf(rep); ei != none {
			return int(dp.d) + 1, ei
		}
	}
	return 0, none
}

// held returns how many leading blocks of the prompt replica rep holds, and
// its entry for the deepest of them, by bisection (its blocks are a prefix).
func (x *Index) held(rep int32, blocks []uint64) (int, int32) {
	lo, hi, e := 0, len(blocks), none
	for lo < hi {
		mid := int(uint(lo+hi) / 2)
		if ei := x.entryOf(rep, blocks[mid]); ei != none {
			lo, e = mid+1, ei
		} else {
			hi = mid
		}
	}
	return lo, e
}

// entryOf returns replica rep's entry for block h, or none.
func (x *Index) entryOf(rep int32, h uint64) int32 {
	ni, ok := x.nodes.get(h)
	if !ok {
		return none
	}
	return x.node[ni].entryOf(rep)
}

// hit marks the deepest block of a prompt the replica holds whole as just
// used; its ancestors' recency follows from it.
func (x *Index) hit(r *replica, e int32) {
	en := &x.ent[e]
	en.stamp = x.clock
	if en.next == interior || en.next == pinned {
		return
	}
	x.removeLeaf(r, e)
	x.pushFront(r, e)
}

// attach adds the blocks as a chain below entry parent (none: from the
// root); the deepest becomes a leaf, the most recently used.
func (x *Index) attach(rep int32, parent int32, blocks []uint64) {
	r := &x.reps[rep]
	var sink uint64
	for _, h := range blocks { // load the slots first, all at once (see flush)
		sink += x.nodes.peek(h)
	}
	x.sink += sink
	last := parent
	for _, h := range blocks {
		x.nodes.reserve()
		i, found := x.nodes.find(h)
		var ni int32
		if found {
			ni = x.nodes.slots[i].val
			if ni == none { // a ghost: it comes back
				ni = x.newNode(h)
				x.nodes.slots[i].val = ni
				x.live++
			} else if x.node[ni].entryOf(rep) != none {
				break // only for hashes that are not chained
			}
		} else {
			ni = x.newNode(h)
			x.nodes.fill(i, h, ni)
			x.live++
		}
		ei := x.newEntry(ni, last)
		x.node[ni].add(holder{rep: rep, ent: ei})
		if last != none {
			x.addChild(r, last)
		}
		last = ei
		r.n++
	}
	if last != parent {
		x.pushFront(r, last)
	} else if parent != none {
		x.hit(r, parent)
	}
}

// addChild counts a new held child of entry e, which stops being a leaf.
func (x *Index) addChild(r *replica, e int32) {
	en := &x.ent[e]
	if en.next != interior {
		if en.next != pinned {
			x.removeLeaf(r, e)
		}
		en.next, en.prev = interior, 0
	}
	en.prev++
}

// RemoveReplica forgets everything replica rep holds (it left the fleet or
// restarted with an empty cache); its capacity is kept.
func (x *Index) RemoveReplica(rep int32) {
	if int(rep) >= len(x.reps) {
		return
	}
	r := &x.reps[rep]
	if r.pinned > 0 {
		x.unpinAll(rep)
	}
	// Its blocks leave as ghosts of no replica: they were not evicted for
	// room, so they say nothing of its cache's marginal worth.
	x.removing = true
	for r.n > 0 {
		x.evict(rep)
	}
	x.flush()
	x.removing = false
	r.margSince, r.margAdded, r.margHits = 0, 0, 0
	x.settle(r)
}

// Idle returns how many Touch calls ago replica rep's least recently used
// block was last used, or -1 while the replica has room (nothing needs
// evicting). Between full replicas, new data costs least where Idle is
// largest: the block it evicts is the coldest. Phantom blocks (Forget),
// older than any other, have no stamp: the age is the oldest named block's.
func (x *Index) Idle(rep int32) int64 {
	if int(rep) >= len(x.reps) {
		return -1
	}
	r := &x.reps[rep]
	if r.n < r.cap || r.n == 0 {
		return -1
	}
	if x.lru(r) == none {
		return 0 // all pinned: new data has nothing cold to replace
	}
	return int64(x.clock - r.oldest)
}

// Nodes returns the number of distinct blocks in the index.
func (x *Index) Nodes() int { return x.live }

// newNode takes a node for hash h; the caller puts it in the table.
func (x *Index) newNode(h uint64) int32 {
	var ni int32
	if x.freeNode != none {
		ni = x.freeNode
		n := &x.node[ni]
		x.freeNode = n.first.ent
		n.hash, n.more = h, n.more[:0]

	} else {
		ni = int32(len(x.node))
		x.node = append(x.node, node{hash: h, first: holder{rep: none}})
	}
	return ni
}

// freeNodeAt frees node ni; its hash leaves the table and joins the ghosts
// at the next flush.
func (x *Index) freeNodeAt(ni, rep int32) {
	n := &x.node[ni]
	b := goneBlock{hash: n.hash, rep: none}
	if !x.removing {
		b.rep, b.ord = rep, x.reps[rep].evictions
	}
	x.gone = append(x.gone, b)
	n.first.ent = x.freeNode
	x.freeNode = ni
}

// forgetNode frees node ni at once, its hash out of the table (a ghost's
// slot stays, with no node).
func (x *Index) forgetNode(ni int32) {
	n := &x.node[ni]
	if i, ok := x.nodes.find(n.hash); ok {
		x.nodes.slots[i].val = none
		if !x.nodes.slots[i].ghost {
			x.nodes.delAt(i)
		}
	}
	x.live--
	n.first.ent = x.freeNode
	x.freeNode = ni
}

// flush removes the hashes of the nodes freed since the last flush from the
// table and adds them to the ghosts, in the order they were freed. Done in
// a batch, the random slots they touch are loaded first, all at once, so
// that the cache misses overlap instead of following one another.
func (x *Index) flush() {
	if len(x.gone) == 0 {
		return
	}
	var sink uint64
	g := &x.ghosts
	for i, b := range x.gone {
		sink += x.nodes.peek(b.hash)
		if g.ring != nil {
			sink += x.nodes.peek(g.ring[(g.next+i)&(len(g.ring)-1)])
		}
	}
	x.sink += sink
	for _, b := range x.gone {
		x.addGhost(b.hash, true, b.rep, b.ord)
	}
	x.gone = x.gone[:0]
}

// newEntry takes an entry for node ni below parent, used now, not yet in
// any list.
func (x *Index) newEntry(ni, parent int32) int32 {
	e := entry{node: ni, parent: parent, stamp: x.clock, next: interior}
	if x.freeEnt != none {
		ei := x.freeEnt
		x.freeEnt = x.ent[ei].next
		x.ent[ei] = e
		return ei
	}
	x.ent = append(x.ent, e)
	return int32(len(x.ent) - 1)
}

// lru returns replica r's least recently used leaf (none if it holds
// nothing): the older of the list's tail and the heap's top.
func (x *Index) lru(r *replica) int32 {
	if len(r.heap) == 0 {
		return r.tail
	}
	if r.tail == none || older(x.ent[r.heap[0]].stamp, x.ent[r.tail].stamp) {
		return r.heap[0]
	}
	return r.tail
}

// older reports whether stamp a is before stamp b (stamps wrap after 2^32
// Touch calls).
func older(a, b uint32) bool { return int32(a-b) < 0 }

// evict drops replica rep's least recently used block (a phantom first);
// it becomes a ghost if no other replica holds it.
func (x *Index) evict(rep int32) {
	x.reps[rep].evictions++
	if r := &x.reps[rep]; r.phantom > 0 {
		r.phantom--
		r.n--
		return
	}
	if ei := x.lru(&x.reps[rep]); ei != none {
		x.removeLeaf(&x.reps[rep], ei)
		x.drop(rep, ei, true)
	}
}

// drop frees entry ei of replica rep, a leaf already out of the replica's
// list and heap. evicted: it was the least recently used (an eviction; its
// block becomes a ghost if no other replica holds it); otherwise it is
// forgotten (Forget) and leaves no ghost. Its parent, if that was its last
// child, becomes a leaf used when the block was (they were used together)
// or later, when a prompt ended there.
func (x *Index) drop(rep, ei int32, evicted bool) {
	r := &x.reps[rep]
	x.gen++
	e := x.ent[ei]
	if x.node[e.node].remove(rep) {
		if evicted {
			x.freeNodeAt(e.node, rep)
		} else {
			x.forgetNode(e.node)
		}
	}
	x.ent[ei] = entry{node: none, parent: none, prev: none, next: x.freeEnt}
	x.freeEnt = ei
	r.n--
	if e.parent == none {
		return
	}
	// The parent was used whenever its child was. Unpinned children leave
	// oldest first, so this matters only when a pin keeps an older sibling.
	p := &x.ent[e.parent]
	if older(p.stamp, e.stamp) {
		p.stamp = e.stamp
	}
	if p.prev--; p.prev > 0 {
		return
	}
	if p.pins > 0 { // a leaf now, but held: out of reach until unpinned
		p.next, p.prev = pinned, none
		return
	}
	if !evicted || older(e.stamp, p.stamp) {
		// Out of the list's order: a forgotten block need not have been
		// the least recently used, so its parent's place is by stamp.
		x.heapPush(r, e.parent)
		return
	}
	x.pushBack(r, e.parent)
}

// Forget undoes what Touch t added for a prompt that replica rep never
// computed (it refused or rejected the request): the replica's blocks of
// the prompt past the first keep (those it held before that Touch),
// deepest first, for as long as each is a leaf that no running request
// holds and no later Touch has used. They leave without becoming ghosts
// (they were never evicted), and the blocks that Touch evicted to make
// room, which the replica still holds, come back as phantoms, up to as
// many as were forgotten: the index no longer knows which they were, but a
// replica whose cache was full stays full. The blocks the Touch kept keep
// the recency it gave them.
func (x *Index) Forget(rep int32, blocks []uint64, keep int, t Touched) {
	if rep < 0 || int(rep) >= len(x.reps) || len(blocks) <= keep {
		return
	}
	x.dropBlocks = nil
	r := &x.reps[rep]
	h, e := x.held(rep, blocks)
	forgot := 0
	for ; h > max(keep, 0) && e != none; h-- {
		en := &x.ent[e]
		if en.next == interior || en.next == pinned || en.pins > 0 || en.stamp != t.Stamp {
			break
		}
		parent := en.parent
		x.removeLeaf(r, e)
		x.drop(rep, e, false)
		e = parent
		forgot++
	}
	back := min(forgot, max(t.Evicted, 0))
	r.phantom += back
	r.n += back
	x.settle(r)
}

// settle recomputes r.oldest after changes to its leaves.
func (x *Index) settle(r *replica) {
	if !r.dirty {
		return
	}
	r.dirty = false
	if v := x.lru(r); v != none {
		r.oldest = x.ent[v].stamp
	}
}

func (x *Index) pushFront(r *replica, ei int32) {
	e := &x.ent[ei]
	e.prev, e.next = none, r.head
	if r.head != none {
		x.ent[r.head].prev = ei
	} else {
		r.tail = ei
		r.dirty = true
	}
	r.head = ei
}

func (x *Index) pushBack(r *replica, ei int32) {
	e := &x.ent[ei]
	e.prev, e.next = r.tail, none
	if r.tail != none {
		x.ent[r.tail].next = ei
	} else {
		r.head = ei
	}
	r.tail = ei
	r.dirty = true
}

// removeLeaf takes leaf ei out of the list or the heap.
func (x *Index) removeLeaf(r *replica, ei int32) {
	e := &x.ent[ei]
	if e.next == inHeap {
		x.heapRemove(r, int(e.prev))
		return
	}
	if e.prev != none {
		x.ent[e.prev].next = e.next
	} else {
		r.head = e.next
	}
	if e.next != none {
		x.ent[e.next].prev = e.prev
	} else {
		r.tail = e.prev
		r.dirty = true
	}
	e.prev, e.next = none, none
}

// The heap is a binary min-heap of leaves by stamp; each leaf's prev holds
// its position.

func (x *Index) heapPush(r *replica, ei int32) {
	x.ent[ei].next = inHeap
	r.heap = append(r.heap, ei)
	x.heapUp(r, len(r.heap)-1)
	r.dirty = true
}

func (x *Index) heapRemove(r *replica, i int) {
	last := len(r.heap) - 1
	r.dirty = true
	if i != last {
		r.heap[i] = r.heap[last]
		x.ent[r.heap[i]].prev = int32(i)
	}
	r.heap = r.heap[:last]
	if i != last {
		x.heapDown(r, i)
		x.heapUp(r, i)
	}
}

func (x *Index) heapUp(r *replica, i int) {
	h := r.heap
	ei := h[i]
	s := x.ent[ei].stamp
	for i > 0 {
		p := (i - 1) / 2
		if !older(s, x.ent[h[p]].stamp) {
			break
		}
		h[i] = h[p]
		x.ent[h[i]].prev = int32(i)
		i = p
	}
	h[i] = ei
	x.ent[ei].prev = int32(i)
}

func (x *Index) heapDown(r *replica, i int) {
	h := r.heap
	ei := h[i]
	s := x.ent[ei].stamp
	for {
		c := 2*i + 1
		if c >= len(h) {
			break
		}
		if c+1 < len(h) && older(x.ent[h[c+1]].stamp, x.ent[h[c]].stamp) {
			c++
		}
		if !older(x.ent[h[c]].stamp, s) {
			break
		}
		h[i] = h[c]
		x.ent[h[i]].prev = int32(i)
		i = c
	}
	h[i] = ei
	x.ent[ei].prev = int32(i)
}
