package policy

import "time"

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

// preciseDepths overwrites, for every candidate whose replica publishes,
// the depth the approximate index matched with what its events say it
// holds in its GPU cache (an offloaded block must still be copied back,
// which cost does not price yet, so it counts as not held).
func (p *Cost) preciseDepths(d *costDecision) {
	if !p.usePrecise(d) {
		return
	}
	for _, id := range p.candID {
		name := p.names[id]
		if !p.precise.Publishes(name) {
			continue
		}
		gpu, _ := p.precise.Match(name, d.blocks, time.Unix(0, d.nowNS))
		p.depth[id] = int32(gpu)
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
