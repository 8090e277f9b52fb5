package kvindex

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// index is what the benchmark drives: Index or the reference model.
type index interface {
	SetCapacity(rep int32, blocks int)
	Match(blocks []uint64, depth []int32) int
	Touch(rep int32, blocks []uint64) Touched
	Idle(rep int32) int64
	Reuse() float64
}

// BenchmarkRoute is the index's share of BenchmarkSelectReleaseCost in
// package balancer: the same fleet, conversations and requests (9 in 10
// continue a conversation some replica holds), but the replica with the
// deepest match wins (else rotation), where policy cost also weighs load.
// Each request is one Match of the fleet, one Idle per replica and one
// Touch. impl=reference is the index before the leaf-only LRU, for an A/B
// in one process.
func BenchmarkRoute(b *testing.B) {
	const perReplica, promptBlocks = 100_000, 64
	for _, n := range []int{4, 1000} {
		for _, impl := range []string{"reference", "index"} {
			b.Run(fmt.Sprintf("replicas=%d/impl=%s", n, impl), func(b *testing.B) {
				if n > 4 && testing.Short() {
					b.Skip("large")
				}
				var x index = New()
				if impl == "reference" {
					x = newRefIndex()
				}
				convs := perReplica / promptBlocks
				chainOf := func(keys []uint64) []uint64 {
					p, h := make([]uint64, len(keys)), uint64(0)
					for i, k := range keys {
						h = chain(h, k)
						p[i] = h
					}
					return p
				}
				keys := make([]uint64, promptBlocks)
				for r := range n {
					x.SetCapacity(int32(r), perReplica)
					for k := range convs {
						c := (r%10)*convs + k
						for i := range keys {
							keys[i] = uint64(c)<<20 | uint64(i)
						}
						x.Touch(int32(r), chainOf(keys))
					}
				}
				rng := rand.New(rand.NewPCG(3, 3))
				prompts := make([][]uint64, 4096)
				for i := range prompts {
					c := rng.IntN(min(n, 10) * convs) // held by some replica, as in package balancer's
					keys := make([]uint64, promptBlocks, promptBlocks+4)
					for k := range keys {
						keys[k] = uint64(c)<<20 | uint64(k)
					}
					if i%10 == 0 {
						for k := range keys {
							keys[k] |= 1 << 62
						}
					} else {
						for k := range 4 {
							keys = append(keys, uint64(i)<<32|1<<63|uint64(k))
						}
					}
					prompts[i] = chainOf(keys)
				}
				depth := make([]int32, n)
				var sink int64
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					p := prompts[i%len(prompts)]
					clear(depth)
					x.Match(p, depth)
					best := int32(i % n)
					for r := range int32(n) {
						sink += x.Idle(r)
						if depth[r] > depth[best] {
							best = r
						}
					}
					x.Touch(best, p)
					sink += int64(x.Reuse())
				}
				_ = sink
			})
		}
	}
}
