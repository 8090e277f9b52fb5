package policy

import (
	"fmt"
	"math/rand/v2"
	"slices"
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
// are not followed: the lists, their indexes and the TTL sweep stay bounded.
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

// listFit is inflightFit as it was before its indexes: every lookup walks
// the replica's list. The indexed one must agree with it on every answer
// and keep the very same lists.
type listFit struct{ pending [][]pendingPrefix }

func (f *listFit) unscheduled(id int32, blocks []uint64, depth int32, cached float64) float64 {
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

func (f *listFit) routed(id int32, blocks []uint64, depth int32, nowNS int64) {
	if id < 0 || depth < 0 || int(depth) >= len(blocks) {
		return
	}
	for len(f.pending) <= int(id) {
		f.pending = append(f.pending, nil)
	}
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

func (f *listFit) started(id int32, blocks []uint64) {
	if id < 0 || int(id) >= len(f.pending) || len(blocks) == 0 {
		return
	}
	q := f.pending[id]
	for k, e := range q {
		if e.n == int32(len(blocks)) && e.last == blocks[len(blocks)-1] {
			q[k] = q[len(q)-1]
			f.pending[id] = q[:len(q)-1]
			return
		}
	}
}

// checkConsistent reports where the indexes disagree with the lists.
func (f *inflightFit) checkConsistent() error {
	type node struct{ rep, at int32 }
	want, wantAt := map[uint64]map[node]int32{}, make([]int32, maxIndexBlocks)
	for id, q := range f.pending {
		byLast := map[lastKey]lastAt{}
		for k, e := range q {
			key := lastKey{e.last, e.n}
			la, ok := byLast[key]
			if !ok {
				la.pos = int32(k)
			}
			la.count++
			byLast[key] = la
			if want[e.first] == nil {
				want[e.first] = map[node]int32{}
			}
			want[e.first][node{int32(id), e.at}]++
			wantAt[e.at]++
			if e.nowNS < f.oldest[id] {
				return fmt.Errorf("replica %d: entry %d routed at %d, before oldest %d", id, k, e.nowNS, f.oldest[id])
			}
		}
		if len(byLast) != len(f.byLast[id]) {
			return fmt.Errorf("replica %d: %d prompts by last block, want %d", id, len(f.byLast[id]), len(byLast))
		}
		for key, la := range byLast {
			if f.byLast[id][key] != la {
				return fmt.Errorf("replica %d: prompt %v at %v, want %v", id, key, f.byLast[id][key], la)
			}
		}
	}
	t := &f.firsts
	if len(t.heads) != len(want) {
		return fmt.Errorf("%d first blocks indexed, want %d", len(t.heads), len(want))
	}
	for h, nodes := range want {
		got := map[node]int32{}
		for n := t.heads[h]; n != noNode; n = t.nodes[n].next {
			got[node{t.nodes[n].rep, t.nodes[n].at}] += t.nodes[n].count
		}
		if fmt.Sprint(got) != fmt.Sprint(nodes) {
			return fmt.Errorf("first block %x: %v, want %v", h, got, nodes)
		}
	}
	for at, n := range wantAt {
		if t.atN != nil && (t.atN[at] != n || (t.atSet[at/64]>>(at%64)&1 == 1) != (n > 0)) {
			return fmt.Errorf("position %d: %d requests (bit %d), want %d", at, t.atN[at], t.atSet[at/64]>>(at%64)&1, n)
		}
	}
	return nil
}

// The indexes answer what the list walk did (firsts, the walk and scan's
// choice of the two each), keep the same lists through routing past the
// bound and the TTL, first tokens, cancels and removals (two alike
// requests included: a small alphabet of blocks), and stay consistent
// with the lists.
func TestCostPendingIndexAgreesWithTheListWalk(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var got inflightFit
	var want listFit
	prompt := func() []uint64 {
		b := make([]uint64, 1+rng.IntN(80))
		for i := range b {
			b[i] = uint64(rng.IntN(3))<<8 | uint64(i) // few distinct blocks a position
		}
		return b
	}
	var routed [][]uint64
	nowNS, full := int64(0), 0
	for step := range 60_000 {
		id := int32(rng.IntN(3))
		starts, rare := 300, 2 // per 1000: the lists stay short, alike requests meet
		if step/10_000%2 == 1 {
			starts, rare = 10, 0 // the lists fill to the bound
		}
		switch op := rng.IntN(1000); {
		case op < 600:
			b := prompt()
			depth := int32(rng.IntN(len(b) + 1))
			got.routed(id, b, depth, nowNS)
			want.routed(id, b, depth, nowNS)
			routed = append(routed, b)
			nowNS += rng.Int64N(int64(100e6))
		case op < 600+starts && len(routed) > 0:
			b := routed[rng.IntN(len(routed))]
			if rng.IntN(2) == 0 {
				b = routed[len(routed)-1-rng.IntN(min(len(routed), 20))] // a recent one
			}
			got.started(id, b)
			want.started(id, b)
		case op < 600+starts+rare:
			got.forget(id)
			if int(id) < len(want.pending) {
				want.pending[id] = want.pending[id][:0]
			}
		case op < 600+starts+2*rare:
			nowNS += rng.Int64N(2 * pendingTTL)
		default:
			b := prompt()
			bound := int32(rng.IntN(len(b) + 5))
			depths := make([]int32, 4)
			for r := range depths {
				depths[r] = int32(rng.IntN(int(bound) + 1))
			}
			for _, how := range []string{"chosen", "index", "walk"} {
				got.scan([]int32{0, 1, 2, 3}, b, bound)
				switch how {
				case "index":
					got.walking = false
					got.firsts.scan(b, min(int(bound), len(b)))
				case "walk":
					got.walking, got.path = true, b
				}
				for r, depth := range depths {
					cached := float64(depth) * tokenize.BlockSize
					if g, w := got.unscheduled(int32(r), depth, cached), want.unscheduled(int32(r), b, depth, cached); g != w {
						t.Fatalf("step %d: replica %d unscheduled %v (%s), want %v", step, r, g, how, w)
					}
				}
			}
		}
		for r := range want.pending {
			if !slices.Equal(got.pending[r], want.pending[r]) {
				t.Fatalf("step %d: replica %d pending\n%v\nwant\n%v", step, r, got.pending[r], want.pending[r])
			}
		}
		if step%97 == 0 {
			if err := got.checkConsistent(); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
		}
		if int(id) < len(got.pending) {
			full = max(full, len(got.pending[id]))
		}
	}
	if full < maxPending {
		t.Errorf("the longest list reached %d, want the bound %d", full, maxPending)
	}
}

// BenchmarkPendingLookup measures one decision's lookup of the pending
// prefixes for every candidate (each holding the whole prompt), the lists
// full and none of their requests on the prompt's path: lookup=list is
// the former walk of every list (listFit), lookup=index firsts alone and
// lookup=chosen what scan chooses. Requests start at positions spread over
// the prompt (the index's worst case: a lookup per position) or all at one.
func BenchmarkPendingLookup(b *testing.B) {
	for _, n := range []int{4, 32} {
		for _, blocks := range []int{64, 1024} {
			for _, starts := range []string{"spread", "one"} {
				rng := rand.New(rand.NewPCG(5, 5))
				var got inflightFit
				var want listFit
				prompt := make([]uint64, blocks)
				for i := range prompt {
					prompt[i] = rng.Uint64()
				}
				ids, other := make([]int32, n), make([]uint64, blocks)
				for id := range int32(n) {
					ids[id] = id
					for range maxPending {
						depth := int32(blocks / 2)
						if starts == "spread" {
							depth = int32(rng.IntN(blocks))
						}
						// routed reads the blocks at depth and the last
						other[depth], other[blocks-1] = rng.Uint64(), rng.Uint64()
						got.routed(id, other, depth, 0)
						want.routed(id, other, depth, 0)
					}
				}
				cached := float64(blocks * tokenize.BlockSize)
				for _, lookup := range []string{"list", "index", "chosen"} {
					name := fmt.Sprintf("replicas=%d/blocks=%d/starts=%s/lookup=%s", n, blocks, starts, lookup)
					b.Run(name, func(b *testing.B) {
						sum := 0.0
						for b.Loop() {
							switch lookup {
							case "list":
								for _, id := range ids {
									sum += want.unscheduled(id, prompt, int32(blocks), cached)
								}
								continue
							case "index":
								got.walking = false
								got.firsts.scan(prompt, blocks)
							default:
								got.scan(ids, prompt, int32(blocks))
							}
							for _, id := range ids {
								sum += got.unscheduled(id, int32(blocks), cached)
							}
						}
						if sum != 0 {
							b.Fatal("a pending prefix on the prompt's path")
						}
					})
				}
			}
		}
	}
}
