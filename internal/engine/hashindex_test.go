package engine

import (
	"math/rand/v2"
	"testing"
)

// TestHashIndexMatchesMap churns the table against a Go map, with keys
// chosen to collide in the low bits.
func TestHashIndexMatchesMap(t *testing.T) {
	for _, spread := range []uint64{1, 1 << 40, 0x9e3779b97f4a7c15} {
		r := rand.New(rand.NewPCG(spread, 1))
		h := newHashIndex(300)
		ref := map[uint64]int32{}
		var live []uint64
		for step := range 20_000 {
			if len(live) < 300 && (len(live) == 0 || r.IntN(2) == 0) {
				k := uint64(r.IntN(2000)) * spread
				_, had := ref[k]
				if got := h.put(k, int32(step)); got == had {
					t.Fatalf("put(%d) = %v with key present %v", k, got, had)
				}
				if !had {
					ref[k] = int32(step)
					live = append(live, k)
				}
			} else {
				i := r.IntN(len(live))
				k := live[i]
				live[i] = live[len(live)-1]
				live = live[:len(live)-1]
				h.del(k, ref[k]+1) // wrong value: must not delete
				h.del(k, ref[k])
				delete(ref, k)
			}
			if step%97 == 0 {
				for k, v := range ref {
					if got, ok := h.get(k); !ok || got != v {
						t.Fatalf("step %d: get(%d) = %d,%v want %d", step, k, got, ok, v)
					}
				}
				if h.n != len(ref) {
					t.Fatalf("n = %d, want %d", h.n, len(ref))
				}
			}
		}
		for _, k := range []uint64{3, 5 * spread, 1999*spread + 1} {
			if _, ok := ref[k]; !ok {
				if _, ok := h.get(k); ok {
					t.Fatalf("get(%d) found a deleted key", k)
				}
			}
		}
	}
}
