package kvindex

import (
	"slices"
	"testing"
)

func TestPinnedPromptIsNotEvicted(t *testing.T) {
	x := New()
	x.SetCapacity(0, 4)
	x.Touch(0, []uint64{1, 2})
	p := x.Pin(0, []uint64{1, 2})
	if p == 0 {
		t.Fatal("Pin of a held prompt returned no pin")
	}
	// Two new prompts need the whole capacity: they evict each other, not
	// the pinned one, and the oldest unpinned goes first.
	x.Touch(0, []uint64{10, 11})
	x.Touch(0, []uint64{20, 21})
	if got := match(x, 1, []uint64{1, 2}); got[0] != 2 {
		t.Fatalf("pinned prompt matched %d blocks, want 2", got[0])
	}
	if got := match(x, 1, []uint64{10, 11}); got[0] != 0 {
		t.Fatalf("older unpinned prompt matched %d blocks, want 0 (evicted)", got[0])
	}
	// Released, it is the least recently used: the next prompt evicts it
	// (its tail first).
	x.Unpin(p)
	x.Touch(0, []uint64{30})
	if got := match(x, 1, []uint64{1, 2}); got[0] != 1 {
		t.Fatalf("after unpin and one new block the prompt matched %d, want 1", got[0])
	}
	x.Unpin(p) // twice: nothing
	if x.Len(0) != 4 {
		t.Fatalf("Len = %d, want 4", x.Len(0))
	}
}

func TestPinsCanFillTheCapacity(t *testing.T) {
	x := New()
	x.SetCapacity(0, 3)
	x.Touch(0, []uint64{1, 2, 3})
	p := x.Pin(0, []uint64{1, 2, 3})
	if x.Idle(0) != 0 {
		t.Fatalf("Idle with everything pinned = %d, want 0", x.Idle(0))
	}
	// Nothing is evictable: the new prompt's first block is recorded past
	// the capacity, the rest (deeper) is not.
	x.Touch(0, []uint64{7, 8, 9})
	if got := match(x, 1, []uint64{7, 8, 9}); got[0] != 1 || x.Len(0) != 4 {
		t.Fatalf("over capacity: matched %d, Len %d; want 1 and 4", got[0], x.Len(0))
	}
	x.Unpin(p)
	x.Touch(0, []uint64{7, 8})
	if x.Len(0) != 3 {
		t.Fatalf("after unpin and a touch Len = %d, want the capacity 3", x.Len(0))
	}
	x.SetCapacity(0, 1)
	if x.Len(0) != 1 {
		t.Fatalf("Len after shrinking = %d, want 1", x.Len(0))
	}
}

func TestRemoveReplicaVoidsItsPins(t *testing.T) {
	x := New()
	x.SetCapacity(0, 4)
	x.SetCapacity(1, 4)
	x.Touch(0, []uint64{1, 2})
	p := x.Pin(0, []uint64{1, 2})
	x.RemoveReplica(0)
	if x.Len(0) != 0 {
		t.Fatalf("removed replica holds %d blocks", x.Len(0))
	}
	// The freed entries are reused by replica 1; the stale pin must not
	// touch them.
	x.Touch(1, []uint64{1, 2})
	q := x.Pin(1, []uint64{1, 2})
	x.Unpin(p)
	x.Touch(1, []uint64{5, 6})
	x.Touch(1, []uint64{7, 8})
	if got := match(x, 2, []uint64{1, 2}); !slices.Equal(got, []int32{0, 2}) {
		t.Fatalf("replica 1's pinned prompt after a stale unpin: %v, want [0 2]", got)
	}
	x.Unpin(q)
	if x.Pin(0, []uint64{1, 2}) != 0 || x.Pin(5, []uint64{1}) != 0 || x.Pin(1, nil) != 0 {
		t.Fatal("Pin of nothing held returned a pin")
	}
	x.Unpin(0) // no pin: nothing
}

// TestPinListStaysBounded: a replica's list of pinned entries (what
// RemoveReplica walks instead of the whole index) does not grow with pins
// released long ago, and still finds the live ones.
func TestPinListStaysBounded(t *testing.T) {
	x := New()
	x.SetCapacity(0, 64)
	x.Touch(0, []uint64{1, 2})
	x.Touch(0, []uint64{1, 3})
	held := x.Pin(0, []uint64{1, 2})
	for range 10_000 {
		x.Unpin(x.Pin(0, []uint64{1, 3}))
	}
	if n := len(x.reps[0].pinList); n > 2*1+64+1 {
		t.Fatalf("pin list holds %d entries for 1 pinned", n)
	}
	x.RemoveReplica(0)
	if x.Len(0) != 0 || x.reps[0].pinned != 0 {
		t.Fatalf("after remove: Len %d, pinned %d", x.Len(0), x.reps[0].pinned)
	}
	x.Unpin(held) // void
}

// TestPinnedFullShareStaysBounded: with its capacity all pinned, a
// replica's share takes one block of each new prompt past its capacity and
// gives it back to the next, so a stream of long prompts (a hostile client,
// a fleet in overload) cannot grow the index beyond the pins plus one.
func TestPinnedFullShareStaysBounded(t *testing.T) {
	x := New()
	x.SetCapacity(0, 4)
	x.Touch(0, []uint64{1, 2, 3, 4})
	x.Pin(0, []uint64{1, 2, 3, 4})
	for i := range uint64(100) {
		p := make([]uint64, 50)
		for j := range p {
			p[j] = 1000*(i+1) + uint64(j)
		}
		x.Touch(0, p)
		if x.Len(0) > 5 {
			t.Fatalf("after %d long prompts the pinned-full share holds %d blocks, want at most 5", i+1, x.Len(0))
		}
	}
}
