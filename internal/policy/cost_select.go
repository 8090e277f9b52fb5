package policy

import "math"

// bound returns the bounded-load limit, max(ceil(bounded_load x the mean
// in flight, counting this request), the least loaded's + slack):
// consistent hashing with bounded loads, so that a prefix every request
// shares cannot pull all traffic to one replica (overBound says whom the
// limit binds).
func (p *Cost) bound(cands []Candidate) int {
	total, minIn := 0, math.MaxInt
	for i := range cands {
		total += cands[i].InFlight
		minIn = min(minIn, cands[i].InFlight)
	}
	return max(int(math.Ceil(p.cfg.BoundedLoad*float64(total+1)/float64(len(cands)))), minIn+p.cfg.BoundedLoadSlack, 1)
}

// overBound reports whether the bounded-load rule keeps candidate c out: it
// would go past the limit, and either holds part of the prompt (the bound
// stops cache affinity from piling requests onto the replicas that hold a
// prefix everyone shares) or has no free batch slot. A replica that holds
// none of a sized prompt and can still admit it is ahead on its estimate
// alone (queue, batch, KV), which already prices its load: bounding it by
// request count sent short requests behind 100K-token prefills on
// longshort, where the one replica without a long prefill takes most short
// requests (BENCHMARKS.md). Twice the limit binds every replica: the bound
// is also the backstop against estimates that are wrong (a replica whose
// /metrics claim rates it does not have would otherwise take requests up
// to a full batch).
func (p *Cost) overBound(c *Candidate, limit int, prefill float64, tokens int) bool {
	if c.InFlight+1 <= limit {
		return false
	}
	holds := prefill < float64(tokens)
	return tokens <= 0 || holds || float64(c.InFlight+1) > min(float64(2*limit), p.slots(c))
}

// tieBreak returns the candidate to take among those within the bound
// whose scores are within tie_steps decode steps of the fastest's: a step
// computes a whole token budget, so smaller differences are below the
// model's resolution, and preferred orders those candidates instead (then
// rotation, walking from the decision's start).
func (p *Cost) tieBreak(d *costDecision, cands []Candidate, fastest int) int {
	n := len(cands)
	if fastest < 0 { // unreachable: the least-loaded candidate is within the limit
		return d.start
	}
	best := fastest
	margin := p.estimates[fastest] + p.cfg.TieSteps*cands[fastest].DecodeStep
	for j := range n {
		i := d.start + j
		if i >= n {
			i -= n
		}
		if p.overBound(&cands[i], d.limit, p.prefills[i], d.tokens) || p.estimates[i] > margin {
			continue
		}
		if p.preferred(i, best, cands) {
			best = i
		}
	}
	return best
}

// preferred orders two candidates whose estimates count as equal: fewer in
// flight (a lighter batch steps faster for everyone in it; the cache is
// already priced in the score), then the most cached prompt, then a cache
// with room or whose coldest block is the coldest (new blocks evict the
// least valuable data).
func (p *Cost) preferred(i, best int, cands []Candidate) bool {
	if cands[i].InFlight != cands[best].InFlight {
		return cands[i].InFlight < cands[best].InFlight
	}
	if p.prefills[i] != p.prefills[best] {
		return p.prefills[i] < p.prefills[best]
	}
	if p.prefills[i] > 0 {
		ii, ib := p.index.Idle(p.candID[i]), p.index.Idle(p.candID[best])
		if (ii < 0) != (ib < 0) {
			return ii < 0
		}
		if ii != ib {
			return ii > ib
		}
	}
	return false
}
