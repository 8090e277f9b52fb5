package bench

import "github.com/llmlb/llmlb/internal/tokenize"

// ceilingCache is the cache ceiling's model: one LRU cache of prompt blocks
// as large as the whole fleet's KV cache, fed every routed request in arrival
// order, as if a perfect router sent each prompt where its prefix is and the
// replicas' caches were one. Its hit rate bounds what any policy can reach on
// the same traffic (up to eviction of blocks that are still in use, which it
// ignores).
//
// Work is O(prompt blocks) per request: a map from block hash to node and an
// intrusive doubly linked list in slices (no per-block allocation).
type ceilingCache struct {
	capacity   int
	index      map[uint64]int32
	hash       []uint64
	prev, next []int32
	head, tail int32 // most and least recently used; -1 when empty

	queryTokens, hitTokens uint64
}

func newCeilingCache(capacity int) *ceilingCache {
	return &ceilingCache{capacity: capacity, index: make(map[uint64]int32), head: -1, tail: -1}
}

// feed looks p up (prefix hits: the leading blocks found, capped like the
// engine's lookup so that at least one token is computed) and then inserts
// or refreshes all its blocks, the last one first so that a prompt's head,
// the part other prompts share, is evicted last (vLLM frees blocks in
// reverse order for the same reason).
func (c *ceilingCache) feed(p tokenize.Prompt) {
	if c.capacity <= 0 || p.Tokens <= 0 {
		return
	}
	c.queryTokens += uint64(p.Tokens)
	maxHit := min(len(p.Blocks), (p.Tokens-1)/tokenize.BlockSize)
	hits := 0
	for hits < maxHit {
		if _, ok := c.index[p.Blocks[hits]]; !ok {
			break
		}
		hits++
	}
	c.hitTokens += uint64(hits * tokenize.BlockSize)
	for i := len(p.Blocks) - 1; i >= 0; i-- {
		c.touch(p.Blocks[i])
	}
}

// hitRate is the hit tokens over the query tokens fed so far.
func (c *ceilingCache) hitRate() float64 {
	return ratio(float64(c.hitTokens), float64(c.queryTokens))
}

// touch makes h the most recently used block, inserting it (and evicting
// the least recently used block when full) if absent.
func (c *ceilingCache) touch(h uint64) {
	if n, ok := c.index[h]; ok {
		c.unlink(n)
		c.pushFront(n)
		return
	}
	var n int32
	if len(c.hash) < c.capacity {
		n = int32(len(c.hash))
		c.hash = append(c.hash, h)
		c.prev = append(c.prev, -1)
		c.next = append(c.next, -1)
	} else {
		n = c.tail
		c.unlink(n)
		delete(c.index, c.hash[n])
		c.hash[n] = h
	}
	c.index[h] = n
	c.pushFront(n)
}

func (c *ceilingCache) unlink(n int32) {
	p, x := c.prev[n], c.next[n]
	if p >= 0 {
		c.next[p] = x
	} else {
		c.head = x
	}
	if x >= 0 {
		c.prev[x] = p
	} else {
		c.tail = p
	}
	c.prev[n], c.next[n] = -1, -1
}

func (c *ceilingCache) pushFront(n int32) {
	c.prev[n] = -1
	c.next[n] = c.head
	if c.head >= 0 {
		c.prev[c.head] = n
	}
	c.head = n
	if c.tail < 0 {
		c.tail = n
	}
}
