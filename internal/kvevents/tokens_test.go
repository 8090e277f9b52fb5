package kvevents

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/llmlb/llmlb/internal/tokenize"
)

// opaqueEngine hashes blocks as an engine does, with a function and a seed
// llmlb knows nothing of (vLLM: SHA-256 from a random NONE_HASH).
type opaqueEngine struct {
	seed      string
	blockSize int
}

// store returns a BlockStored event for blocks [from, to) of tokens, and
// every block's engine hash.
func (g opaqueEngine) store(tokens []uint32, from, to int, medium string) (Event, []uint64) {
	var hs []uint64
	parent := sha256.Sum256([]byte(g.seed))
	for i := 0; (i+1)*g.blockSize <= len(tokens); i++ {
		h := sha256.New()
		h.Write(parent[:])
		for _, t := range tokens[i*g.blockSize : (i+1)*g.blockSize] {
			_ = binary.Write(h, binary.BigEndian, t)
		}
		copy(parent[:], h.Sum(nil))
		hs = append(hs, binary.BigEndian.Uint64(parent[24:]))
	}
	e := Event{Kind: BlockStored, BlockHashes: hs[from:to], TokenIDs: tokens[from*g.blockSize : to*g.blockSize], BlockSize: g.blockSize, Medium: medium}
	if from > 0 {
		e.Parent, e.HasParent = hs[from-1], true
	}
	return e, hs
}

