package bench

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestEventHeapOrder checks that the heap always yields the source with the
// smallest (key, index) after arbitrary re-keying.
func TestEventHeapOrder(t *testing.T) {
	tests := []struct {
		name    string
		sources int
		ops     int
	}{
		{"one source", 1, 50},
		{"few sources", 7, 500},
		{"many sources", 203, 5000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(tt.sources)))
			h := newEventHeap(tt.sources)
			keys := make([]int64, tt.sources)
			for i := range keys {
				keys[i] = never
			}
			for range tt.ops {
				s := rng.IntN(tt.sources)
				k := int64(rng.IntN(20))
				if rng.IntN(5) == 0 {
					k = never
				}
				h.set(s, k)
				keys[s] = k
				want := 0
				for i := range keys {
					if keys[i] < keys[want] {
						want = i
					}
				}
				got, key := h.min()
				if got != want || key != keys[want] {
					t.Fatalf("min = (%d, %d), want (%d, %d); keys %v", got, key, want, keys[want], keys)
				}
			}
		})
	}
}

func TestEventHeapTieBreakByIndex(t *testing.T) {
	h := newEventHeap(5)
	for _, s := range []int{4, 2, 3, 0} {
		h.set(s, 10)
	}
	var order []int
	for {
		s, k := h.min()
		if k == never {
			break
		}
		order = append(order, s)
		h.set(s, never)
	}
	if want := []int{0, 2, 3, 4}; !slices.Equal(order, want) {
		t.Fatalf("order %v, want %v", order, want)
	}
}
