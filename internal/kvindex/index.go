// Package kvindex is the balancer's picture of what each replica holds in its
// KV prefix cache: for every replica, the chained block hashes of the prompts
// the balancer sent there (the same hashing as vLLM and package engine: a
// block's hash covers its whole prefix), bounded by that replica's real KV
// capacity and evicted least-recently-used first, like vLLM's free-block
// queue, so the index stops matching what the replica has evicted.
//
// One hash table from block hash to node serves all replicas: each node lists the
// replicas that hold the block, so matching a prompt against the whole fleet
// is one map lookup per block plus one step per holder, and stops at the
// first block nobody holds. Each (block, replica) pair is an entry in one
// replica's intrusive LRU list; entries and nodes live in arenas indexed by
// int32 with free lists, so a steady state allocates nothing.
//
// An Index is not safe for concurrent use; the policy that owns it runs under
// the balancer's lock.
package kvindex

// none marks the end of a list in the arenas.
const none int32 = -1

// Index maps prompt block hashes to the replicas believed to hold them.
// Replicas are small dense ids chosen by the caller (0, 1, 2, ...).
type Index struct {
	nodes    table // block hash -> node
	node     []node
	freeNode int32

	ent     []entry
	freeEnt int32

	reps []replicaLRU // by replica id

	clock uint32 // Touch calls so far
	freed uint64 // nodes freed so far (their indices may be reused)

	ghosts ghosts // blocks that recently left the index (ghost.go)

	// path holds the nodes of the last Match's blocks (path[d] for block
	// d), so that a Touch of the same blocks right after skips the lookups.
	path       []int32
	pathBlocks []uint64
}

// node is one block hash and the replicas holding it.
type node struct {
	hash    uint64
	holders []holder
}

// holder is one replica holding a node, with its entry in that replica's LRU.
type holder struct {
	rep, ent int32
}

// entry is one (block, replica) pair in the replica's LRU list.
type entry struct {
	node       int32
	prev, next int32  // towards the most / least recently used; none at the ends
	stamp      uint32 // Touch call that last used it (wraps after 2^32 calls)
}

// replicaLRU is one replica's list: head is the most recently used entry.
type replicaLRU struct {
	head, tail int32
	n, cap     int
}

// New returns an empty index.
func New() *Index {
	return &Index{nodes: newTable(), freeNode: none, freeEnt: none}
}

// grow makes sure replica id rep exists (capacity 0 until SetCapacity).
func (x *Index) grow(rep int32) {
	for int32(len(x.reps)) <= rep {
		x.reps = append(x.reps, replicaLRU{head: none, tail: none})
	}
}

// SetCapacity bounds replica rep's share of the index to blocks entries,
// evicting its least recently used blocks if it now holds more. A capacity
// of 0 or less holds nothing.
func (x *Index) SetCapacity(rep int32, blocks int) {
	x.grow(rep)
	r := &x.reps[rep]
	r.cap = max(blocks, 0)
	for r.n > r.cap {
		x.evict(rep)
	}
}

