package kvevents

import (
	"testing"
	"time"
)

// riskIndex is replica a after it stored keys 1..150 one at a time and,
// from the 101st on, evicted the oldest for each new one: 50 evictions,
// each of a key 100 stores old, so a key is expected to live 100 stores.
// Keys 51..150 are held, key k of age 150-k.
func riskIndex(t *testing.T) *Index {
	t.Helper()
	x := NewIndex(0)
	at := t0
	apply := func(evs ...Event) {
		at = at.Add(time.Millisecond)
		x.Apply("a", Batch{Events: evs}, at)
	}
	for k := uint64(1); k <= 100; k++ {
		apply(stored("GPU", k))
	}
	for k := uint64(1); k <= 50; k++ {
		apply(stored("GPU", 100+k), removed("GPU", k))
	}
	return x
}

func keys(from, to uint64) []uint64 {
	var ks []uint64
	for k := from; k <= to; k++ {
		ks = append(ks, k)
	}
	return ks
}

// TestSurvivorsJudgesBlocksAtRisk: a held key is judged gone once its age
// plus the blocks to be allocated before the request starts pass the age
// at which the replica evicts keys by riskMargin (100 stores: 125).
func TestSurvivorsJudgesBlocksAtRisk(t *testing.T) {
	x := riskIndex(t)
	cases := []struct {
		name   string
		blocks []uint64
		allocs int
		want   int
	}{
		{"nothing queued ahead", keys(51, 60), 0, 10},
		{"young keys survive a long queue", keys(141, 150), 100, 10},
		{"old keys survive a short queue", keys(51, 60), 25, 10},       // 99+25 < 125
		{"old keys are gone behind a longer one", keys(51, 60), 26, 0}, // 99+26
		{"a young head keeps its place, an old key ends the run", []uint64{150, 149, 52}, 27, 2},
	}
	for _, c := range cases {
		if got := x.Survivors("a", c.blocks, len(c.blocks), c.allocs, t0); got != c.want {
			t.Errorf("%s: Survivors = %d, want %d", c.name, got, c.want)
		}
	}
	if got := x.Survivors("a", keys(51, 60), 4, 1000, t0); got != 0 {
		t.Errorf("depth 4 of old keys behind 1000 blocks: %d survive, want 0", got)
	}
	if got := x.Survivors("a", keys(51, 60), 4, 0, t0); got != 4 {
		t.Errorf("Survivors never exceeds the depth Match found: got %d, want 4", got)
	}
	if got := x.Survivors("nobody", keys(51, 60), 10, 1000, t0); got != 10 {
		t.Errorf("a replica without entries: %d survive, want all 10", got)
	}
}

// TestSurvivorsWaitsForEvictions: a replica that has evicted too little
// to tell how long a key stays keeps every key.
func TestSurvivorsWaitsForEvictions(t *testing.T) {
	x := NewIndex(0)
	x.Apply("b", Batch{Events: []Event{stored("GPU", keys(1, 40)...), removed("GPU", keys(1, riskMinSamples-1)...)}}, t0)
	if got := x.Survivors("b", keys(riskMinSamples, 40), 3, 1<<20, t0); got != 3 {
		t.Fatalf("after %d evictions: %d of 3 survive, want 3", riskMinSamples-1, got)
	}
}

