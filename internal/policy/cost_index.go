package policy

import (
	"time"

	"github.com/llmlb/llmlb/internal/kvindex"
	"github.com/llmlb/llmlb/internal/tokenize"
)

// candidates works out what each candidate holds of the prompt (its depth
// in the index, p.depth; the tokens it must compute, p.prefills) and what
// it has pending (p.aheads): the estimates price only the tokens a replica
// must compute, behind the work it already owes.
func (p *Cost) candidates(d *costDecision, cands []Candidate) {
	p.mapCandidates(cands)
	clear(p.depth)
	if len(d.blocks) > 0 {
		p.index.Match(d.blocks, p.depth)
		p.preciseDepths(d, cands) // where replicas publish events, what they say
		d.hotDepth, d.hotHolders, d.hotGap, d.hotSeen = p.hotPrefix(d.blocks, d.nowNS)
	}
	if d.inBurst {
		d.hotGap = -1 // a burst's copies are spreadBurst's
	}
	// A session seen before whose prompt no candidate holds all of: the
	// part none holds is its own context, lost everywhere (or its new
	// message), read again by its later turns only.
	p.fresh = 0
	if d.hasSession && len(d.blocks) > 0 {
		held := int32(0)
		for _, id := range p.candID {
			held = max(held, p.depth[id])
		}
		p.fresh = float64(max(0, d.tokens-int(held)*tokenize.BlockSize))
	}
	if len(d.blocks) > 0 { // the pending prefixes on the prompt's path, once for all
		bound := int32(0)
		for _, id := range p.candID {
			bound = max(bound, p.depth[id])
		}
		p.inflight.scan(p.candID, d.blocks, bound)
	}
	for i := range cands {
		c := &cands[i]
		id := p.candID[i]
		cached := 0
		if len(d.blocks) > 0 {
			cached = int(p.depth[id]) * tokenize.BlockSize
		} else if d.hasSession && d.sess.rep == id {
			cached = d.sess.tokens
		}
		cached = max(0, min(cached, d.tokens-1)) // a full hit still computes its last token
		p.prefills[i] = float64(d.tokens - cached)
		p.unsched[i] = 0
		if len(d.blocks) > 0 {
			p.unsched[i] = p.inflight.unscheduled(id, p.depth[id], float64(cached))
		}
		p.aheads[i] = c.PendingPrefill + c.OthersWaiting*p.meanPrompt
	}
}

// learn records the choice where later decisions look: the prompt's
// blocks in the chosen replica's share of the index (returning the token
// Refused undoes that with), the session, the running mean prompt
// that prices a queue of requests other than the balancer's, and the
// running share of prompts found cached (p.shared).
func (p *Cost) learn(d *costDecision, best int) (recorded uint64) {
	if len(d.blocks) > 0 {
		id := p.candID[best]
		recorded = recordedToken(p.index.Touch(id, d.blocks), int(p.depth[id]))
		p.expectPrecise(d, best)
		p.noteRouted(d, best)
		p.inflight.routed(id, d.blocks, p.depth[id], d.nowNS)
	}
	if d.session != "" && p.cfg.Sessions > 0 {
		p.rememberSession(d, best)
	}
	if d.tokens > 0 {
		p.shared += (float64(d.tokens)-p.prefills[best])/float64(d.tokens)/256 - p.shared/256
		p.sharedSeen = min(p.sharedSeen+1, 256)
	}
	prefill := float64(int(p.prefills[best]))
	if p.meanPrompt == 0 {
		p.meanPrompt = prefill
	} else {
		p.meanPrompt += (prefill - p.meanPrompt) / 64
	}
	return recorded
}

