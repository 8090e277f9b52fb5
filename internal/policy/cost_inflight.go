package policy

import (
	"math"
	"math/bits"

	"github.com/llmlb/llmlb/internal/tokenize"
)

// A prefix still being prefilled. The index enters a prompt's blocks on
// the replica it is sent to at once, so a request routed while an earlier
// one there still computes their common prefix is expected to find all of
// it. An engine that prefills one prompt at a time admits the later
// request after that prefill, and it does; one that shares its steps among
// prefills admits it beside the first, where it finds only the part
// scheduled so far (vLLM caches a chunk's blocks when it schedules them)
// and computes the rest again. The part of a candidate's expected hit from
// the first block a request in flight there computes and has not had its
// first token for is its unscheduled hit.
//
// Which of the two a replica is, nothing it exports says; what it reports
// per request does: the prompt tokens the request found cached (vLLM's
// usage.prompt_tokens_details.cached_tokens, the simulator's first-token
// event). Against the hit its decision expected, the tokens it computed
// again, as a share of the unscheduled hit, are learned per replica from 0
// (inflightFit.share): a serial replica gives all of its hit back and its
// share stays at 0, its routing and estimates what they were. A replica
// whose share has moved (recomputeSure) has its candidates' unscheduled
// hit priced as computed in the score, which spreads a burst's requests
// instead of having each compute its context beside the first; the
// reported estimate prices the learned share of it. Both only while every
// candidate's KV cache is under recomputeKVGate used: the spread copies
// contexts onto more replicas, and on KV-bound fleets that thrashed
// (docs/ROUTING.md, "A prefix still being prefilled").
const (
	// recomputeStep is the learned share's step per reported request whose
	// decision expected an unscheduled hit (about the latest 32 count).
	recomputeStep = 1.0 / 32
	// recomputeSure is the share above which the score prices all of an
	// unscheduled hit (below, that part of it): a serial replica's stays
	// at exactly 0. The learned share itself in the score (about 0.25 on
	// parallel engines) spread too little: agentic, 16 slots, P99 2.14 s
	// against 1.80 s.
	recomputeSure = 0.001
	// recomputeKVGate is the KV cache usage (the fleet's highest scraped)
	// from which no unscheduled hit is priced (0.4 and 0.5 let a 64-slot
	// fleet thrash: P99 11.6 and 4.7 s).
	recomputeKVGate = 0.3
	// pendingTTL drops a request from the pending ones after this long
	// without a first token: the backstop for one whose end the policy is
	// never told of (its replica removed and added back meanwhile, say).
	pendingTTL = int64(300e9)
	// maxPending bounds the requests followed per replica (their memory,
	// and the TTL sweep's walk when one expires; a decision's lookup does
	// not depend on it): past it a request is not followed (the earlier
	// ones are those being computed).
	maxPending = 1024
)

// CacheObserver is implemented by a policy that learns from the prompt
// tokens an engine reports a request found in its prefix cache: the
// balancer calls it, under its lock, with the Choice's Shape.
type CacheObserver interface {
	ObserveCached(replica string, s PrefillShape, cached int)
}

// PendingFollower is implemented by a policy that follows requests pending
// a first token: the balancer tells it of one released without a first
// token as cancelled (its client went away), which neither Refused nor
// Finished reports.
type PendingFollower interface {
	Canceled(replica string, blocks []uint64)
}

// AbortFollower is implemented by a policy that follows what the engines
// free: the balancer tells it of a request that had its first token and
// ended other than well (its client went away, its stream broke, its
// replica failed): the engine aborted it and freed its blocks, which
// Finished reports only for a request that ended well.
type AbortFollower interface {
	Aborted(replica string, blocks []uint64)
}

// Aborted tells the event-fed index that an aborted request's blocks are
// free, as a finished one's: its marks would otherwise hold them as in use
// for BusyTTL (a minute), a client that stops its streams early making
// their prefixes look safe from eviction. The guess's index is left as it
// was: its pin on the blocks ends at release whatever the outcome (Ended).
func (p *Cost) Aborted(replica string, blocks []uint64) {
	if _, ok := p.ids[replica]; ok {
		p.touchPrecise(replica, blocks)
	}
}

// Canceled drops a request released without a first token as cancelled
// from replica's pending ones: left there until pendingTTL, a client that
// cancels at once could fill the list with prefixes nothing computes. The
// event-fed index hears that its blocks are free, as for a finished
// request (the engine aborts it): its marks would otherwise hold them as
// in use for a minute.
func (p *Cost) Canceled(replica string, blocks []uint64) {
	if id, ok := p.ids[replica]; ok {
		p.inflight.started(id, blocks)
		p.touchPrecise(replica, blocks)
	}
}

