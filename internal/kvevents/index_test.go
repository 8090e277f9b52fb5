package kvevents

import (
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func stored(medium string, hs ...uint64) Event {
	return Event{Kind: BlockStored, BlockHashes: hs, TokenIDs: make([]uint32, len(hs)), BlockSize: 1, Medium: medium}
}

func removed(medium string, hs ...uint64) Event {
	return Event{Kind: BlockRemoved, BlockHashes: hs, Medium: medium}
}

func TestIndexFollowsEvents(t *testing.T) {
	prompt := []uint64{10, 11, 12, 13}
	steps := []struct {
		name     string
		rep      string
		events   []Event
		wantA    [2]int // Match("a", prompt): gpu, any
		wantB    [2]int
		refusedA uint64
	}{
		{"stored on a", "a", []Event{stored("GPU", 10, 11, 12)}, [2]int{3, 3}, [2]int{0, 0}, 0},
		{"b stores the head only", "b", []Event{stored("GPU", 10)}, [2]int{3, 3}, [2]int{1, 1}, 0},
		{"a offloads block 13 to CPU", "a", []Event{stored("CPU", 13)}, [2]int{3, 4}, [2]int{1, 1}, 0},
		{"a evicts 11 from GPU, keeps a CPU copy", "a", []Event{stored("CPU", 11), removed("GPU", 11)}, [2]int{1, 4}, [2]int{1, 1}, 0},
		{"removing what is not held changes nothing", "b", []Event{removed("GPU", 99)}, [2]int{1, 4}, [2]int{1, 1}, 0},
		{"a clears all", "a", []Event{{Kind: AllBlocksCleared}}, [2]int{0, 0}, [2]int{1, 1}, 0},
		{"a floods past its budget of 4", "a", []Event{stored("GPU", 10, 11, 12, 13, 14, 15)}, [2]int{4, 4}, [2]int{1, 1}, 2},
	}
	x := NewIndex(4)
	for i, s := range steps {
		x.Apply(s.rep, Batch{Events: s.events}, t0.Add(time.Duration(i)*time.Second))
		ga, aa := x.Match("a", prompt, t0)
		gb, ab := x.Match("b", prompt, t0)
		if [2]int{ga, aa} != s.wantA || [2]int{gb, ab} != s.wantB {
			t.Fatalf("%s: a=(%d,%d) b=(%d,%d), want a=%v b=%v", s.name, ga, aa, gb, ab, s.wantA, s.wantB)
		}
		if st, _ := x.Stats("a"); st.Refused != s.refusedA {
			t.Fatalf("%s: a refused %d, want %d", s.name, st.Refused, s.refusedA)
		}
	}
	if st, _ := x.Stats("b"); st.Blocks != 1 {
		t.Errorf("a's flood changed b: %d blocks", st.Blocks)
	}
}

func TestIndexExpireAndClear(t *testing.T) {
	x := NewIndex(0)
	x.Apply("a", Batch{Events: []Event{stored("GPU", 1)}}, t0)
	x.Apply("b", Batch{Events: []Event{stored("GPU", 1)}}, t0.Add(20*time.Second))
	if gone := x.Expire(t0.Add(30*time.Second), 15*time.Second, nil); !slices.Equal(gone, []string{"a"}) {
		t.Fatalf("Expire = %v, want [a]", gone)
	}
	if x.Publishes("a") || !x.Publishes("b") {
		t.Fatalf("after Expire: a publishes %v, b %v", x.Publishes("a"), x.Publishes("b"))
	}
	x.Clear("b", t0.Add(31*time.Second))
	if _, n := x.Match("b", []uint64{1}, t0); n != 0 || !x.Publishes("b") {
		t.Fatalf("after Clear: b matches %d, publishes %v", n, x.Publishes("b"))
	}
	x.Remove("b")
	if x.Publishes("b") {
		t.Fatal("b publishes after Remove")
	}
}

// TestIndexExpireTellsQuietFromGone walks replicas whose events stopped
// through Expire: a live replica that was given nothing new is quiet and
// keeps its entries; one not live, or one that was routed new blocks and
// did not report them, is gone.
func TestIndexExpireTellsQuietFromGone(t *testing.T) {
	const maxAge = 60 * time.Second
	steps := []struct {
		name     string
		live     bool
		expectAt time.Duration // when blocks were routed there after its last batch; <0: never
		at       time.Duration // when Expire runs
		wantGone bool
	}{
		{name: "recent batch", live: false, expectAt: -1, at: 30 * time.Second},
		{name: "quiet, not live", live: false, expectAt: -1, at: 90 * time.Second, wantGone: true},
		{name: "quiet, live, given nothing", live: true, expectAt: -1, at: 10 * time.Minute},
		{name: "live, blocks just routed", live: true, expectAt: 80 * time.Second, at: 90 * time.Second},
		{name: "live, routed blocks unreported for long", live: true, expectAt: 20 * time.Second, at: 90 * time.Second, wantGone: true},
	}
	for _, s := range steps {
		x := NewIndex(0)
		x.Apply("a", Batch{Events: []Event{stored("GPU", 1)}}, t0)
		if s.expectAt >= 0 {
			x.Expect("a", []uint64{1, 2}, t0.Add(s.expectAt))
		}
		gone := x.Expire(t0.Add(s.at), maxAge, map[string]bool{"a": s.live})
		if (len(gone) == 1) != s.wantGone || x.Publishes("a") == s.wantGone {
			t.Errorf("%s: Expire = %v, publishes %v; want gone %v", s.name, gone, x.Publishes("a"), s.wantGone)
		}
	}
	// A batch after the routed blocks ends the wait.
	x := NewIndex(0)
	x.Apply("a", Batch{Events: []Event{stored("GPU", 1)}}, t0)
	x.Expect("a", []uint64{1, 2}, t0.Add(time.Second))
	x.Apply("a", Batch{Events: []Event{stored("GPU", 2)}}, t0.Add(2*time.Second))
	if gone := x.Expire(t0.Add(10*time.Minute), maxAge, map[string]bool{"a": true}); len(gone) != 0 {
		t.Fatalf("a replica that reported its routed blocks expired: %v", gone)
	}
}

func TestIndexExpectCountsRoutedBlocksUntilReported(t *testing.T) {
	x := NewIndex(64)
	x.Apply("a", Batch{Events: []Event{stored("GPU", 1)}}, t0)
	x.Expect("a", []uint64{1, 2, 3}, t0)
	x.Expect("unknown", []uint64{1}, t0) // not publishing: ignored
	steps := []struct {
		name string
		at   time.Duration
		ev   []Event
		want int
	}{
		{"routed blocks count at once", time.Second, nil, 3},
		{"a removal drops the expectation", 2 * time.Second, []Event{removed("GPU", 3)}, 2},
		{"stored blocks stay after the limit", PendingTTL + time.Second, []Event{stored("GPU", 2)}, 2},
		{"cleared drops everything", PendingTTL + 2*time.Second, []Event{{Kind: AllBlocksCleared}}, 0},
	}
	for _, s := range steps {
		now := t0.Add(s.at)
		if s.ev != nil {
			x.Apply("a", Batch{Events: s.ev}, now)
		}
		if gpu, _ := x.Match("a", []uint64{1, 2, 3}, now); gpu != s.want {
			t.Fatalf("%s: match %d, want %d", s.name, gpu, s.want)
		}
	}
	x.Expect("a", []uint64{7}, t0)
	if gpu, _ := x.Match("a", []uint64{7}, t0.Add(PendingTTL)); gpu != 0 {
		t.Fatal("an expectation outlived PendingTTL")
	}
	if x.Publishes("unknown") {
		t.Fatal("Expect made a replica publish")
	}
}
