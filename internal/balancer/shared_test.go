package balancer

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/pins"
)

// outbox is a Sharer that keeps what it was given, for a test to deliver.
type outbox struct{ deltas []Delta }

func (o *outbox) Publish(d Delta) {
	d.Blocks = append([]uint64(nil), d.Blocks...)
	o.deltas = append(o.deltas, d)
}

// deliver applies everything a published to b at now and empties a.
func (o *outbox) deliver(b *Balancer, now time.Time) {
	for _, d := range o.deltas {
		b.Apply(d, now)
	}
	o.deltas = nil
}

func (o *outbox) kinds() (out []DeltaKind) {
	for _, d := range o.deltas {
		out = append(out, d.Kind)
	}
	return out
}

// TestSharedState checks each rule of docs/SHARED_STATE.md on two cores, A
// and B, over the same replicas: what A publishes, applied to B, makes B
// route as A would.
func TestSharedState(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"a session pinned by one instance routes the next turn there at the other", func(t *testing.T) {
			a, b := newFleet(t, 3, nil), newFleet(t, 3, nil)
			out := &outbox{}
			a.SetSharer(out)
			// A sees replica a busy, so its new session goes elsewhere; B
			// sees every replica idle and would rotate to a.
			a.ObserveScrape("a", Snapshot{Running: 2}, nil, t0)
			res, err := a.Select(&Profile{SessionKey: "s1"}, t0)
			if err != nil {
				t.Fatal(err)
			}
			if len(out.deltas) != 1 || out.deltas[0].Kind != DeltaPin || out.deltas[0].Replica != res.Replica ||
				out.deltas[0].URL != "http://"+res.Replica {
				t.Fatalf("published %+v, want one pin of s1 to %s", out.deltas, res.Replica)
			}
			out.deliver(b, t0.Add(100*time.Millisecond))
			if got := pinOf(b, "session", "s1", t0); got != res.Replica {
				t.Fatalf("B pins s1 to %q, want %s", got, res.Replica)
			}
			got, err := b.Select(&Profile{SessionKey: "s1"}, t0.Add(time.Second))
			if err != nil || got.Replica != res.Replica || got.Reason != ReasonAffinity {
				t.Fatalf("B routed s1 to %v (%v), want %s by affinity", got, err, res.Replica)
			}
		}},
		{"a pin used by a peer refreshes the local pin's idle TTL", func(t *testing.T) {
			a, b := newFleet(t, 2, nil), newFleet(t, 2, nil)
			out := &outbox{}
			b.SetSharer(out)
			res, _ := a.Select(&Profile{SessionKey: "s1"}, t0)
			b.Apply(Delta{Kind: DeltaPin, PinKind: pins.Session, Key: "s1", Replica: res.Replica}, t0)
			ttl := a.Config().Affinity.SessionTTL
			// B keeps using the pin; A hears of each use.
			for k := time.Duration(1); k <= 3; k++ {
				at := t0.Add(k * ttl / 2)
				got, err := b.Select(&Profile{SessionKey: "s1"}, at)
				if err != nil {
					t.Fatal(err)
				}
				b.Release(got, OutcomeOK, at)
				out.deliver(a, at)
			}
			if got := pinOf(a, "session", "s1", t0.Add(2*ttl)); got != res.Replica {
				t.Fatalf("A's pin after %v of use at B only: %q, want %s", 2*ttl, got, res.Replica)
			}
		}},
		{"a spill publishes nothing: spill counts are each instance's own", func(t *testing.T) {
			a := newFleet(t, 2, nil)
			out := &outbox{}
			a.SetSharer(out)
			res, _ := a.Select(&Profile{SessionKey: "s1"}, t0)
			a.Release(res, OutcomeOK, t0)
			out.deltas = nil
			a.ObserveScrape(res.Replica, Snapshot{Running: 1, Waiting: 1}, nil, t0.Add(time.Second))
			got, _ := a.Select(&Profile{SessionKey: "s1"}, t0.Add(2*time.Second))
			if !strings.HasPrefix(got.Explanation.PinDecision, "spill") {
				t.Fatalf("decision %q, want a spill", got.Explanation.PinDecision)
			}
			if len(out.deltas) != 0 {
				t.Fatalf("a spill published %+v", out.deltas)
			}
		}},
		{"a dropped prefix pin is dropped at the peer", func(t *testing.T) {
			a, b := newFleet(t, 2, nil), newFleet(t, 2, nil)
			out := &outbox{}
			a.SetSharer(out)
			res, _ := a.Select(&Profile{PrefixKey: "p"}, t0)
			out.deliver(b, t0)
			if pinOf(b, "prefix", "p", t0) != res.Replica {
				t.Fatal("B did not learn the prefix pin")
			}
			// The pinned replica gets a queue: two spills drop the pin.
			a.ObserveScrape(res.Replica, Snapshot{Running: 5, Waiting: 3}, nil, t0.Add(time.Second))
			a.Select(&Profile{PrefixKey: "p"}, t0.Add(2*time.Second))
			a.Select(&Profile{PrefixKey: "p"}, t0.Add(3*time.Second))
			if pinOf(a, "prefix", "p", t0.Add(3*time.Second)) == res.Replica {
				t.Fatal("A kept the prefix pin")
			}
			out.deliver(b, t0.Add(3*time.Second))
			if got := pinOf(b, "prefix", "p", t0.Add(3*time.Second)); got == res.Replica {
				t.Fatalf("B still pins p to %s", got)
			}
		}},
		{"blocks sent by one instance are warm at the other (cost)", func(t *testing.T) {
			a, b := costFleet(t, 4), costFleet(t, 4)
			out := &outbox{}
			a.SetSharer(out)
			p := costProfile("doc", 200, 0)
			res, _ := a.Select(p, t0)
			a.Release(res, OutcomeOK, t0)
			// One record when routed, one when it finished (its blocks' place
			// in the replica's LRU order is set then).
			if k := out.kinds(); len(k) != 2 || k[0] != DeltaBlocks || k[1] != DeltaBlocks ||
				len(out.deltas[0].Blocks) != 200 || len(out.deltas[1].Blocks) != 200 {
				t.Fatalf("published %v, want two blocks records of 200", k)
			}
			out.deliver(b, t0)
			got, _ := b.Select(costProfile("doc", 200, 10), t0.Add(time.Second))
			if got.Replica != res.Replica || got.Reason != ReasonAffinity || got.Explanation.CachedTokens == 0 {
				t.Fatalf("B routed the follow-up to %s (%s, %d cached), want %s warm", got.Replica, got.Reason,
					got.Explanation.CachedTokens, res.Replica)
			}
		}},
		{"a peer's in-flight requests raise the effective load until they expire", func(t *testing.T) {
			b := newFleet(t, 2, nil)
			exp := t0.Add(2 * time.Second)
			b.SetPeerLoad("peer-1", []ReplicaLoad{{Replica: "a", InFlight: 3, Weight: 3}}, exp, t0)
			st := statusOf(t, b, "a", t0)
			if st.EffectiveRunning != 3 || st.PeerInFlight != 3 || st.InFlight != 0 {
				t.Fatalf("a: effective %v, peer %d, own %d; want 3, 3, 0", st.EffectiveRunning, st.PeerInFlight, st.InFlight)
			}
			for range 2 { // least-loaded is b while the peer's load counts
				res, _ := b.Select(&Profile{}, t0.Add(time.Second))
				if res.Replica != "b" {
					t.Fatalf("routed to %s, want b (a carries the peer's 3)", res.Replica)
				}
				b.Release(res, OutcomeOK, t0.Add(time.Second))
			}
			// A peer's load is late: it counts as running, never as a queue
			// that would break a's pins.
			if st.EffectiveWaiting != 0 {
				t.Fatalf("a: effective waiting %v from a peer's load, want 0", st.EffectiveWaiting)
			}
			if st := statusOf(t, b, "a", exp); st.EffectiveRunning != 0 || st.PeerInFlight != 0 {
				t.Fatalf("after the TTL: effective %v, peer %d; want 0", st.EffectiveRunning, st.PeerInFlight)
			}
		}},
		{"a peer's load replaces its previous one; peers add up", func(t *testing.T) {
			b := newFleet(t, 2, nil)
			exp := t0.Add(time.Minute)
			b.SetPeerLoad("p1", []ReplicaLoad{{Replica: "a", InFlight: 3, Weight: 3}}, exp, t0)
			b.SetPeerLoad("p1", []ReplicaLoad{{Replica: "a", InFlight: 1, Weight: 1}}, exp, t0)
			b.SetPeerLoad("p2", []ReplicaLoad{{Replica: "a", InFlight: 2, Weight: 2.5}, {Replica: "zz", InFlight: 9}}, exp, t0)
			if st := statusOf(t, b, "a", t0); st.PeerInFlight != 3 || st.EffectiveRunning != 3.5 {
				t.Fatalf("a: peer %d, effective %v; want 3, 3.5", st.PeerInFlight, st.EffectiveRunning)
			}
		}},
		{"a hostile writer cannot make peers' loads count forever or grow without bound", func(t *testing.T) {
			b := newFleet(t, 2, nil)
			forever := t0.Add(1000 * time.Hour)
			for i := range maxPeers + 100 {
				b.SetPeerLoad(fmt.Sprintf("p%d", i), []ReplicaLoad{{Replica: "a", InFlight: 1, Weight: 1}}, forever, t0)
			}
			if n := len(b.peers); n != maxPeers {
				t.Fatalf("%d peers held, want at most %d", n, maxPeers)
			}
			if st := statusOf(t, b, "a", t0); st.PeerInFlight != maxPeers {
				t.Fatalf("a: peer in flight %d, want %d", st.PeerInFlight, maxPeers)
			}
			// A claimed TTL of 1,000 hours counts for maxPeerLoadTTL only.
			if st := statusOf(t, b, "a", t0.Add(maxPeerLoadTTL)); st.PeerInFlight != 0 {
				t.Fatalf("after %v: peer in flight %d, want 0", maxPeerLoadTTL, st.PeerInFlight)
			}
			// Expired peers make room for new ones.
			b.SetPeerLoad("late", []ReplicaLoad{{Replica: "a", InFlight: 2, Weight: 2}}, forever, t0.Add(2*maxPeerLoadTTL))
			if st := statusOf(t, b, "a", t0.Add(2*maxPeerLoadTTL)); st.PeerInFlight != 2 {
				t.Fatalf("a new peer after the others expired: peer in flight %d, want 2", st.PeerInFlight)
			}
		}},
		{"replicas match by URL when names differ; unknown ones are ignored", func(t *testing.T) {
			b := newFleet(t, 2, nil)
			if !b.Apply(Delta{Kind: DeltaPin, PinKind: pins.Session, Key: "s", Replica: "other-name", URL: "http://b"}, t0) {
				t.Fatal("a pin to b's URL was not applied")
			}
			if got := pinOf(b, "session", "s", t0); got != "b" {
				t.Fatalf("pinned to %q, want b", got)
			}
			if b.Apply(Delta{Kind: DeltaPin, PinKind: pins.Session, Key: "t", Replica: "nobody", URL: "http://nowhere"}, t0) {
				t.Fatal("a pin to an unknown replica was applied")
			}
			if b.Apply(Delta{Kind: DeltaBlocks, Replica: "a", Blocks: []uint64{1, 2}}, t0) {
				t.Fatal("blocks applied to a policy without a block index")
			}
		}},
		{"a fallback publishes nothing", func(t *testing.T) {
			b := newFleet(t, 1, nil)
			out := &outbox{}
			b.SetSharer(out)
			play(t, b, []ev{{at: 0, op: "fail", r: "a"}, {at: 0, op: "alive", r: "a"}})
			res, err := b.Select(&Profile{SessionKey: "s"}, t0)
			if err != nil || res.Reason != ReasonFallback {
				t.Fatalf("got %v, %v; want a fallback", res, err)
			}
			if len(out.deltas) != 0 {
				t.Fatalf("published %v", out.kinds())
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, tc.run)
	}
}

