package policy

import (
	"math"

	"github.com/llmlb/llmlb/internal/tokenize"
)

// maxUtilization caps rho in the delay that added prefill causes others.
const maxUtilization = 0.99

// minShared is the running share of routed prompt tokens found cached
// below which the fleet counts as sharing no prefixes (Cost.shared).
const minShared = 0.005

// estimateAll prices every candidate: its expected TTFT (p.ttfts) and its
// score (p.estimates), which adds what its prefill costs others and prices
// a copy of a hot prefix for the requests that will share it, and returns
// the fastest within the bound (-1: none). It walks from a start that
// moves on each decision, so that the first of equal scores (and the
// tie-break, which walks from the same start) takes turns.
func (p *Cost) estimateAll(d *costDecision, cands []Candidate) int {
	n := len(cands)
	p.noteComputed()
	reuse := p.index.Reuse()
	d.start = int((p.rr + uint64(p.cfg.RotationStart)) % uint64(n))
	p.burst = burstBucket(d)
	p.rr++
	d.byQueue = p.shared < minShared && p.sharedSeen >= 256
	for i := range n {
		if p.depth[p.candID[i]] > 0 {
			d.byQueue = false
		}
	}
	// The unscheduled hit is priced only while every candidate's KV
	// cache is under recomputeKVGate used (cost_inflight.go).
	kvMax := 0.0
	for i := range n {
		kvMax = max(kvMax, cands[i].KVCacheUsage)
	}
	fastest := -1
	for j := range n {
		i := d.start + j
		if i >= n {
			i -= n
		}
		c := &cands[i]
		id := p.candID[i]
		arr := &p.arrivals[id]
		var est float64
		var scored, reported float64 // tokens of the unscheduled hit priced as computed
		if kvMax < recomputeKVGate {
			scored, reported = p.inflight.recompute(id, p.unsched[i])
		}
		p.ttfts[i], est, p.delayed[i], p.evictions[i], p.shapes[i] = p.estimate(c, id, p.aheads[i], p.prefills[i]+scored, reuse, arr.meanGap, n, d.byQueue)
		if reported != scored {
			_, _, _, _, p.shapes[i] = p.estimate(c, id, p.aheads[i], p.prefills[i]+reported, reuse, arr.meanGap, n, d.byQueue)
		}
		p.shapes[i].Hit, p.shapes[i].Unscheduled = float64(d.tokens)-p.prefills[i], p.unsched[i]
		arr.note(d.nowNS)
		p.copyShares[i] = 0
		// A copy of a prefix other requests share is computed once and
		// then serves the later ones: its price counts for the share of
		// them expected to find it here: the requests of the prefix in
		// flight at once (its measured gap against a request's decode
		// time, at most as many as have come), per replica that would
		// hold it.
		if copied := float64(d.hotDepth-int(p.depth[id])) * tokenize.BlockSize; copied > 0 && d.hotGap >= 0 {
			overlap := math.Inf(1)
			if d.hotGap > 0 {
				overlap = c.MeanOutput * c.DecodeStep / d.hotGap
			}
			overlap = min(overlap, d.hotSeen) / float64(d.hotHolders+1)
			if overlap > 1 {
				copied = min(copied, p.prefills[i])
				_, lean, _, _, _ := p.estimate(c, id, p.aheads[i], p.prefills[i]-copied, reuse, arr.meanGap, n, d.byQueue)
				est = lean + (est-lean)/overlap
				p.copyShares[i] = overlap
			}
		}
		p.estimates[i] = est
		if p.overBound(c, d.limit, p.prefills[i], d.tokens) {
			continue
		}
		if fastest < 0 || est < p.estimates[fastest] {
			fastest = i
		}
	}
	return fastest
}

