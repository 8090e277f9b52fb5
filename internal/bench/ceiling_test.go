package bench

import (
	"math"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/engine"
	"github.com/llmlb/llmlb/internal/tokenize"
	"github.com/llmlb/llmlb/internal/workload"
)

// blocks is a prompt of len(keys) full blocks plus extra tokens.
func blocks(extra int, keys ...uint64) tokenize.Prompt {
	return tokenize.Prompt{Tokens: len(keys)*tokenize.BlockSize + extra, Blocks: keys}
}

func TestCeilingCache(t *testing.T) {
	const B = tokenize.BlockSize
	tests := []struct {
		name     string
		capacity int
		feed     []tokenize.Prompt
		wantHit  uint64 // tokens
	}{
		{"cold", 10, []tokenize.Prompt{blocks(5, 1, 2, 3)}, 0},
		{"repeat hits every block", 10, []tokenize.Prompt{blocks(5, 1, 2, 3), blocks(5, 1, 2, 3)}, 3 * B},
		// As the engine: a block-aligned full hit still computes its last block.
		{"block-aligned repeat recomputes the last block", 10, []tokenize.Prompt{blocks(0, 1, 2, 3), blocks(0, 1, 2, 3)}, 2 * B},
		{"shared prefix only", 10, []tokenize.Prompt{blocks(5, 1, 2, 3), blocks(5, 1, 2, 9)}, 2 * B},
		{"a miss ends the prefix", 10, []tokenize.Prompt{blocks(5, 1, 2, 3), blocks(5, 1, 8, 3)}, B},
		// Capacity 3: feeding {4,5} evicts the LRU blocks. The prompt's tail
		// is refreshed first, so its head (block 1) is the last to go.
		{"LRU evicts the tail before the head", 3, []tokenize.Prompt{blocks(5, 1, 2, 3), blocks(5, 4), blocks(5, 1, 2, 3)}, 2 * B},
		{"a hit refreshes", 3, []tokenize.Prompt{blocks(5, 1, 2), blocks(5, 1), blocks(5, 7, 8), blocks(5, 1)}, 2 * B},
		{"no capacity, no ceiling", 0, []tokenize.Prompt{blocks(5, 1), blocks(5, 1)}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCeilingCache(tt.capacity)
			var query uint64
			for _, p := range tt.feed {
				c.feed(p)
				query += uint64(p.Tokens)
			}
			if c.hitTokens != tt.wantHit {
				t.Errorf("hit tokens %d, want %d", c.hitTokens, tt.wantHit)
			}
			if tt.capacity > 0 && c.queryTokens != query {
				t.Errorf("query tokens %d, want %d", c.queryTokens, query)
			}
			if len(c.index) > max(tt.capacity, 0) {
				t.Errorf("%d blocks held, capacity %d", len(c.index), tt.capacity)
			}
		})
	}
}

// TestFirstTokenClasses: per-class TTFT and the slowdown against the
// profile's isolated TTFT.
func TestFirstTokenClasses(t *testing.T) {
	prof, _ := engine.Lookup(engine.DefaultProfile)
	var a accumulator
	a.init(2, &Options{Profile: prof, Duration: time.Minute, ShareWindow: 10 * time.Second})
	req := func(tokens int) *workload.Request { return &workload.Request{Prompt: tokenize.Prompt{Tokens: tokens}} }
	short, long := req(LongPromptTokens-1), req(LongPromptTokens)
	a.firstToken(short, 2*prof.IsolatedTTFT(short.Prompt.Tokens))
	a.firstToken(long, prof.IsolatedTTFT(long.Prompt.Tokens))
	a.firstToken(long, 3*time.Second)

	if len(a.ttftShort) != 1 || len(a.ttftLong) != 2 || len(a.ttft) != 3 {
		t.Fatalf("classes: %d short, %d long, %d all; want 1, 2, 3", len(a.ttftShort), len(a.ttftLong), len(a.ttft))
	}
	want := []float64{2, 1, 3 * float64(time.Second) / float64(prof.IsolatedTTFT(long.Prompt.Tokens))}
	for i, w := range want {
		if math.Abs(a.slowdown[i]-w) > 1e-9 {
			t.Errorf("slowdown[%d] = %v, want %v", i, a.slowdown[i], w)
		}
	}
	// A fake engine without a profile has no isolated TTFT: no slowdown.
	var b accumulator
	b.init(1, &Options{Duration: time.Minute, ShareWindow: 10 * time.Second})
	b.firstToken(short, time.Second)
	if len(b.slowdown) != 0 || len(b.ttftShort) != 1 {
		t.Errorf("without a profile: %d slowdowns, %d short", len(b.slowdown), len(b.ttftShort))
	}
}
