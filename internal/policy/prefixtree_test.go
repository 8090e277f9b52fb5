package policy

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/tokenize"
)

// chain builds chained block hashes from one content key per block, like
// tokenize does: block i's hash covers blocks 0..i.
func chain(keys ...uint64) []uint64 {
	out := make([]uint64, len(keys))
	h := uint64(fnvOffset)
	for i, k := range keys {
		h = tokenize.Mix64(h ^ tokenize.Mix64(k+1))
		out[i] = h
	}
	return out
}

// prompt returns n blocks: shared blocks of prefix family, then unique ones.
func prompt(family uint64, shared int, unique uint64, n int) []uint64 {
	keys := make([]uint64, n)
	for i := range keys {
		if i < shared {
			keys[i] = family<<32 | uint64(i)
		} else {
			keys[i] = 1<<63 | unique<<32 | uint64(i)
		}
	}
	return chain(keys...)
}

func newTree(t *testing.T, mod func(*PrefixTreeConfig)) *PrefixTree {
	t.Helper()
	cfg := DefaultPrefixTreeConfig()
	if mod != nil {
		mod(&cfg)
	}
	p, err := NewPrefixTree(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type treeStep struct {
	name   string
	at     time.Duration // offset from t0
	model  string
	blocks []uint64
	cands  []Candidate
	remove string // RemoveReplica before choosing
	want   string // chosen replica name
	reason string
}

func runTreeSteps(t *testing.T, p *PrefixTree, steps []treeStep) {
	t.Helper()
	for _, s := range steps {
		if s.remove != "" {
			p.RemoveReplica(s.remove)
		}
		cs := s.cands
		if cs == nil {
			cs = cands(0, 0, 0, 0)
		}
		c := p.Choose(&Request{Model: s.model, PromptBlocks: s.blocks}, cs, t0.Add(s.at))
		if got := cs[c.Index].Name; got != s.want || c.Reason != s.reason {
			t.Errorf("%s: got %s/%s (%s), want %s/%s", s.name, got, c.Reason, c.Detail, s.want, s.reason)
		}
		checkInvariants(t, p)
	}
}

func TestPrefixTreeRouting(t *testing.T) {
	a := prompt(1, 20, 1, 40)  // family 1
	a2 := prompt(1, 20, 2, 40) // shares 20/40 = 0.5 with a
	b := prompt(2, 0, 3, 40)   // unrelated
	c := prompt(1, 10, 4, 40)  // shares 10/40 = 0.25 with a: below 0.3
	d := prompt(1, 13, 5, 40)  // shares 13/40 = 0.325 with a: above 0.3
	steps := []treeStep{
		{name: "cold start: smallest tree, first of equals", blocks: a, want: "r0", reason: ReasonLoad},
		{name: "same prompt: longest match", blocks: a, want: "r0", reason: ReasonAffinity},
		{name: "unrelated prompt: smallest tree", blocks: b, want: "r1", reason: ReasonLoad},
		{name: "half shared: match rate 0.5 > 0.3", blocks: a2, want: "r0", reason: ReasonAffinity},
		{name: "quarter shared: 0.25 <= 0.3, smallest tree", blocks: c, want: "r2", reason: ReasonLoad},
		{name: "0.325 shared: longest match wins over smaller trees", blocks: d, want: "r0", reason: ReasonAffinity},
		{name: "empty prompt: match rate 0, smallest tree", blocks: nil, want: "r3", reason: ReasonLoad},
		{name: "deepest match not a candidate: best candidate match (10/30 > 0.3)", blocks: prompt(1, 13, 5, 30), cands: without(cands(0, 0, 0, 0), "r0"), want: "r2", reason: ReasonAffinity},
		{name: "other model: own tree, cold", model: "m2", blocks: a, want: "r0", reason: ReasonLoad},
		{name: "removed replica: its tree is gone, b is a miss", remove: "r1", blocks: b, want: "r1", reason: ReasonLoad},
	}
	runTreeSteps(t, newTree(t, nil), steps)
}

func TestPrefixTreeImbalance(t *testing.T) {
	a := prompt(1, 40, 1, 40)
	tests := []struct {
		name   string
		load   []int // r0 holds prompt a
		want   string
		reason string
	}{
		{"balanced: follows the match", []int{10, 0, 0, 0}, "r0", ReasonAffinity},
		{"max-min = 64, not > abs 64", []int{64, 0, 0, 0}, "r0", ReasonAffinity},
		{"max-min = 65 > 64 and 65 > 1.5*0", []int{65, 0, 0, 0}, "r1", ReasonLoad},
		{"abs exceeded but max <= rel*min (195 <= 1.5*130)", []int{195, 130, 140, 150}, "r0", ReasonAffinity},
		{"both exceeded (196 > 195), least loaded", []int{196, 131, 130, 150}, "r2", ReasonLoad},
		{"loads of all candidates count, not only the match", []int{0, 100, 20, 30}, "r0", ReasonLoad},
	}
	for _, tt := range tests {
		p := newTree(t, nil)
		p.Choose(&Request{PromptBlocks: a}, cands(0, 0, 0, 0), t0)
		cs := cands(tt.load...)
		c := p.Choose(&Request{PromptBlocks: a}, cs, t0.Add(time.Second))
		if got := cs[c.Index].Name; got != tt.want || c.Reason != tt.reason {
			t.Errorf("%s: got %s/%s, want %s/%s", tt.name, got, c.Reason, tt.want, tt.reason)
		}
		checkInvariants(t, p)
	}
}

func TestPrefixTreeImbalancedStillLearns(t *testing.T) {
	p := newTree(t, nil)
	a := prompt(1, 40, 1, 40)
	p.Choose(&Request{PromptBlocks: a}, cands(100, 0), t0) // imbalanced: r1 learns a
	c := p.Choose(&Request{PromptBlocks: a}, cands(0, 0), t0.Add(time.Second))
	if c.Index != 1 || c.Reason != ReasonAffinity {
		t.Errorf("got %+v, want r1 by affinity", c)
	}
}

func TestPrefixTreeEviction(t *testing.T) {
	old := prompt(1, 0, 1, 8)
	fresh := prompt(2, 0, 2, 8)
	p := newTree(t, func(c *PrefixTreeConfig) { c.MaxTreeBlocks = 10 })
	one := cands(0)
	p.Choose(&Request{PromptBlocks: old}, one, t0)
	p.Choose(&Request{PromptBlocks: fresh}, one, t0.Add(time.Second))
	tr := p.trees[""]
	if got := tr.sizeOf(0); got != 16 {
		t.Fatalf("size before eviction = %d, want 16", got)
	}
	// Not yet due: 119 s after the first call.
	p.Choose(&Request{}, one, t0.Add(119*time.Second))
	if got := tr.sizeOf(0); got != 16 {
		t.Fatalf("size at 119s = %d, want 16 (eviction not due)", got)
	}
	// Due at 120 s: the least recently used leaves go first, down to 10.
	p.Choose(&Request{}, one, t0.Add(120*time.Second))
	if got := tr.sizeOf(0); got != 10 {
		t.Fatalf("size after eviction = %d, want 10", got)
	}
	if n := len(tr.walk(old, nil)); n != 2 {
		t.Errorf("old prompt keeps %d blocks, want its first 2", n)
	}
	if n := len(tr.walk(fresh, nil)); n != 8 {
		t.Errorf("fresh prompt keeps %d blocks, want all 8", n)
	}
	checkInvariants(t, p)
}

func TestPrefixTreeEvictionPerTenant(t *testing.T) {
	// Two replicas share a prefix; evicting one's leaves must not remove
	// the other's marks or the shared nodes it still needs.
	p := newTree(t, func(c *PrefixTreeConfig) { c.MaxTreeBlocks = 4; c.CacheThreshold = 0 })
	shared := prompt(1, 4, 1, 8)
	p.Choose(&Request{PromptBlocks: shared}, cands(0, 0), t0)                 // r0 (cold)
	p.Choose(&Request{PromptBlocks: prompt(1, 4, 2, 4)}, cands(9, 0)[1:], t0) // r1 gets the 4 shared blocks only
	p.Choose(&Request{}, cands(0, 0), t0.Add(120*time.Second))
	tr := p.trees[""]
	if tr.sizeOf(0) != 4 || tr.sizeOf(1) != 4 {
		t.Errorf("sizes after eviction = %d, %d; want 4, 4", tr.sizeOf(0), tr.sizeOf(1))
	}
	if n := len(tr.walk(shared, nil)); n != 4 {
		t.Errorf("shared prompt keeps %d blocks, want 4", n)
	}
	checkInvariants(t, p)
}

func TestPrefixTreeConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*PrefixTreeConfig)
		ok   bool
	}{
		{"defaults", func(*PrefixTreeConfig) {}, true},
		{"threshold above 1", func(c *PrefixTreeConfig) { c.CacheThreshold = 1.5 }, false},
		{"negative abs", func(c *PrefixTreeConfig) { c.BalanceAbsThreshold = -1 }, false},
		{"negative rel", func(c *PrefixTreeConfig) { c.BalanceRelThreshold = -1 }, false},
		{"negative interval", func(c *PrefixTreeConfig) { c.EvictionInterval = -time.Second }, false},
		{"eviction off", func(c *PrefixTreeConfig) { c.EvictionInterval = 0 }, true},
		{"zero size", func(c *PrefixTreeConfig) { c.MaxTreeBlocks = 0 }, false},
	}
	for _, tt := range tests {
		cfg := DefaultPrefixTreeConfig()
		tt.mod(&cfg)
		_, err := NewPrefixTree(cfg)
		if (err == nil) != tt.ok {
			t.Errorf("%s: err = %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
}

// TestPrefixTreeRandomOps drives many random requests, removals and
// evictions and checks the tree's invariants after each.
func TestPrefixTreeRandomOps(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	p := newTree(t, func(c *PrefixTreeConfig) { c.MaxTreeBlocks = 60; c.EvictionInterval = 10 * time.Second })
	now := t0
	for i := range 3000 {
		now = now.Add(time.Duration(rng.IntN(2000)) * time.Millisecond)
		n := rng.IntN(6)
		cs := cands(make([]int, n+1)...)
		for j := range cs {
			cs[j].InFlight = rng.IntN(100)
		}
		if rng.IntN(50) == 0 {
			p.RemoveReplica(cs[rng.IntN(len(cs))].Name)
		}
		blocks := prompt(uint64(rng.IntN(5)), rng.IntN(20), uint64(i), rng.IntN(30))
		c := p.Choose(&Request{Model: []string{"", "m"}[rng.IntN(2)], PromptBlocks: blocks}, cs, now)
		if c.Index < 0 || c.Index >= len(cs) {
			t.Fatalf("step %d: index %d out of range", i, c.Index)
		}
		checkInvariants(t, p)
		if t.Failed() {
			t.Fatalf("invariants broken at step %d", i)
		}
	}
}

// checkInvariants recomputes sizes and kids counts from the nodes.
func checkInvariants(t *testing.T, p *PrefixTree) {
	t.Helper()
	for model, tr := range p.trees {
		size := map[int32]int{}
		kids := map[*treeNode]map[int32]int32{}
		for h, n := range tr.nodes {
			if n.hash != h {
				t.Errorf("model %q: node under %x has hash %x", model, h, n.hash)
			}
			if len(n.marks) == 0 {
				t.Errorf("model %q: node %x has no marks", model, h)
			}
			for _, m := range n.marks {
				size[m.id]++
				if n.parent.mark(m.id) == nil {
					t.Errorf("model %q: tenant %d on node %x but not on its parent", model, m.id, h)
				}
				if kids[n.parent] == nil {
					kids[n.parent] = map[int32]int32{}
				}
				kids[n.parent][m.id]++
			}
			if n.parent != &tr.root && tr.nodes[n.parent.hash] != n.parent {
				t.Errorf("model %q: node %x has a parent outside the tree", model, h)
			}
		}
		for id := range tr.size {
			if tr.size[id] != size[int32(id)] {
				t.Errorf("model %q: tenant %d size %d, counted %d", model, id, tr.size[id], size[int32(id)])
			}
		}
		check := func(n *treeNode) {
			for _, m := range n.marks {
				if m.kids != kids[n][m.id] {
					t.Errorf("model %q: node %x tenant %d kids %d, counted %d", model, n.hash, m.id, m.kids, kids[n][m.id])
				}
			}
		}
		check(&tr.root)
		for _, n := range tr.nodes {
			check(n)
		}
		for _, n := range append([]*treeNode{&tr.root}, values(tr.nodes)...) {
			if h := n.next; h != nil && (h.parent != n || tr.nodes[h.hash] != h) {
				t.Errorf("model %q: node %x has a stale walk hint %x", model, n.hash, h.hash)
			}
		}
	}
	for _, c := range p.tenantCand {
		if c != -1 {
			t.Errorf("candidate scratch map not reset: %v", p.tenantCand)
			break
		}
	}
}

func TestPrefixTreeShortMatchStampsMatchedPath(t *testing.T) {
	p := newTree(t, nil)
	a := prompt(1, 4, 1, 40)
	p.Choose(&Request{PromptBlocks: a}, cands(0, 0), t0) // r0 holds a
	later := t0.Add(time.Minute)
	c := p.Choose(&Request{PromptBlocks: prompt(1, 4, 2, 40)}, cands(0, 0), later) // 4/40 shared: miss
	if c.Index != 1 {
		t.Fatalf("short match routed to r%d, want r1 (smallest tree)", c.Index)
	}
	tr := p.trees[""]
	path := tr.walk(a, nil)
	for d, n := range path {
		want := t0
		if d < 4 {
			want = later
		}
		if got := n.mark(p.ids["r0"]).last; got != want.UnixNano() {
			t.Errorf("block %d: r0 stamped at %v, want %v", d, time.Unix(0, got).UTC(), want)
		}
	}
}

func values(m map[uint64]*treeNode) []*treeNode {
	out := make([]*treeNode, 0, len(m))
	for _, n := range m {
		out = append(out, n)
	}
	return out
}