// TestSurvivorsKeepsKeysInUse: keys a request routed to the replica uses
// are safe until it finishes (they are not evictable, and it is scheduled
// first), or BusyTTL if it never is; once it finishes they are the
// freshest, the prompt's last block first out.
func TestSurvivorsKeepsKeysInUse(t *testing.T) {
	x := riskIndex(t)
	old := keys(51, 60)
	x.Expect("a", old, t0)
	x.Expect("a", old, t0) // two requests use them
	if got := x.Survivors("a", old, 10, 1000, t0.Add(time.Second)); got != 10 {
		t.Fatalf("keys in use: %d survive, want 10", got)
	}
	if got := x.Survivors("a", old, 10, 1000, t0.Add(BusyTTL+time.Second)); got != 0 {
		t.Fatalf("keys of requests never reported finished, after BusyTTL: %d survive, want 0", got)
	}
	x.Touch("a", old) // one finished: its blocks move to the end of the order
	if got := x.Survivors("a", old, 10, 1000, t0.Add(time.Second)); got != 10 {
		t.Fatalf("one of two requests finished: %d survive, want 10", got)
	}
	x.Touch("a", old) // both finished: no longer in use, but fresh
	// The prompt's last block is freed first: key 51+i is i ticks old.
	// 20 ticks of touches over 150 stores make n blocks to allocate
	// n*170/150 ticks; a key is gone at 125.
	for _, c := range []struct{ allocs, want int }{{100, 10}, {105, 6}, {110, 1}, {111, 0}} {
		if got := x.Survivors("a", old, 10, c.allocs, t0.Add(time.Second)); got != c.want {
			t.Errorf("freed keys behind %d blocks: %d survive, want %d", c.allocs, got, c.want)
		}
	}
}

// TestUnmarkEndsARefusedRequestsUse: a request turned away before it ran
// (Unmark) stops keeping its keys safe at once, and leaves them where they
// were in the eviction order: still the old keys they were.
func TestUnmarkEndsARefusedRequestsUse(t *testing.T) {
	x := riskIndex(t)
	old := keys(51, 60)
	x.Expect("a", old, t0)
	x.Expect("a", old, t0)
	x.Unmark("a", old) // one of two refused
	if got := x.Survivors("a", old, 10, 1000, t0.Add(time.Second)); got != 10 {
		t.Fatalf("one of two requests refused: %d survive, want 10", got)
	}
	x.Unmark("a", old)
	if got := x.Survivors("a", old, 10, 26, t0.Add(time.Second)); got != 0 {
		t.Fatalf("both refused: %d survive 26 blocks, want 0 (the keys are as old as before: 99+26 > 125)", got)
	}
	x.Unmark("nobody", old) // a replica without entries: nothing to do
}

// TestSurvivorsForgetsClearedKeys: a cleared cache has nothing in use.
func TestSurvivorsForgetsClearedKeys(t *testing.T) {
	x := riskIndex(t)
	x.Expect("a", keys(51, 60), t0)
	x.Apply("a", Batch{Events: []Event{{Kind: AllBlocksCleared}}}, t0)
	x.Apply("a", Batch{Events: []Event{stored("GPU", keys(51, 60)...)}}, t0)
	if got := x.Survivors("a", keys(51, 60), 10, 10, t0); got != 10 {
		t.Fatalf("keys stored again after a clear: %d survive, want 10", got)
	}
	if n, b := len(x.reps["a"].risk.use), len(x.reps["a"].risk.busy); n != 10 || b != 0 {
		t.Fatalf("after a clear and 10 stores: %d keys ordered, %d in use; want 10, 0", n, b)
	}
}