// pendingPrefix is a request routed to a replica that has not had its
// first token: the blocks from at on are ones the replica lacked, being
// computed for it.
type pendingPrefix struct {
	first uint64 // the hash of the prompt's block at, the first it computes
	last  uint64 // the hash of the prompt's last block (Started finds it by it)
	at    int32
	n     int32 // the prompt's blocks
	nowNS int64 // when it was routed
}

// inflightFit is, by replica id, the requests pending a first token and
// the learned share of an unscheduled hit the replica computes again.
//
// Every decision asks it for every candidate, so no decision need walk
// the lists: pending keeps each replica's requests in the order that
// decides which of two alike started drops (swap removal), byLast finds
// that one, firsts finds a prompt's pending prefixes by its block hashes,
// and oldest lets routed skip the TTL sweep while nothing can have expired.
// All three are kept in step with pending (checkConsistent in the tests).
// Where the candidates' lists are short against the prompt positions
// firsts would look up, a decision walks them instead (walkPerLookup):
// the same answer, for less.
type inflightFit struct {
	pending [][]pendingPrefix
	share   []float64
	byLast  []map[lastKey]lastAt // by replica: the first entry of each prompt
	oldest  []int64              // by replica: at most its earliest entry's nowNS
	firsts  pendingFirsts
	walking bool     // the decision walks the lists (scan chose)
	path    []uint64 // the prompt's blocks while walking
}

// walkPerLookup is the list entries a decision walks rather than look up
// one prompt position in firsts: an entry costs about 1 ns, a lookup
// about 10 (BenchmarkPendingLookup).
const walkPerLookup = 8

// lastKey is what started finds a request by: its last block and length.
type lastKey struct {
	last uint64
	n    int32
}

// lastAt is the position in its replica's list of the first entry with a
// lastKey, and how many entries have it (two only when one was routed
// while the index had evicted the other's blocks).
type lastAt struct{ pos, count int32 }

// unscheduled is the tokens of cached (the candidate's expected hit, of
// the prompt's blocks up to depth) from the first block a request in
// flight on replica id computes and has not had its first token for. The
// chained block hashes make a pending request's first computed block
// stand for the whole prefix before it. It reads the decision's scan.
func (f *inflightFit) unscheduled(id int32, depth int32, cached float64) float64 {
	if id < 0 || int(id) >= len(f.pending) || cached <= 0 {
		return 0
	}
	from, ok := depth, true
	if f.walking {
		for _, e := range f.pending[id] {
			if e.at < from && int(e.at) < len(f.path) && f.path[e.at] == e.first {
				from = e.at
			}
		}
	} else {
		from, ok = f.firsts.match(id)
	}
	if !ok || from >= depth {
		return 0
	}
	return max(0, cached-float64(from)*tokenize.BlockSize)
}

// scan prepares unscheduled for a decision on the prompt's blocks among
// candidates ids: bound is at least every candidate's depth. It walks
// their lists if they hold at most walkPerLookup entries a position firsts
// would look up; otherwise firsts finds, for every replica, the shallowest
// of the prompt's first bound blocks a request pending there computes first.
func (f *inflightFit) scan(ids []int32, blocks []uint64, bound int32) {
	bound = min(bound, int32(len(blocks)))
	listed := 0
	for _, id := range ids {
		if id >= 0 && int(id) < len(f.pending) {
			listed += len(f.pending[id])
		}
	}
	f.walking = listed <= walkPerLookup*f.firsts.starts(int(bound))
	if f.walking {
		f.path = blocks
		return
	}
	f.path = nil
	f.firsts.scan(blocks, int(bound))
}

// recompute is the tokens of an unscheduled hit on replica id priced as
// computed: in the score (all of it once the replica's share is above
// recomputeSure) and in the reported estimate (the learned share of it).
func (f *inflightFit) recompute(id int32, unscheduled float64) (scored, reported float64) {
	if id < 0 || int(id) >= len(f.share) || unscheduled <= 0 {
		return 0, 0
	}
	a := f.share[id]
	return min(1, a/recomputeSure) * unscheduled, a * unscheduled
}

// routed notes a request sent to replica id that computes its blocks from
// depth on, dropping those pending longer than pendingTTL.
func (f *inflightFit) routed(id int32, blocks []uint64, depth int32, nowNS int64) {
	if id < 0 || depth < 0 || int(depth) >= len(blocks) {
		return
	}
	f.grow(id)
	if len(f.pending[id]) > 0 && nowNS-f.oldest[id] >= pendingTTL {
		f.expire(id, nowNS)
	}
	q := f.pending[id]
	if len(q) >= maxPending {
		return
	}
	if len(q) == 0 || nowNS < f.oldest[id] {
		f.oldest[id] = nowNS
	}
	e := pendingPrefix{first: blocks[depth], last: blocks[len(blocks)-1], at: depth, n: int32(len(blocks)), nowNS: nowNS}
	if f.byLast[id] == nil {
		f.byLast[id] = make(map[lastKey]lastAt)
	}
	k := lastKey{e.last, e.n}
	if la, ok := f.byLast[id][k]; ok {
		f.byLast[id][k] = lastAt{la.pos, la.count + 1}
	} else {
		f.byLast[id][k] = lastAt{int32(len(q)), 1}
	}
	f.firsts.add(id, e.first, e.at)
	f.pending[id] = append(q, e)
}