// mapCandidates gives each candidate its index id (p.candID), sizes its
// share of the index to its KV capacity, and sizes the per-candidate
// scratch: the index models each replica's cache at its real size.
func (p *Cost) mapCandidates(cands []Candidate) {
	// The fleet rarely changes between two requests: reuse the last
	// mapping where the name at the same position is the same string.
	reuse := p.candID
	p.candID = p.candID[:0]
	same := len(p.lastNames) == len(cands)
	for i := range cands {
		c := &cands[i]
		var id int32
		if i < len(reuse) && i < len(p.lastNames) && p.lastNames[i] == c.Name {
			id = reuse[i]
		} else {
			id, same = p.id(c.Name), false
		}
		p.candID = append(p.candID, id)
		capTokens := c.KVCacheTokens
		if p.cfg.KVCacheTokens > 0 {
			capTokens = p.cfg.KVCacheTokens
		}
		if capTokens <= 0 {
			capTokens = DefaultKVCacheTokens
		}
		if blocks := capTokens / tokenize.BlockSize; p.index.Capacity(id) != blocks {
			p.index.SetCapacity(id, blocks)
		}
	}
	if !same {
		p.lastNames = p.lastNames[:0]
		for i := range cands {
			p.lastNames = append(p.lastNames, cands[i].Name)
		}
	}
	if len(p.depth) < len(p.names) {
		p.depth = make([]int32, len(p.names))
	}
	for len(p.arrivals) < len(p.names) {
		p.arrivals = append(p.arrivals, costArrivals{})
	}
	if cap(p.estimates) < len(cands) {
		p.estimates = make([]float64, len(cands))
		p.ttfts = make([]float64, len(cands))
		p.prefills = make([]float64, len(cands))
		p.delayed = make([]float64, len(cands))
		p.evictions = make([]float64, len(cands))
		p.aheads = make([]float64, len(cands))
		p.copyShares = make([]float64, len(cands))
		p.shapes = make([]PrefillShape, len(cands))
		p.unsched = make([]float64, len(cands))
	}
	p.estimates, p.ttfts, p.prefills = p.estimates[:len(cands)], p.ttfts[:len(cands)], p.prefills[:len(cands)]
	p.delayed, p.evictions, p.aheads = p.delayed[:len(cands)], p.evictions[:len(cands)], p.aheads[:len(cands)]
	p.copyShares, p.shapes, p.unsched = p.copyShares[:len(cands)], p.shapes[:len(cands)], p.unsched[:len(cands)]
}

// id returns the replica's index id, giving a new name the next one.
func (p *Cost) id(name string) int32 {
	id, ok := p.ids[name]
	if !ok {
		id = int32(len(p.names))
		p.ids[name] = id
		p.names = append(p.names, name)
	}
	return id
}

// recordedToken packs a Touch (its stamp and evictions) and the blocks the
// replica held before it into Choice.Recorded: the stamp in the top 32
// bits, bit 31 set, the evictions in bits 15-30 and the held blocks in bits
// 0-14 (both at most maxIndexBlocks).
func recordedToken(t kvindex.Touched, held int) uint64 {
	return uint64(t.Stamp)<<32 | 1<<31 | uint64(min(max(t.Evicted, 0), maxIndexBlocks))<<15 | uint64(min(held, maxIndexBlocks))
}

// recordedTouch unpacks recordedToken.
func recordedTouch(v uint64) (t kvindex.Touched, held int) {
	return kvindex.Touched{Stamp: uint32(v >> 32), Evicted: int(v >> 15 & (1<<16 - 1))}, int(v & (1<<15 - 1))
}

// Refused undoes Choose's record of a prompt the replica turned away
// before running it: the blocks it added there leave the index, unless a
// later prompt has used them since (kvindex.Forget). Without it a rejected
// prompt (too long for the replica's context, say) stayed in the index as
// if the replica had computed it, drew the prompt's next requests there
// for a cache hit that was not, and had evicted as much of what the replica
// does hold. The event-fed index drops its marks of the blocks as in use
// for the request (they would otherwise hold them safe from eviction for
// kvevents.BusyTTL).
func (p *Cost) Refused(replica string, blocks []uint64, recorded uint64) {
	id, ok := p.ids[replica]
	if ok {
		p.inflight.started(id, blocks)
		p.unmarkPrecise(replica, blocks)
	}
	if !ok || recorded&(1<<31) == 0 || len(blocks) == 0 {
		return
	}
	t, held := recordedTouch(recorded)
	p.index.Forget(id, blocks[:min(len(blocks), maxIndexBlocks)], held, t)
}