// discard is a Sharer that does what the Redis client's Publish does on the
// routing path (copy the blocks, a non-blocking send) and drops the rest.
type discard struct{ ch chan Delta }

func (d discard) Publish(x Delta) {
	if len(x.Blocks) > 0 {
		x.Blocks = append([]uint64(nil), x.Blocks...)
	}
	select {
	case d.ch <- x:
	default:
	}
}

// BenchmarkSelectReleaseShared is Select + Release with and without a
// Sharer on 4 replicas: the cost of publishing on the routing path (pins
// looked up before and after, a Delta built, the blocks copied for cost).
func BenchmarkSelectReleaseShared(b *testing.B) {
	for _, pol := range []string{"llmlb", "cost"} {
		for _, shared := range []bool{false, true} {
			b.Run(fmt.Sprintf("policy=%s/shared=%v", pol, shared), func(b *testing.B) {
				bal := newFleet(b, 4, func(c *Config) { c.Policy = pol })
				if shared {
					bal.SetSharer(discard{make(chan Delta)})
				}
				profiles := make([]*Profile, 1000)
				for i := range profiles {
					profiles[i] = costProfile(fmt.Sprint("doc", i%50), 200, 20)
					profiles[i].SessionKey = fmt.Sprint("session-", i)
				}
				now := t0.Add(time.Second)
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					res, err := bal.Select(profiles[i%len(profiles)], now)
					if err != nil {
						b.Fatal(err)
					}
					bal.Release(res, OutcomeOK, now)
				}
			})
		}
	}
}
