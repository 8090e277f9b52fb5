package engine

import (
	"fmt"
	"hash/fnv"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/tokenize"
)

// eventDigest hashes an event stream and the final counters.
func eventDigest(evs []Event, st Stats) uint64 {
	h := fnv.New64a()
	for _, ev := range evs {
		fmt.Fprintf(h, "%d %d %d %d %d\n", ev.Kind, ev.ID, ev.At.UnixNano(), ev.CachedTokens, ev.OutputTokens)
	}
	fmt.Fprintf(h, "%+v", st)
	return h.Sum64()
}

// TestGoldenBehaviour pins the engine's exact behaviour (events, counters)
// on fixed scripts, so that performance work on the block pool cannot change
// what is simulated. Update the digests only for an intended change of the
// model, and say so in the commit.
func TestGoldenBehaviour(t *testing.T) {
	tests := []struct {
		seed   uint64
		blocks int
		want   uint64
	}{
		{21, 150, 0x330819d9a75b6da5},
		{22, 300, 0xa31fb25af9b2f0b0},
		{23, 1000, 0xd9386b502d677b8e},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("seed%d/blocks%d", tt.seed, tt.blocks), func(t *testing.T) {
			p := testProfile()
			p.MaxNumSeqs = 6
			p.KVCacheTokens = tt.blocks * tokenize.BlockSize
			p.MaxNumBatchedTokens = 512
			p.StepPerAttention = 333 * time.Nanosecond
			p.StepPerContextToken = 41 * time.Nanosecond
			e := New(p)
			var ops []op
			for _, o := range randomOps(tt.seed, 300) {
				if o.add == nil || o.add.Prompt.Tokens+o.add.MaxTokens <= tt.blocks*tokenize.BlockSize {
					ops = append(ops, o)
				}
			}
			got := eventDigest(drive(t, e, ops), e.Stats())
			if got != tt.want {
				t.Errorf("digest %#x, want %#x", got, tt.want)
			}
		})
	}
	t.Run("agentic-10min", func(t *testing.T) {
		p, _ := Lookup(DefaultProfile)
		e := agenticHour(t, p, 48, 10*time.Minute)
		if got, want := eventDigest(nil, e.Stats()), uint64(0x4351e7a910a74197); got != want {
			t.Errorf("digest %#x, want %#x", got, want)
		}
	})
}
