package policy

import (
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/tokenize"
)

// fakePrecise says which replicas publish and which blocks each holds.
type fakePrecise map[string]map[uint64]bool

func (f fakePrecise) Publishes(rep string) bool { _, ok := f[rep]; return ok }

func (f fakePrecise) Expect(string, []uint64, time.Time) {}

func (f fakePrecise) KeyByTokens() bool { return false }

// tokenKeyed is a fakePrecise keyed by token ids.
type tokenKeyed struct{ fakePrecise }

func (tokenKeyed) KeyByTokens() bool { return true }

func (f fakePrecise) Match(rep string, blocks []uint64, _ time.Time) (gpu, held int) {
	for _, h := range blocks {
		if !f[rep][h] {
			break
		}
		gpu++
	}
	return gpu, gpu
}

func TestCostPreciseIndexOverridesTheGuess(t *testing.T) {
	prompt := costPrompt("sys", 40, 0, "")
	holds := func(n int) map[uint64]bool {
		m := map[uint64]bool{}
		for _, h := range prompt.PromptBlocks[:n] {
			m[h] = true
		}
		return m
	}
	cases := []struct {
		name        string
		precise     fakePrecise
		seed        bool // the approximate index first sends the prompt to a candidate
		tokens      bool // the index keys blocks by token ids
		tokenPrompt bool // the prompt's blocks were hashed by token ids
		wantIndex   int  // -1: any
		wantCached  int
	}{
		{name: "publisher holds the prompt", precise: fakePrecise{"c": holds(40)}, wantIndex: 2, wantCached: 40*tokenize.BlockSize - 1},
		{name: "publisher holds part", precise: fakePrecise{"b": holds(10)}, wantIndex: 1, wantCached: 10 * tokenize.BlockSize},
		{name: "events say the guessed replica evicted it", seed: true,
			precise: fakePrecise{"a": {}, "b": {}, "c": {}, "d": {}}, wantIndex: -1, wantCached: 0},
		{name: "non-publishers keep the guess", seed: true, precise: fakePrecise{"d": holds(5)}, wantIndex: -2, wantCached: 40*tokenize.BlockSize - 1},
		{name: "keyed by tokens, a prompt hashed by tokens", tokens: true, tokenPrompt: true, precise: fakePrecise{"c": holds(40)}, wantIndex: 2, wantCached: 40*tokenize.BlockSize - 1},
		// A prompt llmlb could not tokenize (tools, say) keeps the guess
		// everywhere: its text blocks can match no token-keyed entry.
		{name: "keyed by tokens, a prompt hashed by text", tokens: true, seed: true,
			precise: fakePrecise{"a": {}, "b": {}, "c": {}, "d": {}}, wantIndex: -2, wantCached: 40*tokenize.BlockSize - 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newCost(t, nil)
			cands := costCands(4)
			prompt := prompt
			prompt.TokenBlocks = c.tokenPrompt
			seeded := -1
			if c.seed {
				seeded = p.Choose(prompt, cands, t0).Index
				if seeded == 3 {
					t.Fatal("seed went to d; the case assumes it does not")
				}
			}
			if c.tokens {
				p.SetPreciseIndex(tokenKeyed{c.precise})
			} else {
				p.SetPreciseIndex(c.precise)
			}
			got := p.Choose(prompt, cands, t0)
			want := c.wantIndex
			if want == -2 {
				want = seeded
			}
			if (want >= 0 && got.Index != want) || got.CachedTokens != c.wantCached {
				t.Fatalf("chose %d with %d cached, want %d with %d", got.Index, got.CachedTokens, want, c.wantCached)
			}
		})
	}
}

// riskyPrecise is a fakePrecise that also judges blocks at risk: on each
// replica, at most keep[rep] of a prompt's blocks survive once any block
// is to be allocated ahead of it. It records what cost asked and touched.
type riskyPrecise struct {
	fakePrecise
	keep    map[string]int
	allocs  map[string]int
	touched map[string]int
}

func (f *riskyPrecise) Survivors(rep string, _ []uint64, depth, allocs int, _ time.Time) int {
	f.allocs[rep] = allocs
	if k, ok := f.keep[rep]; ok && allocs > 0 {
		return min(depth, k)
	}
	return depth
}

func (f *riskyPrecise) Touch(rep string, blocks []uint64) { f.touched[rep] += len(blocks) }

func (f *riskyPrecise) Unmark(string, []uint64) {}