// expire drops replica id's requests pending longer than pendingTTL,
// keeping the others' order, and sets oldest to the earliest left.
func (f *inflightFit) expire(id int32, nowNS int64) {
	q := f.pending[id][:0]
	oldest := nowNS
	for _, e := range f.pending[id] {
		if nowNS-e.nowNS < pendingTTL {
			q = append(q, e)
			oldest = min(oldest, e.nowNS)
		} else {
			f.firsts.remove(id, e.first, e.at)
		}
	}
	f.pending[id], f.oldest[id] = q, oldest
	m := f.byLast[id]
	clear(m)
	for k, e := range q {
		key := lastKey{e.last, e.n}
		if la, ok := m[key]; ok {
			m[key] = lastAt{la.pos, la.count + 1}
		} else {
			m[key] = lastAt{int32(k), 1}
		}
	}
}

// started drops the pending request of replica id with these blocks: its
// first token came, or it ended without one. Another request with the same
// blocks (the same prompt but for its last, partial block) has none pending
// (it expected all of them cached), and its first token says they are
// computed too. Of two alike it drops the first in the list, which the
// swap below reorders.
func (f *inflightFit) started(id int32, blocks []uint64) {
	if id < 0 || int(id) >= len(f.pending) || len(blocks) == 0 {
		return
	}
	blocks = blocks[:min(len(blocks), maxIndexBlocks)]
	key := lastKey{blocks[len(blocks)-1], int32(len(blocks))}
	m := f.byLast[id]
	la, ok := m[key]
	if !ok {
		return
	}
	q := f.pending[id]
	k, end := la.pos, int32(len(q)-1)
	f.firsts.remove(id, q[k].first, q[k].at)
	q[k] = q[end]
	q = q[:end]
	f.pending[id] = q
	if la.count == 1 {
		delete(m, key)
	} else { // another alike: the first of them now
		pos := int32(0)
		for pos < end && (q[pos].n != key.n || q[pos].last != key.last) {
			pos++
		}
		m[key] = lastAt{pos, la.count - 1}
	}
	if k < end { // q[k] came from the end: its prompt's first may be earlier now
		if moved := (lastKey{q[k].last, q[k].n}); moved != key {
			lm := m[moved]
			m[moved] = lastAt{min(lm.pos, k), lm.count}
		}
	}
}

// observe folds in a request of replica id whose decision expected hit
// tokens cached, unscheduled of them, and that found cached: the tokens
// it computed again, as a share of the unscheduled ones.
func (f *inflightFit) observe(id int32, hit, unscheduled float64, cached int) {
	if id < 0 || !(unscheduled > 0) || math.IsInf(unscheduled, 0) || math.IsNaN(hit) || cached < 0 {
		return
	}
	f.grow(id)
	x := min(max((hit-float64(cached))/unscheduled, 0), 1)
	f.share[id] += (x - f.share[id]) * recomputeStep
}

// forget drops replica id's pending requests and share (a restarted
// replica may run with other engine flags).
func (f *inflightFit) forget(id int32) {
	if id >= 0 && int(id) < len(f.share) {
		for _, e := range f.pending[id] {
			f.firsts.remove(id, e.first, e.at)
		}
		clear(f.byLast[id])
		f.pending[id], f.share[id] = f.pending[id][:0], 0
	}
}

// shareOf is replica id's learned share (0 before any report).
func (f *inflightFit) shareOf(id int32) float64 {
	if id < 0 || int(id) >= len(f.share) {
		return 0
	}
	return f.share[id]
}

// grow makes room for replica id.
func (f *inflightFit) grow(id int32) {
	for len(f.share) <= int(id) {
		f.pending = append(f.pending, nil)
		f.share = append(f.share, 0)
		f.byLast = append(f.byLast, nil)
		f.oldest = append(f.oldest, 0)
	}
}

// pendingFirsts is every replica's pending requests by their first
// computed block: a hash table from the block's hash to a chain of
// (replica, position, count) nodes, and which block positions any request
// starts at. A decision looks up only the prompt's blocks at those
// positions, once for all candidates, whatever the lists' lengths.
type pendingFirsts struct {
	heads map[uint64]int32 // block hash -> its first node
	nodes []firstNode      // the chains, free ones threaded through next
	free  int32            // the first free node, or noNode
	atN   []int32          // by block position: the requests starting there
	atSet []uint64         // a bit per position with atN > 0
	from  []int32          // by replica: the latest scan's shallowest match
	seen  []uint32         // by replica: the scan that set from
	stamp uint32           // the latest scan
}

