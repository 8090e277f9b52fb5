package policy

import (
	"math"

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
	// maxPending bounds the requests followed per replica, which every
	// decision reads for every candidate: past it a request is not
	// followed (the earlier ones are those being computed).
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

// Canceled drops a request released without a first token as cancelled
// from replica's pending ones: left there until pendingTTL, a client that
// cancels at once could fill the list with prefixes nothing computes.
func (p *Cost) Canceled(replica string, blocks []uint64) {
	if id, ok := p.ids[replica]; ok {
		p.inflight.started(id, blocks)
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
type inflightFit struct {
	pending [][]pendingPrefix
	share   []float64
}

// unscheduled is the tokens of cached (the candidate's expected hit, of
// the prompt's blocks up to depth) from the first block a request in
// flight on replica id computes and has not had its first token for. The
// chained block hashes make a pending request's first computed block
// stand for the whole prefix before it.
func (f *inflightFit) unscheduled(id int32, blocks []uint64, depth int32, cached float64) float64 {
	if id < 0 || int(id) >= len(f.pending) || cached <= 0 {
		return 0
	}
	from := depth
	for _, e := range f.pending[id] {
		if e.at < from && int(e.at) < len(blocks) && blocks[e.at] == e.first {
			from = e.at
		}
	}
	if from >= depth {
		return 0
	}
	return max(0, cached-float64(from)*tokenize.BlockSize)
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
	q := f.pending[id][:0]
	for _, e := range f.pending[id] {
		if nowNS-e.nowNS < pendingTTL {
			q = append(q, e)
		}
	}
	if len(q) >= maxPending {
		f.pending[id] = q
		return
	}
	f.pending[id] = append(q, pendingPrefix{first: blocks[depth], last: blocks[len(blocks)-1], at: depth, n: int32(len(blocks)), nowNS: nowNS})
}

// started drops the pending request of replica id with these blocks: its
// first token came, or it ended without one. Another request with the same
// blocks (the same prompt but for its last, partial block) has none pending
// (it expected all of them cached), and its first token says they are
// computed too.
func (f *inflightFit) started(id int32, blocks []uint64) {
	if id < 0 || int(id) >= len(f.pending) || len(blocks) == 0 {
		return
	}
	blocks = blocks[:min(len(blocks), maxIndexBlocks)]
	q := f.pending[id]
	for k, e := range q {
		if e.n == int32(len(blocks)) && e.last == blocks[len(blocks)-1] {
			q[k] = q[len(q)-1]
			f.pending[id] = q[:len(q)-1]
			return
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
	}
}

// ObserveCached learns, from the prompt tokens replica reported a request
// found cached, the share of an unscheduled hit it computes again.
func (p *Cost) ObserveCached(replica string, s PrefillShape, cached int) {
	if id, ok := p.ids[replica]; ok {
		p.inflight.observe(id, s.Hit, s.Unscheduled, cached)
	}
}
