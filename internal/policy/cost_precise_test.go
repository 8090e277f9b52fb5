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
