package pins

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// op is one call on the table at t0+at; want is the replica the key is
// pinned to afterwards ("" = no pin).
type op struct {
	at      time.Duration
	do      string // bind | use | spill | spill-noLive | sweep
	kind    Kind
	replica string // bind target or spill's chosen replica
	want    string
}

// TestLifeCycle has one case per pin life-cycle rule of docs/ROUTING.md.
func TestLifeCycle(t *testing.T) {
	m := time.Minute
	tests := []struct {
		name string
		ops  []op
	}{
		{"session pin lives 60 min idle", []op{
			{0, "bind", Session, "a", "a"}, {59 * m, "lookup", Session, "", "a"}, {119 * m, "lookup", Session, "", ""},
		}},
		{"use refreshes the session TTL", []op{
			{0, "bind", Session, "a", "a"}, {50 * m, "use", Session, "", "a"}, {109 * m, "lookup", Session, "", "a"},
		}},
		{"prefix pin lives 5 min idle", []op{
			{0, "bind", Prefix, "a", "a"}, {4 * m, "lookup", Prefix, "", "a"}, {9 * m, "lookup", Prefix, "", ""},
		}},
		{"3 consecutive spills rebind a session pin to the chosen replica", []op{
			{0, "bind", Session, "a", "a"}, {1, "spill", Session, "b", "a"}, {2, "spill", Session, "c", "a"},
			{3, "spill", Session, "d", "d"},
		}},
		{"a used pin resets its spill count", []op{
			{0, "bind", Session, "a", "a"}, {1, "spill", Session, "b", "a"}, {2, "spill", Session, "b", "a"},
			{3, "use", Session, "", "a"}, {4, "spill", Session, "b", "a"}, {5, "spill", Session, "b", "a"},
		}},
		{"no rebind onto a replica that may not take pins", []op{
			{0, "bind", Session, "a", "a"}, {1, "spill", Session, "b", "a"}, {2, "spill", Session, "b", "a"},
			{3, "spill-noLive", Session, "p", "a"}, {4, "spill", Session, "b", "b"},
		}},
		{"a repeated prefix spill deletes the key", []op{
			{0, "bind", Prefix, "a", "a"}, {1, "spill", Prefix, "b", "a"}, {2, "spill", Prefix, "b", ""},
		}},
		{"sweep removes expired pins of both kinds", []op{
			{0, "bind", Prefix, "a", "a"}, {6 * m, "sweep", Prefix, "", ""},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tab := New(DefaultConfig())
			for i, o := range tc.ops {
				now := t0.Add(o.at)
				switch o.do {
				case "bind":
					tab.Bind(o.kind, "k", o.replica, now)
				case "use":
					tab.Use(o.kind, "k", now)
				case "spill":
					tab.Spill(o.kind, "k", o.replica, true, now)
				case "spill-noLive":
					tab.Spill(o.kind, "k", o.replica, false, now)
				case "sweep":
					tab.Sweep(now, 10)
					if tab.Len() != 0 {
						t.Fatalf("op %d: %d pins left after sweep", i, tab.Len())
					}
				}
				got, _, _ := tab.Lookup(o.kind, "k", now)
				if got != o.want {
					t.Fatalf("op %d (%s at +%s): pinned to %q, want %q", i, o.do, o.at, got, o.want)
				}
			}
		})
	}
}

func TestSweepIsBounded(t *testing.T) {
	tab := New(DefaultConfig())
	for i := range 100 {
		tab.Bind(Prefix, string(rune('A'+i%26))+string(rune('a'+i/26)), "r", t0)
	}
	later := t0.Add(time.Hour)
	if n := tab.Sweep(later, 30); n != 30 {
		t.Fatalf("swept %d, want 30", n)
	}
	if tab.Len() != 70 {
		t.Fatalf("len %d, want 70", tab.Len())
	}
}

func TestMaxPinsEvictsClosestToExpiry(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxPins = 2
	tab := New(cfg)
	tab.Bind(Session, "s", "a", t0)                 // expires t0+60m
	tab.Bind(Prefix, "p", "a", t0.Add(time.Minute)) // expires t0+6m: closest
	tab.Bind(Session, "s2", "b", t0.Add(2*time.Minute))
	if _, _, ok := tab.Lookup(Prefix, "p", t0.Add(2*time.Minute)); ok {
		t.Fatalf("prefix pin survived the bound")
	}
	if tab.Len() != 2 {
		t.Fatalf("len %d, want 2", tab.Len())
	}
}

