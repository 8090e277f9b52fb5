package hftok

import (
	"container/list"
	"crypto/sha256"
	"sync"
)

// minCachedSegment is the shortest segment worth caching: below it hashing
// and locking cost about what encoding does.
const minCachedSegment = 64

// segmentCache is a bounded LRU of the ids of text segments, keyed by the
// SHA-256 of the segment (a collision would be a wrong tokenization, so the
// key is a cryptographic hash, not a map hash). Segments are the runs of
// text between added tokens, which tokenizers encodes independently of each
// other: in a chat prompt each message is one, so a conversation's next
// turn re-encodes only its new messages.
type segmentCache struct {
	mu       sync.Mutex
	maxBytes int
	bytes    int
	ll       *list.List // front = most recent
	m        map[[sha256.Size]byte]*list.Element

	hits, misses uint64
}

type cacheEntry struct {
	key [sha256.Size]byte
	ids []uint32
}

// entryCost is the memory an entry holds, roughly.
func entryCost(ids []uint32) int { return 4*len(ids) + 128 }

func newSegmentCache(maxBytes int) *segmentCache {
	return &segmentCache{maxBytes: maxBytes, ll: list.New(), m: map[[sha256.Size]byte]*list.Element{}}
}

func (c *segmentCache) get(key [sha256.Size]byte) ([]uint32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[key]; ok {
		c.ll.MoveToFront(e)
		c.hits++
		return e.Value.(*cacheEntry).ids, true
	}
	c.misses++
	return nil, false
}

func (c *segmentCache) put(key [sha256.Size]byte, ids []uint32) {
	cost := entryCost(ids)
	if cost > c.maxBytes {
		return
	}
	own := append([]uint32(nil), ids...)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[key]; ok {
		return
	}
	c.m[key] = c.ll.PushFront(&cacheEntry{key: key, ids: own})
	c.bytes += cost
	for c.bytes > c.maxBytes {
		e := c.ll.Back()
		ent := e.Value.(*cacheEntry)
		c.ll.Remove(e)
		delete(c.m, ent.key)
		c.bytes -= entryCost(ent.ids)
	}
}

// CacheStats reports the segment cache's hits, misses and size.
type CacheStats struct {
	Hits, Misses   uint64
	Entries, Bytes int
}

// CacheStats returns the segment cache's counters (zero without a cache).
func (t *Tokenizer) CacheStats() CacheStats {
	c := t.cache
	if c == nil {
		return CacheStats{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return CacheStats{Hits: c.hits, Misses: c.misses, Entries: c.ll.Len(), Bytes: c.bytes}
}
