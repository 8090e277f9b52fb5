package policy

import (
	"fmt"
	"testing"

	"github.com/llmlb/llmlb/internal/tokenize"
)

var _ CacheObserver = (*Cost)(nil)

// A request sent beside the prefill of its own prefix: on a replica that
// reports it found all of the hit (serial prefill) the routing stays with the
// cache; on one that reports it computed the unscheduled part again (parallel
// prefill) the learned share prices it and the next such request goes to the
// idle replica, unless a KV cache is filling. Once the prefix's request has
// its first token, nothing is unscheduled.
func TestCostLearnsTheRecomputedShareOfAPendingPrefix(t *testing.T) {
	const shared = 100 * tokenize.BlockSize
	for _, tc := range []struct {
		name      string
		found     int     // cached tokens the replica reports of the expected hit
		kvUsage   float64 // the other replica's scraped KV usage
		wantShare float64 // at least (exactly 0 when 0)
		wantMove  bool
	}{
		{"serial: all of the hit found", shared, 0, 0, false},
		{"parallel: the unscheduled part computed again", 0, 0, 0.1, true},
		{"parallel, a KV cache filling", 0, 0.5, 0.1, false},
		{"parallel: half of it computed again", shared / 2, 0, 0.05, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newCost(t, nil)
			cands := costCands(2)
			first := p.Choose(costPrompt("ctx", 100, 2, "s1"), cands, t0)
			x := first.Index
			cands[x].PendingPrefill, cands[x].PendingRequests, cands[x].InFlight = 800, 1, 1
			cands[1-x].KVCacheUsage = tc.kvUsage

			c := p.Choose(costPrompt("ctx", 100, 3, "s2"), cands, t0)
			if c.Index != x || c.Shape.Hit != shared || c.Shape.Unscheduled != shared {
				t.Fatalf("before any report: index %d (want %d), hit %v, unscheduled %v (want %d)", c.Index, x, c.Shape.Hit, c.Shape.Unscheduled, shared)
			}
			for range 4 {
				p.ObserveCached(cands[x].Name, c.Shape, tc.found)
			}
			share := p.inflight.share[p.ids[cands[x].Name]]
			if tc.wantShare == 0 && share != 0 || share < tc.wantShare {
				t.Fatalf("learned share %v, want %v", share, tc.wantShare)
			}
			c = p.Choose(costPrompt("ctx", 100, 4, "s3"), cands, t0)
			if moved := c.Index != x; moved != tc.wantMove {
				t.Fatalf("third request went to %d, first's replica %d: moved %v, want %v", c.Index, x, moved, tc.wantMove)
			}

			// The first request's first token: its prefix is computed.
			only := cands[x : x+1]
			if c = p.Choose(costPrompt("ctx", 100, 5, "s4"), only, t0); c.Shape.Unscheduled != shared {
				t.Fatalf("before the first token: unscheduled %v, want %d", c.Shape.Unscheduled, shared)
			}
			p.Started(cands[x].Name, costPrompt("ctx", 100, 2, "s1").PromptBlocks)
			if c = p.Choose(costPrompt("ctx", 100, 6, "s5"), only, t0); c.Shape.Unscheduled != 0 {
				t.Fatalf("after the first token: unscheduled %v, want 0", c.Shape.Unscheduled)
			}
		})
	}
}

// A request that ends without a first token (cancelled) leaves the pending
// prefixes too, and a replica's share is forgotten with its cache.
func TestCostPendingPrefixLeavesWithTheRequest(t *testing.T) {
	p := newCost(t, nil)
	cands := costCands(1)
	r := costPrompt("ctx", 10, 1, "s1")
	p.Choose(r, cands, t0)
	id := p.ids["a"]
	if len(p.inflight.pending[id]) != 1 {
		t.Fatalf("pending %v, want the routed request", p.inflight.pending[id])
	}
	p.Finished("a", r.PromptBlocks, t0)
	if len(p.inflight.pending[id]) != 0 {
		t.Fatalf("pending %v after it ended", p.inflight.pending[id])
	}
	p.inflight.observe(id, 160, 160, 0)
	p.ForgetCache("a")
	if p.inflight.share[id] != 0 {
		t.Fatalf("share %v after a restart, want 0", p.inflight.share[id])
	}
}

// Past maxPending requests without a first token, a replica's later ones
// are not followed: every decision reads the list for every candidate.
func TestCostPendingPrefixesAreBounded(t *testing.T) {
	p := newCost(t, nil)
	cands := costCands(1)
	for i := range maxPending + 10 {
		p.Choose(costPrompt(fmt.Sprintf("ctx%d", i), 4, 1, ""), cands, t0)
	}
	if n := len(p.inflight.pending[p.ids["a"]]); n != maxPending {
		t.Fatalf("%d requests followed, want %d", n, maxPending)
	}
}
