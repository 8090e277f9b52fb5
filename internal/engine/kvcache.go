package engine

// The KV cache follows vLLM v1's block pool (vllm/v1/core/block_pool.py):
// fixed-size blocks with a reference count; a full prompt block is cached
// under its chained hash; blocks whose count drops to zero go to the tail of
// an LRU free queue but keep their hash, so a later request can still hit
// them; a block is evicted (its hash forgotten) only when it is taken from
// the head of the free queue for new data; a hit on a free block takes it
// out of the queue again ("touch").

// noBlock marks an empty link.
const noBlock int32 = -1

// kvBlock is one 16-token KV block.
type kvBlock struct {
	hash   uint64
	hashed bool  // hash is valid: the block is cached under it
	ref    int32 // running requests using the block; 0 = in the free queue
	prev   int32 // free-queue links (intrusive doubly linked list)
	next   int32
}

// kvCache is the block pool: blocks, the LRU free queue and the hash index.
type kvCache struct {
	blocks  []kvBlock
	head    int32 // least recently freed: evicted first
	tail    int32
	numFree int
	cached  *hashIndex
	// gen changes whenever a hash is added, so a blocked waiting request
	// knows that its prefix lookup may give more now.
	gen  uint64
	sink uint64 // keeps prefetching loads alive
}

func newKVCache(n int) *kvCache {
	c := &kvCache{
		blocks: make([]kvBlock, n),
		head:   noBlock,
		tail:   noBlock,
		cached: newHashIndex(n),
	}
	// Initially every block is free, in index order.
	for i := range c.blocks {
		c.pushBack(int32(i))
	}
	return c
}

func (c *kvCache) pushBack(i int32) {
	b := &c.blocks[i]
	b.prev, b.next = c.tail, noBlock
	if c.tail == noBlock {
		c.head = i
	} else {
		c.blocks[c.tail].next = i
	}
	c.tail = i
	c.numFree++
}

func (c *kvCache) unlink(i int32) {
	b := &c.blocks[i]
	if b.prev == noBlock {
		c.head = b.next
	} else {
		c.blocks[b.prev].next = b.next
	}
	if b.next == noBlock {
		c.tail = b.prev
	} else {
		c.blocks[b.next].prev = b.prev
	}
	b.prev, b.next = noBlock, noBlock
	c.numFree--
}

// alloc takes the least recently freed block, evicting its cached hash.
// The caller has checked that numFree > 0.
func (c *kvCache) alloc() int32 {
	i := c.head
	c.unlink(i)
	b := &c.blocks[i]
	b.hashed = false // its index entry is now stale (see hashIndex)
	b.ref = 1
	return i
}

// touch adds a reference to a cached block found by a prefix hit.
func (c *kvCache) touch(i int32) {
	b := &c.blocks[i]
	if b.ref == 0 {
		c.unlink(i)
	}
	b.ref++
}

// release drops a reference; an unreferenced block joins the free queue's
// tail (most recently used), keeping its hash.
func (c *kvCache) release(i int32) {
	b := &c.blocks[i]
	b.ref--
	if b.ref == 0 {
		c.pushBack(i)
	}
}

// cache registers block i (now full of computed prompt tokens) under hash
// h. When another block already holds h (two requests prefilled the same
// prefix at once) the block stays uncached, a duplicate as in vLLM.
func (c *kvCache) cache(i int32, h uint64) {
	s, ok := c.cached.find(h)
	switch {
	case ok && c.blocks[s.val].hashed && c.blocks[s.val].hash == h:
		return // a live duplicate
	case ok:
		s.val = i // reuse the stale entry
	default:
		if c.cached.full() {
			c.rebuild()
			s, _ = c.cached.find(h)
		}
		c.cached.fill(s, h, i)
	}
	b := &c.blocks[i]
	b.hash, b.hashed = h, true
	c.gen++
}

// prefetch loads the index slots where hashes live. The loads are
// independent, so the CPU overlaps their cache misses, which a loop of finds
// (a data-dependent branch per probe) cannot; the finds that follow then hit
// the CPU cache. With a hundred engines in one process every probe is
// otherwise a memory round trip.
func (c *kvCache) prefetch(hashes []uint64) {
	var sink uint64
	for _, h := range hashes {
		sink += c.cached.slots[c.cached.home(fixKey(h))].key
	}
	c.sink += sink
}

// matchPrefix appends to hits the cached blocks of the longest leading run
// of hashes, in batches whose index slots and blocks are prefetched.
func (c *kvCache) matchPrefix(hashes []uint64, hits []int32) []int32 {
	const batch = 16
	var vals [batch]int32
	for base := 0; base < len(hashes); base += batch {
		chunk := hashes[base:min(base+batch, len(hashes))]
		c.prefetch(chunk)
		n := 0
		for _, h := range chunk {
			s, ok := c.cached.find(h)
			if !ok {
				break
			}
			vals[n] = s.val
			n++
		}
		var sink uint64
		for _, v := range vals[:n] {
			sink += c.blocks[v].hash
		}
		c.sink += sink
		for j, v := range vals[:n] {
			if b := &c.blocks[v]; !b.hashed || b.hash != chunk[j] {
				return hits // stale entry: the block was evicted
			}
			hits = append(hits, v)
		}
		if n < len(chunk) {
			return hits
		}
	}
	return hits
}

// rebuild drops the index's stale entries: it re-inserts the live ones.
func (c *kvCache) rebuild() {
	c.cached.reset()
	for i := range c.blocks {
		if b := &c.blocks[i]; b.hashed {
			if s, ok := c.cached.find(b.hash); !ok {
				c.cached.fill(s, b.hash, int32(i))
			}
		}
	}
}

// used is the number of blocks referenced by requests.
func (c *kvCache) used() int { return len(c.blocks) - c.numFree }