func TestRemoveReplicaAndList(t *testing.T) {
	tab := New(DefaultConfig())
	tab.Bind(Session, "s1", "a", t0)
	tab.Bind(Session, "s2", "b", t0)
	tab.Bind(Prefix, "p1", "a", t0)
	if n := tab.RemoveReplica("a"); n != 2 {
		t.Fatalf("removed %d, want 2", n)
	}
	l := tab.List(t0, 0)
	if len(l) != 1 || l[0].Key != "s2" || !l[0].ExpiresAt.Equal(t0.Add(time.Hour)) {
		t.Fatalf("list %+v", l)
	}
}

func TestValidateNamesKey(t *testing.T) {
	c := DefaultConfig()
	c.SessionTTL = 0
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "affinity.session_ttl") {
		t.Fatalf("error %v", err)
	}
}

// docs/SECURITY.md: a flood of one-shot session ids (one client inventing a new id
// per request) fills the table; it must not evict a session that has been
// pinned and reused, and the table's memory must stay under its byte bound
// (checked on the real heap, not only on the table's own estimate).
func TestFloodOfOneShotKeysKeepsReusedPins(t *testing.T) {
	if testing.Short() {
		t.Skip("1M pins")
	}
	cfg := DefaultConfig() // 64 MiB, 1M pins
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	tab := New(cfg)
	now := t0
	legit := []string{"user-alice-session", "user-bob-session"}
	for _, k := range legit {
		tab.Bind(Session, k, "a", now)
		tab.Use(Session, k, now.Add(time.Second)) // the second turn: now reused
	}
	const flood = 1_000_000
	key := make([]byte, 0, 64)
	for i := range flood {
		now = t0.Add(time.Duration(i) * time.Millisecond) // 1000 new ids a second for ~17 min
		key = fmt.Appendf(key[:0], "%08d-f00d-4bad-8bad-%012d", i, i)
		tab.Bind(Session, string(key), "b", now)
		if i%100_000 == 0 { // the legitimate users keep talking, much less often
			tab.Use(Session, legit[0], now)
		}
		if tab.Bytes() > cfg.MaxBytes || tab.Len() > cfg.MaxPins {
			t.Fatalf("after %d keys: %d bytes, %d pins, over the bounds", i, tab.Bytes(), tab.Len())
		}
	}
	for _, k := range legit {
		if r, _, ok := tab.Lookup(Session, k, now); !ok || r != "a" {
			t.Errorf("reused session %q was evicted by the flood (pinned to %q, %v)", k, r, ok)
		}
	}
	oneShot, reused := tab.Evictions()
	if oneShot == 0 || reused != 0 {
		t.Errorf("evictions: %d one-shot, %d reused; want some one-shot and no reused", oneShot, reused)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d pins, estimated %d B (%.0f B/pin), heap +%d B (%.0f B/pin)", tab.Len(), tab.Bytes(),
		float64(tab.Bytes())/float64(tab.Len()), heap, float64(heap)/float64(tab.Len()))
	if heap > cfg.MaxBytes {
		t.Errorf("heap grew by %d B, over max_pin_bytes %d: EntryBytes underestimates a pin", heap, cfg.MaxBytes)
	}
	runtime.KeepAlive(tab)
}

// Reused pins compete only with each other: a promotion past 4/5 of the
// bound evicts the least recently used reused pin, never a newer one.
func TestReusedPinsEvictEachOtherLRU(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxPins = 10 // protected segment: 8
	tab := New(cfg)
	for i := range 9 {
		k := fmt.Sprint("s", i)
		at := t0.Add(time.Duration(i) * time.Second)
		tab.Bind(Session, k, "a", at)
		tab.Use(Session, k, at)
	}
	if _, _, ok := tab.Lookup(Session, "s0", t0.Add(time.Minute)); ok {
		t.Errorf("the least recently used reused pin survived")
	}
	for i := 1; i < 9; i++ {
		if _, _, ok := tab.Lookup(Session, fmt.Sprint("s", i), t0.Add(time.Minute)); !ok {
			t.Errorf("reused pin s%d evicted", i)
		}
	}
	if _, reused := tab.Evictions(); reused != 1 {
		t.Errorf("%d reused evictions, want 1", reused)
	}
}