// TestCostPreciseDiscountsBlocksAtRisk: a publishing replica's cached
// prefix counts only as far as it is expected to survive the prefill
// queued ahead of the request there (its pending prefill, in blocks), and
// a finished request's blocks are touched in the event-fed index.
func TestCostPreciseDiscountsBlocksAtRisk(t *testing.T) {
	prompt := costPrompt("sys", 40, 0, "")
	all := map[uint64]bool{}
	for _, h := range prompt.PromptBlocks {
		all[h] = true
	}
	f := &riskyPrecise{fakePrecise: fakePrecise{"a": all, "b": {}, "c": {}, "d": {}},
		keep: map[string]int{"a": 10}, allocs: map[string]int{}, touched: map[string]int{}}
	p := newCost(t, nil)
	p.SetPreciseIndex(f)
	cands := costCands(4)
	got := p.Choose(prompt, cands, t0)
	if got.Index != 0 || got.CachedTokens != 40*tokenize.BlockSize-1 || f.allocs["a"] != 0 {
		t.Fatalf("nothing queued on a: chose %d with %d cached (asked with %d blocks ahead), want a with the whole prompt",
			got.Index, got.CachedTokens, f.allocs["a"])
	}
	// 320 prompt tokens queued ahead on a: 20 blocks. Were the whole
	// prefix to survive them, a would still be the fastest.
	cands[0].PendingPrefill = 320
	delete(f.keep, "a")
	if got = p.Choose(prompt, cands, t0); got.Index != 0 || f.allocs["a"] != 20 {
		t.Fatalf("a's prefix surviving: chose %d (asked with %d blocks ahead), want a with 20", got.Index, f.allocs["a"])
	}
	// None of it is expected to: an idle replica is faster.
	f.keep["a"] = 0
	if got = p.Choose(prompt, cands, t0); got.Index == 0 {
		t.Fatal("chose a, whose prefix the queue ahead evicts, over idle replicas")
	}
	// 10 of the prompt's 40 blocks are: a expects those 10.
	f.keep["a"] = 10
	if got = p.Choose(prompt, cands[:1], t0); got.CachedTokens != 10*tokenize.BlockSize {
		t.Fatalf("a expects %d cached tokens, want the 160 expected to survive", got.CachedTokens)
	}
	p.Finished("a", prompt.PromptBlocks, t0)
	p.Finished("e", prompt.PromptBlocks, t0) // publishes nothing
	if f.touched["a"] != 40 || f.touched["e"] != 0 {
		t.Fatalf("touched %v, want a's 40 blocks only", f.touched)
	}
}

// touchSpy is a fakePrecise that records which blocks were reported free.
type touchSpy struct {
	fakePrecise
	touched map[string]int
}

func (s *touchSpy) Survivors(_ string, _ []uint64, depth, _ int, _ time.Time) int { return depth }

func (s *touchSpy) Touch(rep string, blocks []uint64) { s.touched[rep] += len(blocks) }

func (s *touchSpy) Unmark(rep string, blocks []uint64) { s.touched["unmarked "+rep] += len(blocks) }

// TestCostReleasedRequestFreesItsPreciseBlocks: a request released without
// a first token as cancelled (Canceled), or one that ran and ended other
// than well (Aborted), frees its blocks in the event-fed index of a
// publishing replica, as a finished one does: the engine aborts it.
func TestCostReleasedRequestFreesItsPreciseBlocks(t *testing.T) {
	for name, release := range map[string]func(p *Cost, replica string, blocks []uint64){
		"cancelled": (*Cost).Canceled,
		"aborted":   (*Cost).Aborted,
	} {
		p := newCost(t, nil)
		spy := &touchSpy{fakePrecise: fakePrecise{"a": {}}, touched: map[string]int{}}
		p.SetPreciseIndex(spy)
		prompt := costPrompt("ctx", 20, 2, "s1")
		p.Choose(prompt, costCands(2), t0)
		release(p, "a", prompt.PromptBlocks)
		release(p, "b", prompt.PromptBlocks)
		if got := spy.touched["a"]; got != len(prompt.PromptBlocks) {
			t.Errorf("%s: publishing replica: %d blocks freed, want %d", name, got, len(prompt.PromptBlocks))
		}
		if got := spy.touched["b"]; got != 0 {
			t.Errorf("%s: non-publishing replica: %d blocks freed, want 0", name, got)
		}
	}
}

// TestCostRefusedRequestUnmarksItsPreciseBlocks: a request a publishing
// replica turned away before it ran drops its marks of the blocks as in
// use in the event-fed index, without touching them (the engine never
// used them).
func TestCostRefusedRequestUnmarksItsPreciseBlocks(t *testing.T) {
	p := newCost(t, nil)
	spy := &touchSpy{fakePrecise: fakePrecise{"a": {}}, touched: map[string]int{}}
	p.SetPreciseIndex(spy)
	prompt := costPrompt("ctx", 20, 2, "s1")
	c := p.Choose(prompt, costCands(2), t0)
	p.Refused("a", prompt.PromptBlocks, c.Recorded)
	p.Refused("b", prompt.PromptBlocks, c.Recorded)
	if got, want := spy.touched["unmarked a"], len(prompt.PromptBlocks); got != want {
		t.Errorf("publishing replica: %d blocks unmarked, want %d", got, want)
	}
	if len(spy.touched) != 1 {
		t.Errorf("blocks touched or unmarked elsewhere: %v", spy.touched)
	}
}
