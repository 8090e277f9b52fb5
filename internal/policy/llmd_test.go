package policy

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/tokenize"
)

func newLLMD(t *testing.T, mod func(*LLMDConfig)) *LLMD {
	t.Helper()
	cfg := DefaultLLMDConfig()
	if mod != nil {
		mod(&cfg)
	}
	p, err := NewLLMD(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// llmdFleet is n idle replicas with a known KV capacity.
func llmdFleet(n int) []Candidate {
	cs := make([]Candidate, n)
	for i := range cs {
		cs[i] = Candidate{Name: fmt.Sprintf("r%d", i), Live: true, KVCacheTokens: 1 << 20}
	}
	return cs
}

func blocksReq(model string, blocks []uint64) *Request {
	return &Request{Model: model, PromptTokens: len(blocks) * tokenize.BlockSize, PromptBlocks: blocks}
}

// TestLLMDScores: the weighted sum of llm-d's default profile, queue 2, KV
// 2, prefix 3, each score in [0, 1].
func TestLLMDScores(t *testing.T) {
	sys := prompt(1, 8, 1, 10)
	for _, tc := range []struct {
		name    string
		waiting []float64
		kv      []float64
		holder  int // replica sent a prompt with the same 8 leading blocks first, -1 none
		want    int
	}{
		// Prefix 3 x 0.8 = 2.4 beats the KV scorer's 2 x 0.5 = 1.
		{"prefix beats half the KV", []float64{0, 0, 0}, []float64{0.5, 0, 0}, 0, 0},
		// The queue scorer is min-max: the holder with the longest queue
		// scores 0 there, and loses 2 points to the 2.4 its match brings.
		{"prefix within a queue's reach", []float64{10, 0, 5}, []float64{0, 0, 0}, 0, 0},
		{"queue and KV together beat the prefix", []float64{10, 0, 5}, []float64{0.7, 0, 0}, 0, 1},
		{"no prefix: shortest queue", []float64{3, 1, 2}, []float64{0, 0, 0}, -1, 1},
		{"no prefix, equal queues: most free KV", []float64{4, 4, 4}, []float64{0.3, 0.2, 0.1}, -1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newLLMD(t, nil)
			cs := llmdFleet(3)
			if tc.holder >= 0 {
				only := []Candidate{cs[tc.holder]}
				if got := p.Choose(blocksReq("m", prompt(1, 8, 2, 10)), only, t0); got.Index != 0 {
					t.Fatal("the only candidate was not chosen")
				}
			}
			for i := range cs {
				cs[i].ScrapedWaiting, cs[i].KVCacheUsage = tc.waiting[i], tc.kv[i]
			}
			got := p.Choose(blocksReq("m", sys), cs, t0)
			if got.Index != tc.want {
				t.Errorf("chose r%d (%s), want r%d", got.Index, got.Detail, tc.want)
			}
		})
	}
}

// TestLLMDMatchIsTheOriginals: blocks are matched in order until the first
// one no replica holds, and each replica counts every block of that run it
// holds (GIE's matchLongestPrefix), not only a prefix of its own.
func TestLLMDMatchIsTheOriginals(t *testing.T) {
	p := newLLMD(t, nil)
	cs := llmdFleet(3)
	full := prompt(1, 10, 0, 10)
	// r0 holds blocks 0-4, r1 blocks 5-9 (its first five evicted, as
	// an LRU evicts a prompt's head first).
	p.Choose(blocksReq("m", full[:5]), cs[:1], t0)
	p.Choose(blocksReq("m", full), cs[1:2], t0)
	id1 := p.ids["r1"]
	for _, k := range p.keys[:5] {
		s := p.servers[id1]
		i := s.at[k]
		s.unlink(i)
		delete(s.at, k)
		p.unhold(k, id1)
	}
	p.hashPrompt(blocksReq("m", full))
	p.match()
	if got := []int32{p.matched[p.ids["r0"]], p.matched[id1]}; got[0] != 5 || got[1] != 5 {
		t.Errorf("matched r0, r1 = %v, want [5 5]", got)
	}
	// Another model's prompt with the same blocks matches nothing.
	p.hashPrompt(blocksReq("other", full))
	p.match()
	if p.matched[p.ids["r0"]] != 0 || p.matched[id1] != 0 {
		t.Errorf("another model's prompt matched %v", p.matched)
	}
	// Past MaxPrefixBlocks nothing is hashed.
	q := newLLMD(t, func(c *LLMDConfig) { c.MaxPrefixBlocks = 4 })
	q.hashPrompt(blocksReq("m", full))
	if len(q.keys) != 4 {
		t.Errorf("hashed %d blocks, want 4", len(q.keys))
	}
}

// TestLLMDIndexIsAnLRU: each replica's index holds its KV capacity in
// blocks (autoTune) or the configured count, and evicts the least recently
// recorded block.
func TestLLMDIndexIsAnLRU(t *testing.T) {
	p := newLLMD(t, nil)
	c := []Candidate{{Name: "r0", Live: true, KVCacheTokens: 4 * tokenize.BlockSize}}
	a, b := prompt(1, 3, 0, 3), prompt(2, 2, 0, 2)
	p.Choose(blocksReq("m", a), c, t0)
	p.Choose(blocksReq("m", b), c, t0) // 5 blocks into 4: a's first goes
	s := p.servers[p.ids["r0"]]
	if s.len() != 4 {
		t.Fatalf("index holds %d blocks, want 4", s.len())
	}
	p.hashPrompt(blocksReq("m", a))
	p.match()
	if p.matched[0] != 0 {
		t.Errorf("a's first block was evicted, yet %d blocks matched", p.matched[0])
	}
	if len(p.holders) != 4 {
		t.Errorf("%d blocks have holders, want 4", len(p.holders))
	}
	// A configured capacity wins over the KV's; without either, 31,250.
	q := newLLMD(t, func(c *LLMDConfig) { c.LRUCapacityPerServer = 2 })
	q.Choose(blocksReq("m", a), c, t0)
	if n := q.servers[0].len(); n != 2 {
		t.Errorf("configured capacity 2: holds %d", n)
	}
	r := newLLMD(t, nil)
	r.Choose(blocksReq("m", a), []Candidate{{Name: "x", Live: true}}, t0)
	if r.servers[0].capacity != llmdDefaultLRUCapacity {
		t.Errorf("capacity without KV size %d, want %d", r.servers[0].capacity, llmdDefaultLRUCapacity)
	}
	// Removing the replica drops its blocks.
	p.RemoveReplica("r0")
	if s.len() != 0 || len(p.holders) != 0 {
		t.Errorf("after RemoveReplica: %d blocks, %d holders", s.len(), len(p.holders))
	}
}

// TestLLMDTiesAreRandom: equal scores are broken at random (max-score
// picker shuffles), so an idle fleet's first requests spread, and a run
// is the same every time.
func TestLLMDTiesAreRandom(t *testing.T) {
	counts := func() map[int]int {
		p := newLLMD(t, nil)
		cs := llmdFleet(4)
		n := map[int]int{}
		for range 400 {
			n[p.Choose(&Request{Model: "m"}, cs, t0).Index]++
		}
		return n
	}
	first := counts()
	for i := range 4 {
		if first[i] < 60 {
			t.Errorf("replica %d got %d of 400 equal-score picks", i, first[i])
		}
	}
	if again := counts(); fmt.Sprint(again) != fmt.Sprint(first) {
		t.Errorf("two runs picked differently: %v, %v", first, again)
	}
}

func TestLLMDSettings(t *testing.T) {
	s := DefaultSettings()
	if err := s.Apply(NameLLMD, [][2]string{{"prefix_weight", "1"}, {"refresh_interval", "3s"}, {"lru_capacity_per_server", "100"}}); err != nil {
		t.Fatal(err)
	}
	if s.LLMD.PrefixWeight != 1 || s.LLMD.RefreshInterval != 3*time.Second || s.LLMD.LRUCapacityPerServer != 100 {
		t.Errorf("applied settings %+v", s.LLMD)
	}
	err := s.Apply(NameLLMD, [][2]string{{"queue_weight", "-1"}})
	if err == nil || !strings.Contains(err.Error(), "llmd.queue_weight") {
		t.Errorf("negative weight: %v", err)
	}
	if err := s.Apply(NameLLMD, [][2]string{{"threshold", "1"}}); err == nil || !strings.Contains(err.Error(), "unknown parameter") {
		t.Errorf("unknown parameter: %v", err)
	}
}

// TestLLMDOnHostileMetrics: whatever the replicas export (NaN, infinities,
// negative queues, KV usage beyond 1) and however the fleet changes, the
// choice is a candidate and the index stays within its bounds.
func TestLLMDOnHostileMetrics(t *testing.T) {
	p := newLLMD(t, func(c *LLMDConfig) { c.LRUCapacityPerServer = 64 })
	odd := []float64{0, 1, -1, 0.5, 2, 1e300, math.NaN(), math.Inf(1), math.Inf(-1)}
	rng := rand.New(rand.NewPCG(5, 5))
	for i := range 3000 {
		n := 1 + rng.IntN(6)
		cs := make([]Candidate, n)
		for j := range cs {
			cs[j] = Candidate{Name: fmt.Sprintf("r%d", rng.IntN(10)), Live: true,
				ScrapedWaiting: odd[rng.IntN(len(odd))], KVCacheUsage: odd[rng.IntN(len(odd))],
				KVCacheTokens: rng.IntN(3) * 512}
		}
		var r *Request
		if i%7 != 0 {
			r = blocksReq(fmt.Sprint(rng.IntN(2)), prompt(uint64(rng.IntN(4)), rng.IntN(20), uint64(i), 1+rng.IntN(300)))
		}
		if i%500 == 499 {
			p.RemoveReplica(fmt.Sprintf("r%d", rng.IntN(10)))
		}
		got := p.Choose(r, cs, t0)
		if got.Index < 0 || got.Index >= n {
			t.Fatalf("decision %d: index %d of %d candidates", i, got.Index, n)
		}
	}
	total := 0
	for _, s := range p.servers {
		if s.len() > s.capacity {
			t.Errorf("a server holds %d blocks over its capacity %d", s.len(), s.capacity)
		}
		total += s.len()
	}
	held := 0
	for _, hs := range p.holders {
		held += len(hs)
	}
	if held != total {
		t.Errorf("holders list %d (block, server) pairs, the LRUs %d", held, total)
	}
}

// TestLLMDExplains: with explaining on, Detail gives every candidate's
// scorers; off, a decision over prompts the index holds allocates nothing.
func TestLLMDExplains(t *testing.T) {
	p := newLLMD(t, nil)
	cs := llmdFleet(2)
	cs[1].ScrapedWaiting = 3
	req := blocksReq("m", prompt(1, 4, 0, 4))
	p.Choose(req, cs, t0)
	if allocs := testing.AllocsPerRun(100, func() { p.Choose(req, cs, t0) }); allocs != 0 {
		t.Errorf("a decision allocates %v times with explaining off", allocs)
	}
	p.SetExplain(true)
	got := p.Choose(req, cs, t0).Detail
	for _, want := range []string{"r0 score=7.000 queue=1.000 kv=1.000 prefix=1.000 (4 of 4 blocks)", "r1 score=2.000 queue=0.000", "waiting=3"} {
		if !strings.Contains(got, want) {
			t.Errorf("Detail %q lacks %q", got, want)
		}
	}
}
