package pins

import (
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

// TestLifeCycle has one case per pin life-cycle rule of SPEC s3.
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
