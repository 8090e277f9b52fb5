package kvevents

import "time"

// Blocks at risk: a block a replica holds now may be gone by the time a
// request routed there starts. vLLM looks a waiting request's prefix up
// only when it schedules it, and until then every block the prefills
// queued ahead of it allocate evicts the least recently freed cached
// block. On the Mooncake conversation trace at 4 replicas 7% of the cached
// tokens the events promised were not found, and all of those were held
// when the request was routed and evicted while it waited behind tens of
// thousands of prompt tokens.
//
// The events say when a block is stored and evicted, not when it is freed,
// so each replica's share of the index keeps an eviction order of its own:
// a clock that counts the uses of its GPU keys (stored, or freed by a
// request that finished: Touch, the prompt's last block first as vLLM
// frees them), each key's last use, which keys requests routed there and
// not finished are using (they are not evictable, and they are scheduled
// before any request routed later), and how old the keys it evicts are at
// eviction (their mean age, lately). A key not in use, of age a, is judged
// gone after n more blocks are allocated there once a plus the clock's
// advance over n stores passes its expected life by riskMargin.

// riskMinSamples is how many evictions a replica must have made before
// its keys are judged at risk: until its cache has filled, nothing is
// evicted.
const riskMinSamples = 32

// riskWeight is the weight of one eviction's age in the mean age at
// eviction.
const riskWeight = 1.0 / 256

// riskMargin is how far past the mean age at eviction a key must be
// expected to get before it is judged gone: the ages scatter around their
// mean (a key freed behind a run of blocks in use waits longer), and a
// prefix judged gone that was not sends its request away from its cache.
// On the Mooncake traces 1.25 keeps the index's accuracy at 0.97-1.00
// (0.93-0.98 without) and the hit rate at or above what it was; 1 makes the
// accuracy 1.00 and costs 0.4-0.8 points of hit rate.
const riskMargin = 1.25

// BusyTTL is how long a key routed to a replica (Expect) counts as used by
// a request there when the request is never reported finished (Touch).
const BusyTTL = time.Minute

// lruRisk is one replica's eviction order.
type lruRisk struct {
	// clock counts the uses of GPU keys; it wraps, ages are differences.
	clock uint32
	use   map[uint64]uint32   // the clock at each GPU key's last use
	busy  map[uint64]busyMark // keys requests routed there are using
	// life is the mean age of the keys evicted lately, samples how many
	// have been; ticks and stores count the clock's advance and the
	// stores in it lately, so that n blocks to allocate are n*ticks/stores
	// ticks.
	life          float64
	samples       int
	ticks, stores float64
}

// busyMark is how many requests routed to the replica use a key and are
// not reported finished, and until when the latest counts (BusyTTL).
type busyMark struct {
	n     int32
	until int64
}

// stored records that key k entered the GPU cache: used now.
func (l *lruRisk) stored(k uint64) {
	l.clock++
	l.use[k] = l.clock
	l.stores++
	l.tick(1)
}

// tick counts n steps of the clock, halving the counts now and then.
func (l *lruRisk) tick(n int) {
	if l.ticks += float64(n); l.ticks > 1<<20 {
		l.ticks /= 2
		l.stores /= 2
	}
}

// left records that key k left the GPU cache: its age is a sample of how
// long a key stays.
func (l *lruRisk) left(k uint64) {
	u, ok := l.use[k]
	if !ok {
		return
	}
	delete(l.use, k)
	delete(l.busy, k)
	age := float64(l.clock - u)
	if l.samples == 0 {
		l.life = age
	}
	l.life += (age - l.life) * riskWeight
	l.samples++
}

// reset forgets the order (the replica's cache was cleared); the ages
// measured stay, they describe the cache's size and load.
func (l *lruRisk) reset() {
	clear(l.use)
	clear(l.busy)
}

// heldRun is how many leading blocks are GPU keys.
func (l *lruRisk) heldRun(blocks []uint64) int {
	n := 0
	for _, h := range blocks {
		if _, ok := l.use[h]; !ok {
			break
		}
		n++
	}
	return n
}

// routed records that a prompt was routed there at now: its request uses
// the leading blocks the replica holds until it finishes.
func (l *lruRisk) routed(blocks []uint64, now time.Time) {
	until := now.Add(BusyTTL).UnixNano()
	for _, h := range blocks[:l.heldRun(blocks)] {
		b := l.busy[h]
		l.busy[h] = busyMark{n: b.n + 1, until: until}
	}
}

// Touch records that a request on replica rep using the prompt's blocks
// finished: vLLM frees its blocks then, the prompt's last block first, so
// they join the end of the replica's eviction order, the first block last.
// Only the leading blocks held in the GPU cache are touched.
func (x *Index) Touch(rep string, blocks []uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	r := x.reps[rep]
	if r == nil {
		return
	}
	l := &r.risk
	n := l.heldRun(blocks)
	for i, h := range blocks[:n] {
		l.use[h] = l.clock + uint32(n-i)
		if b := l.busy[h]; b.n > 1 {
			l.busy[h] = busyMark{n: b.n - 1, until: b.until}
		} else {
			delete(l.busy, h)
		}
	}
	l.clock += uint32(n)
	l.tick(n)
}

// Survivors returns how many of the first depth blocks of a prompt (as
// Match found them on replica rep) are expected still in its GPU cache,
// at now, once allocs more blocks have been allocated there: the prefills
// queued ahead of a request evict about that many before it starts. A
// block used by a request routed there and not finished is safe, and so
// is one routed there and not yet reported (Expect): the request that
// computes it holds it. Until the replica has evicted enough to tell how
// long a block stays, every block is.
func (x *Index) Survivors(rep string, blocks []uint64, depth, allocs int, now time.Time) int {
	depth = min(depth, len(blocks))
	if allocs <= 0 || depth <= 0 {
		return depth
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	r := x.reps[rep]
	if r == nil || r.risk.samples < riskMinSamples || r.risk.stores == 0 {
		return depth
	}
	l := &r.risk
	ahead := float64(allocs) * l.ticks / l.stores
	ns := now.UnixNano()
	for i, h := range blocks[:depth] {
		if l.busy[h].until > ns {
			continue
		}
		if u, ok := l.use[h]; ok && float64(l.clock-u)+ahead >= l.life*riskMargin {
			return i
		}
	}
	return depth
}