// noNode ends a chain of firstNodes.
const noNode = int32(-1)

// firstNode is the requests pending on replica rep that compute the
// prompt from block at on, whose hash keys its chain.
type firstNode struct{ rep, at, count, next int32 }

// add notes a request pending on rep that computes from block at (hash h).
func (t *pendingFirsts) add(rep int32, h uint64, at int32) {
	if t.heads == nil {
		t.heads, t.free = make(map[uint64]int32), noNode
		t.atN, t.atSet = make([]int32, maxIndexBlocks), make([]uint64, maxIndexBlocks/64)
	}
	for len(t.from) <= int(rep) {
		t.from, t.seen = append(t.from, 0), append(t.seen, 0)
	}
	for int(at) >= len(t.atN) { // a prompt past maxIndexBlocks: Choose cuts them
		t.atN, t.atSet = append(t.atN, make([]int32, 64)...), append(t.atSet, 0)
	}
	t.atN[at]++
	t.atSet[at/64] |= 1 << (at % 64)
	head, ok := t.heads[h]
	if !ok {
		head = noNode
	}
	for n := head; n != noNode; n = t.nodes[n].next {
		if t.nodes[n].rep == rep && t.nodes[n].at == at {
			t.nodes[n].count++
			return
		}
	}
	n := t.free
	if n == noNode {
		n = int32(len(t.nodes))
		t.nodes = append(t.nodes, firstNode{})
	} else {
		t.free = t.nodes[n].next
	}
	t.nodes[n] = firstNode{rep: rep, at: at, count: 1, next: head}
	t.heads[h] = n
}

// remove undoes one add.
func (t *pendingFirsts) remove(rep int32, h uint64, at int32) {
	head, ok := t.heads[h]
	if !ok {
		return
	}
	prev := noNode
	for n := head; n != noNode; prev, n = n, t.nodes[n].next {
		nd := &t.nodes[n]
		if nd.rep != rep || nd.at != at {
			continue
		}
		if t.atN[at]--; t.atN[at] == 0 {
			t.atSet[at/64] &^= 1 << (at % 64)
		}
		if nd.count--; nd.count > 0 {
			return
		}
		switch {
		case prev != noNode:
			t.nodes[prev].next = nd.next
		case nd.next != noNode:
			t.heads[h] = nd.next
		default:
			delete(t.heads, h)
		}
		nd.next, t.free = t.free, n
		return
	}
}

// scan notes, for every replica with a request pending that computes one
// of the prompt's first bound blocks first, the shallowest such block.
func (t *pendingFirsts) scan(blocks []uint64, bound int) {
	if t.stamp++; t.stamp == 0 { // wrapped: no stale mark may match
		clear(t.seen)
		t.stamp = 1
	}
	if len(t.heads) == 0 {
		return
	}
	bound = min(bound, len(t.atN)) // no request starts past it
	for w := 0; w*64 < bound; w++ {
		word := t.atSet[w]
		if rest := bound - w*64; rest < 64 {
			word &= 1<<rest - 1
		}
		for ; word != 0; word &= word - 1 {
			at := int32(w*64 + bits.TrailingZeros64(word))
			head, ok := t.heads[blocks[at]]
			if !ok {
				continue
			}
			for n := head; n != noNode; n = t.nodes[n].next {
				if nd := &t.nodes[n]; nd.at == at && t.seen[nd.rep] != t.stamp {
					t.seen[nd.rep], t.from[nd.rep] = t.stamp, at
				}
			}
		}
	}
}

// starts is the block positions below bound some request starts at.
func (t *pendingFirsts) starts(bound int) int {
	n := 0
	for w := 0; w < len(t.atSet) && w*64 < bound; w++ {
		word := t.atSet[w]
		if rest := bound - w*64; rest < 64 {
			word &= 1<<rest - 1
		}
		n += bits.OnesCount64(word)
	}
	return n
}

// match is the latest scan's shallowest block for replica rep, if any.
func (t *pendingFirsts) match(rep int32) (int32, bool) {
	if int(rep) >= len(t.seen) || t.seen[rep] != t.stamp {
		return 0, false
	}
	return t.from[rep], true
}

// ObserveCached learns, from the prompt tokens replica reported a request
// found cached, the share of an unscheduled hit it computes again.
func (p *Cost) ObserveCached(replica string, s PrefillShape, cached int) {
	if id, ok := p.ids[replica]; ok {
		p.inflight.observe(id, s.Hit, s.Unscheduled, cached)
	}
}
