package sharedstate

import (
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/pins"
)

// fakeCore records what the bus delivers.
type fakeCore struct {
	applied []balancer.Delta
	peers   map[string][]balancer.ReplicaLoad
	expires map[string]time.Time
	load    []balancer.ReplicaLoad
}

func (f *fakeCore) Apply(d balancer.Delta, _ time.Time) bool {
	f.applied = append(f.applied, d)
	return true
}

func (f *fakeCore) SetPeerLoad(peer string, loads []balancer.ReplicaLoad, expires, _ time.Time) {
	if f.peers == nil {
		f.peers, f.expires = map[string][]balancer.ReplicaLoad{}, map[string]time.Time{}
	}
	f.peers[peer], f.expires[peer] = loads, expires
}

func (f *fakeCore) Load() []balancer.ReplicaLoad { return f.load }

func TestBusDeliversAfterTheDelayToTheOthers(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a, b, c := &fakeCore{load: []balancer.ReplicaLoad{{Replica: "r1", InFlight: 2, Weight: 2}}}, &fakeCore{}, &fakeCore{}
	bus := NewBus(50*time.Millisecond, 2*time.Second, a, b, c)
	blocks := []uint64{1, 2, 3}
	bus.Member(0).Publish(balancer.Delta{Kind: balancer.DeltaPin, At: t0, PinKind: pins.Session, Key: "s", Replica: "r1"})
	bus.Member(0).Publish(balancer.Delta{Kind: balancer.DeltaBlocks, At: t0.Add(time.Millisecond), Replica: "r1", Blocks: blocks})
	blocks[0] = 99 // the bus keeps its own copy
	bus.PublishLoad(0, t0.Add(2*time.Millisecond))

	if next, ok := bus.Next(); !ok || !next.Equal(t0.Add(50*time.Millisecond)) {
		t.Fatalf("next delivery %v %v, want t0+50ms", next, ok)
	}
	if n := bus.Deliver(t0.Add(49 * time.Millisecond)); n != 0 {
		t.Fatalf("delivered %d before the delay", n)
	}
	if n := bus.Deliver(t0.Add(51 * time.Millisecond)); n != 2 {
		t.Fatalf("delivered %d at +51ms, want the pin and the blocks", n)
	}
	for _, core := range []*fakeCore{b, c} {
		if len(core.applied) != 2 || core.applied[0].Key != "s" || core.applied[1].Blocks[0] != 1 {
			t.Fatalf("applied %+v", core.applied)
		}
	}
	if len(a.applied) != 0 {
		t.Fatal("the sender got its own change back")
	}
	bus.Deliver(t0.Add(time.Second))
	if got := b.peers["balancer-1"]; len(got) != 1 || got[0].InFlight != 2 || !b.expires["balancer-1"].Equal(t0.Add(2*time.Second+2*time.Millisecond)) {
		t.Fatalf("load at b: %+v until %v", got, b.expires["balancer-1"])
	}
	if _, ok := bus.Next(); ok {
		t.Fatal("messages left after delivering all")
	}
}
