package kvevents

import (
	"testing"
	"time"
)

// TestMarginalReuseFromEvents walks a replica's evictions: a block it
// evicted and any replica computes again counts while a cache larger by
// the margin would still have held it, one still held elsewhere is no
// loss, and Computed counts every block newly stored in a GPU cache.
func TestMarginalReuseFromEvents(t *testing.T) {
	x := NewIndex(0)
	x.SetMargin(0.25)
	at := t0
	apply := func(rep string, evs ...Event) {
		at = at.Add(time.Second)
		x.Apply(rep, Batch{Events: evs}, at)
	}
	// a's cache holds 64 blocks at most (its peak), so the margin is 16
	// of its evictions.
	for h := uint64(1); h <= 64; h++ {
		apply("a", stored("GPU", h))
	}
	apply("b", stored("GPU", 1000))
	if got := x.Computed(); got != 65 {
		t.Fatalf("Computed = %d, want 65", got)
	}
	apply("b", stored("GPU", 1000)) // a further copy is not computed
	apply("b", stored("CPU", 1000)) // nor an offload
	if got := x.Computed(); got != 65 {
		t.Fatalf("Computed after a copy and an offload = %d, want 65", got)
	}
	// a evicts 1..40; b computes 1..10 again soon after (within the
	// margin) and 11..20 only after 20 or more later evictions (past it).
	for h := uint64(1); h <= 10; h++ {
		apply("a", removed("GPU", h))
	}
	for h := uint64(1); h <= 10; h++ {
		apply("b", stored("GPU", h))
	}
	for h := uint64(11); h <= 40; h++ {
		apply("a", removed("GPU", h))
	}
	for h := uint64(11); h <= 20; h++ {
		apply("b", stored("GPU", h))
	}
	if _, ok := x.MarginalReuse("a"); !ok {
		t.Fatal("MarginalReuse not known after 40 evictions")
	}
	if m, _ := x.MarginalReuse("a"); m < 0.24 || m > 0.26 {
		t.Fatalf("MarginalReuse(a) = %.3f, want 10/40 (10 back within the margin, 10 after)", m)
	}
	// A block a evicts while b holds it is no ghost: its requests find
	// it on b; only blocks the fleet lost count.
	apply("b", stored("GPU", 50))
	for h := uint64(41); h <= 50; h++ {
		apply("a", removed("GPU", h))
	}
	if m, _ := x.MarginalReuse("a"); m < 10.0/49-0.001 || m > 10.0/49+0.001 {
		t.Fatalf("MarginalReuse(a) = %.3f, want 10/49 (block 50 is still on b)", m)
	}
	if _, ok := x.MarginalReuse("b"); ok {
		t.Fatal("MarginalReuse(b) known before b evicted anything")
	}
	if _, ok := x.MarginalReuse("nobody"); ok {
		t.Fatal("MarginalReuse of an unknown replica")
	}
}

// TestMarginalReuseKeyedByTokens: keyed by tokens, an engine block larger
// than tokenize.BlockSize is several keys, each computed and evicted.
func TestMarginalReuseKeyedByTokens(t *testing.T) {
	x := NewIndex(0)
	x.SetKeyByTokens(true)
	x.SetMargin(1)
	block := func(h uint64, tok uint32) Event {
		toks := make([]uint32, 32)
		for i := range toks {
			toks[i] = tok
		}
		return Event{Kind: BlockStored, BlockHashes: []uint64{h}, TokenIDs: toks, BlockSize: 32, Medium: MediumGPU}
	}
	for i := range uint64(20) {
		x.Apply("a", Batch{Events: []Event{block(100+i, uint32(i))}}, t0)
	}
	if got := x.Computed(); got != 40 {
		t.Fatalf("Computed = %d, want 40 (20 engine blocks of 2 keys)", got)
	}
	for i := range uint64(20) {
		x.Apply("a", Batch{Events: []Event{removed(MediumGPU, 100+i)}}, t0)
	}
	for i := range uint64(8) { // computed again, by another replica
		x.Apply("b", Batch{Events: []Event{block(200+i, uint32(i))}}, t0)
	}
	if m, ok := x.MarginalReuse("a"); !ok || m < 0.399 || m > 0.401 {
		t.Fatalf("MarginalReuse(a) = %.3f, %v; want 16/40", m, ok)
	}
}
