package policy

import "time"

// Attach keeps the fleet view, for the Sharer of shared state.
func (p *Cost) Attach(f Fleet) { p.fleet = f }

// Routed publishes the prompt's blocks the chosen replica was sent, so that
// the peers' indexes expect them there too (shared state).
func (p *Cost) Routed(replica string, r *Request, _ Choice, now time.Time) {
	p.publishBlocks(replica, r.PromptBlocks, now)
}

// publishBlocks tells the peers a replica was sent, or finished, a prompt
// with these blocks (at most what the index keeps of one prompt).
func (p *Cost) publishBlocks(replica string, blocks []uint64, now time.Time) {
	if p.fleet == nil || len(blocks) == 0 {
		return
	}
	if s := p.fleet.Sharer(); s != nil {
		s.Publish(Delta{Kind: DeltaBlocks, At: now, Replica: replica, Blocks: blocks[:min(len(blocks), MaxIndexBlocks)]})
	}
}

// Apply enters a peer's prompt blocks into the index as if this balancer
// had sent them to the replica.
func (p *Cost) Apply(d Delta, capacityTokens int, _ time.Time) bool {
	if d.Kind != DeltaBlocks || len(d.Blocks) == 0 {
		return false
	}
	p.Record(d.Replica, d.Blocks[:min(len(d.Blocks), MaxIndexBlocks)], capacityTokens)
	return true
}
