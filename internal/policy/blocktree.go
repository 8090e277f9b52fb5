package policy

import "container/heap"

// blockTree is one model's approximate prefix tree shared by all replicas
// (SGLang's multi-tenant radix tree): one node per distinct chained block
// hash, each node marked with the replicas ("tenants") that were sent the
// prefix ending at that block and when. Because a block's hash covers its
// whole prefix, the tree is stored as a flat map from hash to node with
// parent links: one map lookup per block, no child maps.
//
// Invariants: a tenant marked on a node is marked on all its ancestors; a
// mark's kids counts the node's children that carry the same tenant, so
// "leaf for tenant" (the eviction unit) is kids == 0; a node with no marks
// is removed.
type blockTree struct {
	root  treeNode
	nodes map[uint64]*treeNode
	size  []int // blocks held per tenant id
}

type treeNode struct {
	parent *treeNode
	next   *treeNode // the child most recently walked or created: a hint that spares the map lookup
	hash   uint64
	marks  []treeMark
	inline [1]treeMark // backing array for the common single-tenant case
}

type treeMark struct {
	id   int32 // tenant
	kids int32 // children of the node that carry this tenant
	last int64 // last access by this tenant, unix nanoseconds of the driving clock
}

func newBlockTree() *blockTree {
	return &blockTree{nodes: make(map[uint64]*treeNode)}
}

func (n *treeNode) mark(id int32) *treeMark {
	for i := range n.marks {
		if n.marks[i].id == id {
			return &n.marks[i]
		}
	}
	return nil
}

func (t *blockTree) sizeOf(id int32) int {
	if int(id) < len(t.size) {
		return t.size[id]
	}
	return 0
}

// walk appends to path the existing nodes along blocks, stopping at the
// first block the tree lacks (or a hash collision: a node whose parent is
// not the previous block's node).
func (t *blockTree) walk(blocks []uint64, path []*treeNode) []*treeNode {
	prev := &t.root
	for _, h := range blocks {
		n := prev.next
		if n == nil || n.hash != h {
			if n = t.nodes[h]; n == nil || n.parent != prev {
				break
			}
			prev.next = n
		}
		path = append(path, n)
		prev = n
	}
	return path
}

// touch refreshes the tenant's access time along path and at the root, as
// SGLang's prefix_match does for the tenant it returns.
func (t *blockTree) touch(path []*treeNode, id int32, now int64) {
	if m := t.root.mark(id); m != nil {
		m.last = now
	}
	for _, n := range path {
		if m := n.mark(id); m != nil {
			m.last = now
		}
	}
}

// insert marks the tenant on every block of the prompt, creating missing
// nodes; path holds the nodes walk found for the same blocks.
func (t *blockTree) insert(blocks []uint64, path []*treeNode, id int32, now int64) {
	for int(id) >= len(t.size) {
		t.size = append(t.size, 0)
	}
	prev := &t.root
	t.addMark(prev, nil, id, now)
	for i, h := range blocks {
		var n *treeNode
		if i < len(path) {
			n = path[i]
		} else {
			n = t.nodes[h]
			if n != nil && n.parent != prev {
				return // hash collision: keep the tree consistent, stop here
			}
			if n == nil {
				n = &treeNode{parent: prev, hash: h}
				n.marks = n.inline[:0]
				t.nodes[h] = n
			}
			prev.next = n
		}
		if t.addMark(n, prev, id, now) {
			t.size[id]++
		}
		prev = n
	}
}

// addMark marks id on n (a child of parent, nil for the root) and reports
// whether the mark is new.
func (t *blockTree) addMark(n, parent *treeNode, id int32, now int64) bool {
	if m := n.mark(id); m != nil {
		m.last = now
		return false
	}
	n.marks = append(n.marks, treeMark{id: id, last: now})
	if parent != nil {
		parent.mark(id).kids++
	}
	return true
}

// dropMark removes id's mark from a non-root node that is a leaf for id,
// and the node itself when no tenant is left.
func (t *blockTree) dropMark(n *treeNode, id int32) {
	for i := range n.marks {
		if n.marks[i].id != id {
			continue
		}
		last := len(n.marks) - 1
		n.marks[i] = n.marks[last]
		n.marks = n.marks[:last]
		t.size[id]--
		if pm := n.parent.mark(id); pm != nil {
			pm.kids--
		}
		break
	}
	if len(n.marks) == 0 && t.nodes[n.hash] == n {
		t.unlink(n)
	}
}

// unlink removes a node without marks (so without live children) from the
// tree, and the walk hint that points at it.
func (t *blockTree) unlink(n *treeNode) {
	delete(t.nodes, n.hash)
	if n.parent.next == n {
		n.parent.next = nil
	}
	n.next = nil
}

// removeTenant drops every mark of id (SGLang's remove_tenant).
func (t *blockTree) removeTenant(id int32) {
	for h, n := range t.nodes {
		for i := range n.marks {
			if n.marks[i].id == id {
				last := len(n.marks) - 1
				n.marks[i] = n.marks[last]
				n.marks = n.marks[:last]
				break
			}
		}
		if len(n.marks) == 0 && t.nodes[h] == n {
			t.unlink(n)
		}
	}
	for i := range t.root.marks {
		if t.root.marks[i].id == id {
			last := len(t.root.marks) - 1
			t.root.marks[i] = t.root.marks[last]
			t.root.marks = t.root.marks[:last]
			break
		}
	}
	if int(id) < len(t.size) {
		t.size[id] = 0
	}
}

// evict removes least recently used leaves of every tenant holding more than
// maxBlocks until it holds maxBlocks (SGLang's evict_tenant_by_size); a
// parent that becomes a leaf for the tenant joins the queue. h is a reusable
// buffer, returned for the next call.
func (t *blockTree) evict(maxBlocks int, h evictionHeap) evictionHeap {
	over := false
	for _, s := range t.size {
		over = over || s > maxBlocks
	}
	if !over {
		return h
	}
	for _, n := range t.nodes {
		for _, m := range n.marks {
			if m.kids == 0 && t.size[m.id] > maxBlocks {
				h = append(h, evictionEntry{last: m.last, node: n, id: m.id})
			}
		}
	}
	heap.Init(&h)
	for h.Len() > 0 {
		e := heap.Pop(&h).(evictionEntry)
		if t.size[e.id] <= maxBlocks {
			continue
		}
		t.dropMark(e.node, e.id)
		if parent := e.node.parent; parent != &t.root {
			if pm := parent.mark(e.id); pm != nil && pm.kids == 0 {
				heap.Push(&h, evictionEntry{last: pm.last, node: parent, id: e.id})
			}
		}
	}
	clear(h[:cap(h)])
	return h[:0]
}

type evictionEntry struct {
	last int64
	node *treeNode
	id   int32
}

// evictionHeap is a min-heap of leaves by last access.
type evictionHeap []evictionEntry

func (h evictionHeap) Len() int           { return len(h) }
func (h evictionHeap) Less(i, j int) bool { return h[i].last < h[j].last }
func (h evictionHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *evictionHeap) Push(x any)        { *h = append(*h, x.(evictionEntry)) }
func (h *evictionHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}
