package kvindex

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func match(x *Index, n int, blocks []uint64) []int32 {
	d := make([]int32, n)
	x.Match(blocks, d)
	return d
}

func TestMatchDepthPerReplica(t *testing.T) {
	x := New()
	for r := range int32(3) {
		x.SetCapacity(r, 100)
	}
	x.Touch(0, []uint64{1, 2, 3, 4})
	x.Touch(1, []uint64{1, 2, 9})
	got := match(x, 3, []uint64{1, 2, 3, 7})
	if want := []int32{3, 2, 0}; !slices.Equal(got, want) {
		t.Fatalf("depths = %v, want %v", got, want)
	}
	if deep := x.Match([]uint64{5}, make([]int32, 3)); deep != 0 {
		t.Fatalf("deepest for an unknown block = %d", deep)
	}
}

func TestEvictsTailBeforeHead(t *testing.T) {
	x := New()
	x.SetCapacity(0, 4)
	x.Touch(0, []uint64{1, 2, 3, 4})
	x.Touch(0, []uint64{1, 2, 10}) // 1, 2 refreshed; 10 new evicts the LRU: block 4
	if got := match(x, 1, []uint64{1, 2, 3, 4}); got[0] != 3 {
		t.Fatalf("depth after eviction = %d, want 3 (block 4, the old tail, evicted)", got[0])
	}
	if x.Len(0) != 4 {
		t.Fatalf("len = %d, want the capacity 4", x.Len(0))
	}
	x.SetCapacity(0, 2) // keeps the two most recent: 1 and 2
	if got := match(x, 1, []uint64{1, 2, 10}); got[0] != 2 {
		t.Fatalf("depth after shrink = %d, want 2", got[0])
	}
}

func TestRemoveReplicaAndZeroCapacity(t *testing.T) {
	x := New()
	x.SetCapacity(0, 10)
	x.SetCapacity(1, 10)
	x.Touch(0, []uint64{1, 2})
	x.Touch(1, []uint64{1, 2})
	x.RemoveReplica(0)
	if got := match(x, 2, []uint64{1, 2}); !slices.Equal(got, []int32{0, 2}) {
		t.Fatalf("after remove: %v", got)
	}
	x.Touch(2, []uint64{1}) // replica 2 has capacity 0: holds nothing
	if got := match(x, 3, []uint64{1}); got[2] != 0 {
		t.Fatalf("zero-capacity replica matched %d", got[2])
	}
	x.RemoveReplica(1)
	if x.Nodes() != 0 {
		t.Fatalf("nodes left = %d", x.Nodes())
	}
}

// TestAgainstModel drives the index and a plain per-replica LRU model with
// the same random operations (chained hashes, as the index requires) and
// compares every match.
func TestAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const reps = 5
	x := New()
	model := make([][]uint64, reps) // most recent first
	caps := []int{3, 8, 20, 50, 0}
	for r := range reps {
		x.SetCapacity(int32(r), caps[r])
	}
	for step := range 20000 {
		n := 1 + rng.IntN(12)
		blocks := make([]uint64, n)
		root := uint64(rng.IntN(6)) << 32
		parent := uint64(0)
		for i := range blocks {
			parent = chain(parent, root|uint64(i)<<8|uint64(rng.IntN(2)*int(i/4)))
			blocks[i] = parent
		}
		if rng.IntN(3) == 0 {
			r := rng.IntN(reps)
			x.Touch(int32(r), blocks)
			for i := len(blocks) - 1; i >= 0; i-- {
				m := slices.DeleteFunc(model[r], func(b uint64) bool { return b == blocks[i] })
				model[r] = append([]uint64{blocks[i]}, m...)
				if len(model[r]) > caps[r] {
					model[r] = model[r][:caps[r]]
				}
			}
			continue
		}
		got := match(x, reps, blocks)
		for r := range reps {
			want := int32(0)
			for _, b := range blocks {
				if !slices.Contains(model[r], b) {
					break
				}
				want++
			}
			if got[r] != want {
				t.Fatalf("step %d replica %d: depth %d, want %d", step, r, got[r], want)
			}
		}
	}
	for r := range reps {
		if x.Len(int32(r)) != len(model[r]) {
			t.Fatalf("replica %d: len %d, want %d", r, x.Len(int32(r)), len(model[r]))
		}
	}
}

// TestReuseCountsEvictedBlocksAskedForAgain: Reuse is the share of blocks
// that left the index and were matched again.
func TestReuseCountsEvictedBlocksAskedForAgain(t *testing.T) {
	x := New()
	x.SetCapacity(0, 4)
	x.Touch(0, []uint64{1, 2, 3, 4})
	x.Touch(0, []uint64{5, 6, 7, 8}) // evicts 1-4: they leave the index
	if r := x.Reuse(); r != 0 {
		t.Fatalf("reuse before any evicted block came back = %v", r)
	}
	x.Match([]uint64{1, 2, 9}, make([]int32, 1)) // 1 and 2 come back
	if r := x.Reuse(); r != 0.5 {
		t.Fatalf("reuse = %v, want 2 of 4 evicted blocks = 0.5", r)
	}
	x.Match([]uint64{1, 2}, make([]int32, 1)) // counted once
	if r := x.Reuse(); r != 0.5 {
		t.Fatalf("reuse after a repeat = %v, want 0.5", r)
	}
}

