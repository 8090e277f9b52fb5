package policy

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkPrefixTreeChoose replays a stream of requests through Choose:
// 64 shared system prompts of `shared` blocks, each followed by a unique
// suffix of `unique` blocks, over 8 replicas, one request per virtual
// 10 ms (so the 120 s eviction runs during long runs).
func BenchmarkPrefixTreeChoose(b *testing.B) {
	for _, bc := range []struct{ shared, unique int }{
		{125, 8},   // 2K-token shared prefix, short suffix (oneshot-like)
		{32, 480},  // 8K-token agentic turn
		{64, 6200}, // 100K-token prefill
	} {
		b.Run(fmt.Sprintf("shared=%d,unique=%d", bc.shared, bc.unique), func(b *testing.B) {
			const n = 1024
			reqs := make([]Request, n)
			for i := range reqs {
				reqs[i].PromptBlocks = prompt(uint64(i%64), bc.shared, uint64(i), bc.shared+bc.unique)
			}
			p, err := NewPrefixTree(DefaultPrefixTreeConfig())
			if err != nil {
				b.Fatal(err)
			}
			cs := cands(0, 0, 0, 0, 0, 0, 0, 0)
			now := t0
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				// Reuse each prompt with a fresh suffix: the tree keeps growing
				// as in a real stream, up to eviction.
				r := &reqs[i%n]
				r.PromptBlocks[len(r.PromptBlocks)-1] ^= uint64(i)
				c := p.Choose(r, cs, now)
				cs[c.Index].InFlight = (cs[c.Index].InFlight + 1) % 8
				now = now.Add(10 * time.Millisecond)
				i++
			}
		})
	}
}

// BenchmarkPrefixTreeSessions replays agentic sessions: 256 sessions over 8
// system prompts, each turn resending the whole history (a 512-token system
// prompt plus 512 tokens a turn, 16 turns, then the session starts over),
// sessions interleaved round-robin, 8 replicas.
func BenchmarkPrefixTreeSessions(b *testing.B) {
	const sessions, turns, sysBlocks, turnBlocks = 256, 16, 32, 32
	full := make([][]uint64, sessions)
	for s := range full {
		full[s] = prompt(uint64(s%8), sysBlocks, uint64(s), sysBlocks+turns*turnBlocks)
	}
	p, err := NewPrefixTree(DefaultPrefixTreeConfig())
	if err != nil {
		b.Fatal(err)
	}
	cs := cands(0, 0, 0, 0, 0, 0, 0, 0)
	now := t0
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		s, turn := i%sessions, (i/sessions)%turns
		r := Request{PromptBlocks: full[s][:sysBlocks+(turn+1)*turnBlocks]}
		c := p.Choose(&r, cs, now)
		cs[c.Index].InFlight = (cs[c.Index].InFlight + 1) % 8
		now = now.Add(10 * time.Millisecond)
		i++
	}
}