// TestSurvivorsCountsComputedKeysInUse: a key a request routed to the
// replica computes is held by that request until it finishes, so it cannot
// be evicted before then: its age counts from now, not from when it was
// stored (a long prompt's first blocks are stored long before its last,
// and a running request holds them however old). It is at risk only when
// the prefills queued ahead alone turn the cache over. A key computed
// behind the balancer's back, with no request known to hold it, ages from
// its store.
func TestSurvivorsCountsComputedKeysInUse(t *testing.T) {
	// Keys 201..210 stored at clock 151..160, then 90 more stores each
	// evicting one of keys 51..140 (about 110 stores old): at clock 250
	// key 201 is 99 stores old, key 210 90; a key is gone at about 125.
	setup := func(route bool) *Index {
		x := riskIndex(t)
		if route {
			x.Expect("a", keys(201, 210), t0) // none held: it computes them
		}
		x.Apply("a", Batch{Events: []Event{stored("GPU", keys(201, 210)...)}}, t0)
		for k := uint64(1); k <= 90; k++ {
			x.Apply("a", Batch{Events: []Event{stored("GPU", 1000+k), removed("GPU", 50+k)}}, t0)
		}
		return x
	}
	cases := []struct {
		name     string
		route    bool // a request routed there computes the keys
		finished bool // and it finished (Touch)
		shared   bool // a later request found them held (Expect again)
		allocs   int
		want     int
	}{
		{"computed and in use, behind a short queue", true, false, false, 30, 10},
		{"computed and in use, behind a queue that turns the cache over", true, false, false, 130, 0},
		{"computed behind the balancer's back ages from its store", false, false, false, 30, 0},
		{"computed, finished: freed now, the freshest", true, true, false, 30, 10},
		{"computed, finished, behind a long queue", true, true, false, 130, 0},
		{"shared by a request queued ahead: safe behind any queue", true, false, true, 1000, 10},
	}
	for _, c := range cases {
		x := setup(c.route)
		if c.finished {
			x.Touch("a", keys(201, 210))
		}
		if c.shared {
			x.Expect("a", keys(201, 210), t0)
		}
		if got := x.Survivors("a", keys(201, 210), 10, c.allocs, t0.Add(time.Second)); got != c.want {
			t.Errorf("%s: %d survive behind %d blocks, want %d", c.name, got, c.allocs, c.want)
		}
	}
}

// TestBusyMarksBounded: the keys marked in use are held to a quarter of
// the budget, as pending blocks are; marks past BusyTTL make room.
func TestBusyMarksBounded(t *testing.T) {
	x := NewIndex(40) // at most 10 marks
	x.Apply("a", Batch{Events: []Event{stored("GPU", 1)}}, t0)
	steps := []struct {
		name   string
		blocks []uint64
		at     time.Time
		want   int
	}{
		{"a prompt of 8 blocks", keys(101, 108), t0, 8},
		{"another of 8: two more fit", keys(201, 208), t0.Add(time.Second), 10},
		{"after BusyTTL the old marks make room", keys(301, 308), t0.Add(BusyTTL + 2*time.Second), 8},
	}
	for _, s := range steps {
		x.Expect("a", s.blocks, s.at)
		if got := len(x.reps["a"].risk.busy); got != s.want {
			t.Errorf("%s: %d keys marked, want %d", s.name, got, s.want)
		}
	}
}

// TestBusyMarksSweptAtMostOncePerInterval: at the cap, expired marks are
// swept out at most once per sweepEvery, not on every routed prompt.
func TestBusyMarksSweptAtMostOncePerInterval(t *testing.T) {
	x := NewIndex(40) // at most 10 marks
	x.Apply("a", Batch{Events: []Event{stored("GPU", 1)}}, t0)
	marked := func(k uint64) bool { _, ok := x.reps["a"].risk.busy[k]; return ok }
	x.Expect("a", keys(101, 108), t0)                  // until t0 + BusyTTL
	x.Expect("a", keys(201, 202), t0.Add(time.Second)) // until a second later
	swept := t0.Add(BusyTTL + 500*time.Millisecond)
	x.Expect("a", keys(301, 308), swept) // sweeps out 101-108
	if !marked(301) || marked(101) || !marked(201) {
		t.Fatal("the first sweep at the cap did not make room for the new prompt")
	}
	// 201-202 expire, but the last sweep was under a second ago.
	x.Expect("a", keys(401, 402), swept.Add(800*time.Millisecond))
	if marked(401) || !marked(201) {
		t.Fatal("swept again within sweepEvery")
	}
	x.Expect("a", keys(501, 502), swept.Add(sweepEvery))
	if !marked(501) || marked(201) {
		t.Fatal("not swept once sweepEvery had passed")
	}
}