// A key longer than MaxKeyBytes costs no more than a short one, and is still
// found under its own (long) value.
func TestLongKeysAreHashed(t *testing.T) {
	tab := New(DefaultConfig())
	long := strings.Repeat("x", 1<<20)
	tab.Bind(Session, long, "a", t0)
	if tab.Bytes() > EntryBytes+MaxKeyBytes {
		t.Fatalf("a 1 MiB key costs %d B", tab.Bytes())
	}
	if r, _, ok := tab.Lookup(Session, long, t0); !ok || r != "a" {
		t.Fatalf("long key not found: %q %v", r, ok)
	}
	if r, _, ok := tab.Lookup(Session, long[:len(long)-1], t0); ok {
		t.Fatalf("a different long key matched: %q", r)
	}
	if !tab.Delete(Session, long) || tab.Len() != 0 || tab.Bytes() != 0 {
		t.Fatalf("delete: len %d bytes %d", tab.Len(), tab.Bytes())
	}
}

func TestMaxBytesBoundsTheTable(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxBytes = MinMaxBytes
	tab := New(cfg)
	for i := range 10_000 {
		tab.Bind(Prefix, fmt.Sprint("p", i), "a", t0)
		if tab.Bytes() > cfg.MaxBytes {
			t.Fatalf("bytes %d over %d after %d binds", tab.Bytes(), cfg.MaxBytes, i)
		}
	}
	if want := int(cfg.MaxBytes / (EntryBytes + 6)); tab.Len() < want*9/10 {
		t.Errorf("only %d pins kept, want about %d", tab.Len(), want)
	}
	cfg.MaxBytes = 1000
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "affinity.max_pin_bytes") {
		t.Errorf("Validate: %v", err)
	}
}

// docs/SECURITY.md: Page visits a bounded number of entries per call (the caller
// holds the routing lock), and a walk with cursors lists every pin once.
func TestPageIsBoundedAndResumes(t *testing.T) {
	tab := New(DefaultConfig())
	const n = 10_000
	for i := range n {
		tab.Bind(Session, fmt.Sprint("s", i), "a", t0.Add(time.Duration(i)))
		if i%10 == 0 {
			tab.Use(Session, fmt.Sprint("s", i), t0.Add(time.Duration(i))) // some reused
		}
	}
	tab.Bind(Prefix, "p", "b", t0)

	seen := map[string]int{}
	cur, calls := Cursor{}, 0
	for {
		page, next, done := tab.Page(t0.Add(n), cur, 100, 150)
		calls++
		if len(page) > 100 {
			t.Fatalf("page of %d, limit 100", len(page))
		}
		for _, p := range page {
			seen[p.Kind.String()+"/"+p.Key]++
		}
		if done {
			break
		}
		cur = next
		if calls > 1000 {
			t.Fatal("the walk does not end")
		}
	}
	if len(seen) != n+1 {
		t.Fatalf("walk saw %d pins, want %d", len(seen), n+1)
	}
	for k, c := range seen {
		if c != 1 {
			t.Fatalf("%s listed %d times", k, c)
		}
	}

	// Every pin expired: a page still stops after budget visits.
	late := t0.Add(2 * time.Hour)
	page, next, done := tab.Page(late, Cursor{}, 100, 500)
	if len(page) != 0 || done || next.Key == "" {
		t.Fatalf("expired table: page %d, done %v, cursor %+v; want 0, false, a cursor", len(page), done, next)
	}

	// The cursor's pin is used (moves to the back) or deleted: the walk
	// resumes after the pins used no later than it.
	tab2 := New(DefaultConfig())
	for i := range 10 {
		tab2.Bind(Session, fmt.Sprint("k", i), "a", t0.Add(time.Duration(i)*time.Second))
	}
	page, next, _ = tab2.Page(t0.Add(time.Minute), Cursor{}, 3, 100)
	if len(page) != 3 || next.Key != "k2" {
		t.Fatalf("first page %v, cursor %+v", page, next)
	}
	tab2.Delete(Session, "k2")
	page, _, _ = tab2.Page(t0.Add(time.Minute), next, 2, 100)
	if len(page) != 2 || page[0].Key != "k3" || page[1].Key != "k4" {
		t.Fatalf("after the cursor's pin went away: %+v", page)
	}
}