// Started pins the prompt's blocks on the replica while the request runs
// (from its first token to its end; vLLM holds a running request's blocks
// out of its free queue) and returns the token Ended releases them with.
func (p *Cost) Started(replica string, blocks []uint64) uint64 {
	id, ok := p.ids[replica]
	if !ok || len(blocks) == 0 {
		return 0
	}
	p.inflight.started(id, blocks)
	return uint64(p.index.Pin(id, blocks[:min(len(blocks), maxIndexBlocks)]))
}

// Ended releases what Started pinned.
func (p *Cost) Ended(token uint64) { p.index.Unpin(kvindex.Pin(token)) }

// RemoveReplica forgets the replica's cached blocks and its prefill model
// (a replica restarted may run with other engine flags).
func (p *Cost) RemoveReplica(name string) {
	if id, ok := p.ids[name]; ok {
		p.index.RemoveReplica(id)
		p.prefill.forget(id)
		p.report.forget(id)
		p.inflight.forget(id)
	}
}

// Record notes that the named replica holds the blocks (a prompt sent there
// by another route: a warm start, a peer balancer), as if it had chosen it.
// capacityTokens sizes the replica's share of the index when it is new.
func (p *Cost) Record(name string, blocks []uint64, capacityTokens int) {
	id := p.id(name)
	if p.index.Capacity(id) == 0 {
		if p.cfg.KVCacheTokens > 0 {
			capacityTokens = p.cfg.KVCacheTokens
		}
		if capacityTokens <= 0 {
			capacityTokens = DefaultKVCacheTokens
		}
		p.index.SetCapacity(id, capacityTokens/tokenize.BlockSize)
	}
	p.index.Touch(id, blocks[:min(len(blocks), maxIndexBlocks)])
}

// ForgetCache forgets what a replica holds (it restarted: its counters went
// back), keeping its identity.
func (p *Cost) ForgetCache(name string) { p.RemoveReplica(name) }

// Finished records a finished request's prompt blocks again on its replica:
// vLLM frees a request's blocks when it finishes (its prompt's tail first),
// so they join the replica's LRU order then; a long request's prompt is
// fresher in the replica's cache than its routing time says.
func (p *Cost) Finished(replica string, blocks []uint64, now time.Time) {
	p.publishBlocks(replica, blocks, now) // the peers' indexes learn the same order
	p.touchPrecise(replica, blocks)
	id, ok := p.ids[replica]
	if !ok || len(blocks) == 0 {
		return
	}
	p.inflight.started(id, blocks) // ended without a first token (Started drops the others)
	p.index.Touch(id, blocks[:min(len(blocks), maxIndexBlocks)])
}

// Holder returns the replica whose share of the index holds the most
// leading blocks of a prompt, and how many tokens that is (0 and "" when
// no replica holds its first block). It changes nothing: flow control asks
// it before dispatching a held request (CacheHolder).
func (p *Cost) Holder(blocks []uint64) (replica string, tokens int) {
	if len(blocks) == 0 || len(p.names) == 0 {
		return "", 0
	}
	if len(blocks) > maxIndexBlocks {
		blocks = blocks[:maxIndexBlocks]
	}
	if cap(p.holderDepth) < len(p.names) {
		p.holderDepth = make([]int32, len(p.names))
	}
	depth := p.holderDepth[:len(p.names)]
	clear(depth)
	p.index.Match(blocks, depth)
	best := -1
	for id, d := range depth {
		if d > 0 && (best < 0 || d > depth[best]) {
			best = id
		}
	}
	if best < 0 {
		return "", 0
	}
	return p.names[best], int(depth[best]) * tokenize.BlockSize
}
