package policy

import (
	"time"

	"github.com/llmlb/llmlb/internal/tokenize"
)

// PreciseIndex is what replicas' own KV cache events say they hold
// (package kvevents): for a replica that publishes, how many leading
// blocks of a prompt it holds, exactly, where cost's own index guesses.
type PreciseIndex interface {
	// Publishes reports whether the replica's events are arriving.
	Publishes(replica string) bool
	// Match returns how many leading blocks the replica holds in its GPU
	// cache (gpu) and in any medium (held) at now.
	Match(replica string, blocks []uint64, now time.Time) (gpu, held int)
	// Expect records that blocks were just routed to the replica: they
	// count as held until its events report them (or a time limit).
	Expect(replica string, blocks []uint64, now time.Time)
	// KeyByTokens reports whether blocks are keyed by the token ids the
	// events carry (prompts hashed with the model's tokenizer) rather
	// than by the engines' own hashes.
	KeyByTokens() bool
}

// SetPreciseIndex makes cost read what a publishing replica holds from x
// rather than from its own index; replicas that do not publish keep the
// guess, in the same decision. A prompt hashed the other way than x keys
// its blocks (over its text where x keys by token ids: one llmlb cannot
// tokenize as the engine does, such as a request with tools) keeps the
// guess everywhere. nil turns it off.
func (p *Cost) SetPreciseIndex(x PreciseIndex) {
	p.precise = x
	p.setFleetMargin()
}

// evictionRisk is what an event-fed index may say beyond PreciseIndex
// (kvevents.Index does): which of the blocks a replica holds now are
// expected gone by the time a request queued there starts, and when a
// request's blocks were freed.
type evictionRisk interface {
	// Survivors returns how many of the first depth blocks the replica
	// holds are expected still held once allocs more blocks have been
	// allocated there.
	Survivors(replica string, blocks []uint64, depth, allocs int, now time.Time) int
	// Touch records that a request using the blocks finished on the
	// replica: vLLM frees its blocks then, at the end of its eviction
	// order.
	Touch(replica string, blocks []uint64)
	// Unmark records that a request routed there with the blocks was
	// turned away before it ran: they are no longer in use for it.
	Unmark(replica string, blocks []uint64)
}

// preciseDepths overwrites, for every candidate whose replica publishes,
// the depth the approximate index matched with what its events say it
// holds in its GPU cache (an offloaded block must still be copied back,
// which cost does not price yet, so it counts as not held), less the
// blocks the prefills queued ahead of the request are expected to evict
// before it starts (vLLM looks its prefix up only then); not when this
// balancer routes a small share of the fleet's prompts (fleetView).
func (p *Cost) preciseDepths(d *costDecision, cands []Candidate) {
	if !p.usePrecise(d) {
		return
	}
	risk, _ := p.precise.(evictionRisk)
	if _, fleet := p.fleetView(); fleet {
		// Most requests on the replicas are other balancers': it sees
		// neither when they free their blocks nor what they queue.
		risk = nil
	}
	for i, id := range p.candID {
		name := p.names[id]
		if !p.precise.Publishes(name) {
			continue
		}
		gpu, _ := p.precise.Match(name, d.blocks, time.Unix(0, d.nowNS))
		if risk != nil && gpu > 0 {
			c := &cands[i]
			ahead := c.PendingPrefill + c.OthersWaiting*p.meanPrompt
			gpu = risk.Survivors(name, d.blocks, gpu, int(ahead/tokenize.BlockSize), time.Unix(0, d.nowNS))
		}
		p.depth[id] = int32(gpu)
	}
}

// touchPrecise tells the event-fed index that a request using the blocks
// finished on the replica.
func (p *Cost) touchPrecise(replica string, blocks []uint64) {
	if risk, ok := p.precise.(evictionRisk); ok && len(blocks) > 0 && p.precise.Publishes(replica) {
		risk.Touch(replica, blocks[:min(len(blocks), maxIndexBlocks)])
	}
}

// unmarkPrecise tells the event-fed index that a request routed to
// replica with the blocks was turned away before it ran.
func (p *Cost) unmarkPrecise(replica string, blocks []uint64) {
	if risk, ok := p.precise.(evictionRisk); ok && len(blocks) > 0 && p.precise.Publishes(replica) {
		risk.Unmark(replica, blocks[:min(len(blocks), maxIndexBlocks)])
	}
}

// expectPrecise tells the event-fed index that the prompt was routed to
// candidate best, so that the next request for it finds it there before
// the engine's events report it.
func (p *Cost) expectPrecise(d *costDecision, best int) {
	if !p.usePrecise(d) {
		return
	}
	if name := p.names[p.candID[best]]; p.precise.Publishes(name) {
		p.precise.Expect(name, d.blocks, time.Unix(0, d.nowNS))
	}
}

// usePrecise reports whether the event-fed index can match the prompt: it
// has blocks, hashed as the index keys them.
func (p *Cost) usePrecise(d *costDecision) bool {
	return p.precise != nil && len(d.blocks) > 0 && d.tokenBlocks == p.precise.KeyByTokens()
}