// TestForgetUndoesARefusedPrompt: a prompt the replica never computed
// leaves the index, down to what the replica held before it, without
// ghosts; a later prompt that used its blocks keeps them.
func TestForgetUndoesARefusedPrompt(t *testing.T) {
	x := New()
	x.SetCapacity(0, 100)
	x.SetCapacity(1, 100)
	x.Touch(0, []uint64{1, 2})
	x.Touch(1, []uint64{1, 2, 3, 4, 5})
	refused := []uint64{1, 2, 3, 4, 5}
	keep := int(match(x, 2, refused)[0])
	touched := x.Touch(0, refused)
	x.Forget(0, refused, keep, touched)
	if got := match(x, 2, refused); !slices.Equal(got, []int32{2, 5}) {
		t.Fatalf("depths after the refusal = %v, want [2 5] (replica 0 back to its 2 blocks; replica 1 untouched)", got)
	}
	if x.Len(0) != 2 || x.Nodes() != 5 || x.Reuse() != 0 {
		t.Fatalf("len %d, nodes %d, reuse %v: want 2, 5 and no ghosts", x.Len(0), x.Nodes(), x.Reuse())
	}

	// Blocks another prompt used since the refused one stay: the same
	// prompt sent again, or a longer one through it.
	touched = x.Touch(0, refused)
	x.Touch(0, []uint64{1, 2, 3})
	x.Forget(0, refused, keep, touched)
	if got := match(x, 1, refused)[0]; got != 3 {
		t.Fatalf("depth after a refusal whose head a later prompt used = %d, want 3", got)
	}
	touched = x.Touch(0, refused)
	x.Touch(0, []uint64{1, 2, 3, 4, 5, 6})
	x.Forget(0, refused, 3, touched)
	if got := match(x, 1, []uint64{1, 2, 3, 4, 5, 6})[0]; got != 6 {
		t.Fatalf("depth after a refusal a later prompt extended = %d, want 6", got)
	}
}

// TestForgetKeepsAFullReplicaFull: the blocks a refused prompt evicted are
// still on the replica, so the index stays full, and new blocks evict those
// unnamed blocks (the oldest) before anything it can name.
func TestForgetKeepsAFullReplicaFull(t *testing.T) {
	x := New()
	x.SetCapacity(0, 4)
	x.Touch(0, []uint64{1, 2, 3, 4})
	refused := []uint64{10, 11}
	touched := x.Touch(0, refused) // evicts 4 and 3, the old tail
	if touched.Evicted != 2 {
		t.Fatalf("the refused prompt's Touch evicted %d, want 2", touched.Evicted)
	}
	x.Forget(0, refused, 0, touched)
	if x.Len(0) != 4 || x.Idle(0) < 0 {
		t.Fatalf("after the refusal: len %d, idle %d; want the replica still full (4)", x.Len(0), x.Idle(0))
	}
	if got := match(x, 1, refused)[0]; got != 0 {
		t.Fatalf("refused prompt still matched to depth %d", got)
	}
	x.Touch(0, []uint64{20, 21})
	if got := match(x, 1, []uint64{1, 2})[0]; got != 2 || x.Len(0) != 4 {
		t.Fatalf("after new blocks: depth of [1 2] %d, len %d; want 2 and 4 (the unnamed blocks went first)", got, x.Len(0))
	}

	// With room, a refusal evicted nothing and frees what it took.
	x.SetCapacity(0, 100)
	n := x.Len(0)
	touched = x.Touch(0, refused)
	x.Forget(0, refused, 0, touched)
	if x.Len(0) != n {
		t.Fatalf("len %d after a refusal with room, want %d", x.Len(0), n)
	}
}

// TestMarginalReuseCountsHitsWithinTheMargin: a replica whose evicted
// blocks come back soon after (a cyclic working set a fifth larger than its
// cache) has a marginal reuse near 1, one whose evicted blocks come back
// only much later (three times its cache) 0, though both count in Reuse;
// removing a replica starts its count again.
func TestMarginalReuseCountsHitsWithinTheMargin(t *testing.T) {
	x := New()
	x.SetMargin(0.5)
	x.SetCapacity(0, 100)
	x.SetCapacity(1, 100)
	d := make([]int32, 2)
	ask := func(rep int32, h uint64) {
		b := []uint64{h}
		x.Match(b, d)
		x.Touch(rep, b)
	}
	if _, ok := x.MarginalReuse(0); ok {
		t.Fatal("a replica that evicted nothing has a marginal reuse")
	}
	for range 10 {
		for h := range uint64(120) {
			ask(0, 1_000+h)
		}
		for h := range uint64(300) {
			ask(1, 10_000+h)
		}
	}
	near, ok0 := x.MarginalReuse(0)
	far, ok1 := x.MarginalReuse(1)
	if !ok0 || !ok1 {
		t.Fatalf("after thousands of evictions: ok %v %v", ok0, ok1)
	}
	if near < 0.9 || far != 0 {
		t.Errorf("marginal reuse %.3f (blocks back 20 evictions later) and %.3f (200 later) with a margin of 50: want near 1 and 0", near, far)
	}
	if r := x.Reuse(); r < 0.5 {
		t.Errorf("reuse %.3f: every evicted block came back", r)
	}
	x.RemoveReplica(0)
	if _, ok := x.MarginalReuse(0); ok {
		t.Error("a removed replica kept its marginal reuse")
	}
	x.SetMargin(0)
	for h := range uint64(300) {
		ask(1, 10_000+h)
	}
	if m, _ := x.MarginalReuse(1); m != 0 {
		t.Errorf("margin 0: marginal reuse %.3f, want 0", m)
	}
}