// estimate is candidate c's expected TTFT for a prefill of prefill tokens
// behind ahead, and its score: the TTFT plus the delay the prefill causes
// the requests it holds up (delayed of them) plus the price of the blocks
// it evicts (eviction); shape is the TTFT's parts its prefill model weighs.
// byQueue prices that delay from the replica's queue time alone
// (costDecision.byQueue).
func (p *Cost) estimate(c *Candidate, id int32, ahead, prefill, reuse, meanGap float64, n int, byQueue bool) (ttft, score, delayed, eviction float64, shape PrefillShape) {
	// The work ahead and this prompt are computed in steps of at most
	// batch_tokens, each paying about a decode step on top of its tokens:
	// all of the work ahead when the replica prefills one prompt at a
	// time, each request's ahead up to this prompt's length when it
	// shares its steps among prefills, weighed as the replica's first
	// tokens were measured to (cost_prefill.go).
	requests := float64(c.PendingRequests) + c.OthersWaiting
	shape.Serial, shape.Shared = p.prefillTimes(c, ahead, prefill, requests)
	est := 0.0
	// A full batch admits this request only as running ones finish:
	// one frees a slot every mean-output x step / max_num_seqs. (The
	// running count at a scrape that showed a queue, as the batch's
	// real size, was measured worse: a stale yes/no per replica that
	// herded requests onto those without one, docs/ROUTING.md.)
	slots := p.slots(c)
	if excess := max(float64(c.InFlight), c.ScrapedRunning+c.ScrapedWaiting) + 1 - slots; excess > 0 {
		est += excess * c.MeanOutput * c.DecodeStep / slots
	}
	// A full KV cache admits this prompt only as running requests end
	// and free theirs: the KV the balancer's requests there hold (their
	// computed prompts, half their mean output so far) turns over in
	// about one request's decode, mean-output x step. Without it a
	// replica that has just taken long contexts looked as fast as any,
	// and short prompts sent after them waited 12-15 s on the overloaded
	// conversation trace runs (measured effect in BENCHMARKS.md). This
	// balancer's prompts are known, and with shared state its peers' as
	// they last published them; direct clients' requests count not at
	// all. Without shared state, with KV events showing that it routes
	// well under the blocks the fleet computes, its share is scaled to
	// the fleet's (heldKV).
	held := p.heldKV(c.HeldPrefill+float64(c.InFlight)*c.MeanOutput/2) + c.PeerHeldPrefill
	if excess := held + prefill - float64(p.index.Capacity(id)*tokenize.BlockSize); excess > 0 && held > 0 {
		est += min(excess, prefill) / held * c.MeanOutput * c.DecodeStep
	}
	shape.Waits = est
	scale, shared := p.prefill.model(id)
	shape.Tokens = prefill
	shape.Burst = p.burst
	ttft = est + scale*p.prefill.sizeFactor(id, prefill)*p.prefill.burstFactor(id, p.burst)*((1-shared)*shape.Serial+shared*shape.Shared)
	shape.Modelled = ttft
	shape.Class = reportClass(c.PendingPrefill <= 0, p.burst, float64(c.InFlight), slots, requests, ahead, float64(p.cfg.BatchTokens))
	// The score keeps the serial prefill at the learned rate: weighed
	// by the learned model it routed worse (the fleet's scale moved the
	// balance between prefill and the slot, KV and eviction prices:
	// chat's P99 0.91 s to 1.26 s; a serial replica's share learned
	// above 0 sent more to loaded replicas: P99 at 16 slots 2.59 s to
	// 2.96 s) and no better on parallel engines (docs/ROUTING.md,
	// "Prefill concurrency").
	est += shape.Serial
	// The prefill a choice adds also delays others on that replica, by
	// its time x the number of requests it holds up. Two groups:
	//  - those sharing the replica's batch and queue: rho/(1-rho), rho
	//    its batch over its slots, the waiting-time cost of added work
	//    in a queue; nothing when idle, the cache's worth under load;
	//  - those reaching the replica while it works off its queue and
	//    this prefill: that time over the replica's share of the
	//    measured gap between requests, counted at most once (a later
	//    request can mostly go elsewhere).
	// The second keeps a prompt with its prefix in proportion to how
	// fast requests come, where the first sees only the batch
	// (BENCHMARKS.md: the benchmark bar met on 42 of 68 held-out trace
	// runs, 36 without it). (KV usage as rho was measured worse: long
	// contexts fill the KV of replicas whose queues are short. The
	// fleet's prefill utilization as a floor was measured too: by
	// pricing every replica's prefill alike, it put short prompts
	// behind long prefills on longshort. The arrivals instead of rho
	// lost the overloaded agentic run's cache; as a floor under rho
	// they met the rule less often; without the cap of one a
	// prefill's price grows with the square of its time, and long
	// prompts waited behind their prefix's queue.)
	//
	// By queue (a prompt no replica holds any of, on a fleet that shares
	// no prefixes): the in-flight count that rho reads also counts the
	// requests still waiting for their prefill, so on a prefill-bound
	// replica rho reached its cap with the running batch far below the
	// slots, and a long prompt was priced at 99x its prefill wherever
	// 64 requests were in flight, going to the replica with the fewest
	// whatever its work ahead. There the requests it delays are those
	// that reach the replica while its queue and this prefill are worked
	// off: that time over the replica's share of the gap between
	// requests, at most as many as rho's cap. On overloaded runs of the
	// Azure code trace (4 and 8 replicas at 1.5, 2 and 3x speed) and
	// longshort (4 and 8 at 1.5x) P99 went from 1.093x the best
	// other's (geometric mean) to 0.998x, and p50 from 0.81-1.01x the
	// best other's to 0.97-1.00x: the count's price had served short
	// prompts first at the long ones' expense. (Everywhere,
	// this price lost the overloaded conversation runs' p50, 0.45x the
	// best other's to 1.27x: with prefixes shared, the count keeps long
	// contexts off the replicas where short requests queue. A prompt
	// with a cached prefix keeps the count, with the arrivals counted
	// at most once, so that a fast stream does not hold it behind its
	// prefix's queue.)
	rho := min(maxUtilization, max(float64(c.InFlight), c.ScrapedRunning)/slots)
	own := prefill / c.PrefillRate
	delayed = rho / (1 - rho)
	if meanGap > 0 {
		arrivals := (ahead/c.PrefillRate + own) / (meanGap * float64(n))
		if byQueue {
			delayed = min(maxUtilization/(1-maxUtilization), arrivals)
		} else {
			delayed += min(1, arrivals)
		}
	}
	est += own * delayed
	// On a full cache every computed block evicts one; evicted blocks
	// come back with the index's measured reuse rate, and then cost
	// their prefill again, by eviction_weight (CostConfig).
	// The replica's own marginal reuse adds what its evictions are
	// expected to cost in recompute there (margin_window, CostConfig;
	// measured on its events when this balancer routes well under the
	// fleet's traffic, marginalReuse).
	if reuse > 0 && p.index.Idle(id) >= 0 {
		eviction = p.cfg.EvictionWeight * reuse * prefill / c.PrefillRate
		if m, ok := p.marginalReuse(id); ok && p.cfg.MarginWindow > 0 && p.fresh > 0 {
			eviction += m / p.cfg.MarginWindow * min(prefill, p.fresh) / c.PrefillRate
		}
		est += eviction
	}
	return ttft, est, delayed, eviction, shape
}

