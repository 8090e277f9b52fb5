package kvindex

import (
	"math/rand/v2"
	"testing"
)

// TestTableAgainstMap runs random puts, gets and deletes (with colliding
// and zero keys) against Go's map.
func TestTableAgainstMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 9))
	tb := newTable()
	ref := map[uint64]int32{}
	for step := range 200_000 {
		k := uint64(rng.IntN(5000))
		if rng.IntN(4) == 0 {
			k <<= 40 // keys differing only in high bits
		}
		switch rng.IntN(3) {
		case 0:
			v := int32(rng.IntN(1 << 20))
			tb.put(k, v)
			ref[k] = v
		case 1:
			tb.del(k)
			delete(ref, k)
		}
		got, ok := tb.get(k)
		want, wantOK := ref[k]
		if ok != wantOK || got != want {
			t.Fatalf("step %d key %d: got %d,%v want %d,%v", step, k, got, ok, want, wantOK)
		}
		if tb.n != len(ref) {
			t.Fatalf("step %d: n = %d, want %d", step, tb.n, len(ref))
		}
	}
	for k, v := range ref {
		if got, ok := tb.get(k); !ok || got != v {
			t.Fatalf("key %d: got %d,%v want %d", k, got, ok, v)
		}
	}
}
