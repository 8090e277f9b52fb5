package engine

// The KV cache follows vLLM v1's block pool (vllm/v1/core/block_pool.py):
// fixed-size blocks with a reference count; a full prompt block is cached
// under its chained hash; blocks whose count drops to zero go to the tail of
// an LRU free queue but keep their hash, so a later request can still hit
// them; a block is evicted (its hash forgotten) only when it is taken from
// the head of the free queue for new data; a hit on a free block takes it
// out of the queue again ("touch").

// kvBlock is one 16-token KV block.
type kvBlock struct {
	hash    uint64
	freeSeq uint32 // sequence number of its live free-queue entry; 0 when referenced
	ref     int32  // running requests using the block; 0 = in the free queue
	hashed  bool   // hash is valid: the block is cached under it
}

// freeEntry is one entry of the free queue: block freed at sequence seq.
type freeEntry struct {
	block int32
	seq   uint32
}

// kvCache is the block pool: blocks, the LRU free queue and the hash index.
//
// The free queue is a FIFO array of (block, sequence) entries with lazy
// removal: freeing a block appends an entry and stamps the block with the
// entry's sequence number; a hit on a free block just clears the stamp, so
// its entry goes stale; taking a block pops entries from the head, skipping
// stale ones. The live entries are exactly vLLM's doubly linked free list,
// in the same order, but removal touches no neighbours and allocation walks
// an array instead of a pointer chain (fewer cache misses per block).
type kvCache struct {
	blocks  []kvBlock
	fq      []freeEntry // fq[fhead:] holds the queue; capacity fixed at 2n+16
	fhead   int
	seq     uint32 // last sequence number handed out
	numFree int
	cached  *hashIndex
	// gen changes whenever a hash is added, so a blocked waiting request
	// knows that its prefix lookup may give more now.
	gen  uint64
	sink uint64 // keeps prefetching loads alive
	// events logs what is cached and evicted, as the engine's KV events
	// would publish it; nil unless asked for (kvevents.go).
	events *kvEventLog
}

func newKVCache(n int) *kvCache {
	c := &kvCache{
		blocks: make([]kvBlock, n),
		fq:     make([]freeEntry, 0, 2*n+16),
		cached: newHashIndex(n),
	}
	// Initially every block is free, in index order.
	for i := range c.blocks {
		c.pushBack(int32(i))
	}
	return c
}

// pushBack appends block i to the free queue (most recently used end).
func (c *kvCache) pushBack(i int32) {
	if len(c.fq) == cap(c.fq) {
		c.compact()
	}
	c.seq++
	if c.seq == 0 { // wrapped: 0 means "not free"
		c.seq = 1
	}
	c.blocks[i].freeSeq = c.seq
	c.fq = append(c.fq, freeEntry{i, c.seq})
	c.numFree++
}

// live reports whether a free-queue entry still stands for its block.
func (c *kvCache) live(e freeEntry) bool { return c.blocks[e.block].freeSeq == e.seq }

// compact drops stale entries (and the consumed head). At most n entries
// are live, so at least n+16 appends follow before the next compaction;
// stale entries never live long enough for a sequence number to wrap
// around onto them.
func (c *kvCache) compact() {
	w := 0
	for _, e := range c.fq[c.fhead:] {
		if c.live(e) {
			c.fq[w] = e
			w++
		}
	}
	c.fq = c.fq[:w]
	c.fhead = 0
}

// unlink takes free block i out of the queue (its entry goes stale).
func (c *kvCache) unlink(i int32) {
	c.blocks[i].freeSeq = 0
	c.numFree--
}

// alloc takes the least recently freed block, evicting its cached hash.
// The caller has checked that numFree > 0.
func (c *kvCache) alloc() int32 {
	for {
		e := c.fq[c.fhead]
		c.fhead++
		if !c.live(e) {
			continue
		}
		b := &c.blocks[e.block]
		b.freeSeq = 0
		if b.hashed && c.events != nil {
			c.events.add(b.hash, false)
		}
		b.hashed = false // its index entry is now stale (see hashIndex)
		b.ref = 1
		c.numFree--
		return e.block
	}
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
	if c.events != nil {
		c.events.add(h, true)
	}
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

// prefetchBlocks loads blocks ids (see prefetch).
func (c *kvCache) prefetchBlocks(ids []int32) {
	var sink uint64
	for _, i := range ids {
		sink += uint64(c.blocks[i].ref)
	}
	c.sink += sink
}

// prefetchFree loads the blocks of the next n free-queue entries.
func (c *kvCache) prefetchFree(n int) {
	var sink uint64
	for _, e := range c.fq[c.fhead:min(c.fhead+n, len(c.fq))] {
		sink += uint64(c.blocks[e.block].freeSeq)
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