// Capacity returns replica rep's bound in blocks.
func (x *Index) Capacity(rep int32) int {
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
// deepest match. The walk stops at the first block no replica continues.
func (x *Index) Match(blocks []uint64, depth []int32) (deepest int) {
	x.path, x.pathBlocks = x.path[:0], blocks
	for d, h := range blocks {
		ni, ok := x.nodes.get(h)
		if !ok {
			break
		}
		x.path = append(x.path, ni)
		advanced := false
		for _, hd := range x.node[ni].holders {
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
func (x *Index) Touch(rep int32, blocks []uint64) {
	x.grow(rep)
	if x.reps[rep].cap == 0 {
		return
	}
	x.clock++
	// Nodes the last Match found for these very blocks need no lookup, as
	// long as no node was freed in between (its index may be reused).
	known := 0
	if len(x.pathBlocks) == len(blocks) && len(blocks) > 0 && &x.pathBlocks[0] == &blocks[0] {
		known = len(x.path)
	}
	path := x.path
	x.path, x.pathBlocks = x.path[:0], nil
	freedBefore := x.freed
	for i := len(blocks) - 1; i >= 0; i-- {
		ni := none
		if i < known && x.freed == freedBefore {
			ni = path[i]
		}
		x.touch(rep, blocks[i], ni)
	}
}

func (x *Index) touch(rep int32, h uint64, ni int32) {
	if ni == none {
		var ok bool
		if ni, ok = x.nodes.get(h); !ok {
			ni = x.newNode(h)
		}
	}
	n := &x.node[ni]
	for _, hd := range n.holders {
		if hd.rep == rep {
			x.moveToFront(rep, hd.ent)
			return
		}
	}
	r := &x.reps[rep]
	if r.n >= r.cap {
		x.evict(rep) // may not free ni: it has no holder rep yet
	}
	ei := x.newEntry(ni)
	x.ent[ei].stamp = x.clock
	x.node[ni].holders = append(x.node[ni].holders, holder{rep: rep, ent: ei})
	x.pushFront(rep, ei)
}

// RemoveReplica forgets everything replica rep holds (it left the fleet or
// restarted with an empty cache); its capacity is kept.
func (x *Index) RemoveReplica(rep int32) {
	if int(rep) >= len(x.reps) {
		return
	}
	for x.reps[rep].n > 0 {
		x.evict(rep)
	}
}

// Idle returns how many Touch calls ago replica rep's least recently used
// block was last used, or -1 while the replica has room (nothing needs
// evicting). Between full replicas, new data costs least where Idle is
// largest: the block it evicts is the coldest.
func (x *Index) Idle(rep int32) int64 {
	if int(rep) >= len(x.reps) {
		return -1
	}
	r := &x.reps[rep]
	if r.n < r.cap || r.tail == none {
		return -1
	}
	return int64(x.clock - x.ent[r.tail].stamp)
}

// Nodes returns the number of distinct blocks in the index.
func (x *Index) Nodes() int { return x.nodes.n }

func (x *Index) newNode(h uint64) int32 {
	var ni int32
	if x.freeNode != none {
		ni = x.freeNode
		x.freeNode = x.node[ni].holders[0].rep // free list threaded through a sentinel holder
		x.node[ni] = node{hash: h, holders: x.node[ni].holders[:0]}
	} else {
		ni = int32(len(x.node))
		x.node = append(x.node, node{hash: h})
	}
	x.nodes.put(h, ni)
	return ni
}

func (x *Index) freeNodeAt(ni int32) {
	x.freed++
	n := &x.node[ni]
	x.ghosts.add(n.hash)
	x.nodes.del(n.hash)
	n.holders = append(n.holders[:0], holder{rep: x.freeNode})
	x.freeNode = ni
}

func (x *Index) newEntry(ni int32) int32 {
	if x.freeEnt != none {
		ei := x.freeEnt
		x.freeEnt = x.ent[ei].next
		x.ent[ei] = entry{node: ni, prev: none, next: none}
		return ei
	}
	x.ent = append(x.ent, entry{node: ni, prev: none, next: none})
	return int32(len(x.ent) - 1)
}

// evict drops replica rep's least recently used block.
func (x *Index) evict(rep int32) {
	r := &x.reps[rep]
	ei := r.tail
	if ei == none {
		return
	}

	x.unlink(rep, ei)
	ni := x.ent[ei].node
	n := &x.node[ni]
	for i, hd := range n.holders {
		if hd.rep == rep {
			last := len(n.holders) - 1
			n.holders[i] = n.holders[last]
			n.holders = n.holders[:last]
			break
		}
	}
	if len(n.holders) == 0 {
		x.freeNodeAt(ni)
	}
	x.ent[ei] = entry{node: none, prev: none, next: x.freeEnt}
	x.freeEnt = ei
}

func (x *Index) pushFront(rep, ei int32) {
	r := &x.reps[rep]
	e := &x.ent[ei]
	e.prev, e.next = none, r.head
	if r.head != none {
		x.ent[r.head].prev = ei
	}
	r.head = ei
	if r.tail == none {
		r.tail = ei
	}
	r.n++
}

func (x *Index) unlink(rep, ei int32) {
	r := &x.reps[rep]
	e := &x.ent[ei]
	if e.prev != none {
		x.ent[e.prev].next = e.next
	} else {
		r.head = e.next
	}
	if e.next != none {
		x.ent[e.next].prev = e.prev
	} else {
		r.tail = e.prev
	}
	e.prev, e.next = none, none
	r.n--
}

func (x *Index) moveToFront(rep, ei int32) {
	x.ent[ei].stamp = x.clock
	if x.reps[rep].head == ei {
		return
	}
	x.unlink(rep, ei)
	x.pushFront(rep, ei)
}
