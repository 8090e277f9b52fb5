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
// not finished are using, and how old the keys it evicts are at eviction
// (their mean age, lately). A key not in use, of age a, is judged gone
// after n more blocks are allocated there once a plus the clock's advance
// over n stores passes its expected life by riskMargin. A key a request
// queued there found held is safe: that request is scheduled before any
// routed later and takes it out of the eviction order. A key a request
// routed there computes is held by that request until it finishes (vLLM
// evicts only free blocks), so it is freed no earlier than now: its age
// counts from now, not from its store, and only a queue ahead that turns
// the cache over on its own puts it at risk. Aged from their store, the
// blocks of running requests were 25 of the 35 judged at risk on the
// Mooncake conversation trace (1x speed, three rotation starts), and 15 of
// the 17 of those whose fate could be told were still held after the
// blocks queued ahead had been stored.

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

// sweepEvery is how often, at most, a replica's expired marks (busy, and
// the blocks routed there not yet reported) are swept out to make room.
const sweepEvery = time.Second

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
	swept         int64 // Unix nanoseconds of the last sweep of busy
	life          float64
	samples       int
	ticks, stores float64
}

// busyMark is how many requests routed to the replica use a key and are
// not reported finished, those that found it held (n) and those that
// compute it, and until when the latest counts (BusyTTL).
type busyMark struct {
	n, computing int32
	until        int64
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

// routed records that a prompt was routed there at now: its request holds
// every block of it from when it is scheduled until it finishes (Touch),
// those the replica holds now (it shares them) and those it computes. At
// most limit keys are marked; marks past BusyTTL make room first, swept at
// most once per sweepEvery (at the cap, a sweep per request walked every
// mark under the index's lock: a client that sends long prompts and
// cancels them, which leaves their marks for BusyTTL, could make every
// decision walk a quarter of the budget).
func (l *lruRisk) routed(blocks []uint64, now time.Time, limit int) {
	ns := now.UnixNano()
	if len(l.busy)+len(blocks) > limit && ns-l.swept >= int64(sweepEvery) {
		l.swept = ns
		for h, b := range l.busy {
			if b.until <= ns {
				delete(l.busy, h)
			}
		}
	}
	until := now.Add(BusyTTL).UnixNano()
	held := l.heldRun(blocks)
	for i, h := range blocks {
		b, ok := l.busy[h]
		if !ok && len(l.busy) >= limit {
			return
		}
		b.until = until
		if i < held {
			b.n++
		} else {
			b.computing++
		}
		l.busy[h] = b
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
	}
	l.unmark(blocks)
	l.clock += uint32(n)
	l.tick(n)
}

// Unmark records that a request routed to replica rep with the prompt's
// blocks (Expect) was turned away before it ran: its marks of the blocks
// as in use go, and their place in the eviction order stays, as the
// engine never used them.
func (x *Index) Unmark(rep string, blocks []uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if r := x.reps[rep]; r != nil {
		r.risk.unmark(blocks)
	}
}

// unmark drops one request's marks of the blocks as in use.
func (l *lruRisk) unmark(blocks []uint64) {
	for _, h := range blocks {
		b, ok := l.busy[h]
		if !ok {
			continue
		}
		// The request that computed a key was routed before those that
		// found it held, and is the likelier to end first.
		if b.computing > 0 {
			b.computing--
		} else {
			b.n--
		}
		if b.n <= 0 && b.computing <= 0 {
			delete(l.busy, h)
		} else {
			l.busy[h] = b
		}
	}
}

// Survivors returns how many of the first depth blocks of a prompt (as
// Match found them on replica rep) are expected still in its GPU cache,
// at now, once allocs more blocks have been allocated there: the prefills
// queued ahead of a request evict about that many before it starts. A
// block a request queued there found held is safe, and so is one routed
// there and not yet reported (Expect); one a request there computed and
// has not finished is as old as a block freed now. Until the replica has
// evicted enough to tell how long a block stays, every block is.
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
		u, ok := l.use[h]
		if !ok {
			continue // routed there, not yet reported: its request holds it
		}
		age := float64(l.clock - u)
		if b := l.busy[h]; b.until > ns {
			if b.n > 0 {
				continue // a request queued ahead shares it
			}
			age = 0 // in use: freed no earlier than now
		}
		if age+ahead >= l.life*riskMargin {
			return i
		}
	}
	return depth
}
