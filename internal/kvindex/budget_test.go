package kvindex

import (
	"math/rand/v2"
	"runtime"
	"testing"
)

// A replica claiming 2^36 tokens of KV cache (2^32 blocks) while a client
// sent unique 1 MiB prompts kept 475 MB of index. The index as a whole is
// held to its budget whatever the replicas claim: claims are scaled down
// together when their sum exceeds it.
func TestBudgetBoundsTheIndex(t *testing.T) {
	x := New()
	x.SetCapacity(0, 1<<32)  // the liar
	x.SetCapacity(1, 20_000) // an honest replica
	if got := x.Capacity(0); got != 1<<32 {
		t.Errorf("Capacity(0) = %d, want the claim %d", got, 1<<32)
	}
	const prompts, blocksPerPrompt = 100, 16_384 // 1 MiB of text each
	rng := rand.New(rand.NewPCG(1, 2))
	blocks := make([]uint64, blocksPerPrompt)
	for range prompts {
		for i := range blocks {
			blocks[i] = rng.Uint64()
		}
		x.Touch(0, blocks)
	}
	total := x.Len(0) + x.Len(1)
	if total > DefaultBudgetBlocks {
		t.Errorf("index holds %d blocks, want at most the budget %d", total, DefaultBudgetBlocks)
	}
	if x.Nodes() > DefaultBudgetBlocks {
		t.Errorf("index has %d nodes, want at most %d", x.Nodes(), DefaultBudgetBlocks)
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("after %d unique prompts of %d blocks: %d blocks held, heap %d MB", prompts, blocksPerPrompt, total, ms.HeapAlloc>>20)
	if ms.HeapAlloc > 150<<20 {
		t.Errorf("heap %d MB, want under 150 MB", ms.HeapAlloc>>20)
	}
	runtime.KeepAlive(x)
}

// Claims within the budget are kept as they are; over it they shrink in
// proportion, and grow back when the budget allows.
func TestBudgetScalesClaims(t *testing.T) {
	x := New()
	x.SetBudget(1000)
	x.SetCapacity(0, 300)
	x.SetCapacity(1, 500)
	if a, b := x.EffectiveCapacity(0), x.EffectiveCapacity(1); a != 300 || b != 500 {
		t.Errorf("within budget: %d, %d; want 300, 500", a, b)
	}
	x.SetCapacity(2, 1200) // sum 2000: halved
	for rep, want := range []int{150, 250, 600} {
		if got := x.EffectiveCapacity(int32(rep)); got != want {
			t.Errorf("over budget: replica %d has %d, want %d", rep, got, want)
		}
	}
	x.SetCapacity(2, 0)
	if a, b := x.EffectiveCapacity(0), x.EffectiveCapacity(1); a != 300 || b != 500 {
		t.Errorf("back within budget: %d, %d; want 300, 500", a, b)
	}
}