func ids(n int, base uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

func TestIndexKeyedByTokens(t *testing.T) {
	g := opaqueEngine{seed: "engine-a", blockSize: 16}
	toks := ids(5*16+7, 100)
	prompt := tokenize.FromTokenIDs(toks).Blocks // 5 full blocks
	x := NewIndex(0)
	x.SetKeyByTokens(true)
	match := func() [2]int { gpu, held := x.Match("a", prompt, t0); return [2]int{gpu, held} }

	head, hs := g.store(toks, 0, 2, "GPU")
	x.Apply("a", Batch{Events: []Event{head}}, t0)
	if got := match(); got != [2]int{2, 2} {
		t.Fatalf("head stored: match %v, want [2 2]", got)
	}
	// The rest arrives chained from its parent's engine hash.
	tail, _ := g.store(toks, 2, 5, "GPU")
	x.Apply("a", Batch{Events: []Event{tail}}, t0)
	if got := match(); got != [2]int{5, 5} {
		t.Fatalf("tail stored: match %v, want [5 5]", got)
	}
	// Offloaded to CPU, then evicted from GPU: held, not on GPU.
	cpu, _ := g.store(toks, 3, 5, "CPU")
	x.Apply("a", Batch{Events: []Event{cpu, removed("GPU", hs[3], hs[4])}}, t0)
	if got := match(); got != [2]int{3, 5} {
		t.Fatalf("blocks 3-4 offloaded: match %v, want [3 5]", got)
	}
	x.Apply("a", Batch{Events: []Event{removed("GPU", hs[1])}}, t0)
	if got := match(); got != [2]int{1, 1} {
		t.Fatalf("block 1 evicted: match %v, want [1 1]", got)
	}
	x.Apply("a", Batch{Events: []Event{{Kind: AllBlocksCleared}}}, t0)
	if got := match(); got != [2]int{0, 0} {
		t.Fatalf("cleared: match %v", got)
	}
	if st, _ := x.Stats("a"); st.Blocks != 0 || st.Unkeyed != 0 {
		t.Fatalf("cleared: %+v", st)
	}
}

func TestIndexKeyedByTokensLeavesOutWhatItCannotKey(t *testing.T) {
	toks := ids(4*16, 7)
	prompt := tokenize.FromTokenIDs(toks).Blocks
	g := opaqueEngine{seed: "s", blockSize: 16}
	x := NewIndex(0)
	x.SetKeyByTokens(true)

	// A chain whose parent was stored before llmlb subscribed.
	tail, _ := g.store(toks, 2, 4, "GPU")
	lora, _ := g.store(toks, 0, 2, "GPU")
	lora.LoRAID, lora.HasLoRA = 3, true
	small, _ := opaqueEngine{seed: "s", blockSize: 8}.store(toks, 0, 8, "GPU")
	x.Apply("a", Batch{Events: []Event{tail, lora, small}}, t0)
	if gpu, held := x.Match("a", prompt, t0); gpu != 0 || held != 0 {
		t.Fatalf("match (%d, %d), want nothing", gpu, held)
	}
	if st, _ := x.Stats("a"); st.Unkeyed != 2+2+8 || st.Blocks != 0 {
		t.Fatalf("stats %+v, want 12 unkeyed, no blocks", st)
	}
}

func TestIndexKeyedByTokensLargerEngineBlocks(t *testing.T) {
	// An engine with 32-token blocks: each of its blocks is two of ours.
	toks := ids(3*32, 900)
	prompt := tokenize.FromTokenIDs(toks).Blocks // 6 blocks of 16
	g := opaqueEngine{seed: "s", blockSize: 32}
	x := NewIndex(0)
	x.SetKeyByTokens(true)
	head, hs := g.store(toks, 0, 1, "GPU")
	tail, _ := g.store(toks, 1, 3, "GPU")
	x.Apply("a", Batch{Events: []Event{head, tail}}, t0)
	if gpu, _ := x.Match("a", prompt, t0); gpu != 6 {
		t.Fatalf("match %d, want 6", gpu)
	}
	x.Apply("a", Batch{Events: []Event{removed("GPU", hs[1])}}, t0)
	if gpu, _ := x.Match("a", prompt, t0); gpu != 2 {
		t.Fatalf("engine block 1 removed: match %d, want 2", gpu)
	}
	if st, _ := x.Stats("a"); st.Blocks != 4 {
		t.Fatalf("%d keys held, want 4", st.Blocks)
	}
}

func TestIndexKeyedByTokensSharedKeys(t *testing.T) {
	// Equal tokens under two engine hashes (another salt): removing one
	// keeps the key the other still holds.
	toks := ids(2*16, 1)
	prompt := tokenize.FromTokenIDs(toks).Blocks
	a, ha := opaqueEngine{seed: "salt-1", blockSize: 16}.store(toks, 0, 2, "GPU")
	b, hb := opaqueEngine{seed: "salt-2", blockSize: 16}.store(toks, 0, 2, "GPU")
	x := NewIndex(0)
	x.SetKeyByTokens(true)
	// a is stored twice (vLLM does not de-duplicate): two copies.
	x.Apply("r", Batch{Events: []Event{a, b, a}}, t0)
	x.Apply("r", Batch{Events: []Event{removed("GPU", ha...), removed("GPU", ha...)}}, t0)
	if gpu, _ := x.Match("r", prompt, t0); gpu != 2 {
		t.Fatalf("one of two holders removed: match %d, want 2", gpu)
	}
	x.Apply("r", Batch{Events: []Event{removed("GPU", hb...)}}, t0)
	if gpu, _ := x.Match("r", prompt, t0); gpu != 0 {
		t.Fatalf("both removed: match %d, want 0", gpu)
	}
	if st, _ := x.Stats("r"); st.Blocks != 0 {
		t.Fatalf("%d keys left", st.Blocks)
	}
}

func TestIndexKeyedByTokensBudget(t *testing.T) {
	toks := ids(6*16, 1)
	e, _ := opaqueEngine{seed: "s", blockSize: 16}.store(toks, 0, 6, "GPU")
	x := NewIndex(4)
	x.SetKeyByTokens(true)
	if refused := x.Apply("r", Batch{Events: []Event{e}}, t0); refused != 2 {
		t.Fatalf("refused %d, want 2", refused)
	}
	if gpu, _ := x.Match("r", tokenize.FromTokenIDs(toks).Blocks, t0); gpu != 4 {
		t.Fatalf("match %d, want the 4 within budget", gpu)
	}
	// Switching the keying forgets what no longer matches.
	x.SetKeyByTokens(false)
	if x.Publishes("r") || x.KeyByTokens() {
		t.Fatal("switching to engine hashes kept the token-keyed entries")
	}
}

func TestIndexCountsCopies(t *testing.T) {
	// vLLM does not de-duplicate its cache: a block two requests computed
	// at once is stored twice and evicted twice; it leaves with its last
	// copy, keyed either way.
	toks := ids(16, 1)
	e, hs := opaqueEngine{seed: "s", blockSize: 16}.store(toks, 0, 1, "GPU")
	for _, byTokens := range []bool{false, true} {
		x := NewIndex(0)
		x.SetKeyByTokens(byTokens)
		prompt := hs
		if byTokens {
			prompt = tokenize.FromTokenIDs(toks).Blocks
		}
		x.Apply("r", Batch{Events: []Event{e, e}}, t0)
		x.Apply("r", Batch{Events: []Event{removed("GPU", hs[0])}}, t0)
		if gpu, _ := x.Match("r", prompt, t0); gpu != 1 {
			t.Fatalf("by tokens %v: one of two copies evicted: match %d, want 1", byTokens, gpu)
		}
		x.Apply("r", Batch{Events: []Event{removed("GPU", hs[0])}}, t0)
		if gpu, _ := x.Match("r", prompt, t0); gpu != 0 {
			t.Fatalf("by tokens %v: both copies evicted: match %d, want 0", byTokens, gpu)
		}
	}
}

func TestIndexKeyedByTokensBoundsEngineHashes(t *testing.T) {
	// One block's tokens under ever new engine hashes (a lying replica):
	// the index holds one key, and the engine hashes stay within the
	// budget.
	toks := ids(16, 5)
	x := NewIndex(8)
	x.SetKeyByTokens(true)
	var refused int
	for i := range 100 {
		e, _ := opaqueEngine{seed: fmt.Sprint("salt", i), blockSize: 16}.store(toks, 0, 1, "GPU")
		refused += x.Apply("r", Batch{Events: []Event{e}}, t0)
	}
	st, _ := x.Stats("r")
	if st.Blocks != 1 || refused != 92 {
		t.Fatalf("%d keys, %d refused; want 1 key and 92 of 100 refused", st.Blocks, refused)
	}
	x.mu.RLock()
	n := len(x.reps["r"].engine)
	x.mu.RUnlock()
	if n != 8 {
		t.Fatalf("%d engine hashes held, want the budget's 8", n)
	}
}
