package engine

import (
	"math/rand/v2"
	"testing"
)

// TestKVCacheIndexMatchesModel churns the block pool's hash index (lazy
// deletion, stale-entry reuse, rebuilds) against a plain map of what is
// cached, with keys chosen to collide in the table.
func TestKVCacheIndexMatchesModel(t *testing.T) {
	for _, spread := range []uint64{1, 1 << 40, 0x9e3779b97f4a7c15} {
		r := rand.New(rand.NewPCG(spread, 1))
		const n = 64
		c := newKVCache(n)
		model := map[uint64]int32{} // hash -> block, live entries only
		var held []int32
		rebuilds := 0
		for step := range 50_000 {
			switch op := r.IntN(10); {
			case op < 5 && c.numFree > 0:
				// Allocate a block (evicting the LRU one) and cache it.
				i := c.alloc()
				for h, j := range model {
					if j == i {
						delete(model, h)
					}
				}
				h := uint64(1+r.IntN(300)) * spread
				before := c.cached.used
				c.cache(i, h)
				if c.cached.used < before {
					rebuilds++
				}
				if _, dup := model[h]; !dup {
					model[h] = i
				}
				held = append(held, i)
			case op < 9 && len(held) > 0:
				k := r.IntN(len(held))
				c.release(held[k])
				held[k] = held[len(held)-1]
				held = held[:len(held)-1]
			default:
				// A hit re-references a cached block.
				h := uint64(1+r.IntN(300)) * spread
				if i, ok := c.lookup(h); ok {
					c.touch(i)
					held = append(held, i)
				}
			}
			for h := range uint64(301) {
				if h == 0 {
					continue // stored as 1: documented collision
				}
				h *= spread
				want, live := model[h]
				got, ok := c.lookup(h)
				if ok != live || (ok && got != want) {
					t.Fatalf("step %d: lookup(%#x) = %d,%v; want %d,%v", step, h, got, ok, want, live)
				}
			}
		}
		if rebuilds == 0 {
			t.Errorf("spread %#x: no rebuild exercised", spread)
		}
	}
}

// lookup returns the cached block with hash h.
func (c *kvCache) lookup(h uint64) (int32, bool) {
	s, ok := c.cached.find(h)
	if !ok {
		return 0, false
	}
	if b := &c.blocks[s.val]; !b.hashed || b.hash != h {
		return 0, false // stale entry: the block was evicted
	}
	return s.val, true
}