// costHot is how often requests come that match a prefix as their deepest
// held block: a running mean of the gaps between them.
type costHot struct {
	last    int64 // Unix nanoseconds
	meanGap float64
	seen    uint32
}

// hotPrefix returns the depth of the candidates' deepest match of the prompt
// (its mapped blocks in p.depth), how many of them hold it, and the mean gap
// in seconds between the requests that matched it before (0 until two
// have).
func (p *Cost) hotPrefix(blocks []uint64, nowNS int64) (depth, holders int, gap float64, seen float64) {
	for _, id := range p.candID {
		switch d := int(p.depth[id]); {
		case d > depth:
			depth, holders = d, 1
		case d == depth && d > 0:
			holders++
		}
	}
	if depth == 0 || p.cfg.HotPrefixes == 0 {
		return 0, 0, -1, 0
	}
	key := blocks[depth-1]
	h, ok := p.hot[key]
	if !ok && len(p.hot) >= p.cfg.HotPrefixes {
		for k := range p.hot { // forget an arbitrary prefix
			delete(p.hot, k)
			break
		}
	}
	if ok && nowNS >= h.last {
		g := float64(nowNS-h.last) / 1e9
		if h.seen == 1 {
			h.meanGap = g
		} else {
			h.meanGap += (g - h.meanGap) / 16
		}
	}
	gap = h.meanGap
	if h.seen < 2 {
		gap = -1
	}
	seen = float64(h.seen)
	h.last, h.seen = nowNS, min(h.seen+1, 1<<30)
	p.hot[key] = h
	return depth, holders, gap, seen
}

// costArrivals is one replica's running mean of the seconds between the
// decisions it was a candidate in: how fast requests that could go there
// come, whatever the other replicas serve (models on disjoint replicas do
// not count each other's requests; LoRA adapters on the same replicas do).
// It is updated for every candidate of every decision, so it keeps the
// time as Unix nanoseconds: time.Time arithmetic there cost a third of a
// decision at 1,000 replicas.
type costArrivals struct {
	meanGap float64
	last    int64 // Unix nanoseconds; valid when seen
	seen    bool
}

// note updates the mean gap over about the last 64 decisions (a clock that
// went back is skipped; while the mean is 0, as after requests that came
// together at start, the next gap replaces it).
func (a *costArrivals) note(now int64) {
	if a.seen {
		if gap := now - a.last; gap >= 0 {
			g := float64(gap) / 1e9
			if a.meanGap == 0 {
				a.meanGap = g
			} else {
				a.meanGap += (g - a.meanGap) / 64
			}
		}
	}
	a.last, a.seen = now, true
}
