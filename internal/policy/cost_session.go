package policy

import (
	"math"
	"time"
)

// costSession remembers where a session's last request went, for requests
// whose prompt has no blocks, and the session's current burst.
type costSession struct {
	rep    int32
	tokens int
	// firstTokenBy is when the session's requests so far are expected to
	// have their first tokens (Unix nanoseconds): a request before it is
	// part of a burst, whose first request went to burstRep; burstTokens is
	// the prefill the burst's requests sent there make it compute.
	firstTokenBy int64
	burstRep     int32
	burstTokens  float64
	// burstCount is the requests of the current burst so far, prevBurst
	// those of the session's burst before (1 for a lone request).
	burstCount, prevBurst int32
}

// maxBurstWindow bounds how long after a request the session's next ones
// count as its burst, whatever its estimate (an estimate of hours is a
// replica in trouble, not a prefill).
const maxBurstWindow = 10 * time.Minute

// burstWindow is a TTFT estimate in seconds as nanoseconds, within
// [0, maxBurstWindow].
func burstWindow(ttft float64) int64 {
	if !(ttft > 0) {
		return 0
	}
	return int64(min(ttft, maxBurstWindow.Seconds()) * float64(time.Second))
}

// spread lets a later request of a session's burst leave the burst's
// replica, best, for the best other one (spreadBurst says when and why),
// noting the move in d for the explanation; it returns the candidate to
// take.
func (p *Cost) spread(d *costDecision, cands []Candidate, best int) int {
	if d.inBurst {
		return p.spreadInBurst(d, cands, best)
	}
	return best
}

// spreadInBurst is spread for a later request of a burst: one that would
// go to the burst's replica, best, may move (spreadBurst weighs it).
func (p *Cost) spreadInBurst(d *costDecision, cands []Candidate, best int) int {
	if !(p.cfg.BurstSpread > 0 && best >= 0 && p.candID[best] == d.sess.burstRep) {
		return best
	}
	// The burst's later requests follow a copy to its replica: expect as
	// many as the session's previous burst had, less those routed.
	sharing := max(1, int(d.sess.prevBurst)-int(d.sess.burstCount))
	alt, added := p.spreadBurst(best, cands, d.limit, d.tokens, d.sess.burstTokens, sharing)
	d.burstAdded = added
	if alt != best {
		d.spreadFrom = best
	}
	return alt
}

// spreadBurst returns the candidate a later request of a burst takes
// instead of best, the burst's replica: the best other one within the
// bound, if its score there is at most burst_spread x what the burst's
// earlier requests add to the request's TTFT on best; best otherwise
// (CostConfig.BurstSpread says why). What they add is their prefill still
// ahead of it there (burstTokens, at most the replica's work ahead: what
// it has computed since is gone), in tokens and steps, so neither time
// nor other sessions' queue counts. The price of the blocks the copy
// evicts counts once for the sharing requests of the burst expected to
// follow the copy there: on a full cache it would otherwise keep a whole
// burst behind a replica's 100K-token prefill to spare one copy (as
// measured by mixed's P99, BENCHMARKS.md). It also returns what the burst
// added, in seconds.
func (p *Cost) spreadBurst(best int, cands []Candidate, limit, tokens int, burstTokens float64, sharing int) (int, float64) {
	c := &cands[best]
	ahead := p.aheads[best]
	behind := min(burstTokens, ahead)
	if !(behind > 0) {
		return best, 0
	}
	work, batch := ahead+p.prefills[best], float64(p.cfg.BatchTokens)
	added := c.DecodeStep*(math.Floor(work/batch)-math.Floor((work-behind)/batch)) + behind/c.PrefillRate
	alt := -1
	for i := range cands {
		if i == best || p.overBound(&cands[i], limit, p.prefills[i], tokens) {
			continue
		}
		if alt < 0 || p.estimates[i] < p.estimates[alt] {
			alt = i
		}
	}
	if alt < 0 {
		return best, added
	}
	score := p.estimates[alt] - p.evictions[alt]*(1-1/float64(sharing))
	if score <= p.estimates[best]+p.cfg.BurstSpread*added {
		return alt, added
	}
	return best, added
}

// rememberSession notes where the session's request went, for its later
// requests whose prompt has no blocks, and the burst it starts or
// continues, for spread: a session's requests come in bursts whose later
// requests would otherwise all queue behind the first's.
// It is called for a request with a session while sessions are kept.
func (p *Cost) rememberSession(d *costDecision, best int) {
	if _, ok := p.sessions[d.session]; !ok && len(p.sessions) >= p.cfg.Sessions {
		for k := range p.sessions { // evict an arbitrary session
			delete(p.sessions, k)
			break
		}
	}
	sess := &d.sess
	next := costSession{rep: p.candID[best], tokens: d.tokens, burstRep: p.candID[best], burstTokens: p.prefills[best],
		firstTokenBy: d.nowNS + burstWindow(p.ttfts[best])}
	next.burstCount, next.prevBurst = 1, sess.burstCount
	if d.inBurst {
		next.firstTokenBy = max(next.firstTokenBy, sess.firstTokenBy)
		next.burstRep, next.burstTokens = sess.burstRep, sess.burstTokens
		if next.burstRep == p.candID[best] {
			next.burstTokens += p.prefills[best]
		}
		next.burstCount, next.prevBurst = min(sess.burstCount+1, math.MaxInt32), sess.prevBurst
	}
	p.sessions[d.session] = next
}
