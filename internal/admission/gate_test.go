package admission

import (
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/flowcontrol"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// fleet returns a balancer over replicas a and b serving model m, each seen
// running 2 with 1 waiting on three scrapes: their limit is learned as 2, and
// with a request waiting in each engine they are full.
func fleet(t *testing.T) *balancer.Balancer {
	t.Helper()
	b, err := balancer.New(balancer.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b"} {
		if err := b.AddReplica(balancer.ReplicaSpec{Name: name, URL: "http://" + name, Models: []string{"m"}}, t0); err != nil {
			t.Fatal(err)
		}
		b.ObserveScrape(name, balancer.Snapshot{Running: 2, Waiting: 1}, nil, t0)
		b.ObserveScrape(name, balancer.Snapshot{Running: 2, Waiting: 1}, nil, t0.Add(time.Second))
		b.ObserveScrape(name, balancer.Snapshot{Running: 2, Waiting: 1}, nil, t0.Add(2*time.Second))
	}
	return b
}

func TestGateHoldsAtSaturationAndDispatchesLate(t *testing.T) {
	b := fleet(t)
	if !b.Saturated("m", t0) {
		t.Fatal("a pool of full replicas is not saturated")
	}
	g := New(b, flowcontrol.DefaultConfig())
	now := t0.Add(2 * time.Second)
	reqs := []*Request{
		{ID: 1, Profile: &balancer.Profile{Model: "m", PromptTokens: 100}, Tenant: "x"},
		{ID: 2, Profile: &balancer.Profile{Model: "m", PromptTokens: 100}, Tenant: "x", Priority: 5},
		{ID: 3, Profile: &balancer.Profile{Model: "m", PromptTokens: 100}, Tenant: "y", Priority: -1},
	}
	for i, r := range reqs {
		d, err := g.Admit(r, now)
		if err != nil {
			t.Fatal(err)
		}
		want := flowcontrol.Queued
		if i == 2 {
			want = flowcontrol.Refused // sheddable at saturation
		}
		if d.Outcome != want {
			t.Fatalf("request %d: %v, want %v", r.ID, d.Outcome, want)
		}
	}
	if got := g.Pump(now); len(got) != 0 {
		t.Fatalf("pumped %d with every replica full", len(got))
	}
	// b's scrape shows its queue gone and a slot free: room for one.
	later := now.Add(300 * time.Millisecond)
	b.ObserveScrape("b", balancer.Snapshot{Running: 1}, nil, later)
	got := g.Pump(later)
	if len(got) != 1 || got[0].Request.ID != 2 || got[0].Err != nil || got[0].Res.Replica != "b" {
		t.Fatalf("pump = %+v, want the priority-5 request on b", got)
	}
	if got[0].Waited != 300*time.Millisecond {
		t.Errorf("waited %v, want 300ms", got[0].Waited)
	}
	if len(g.Pump(later)) != 0 {
		t.Fatal("b took a second request beyond its room")
	}
	// The other waiter's client goes away: it leaves at once.
	if !g.Remove(reqs[0]) || g.Len() != 0 {
		t.Fatalf("Remove failed or %d still waiting", g.Len())
	}
	b.Release(got[0].Res, balancer.OutcomeOK, later)
	g.Done(got[0].Request, later)
}

func TestGateUnsaturatedDispatchesAtOnce(t *testing.T) {
	b, err := balancer.New(balancer.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := b.AddReplica(balancer.ReplicaSpec{Name: "a", URL: "http://a"}, t0); err != nil {
		t.Fatal(err)
	}
	b.ObserveScrape("a", balancer.Snapshot{Running: 40}, nil, t0) // limit not known: never full
	g := New(b, flowcontrol.DefaultConfig())
	for i := range 100 {
		d, err := g.Admit(&Request{ID: uint64(i), Profile: &balancer.Profile{Model: "m"}, Priority: -1}, t0)
		if err != nil || d.Outcome != flowcontrol.Dispatch {
			t.Fatalf("request %d: %v %v, want dispatch", i, d, err)
		}
	}
}

func TestGateExpiresAndDrains(t *testing.T) {
	b := fleet(t)
	cfg := flowcontrol.DefaultConfig()
	cfg.MaxQueueTime = time.Second
	g := New(b, cfg)
	for i := range 3 {
		if d, _ := g.Admit(&Request{ID: uint64(i), Profile: &balancer.Profile{Model: "m"}}, t0.Add(time.Duration(i)*time.Second)); d.Outcome != flowcontrol.Queued {
			t.Fatalf("request %d: %v", i, d.Outcome)
		}
	}
	if at, ok := g.NextExpiry(); !ok || !at.Equal(t0.Add(time.Second)) {
		t.Fatalf("next expiry %v %v, want the first request's, at +1s", at, ok)
	}
	if got := g.Expire(t0.Add(2 * time.Second)); len(got) != 2 {
		t.Fatalf("expired %d, want the 2 that waited 1s", len(got))
	}
	if got := g.Drain(); len(got) != 1 || g.Len() != 0 {
		t.Fatalf("drained %d, %d left", len(got), g.Len())
	}
	if _, ok := g.NextExpiry(); ok {
		t.Fatal("an empty gate has a next expiry")
	}
}

func TestGateBoundsQueuesByModel(t *testing.T) {
	b, err := balancer.New(balancer.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := b.AddReplica(balancer.ReplicaSpec{Name: "a", URL: "http://a"}, t0); err != nil { // serves any model
		t.Fatal(err)
	}
	g := New(b, flowcontrol.DefaultConfig())
	for i := range maxQueues + 50 {
		g.Admit(&Request{ID: uint64(i), Profile: &balancer.Profile{Model: string(rune('a'+i%26)) + string(rune(i))}}, t0)
	}
	if n := len(g.Stats(t0)); n > maxQueues {
		t.Fatalf("%d queues, want at most %d", n, maxQueues)
	}
}

// A request's enqueue time is written before its queue holds it, so the
// goroutine that takes it out (Pump, Expire, Drain) reads it without a race
// (run with -race).
func TestGateEnqueuedReadsAcrossGoroutines(t *testing.T) {
	g := New(fleet(t), flowcontrol.DefaultConfig())
	now := t0.Add(2 * time.Second)
	const n = 50
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if d, err := g.Admit(&Request{ID: uint64(i), Profile: &balancer.Profile{Model: "m"}}, now); err != nil || d.Outcome != flowcontrol.Queued {
				t.Errorf("request %d: %v %v", i, d.Outcome, err)
			}
		}()
	}
	for drained := 0; drained < n; {
		for _, r := range g.Drain() {
			if !r.Enqueued().Equal(now) {
				t.Errorf("request %d enqueued at %v", r.ID, r.Enqueued())
			}
			drained++
		}
	}
	wg.Wait()
}

// TestGateDispatchHonoursExclude: a held request is dispatched only to a
// replica it allows (Request.Exclude, epp's gateway subset), even when the
// replica that freed is one it excludes.
func TestGateDispatchHonoursExclude(t *testing.T) {
	b := fleet(t)
	g := New(b, flowcontrol.DefaultConfig())
	now := t0.Add(2 * time.Second)
	r := &Request{ID: 1, Profile: &balancer.Profile{Model: "m"}, Exclude: []string{"b"}}
	if d, _ := g.Admit(r, now); d.Outcome != flowcontrol.Queued {
		t.Fatalf("%v, want queued", d.Outcome)
	}
	b.ObserveScrape("b", balancer.Snapshot{Running: 1}, nil, now) // b has room, a none
	got := g.Pump(now)
	if len(got) != 1 || got[0].Err != nil || got[0].Res.Replica != "a" {
		t.Fatalf("pump = %+v, want the request on a (b is excluded)", got)
	}
	b.Release(got[0].Res, balancer.OutcomeOK, now)
	g.Done(r, now)
}

// TestGateDoesNotEmptyTheQueueIntoAJoiningReplica: a replica that joins a
// saturated pool (autoscaling) has no limit of its own yet; held requests
// go to it up to the largest limit another replica has (2 here), not all
// at once, and more as its scrapes show it running them with none
// waiting (twice what it ran).
func TestGateDoesNotEmptyTheQueueIntoAJoiningReplica(t *testing.T) {
	b := fleet(t)
	g := New(b, flowcontrol.DefaultConfig())
	now := t0.Add(2 * time.Second)
	for i := range 50 {
		if _, err := g.Admit(&Request{ID: uint64(i + 1), Profile: &balancer.Profile{Model: "m", PromptTokens: 100}, Tenant: "x"}, now); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.AddReplica(balancer.ReplicaSpec{Name: "c", URL: "http://c", Models: []string{"m"}}, now); err != nil {
		t.Fatal(err)
	}
	b.ObserveScrape("c", balancer.Snapshot{}, nil, now)
	pumped := func(want int) {
		t.Helper()
		got := g.Pump(now)
		for _, tk := range got {
			if tk.Err != nil || tk.Res.Replica != "c" {
				t.Fatalf("a held request went to %v (err %v), want c", tk.Res, tk.Err)
			}
		}
		if len(got) != want {
			t.Fatalf("pumped %d into the joining replica, want %d", len(got), want)
		}
	}
	pumped(2)
	now = now.Add(time.Second)
	b.ObserveScrape("c", balancer.Snapshot{Running: 2}, nil, now)
	pumped(2) // it ran 2 with none waiting: room up to 4
}

// reserveFleet returns a balancer over replicas a and b serving model m,
// each with a running limit of 4 of which 1 is kept in reserve.
func reserveFleet(t *testing.T) *balancer.Balancer {
	t.Helper()
	cfg := balancer.DefaultConfig()
	cfg.Saturation.MaxRunning, cfg.Saturation.ReserveShare = 4, 0.25
	b, err := balancer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b"} {
		if err := b.AddReplica(balancer.ReplicaSpec{Name: name, URL: "http://" + name, Models: []string{"m"}}, t0); err != nil {
			t.Fatal(err)
		}
		b.ObserveScrape(name, balancer.Snapshot{}, nil, t0)
	}
	return b
}

// A tenant over its share fills the replicas only up to the reserve; a
// request of another tenant arriving then takes a reserved slot at once,
// past the flood's held requests.
func TestGateKeepsAReserveForTenantsBelowTheirShare(t *testing.T) {
	b := reserveFleet(t)
	g := New(b, flowcontrol.DefaultConfig())
	admit := func(id uint64, tenant string) flowcontrol.Outcome {
		t.Helper()
		r := &Request{ID: id, Profile: &balancer.Profile{Model: "m", PromptTokens: 100}, Tenant: tenant}
		return admitAndRoute(t, g, b, r)
	}
	if got := admit(1, "polite"); got != flowcontrol.Dispatch {
		t.Fatalf("first polite request: %v", got)
	}
	// The flood gets 5 of the 6 slots outside the reserve, then waits.
	var outcomes []flowcontrol.Outcome
	for id := uint64(2); id <= 8; id++ {
		outcomes = append(outcomes, admit(id, "flood"))
	}
	want := []flowcontrol.Outcome{flowcontrol.Dispatch, flowcontrol.Dispatch, flowcontrol.Dispatch, flowcontrol.Dispatch,
		flowcontrol.Dispatch, flowcontrol.Queued, flowcontrol.Queued}
	if diff := cmp.Diff(want, outcomes); diff != "" {
		t.Fatalf("flood outcomes (-want +got):\n%s", diff)
	}
	if got := g.Pump(t0); len(got) != 0 {
		t.Fatalf("pumped %d flood requests into the reserve", len(got))
	}
	// The polite tenant's next two take the reserve at once; its third
	// waits like the rest.
	for id, want := range map[uint64]flowcontrol.Outcome{9: flowcontrol.Dispatch, 10: flowcontrol.Dispatch} {
		if got := admit(id, "polite"); got != want {
			t.Fatalf("polite request %d: %v, want %v", id, got, want)
		}
	}
	if got := admit(11, "polite"); got != flowcontrol.Queued {
		t.Fatalf("polite request with the pool full: %v", got)
	}
	if !b.Saturated("m", t0) {
		t.Fatal("every slot taken, but the pool is not saturated")
	}
}

// admitAndRoute admits r at t0 and, if the gate dispatches it at once,
// routes it as the shell would (Select), so that it holds its replica.
func admitAndRoute(t *testing.T, g *Gate, b *balancer.Balancer, r *Request) flowcontrol.Outcome {
	t.Helper()
	d, err := g.Admit(r, t0)
	if err != nil {
		t.Fatal(err)
	}
	if d.Outcome == flowcontrol.Dispatch {
		if _, err := b.Select(r.Profile, t0); err != nil {
			t.Fatal(err)
		}
	}
	return d.Outcome
}

// With one tenant the reserve is never held back.
func TestGateOneTenantUsesTheWholeLimit(t *testing.T) {
	b := reserveFleet(t)
	g := New(b, flowcontrol.DefaultConfig())
	for id := uint64(1); id <= 8; id++ {
		r := &Request{ID: id, Profile: &balancer.Profile{Model: "m", PromptTokens: 100}, Tenant: "only"}
		d, err := g.Admit(r, t0)
		if err != nil || d.Outcome != flowcontrol.Dispatch {
			t.Fatalf("request %d: %v, %v; want every slot of the limits used", id, d.Outcome, err)
		}
		if _, err := b.Select(r.Profile, t0); err != nil {
			t.Fatal(err)
		}
	}
	if !b.Saturated("m", t0) {
		t.Fatal("8 of 8 slots taken, but the pool is not saturated")
	}
}

// While a higher priority has requests outstanding, lower ones fill the
// replicas only up to the reserve, which the higher one takes at once.
func TestGateKeepsTheReserveForAHigherPriority(t *testing.T) {
	b := reserveFleet(t)
	g := New(b, flowcontrol.DefaultConfig())
	admit := func(id uint64, prio int) flowcontrol.Outcome {
		t.Helper()
		r := &Request{ID: id, Profile: &balancer.Profile{Model: "m", PromptTokens: 100}, Tenant: "one", Priority: prio}
		return admitAndRoute(t, g, b, r)
	}
	if got := admit(1, 1); got != flowcontrol.Dispatch {
		t.Fatalf("first high request: %v", got)
	}
	var outcomes []flowcontrol.Outcome
	for id := uint64(2); id <= 7; id++ {
		outcomes = append(outcomes, admit(id, 0))
	}
	want := []flowcontrol.Outcome{flowcontrol.Dispatch, flowcontrol.Dispatch, flowcontrol.Dispatch, flowcontrol.Dispatch,
		flowcontrol.Dispatch, flowcontrol.Queued}
	if diff := cmp.Diff(want, outcomes); diff != "" {
		t.Fatalf("default-priority outcomes (-want +got):\n%s", diff)
	}
	for _, id := range []uint64{8, 9} {
		if got := admit(id, 1); got != flowcontrol.Dispatch {
			t.Fatalf("high request %d with the reserve free: %v", id, got)
		}
	}
	if got := admit(10, 1); got != flowcontrol.Queued {
		t.Fatalf("high request with every slot taken: %v", got)
	}
}

// blocks returns n distinct block hashes starting at from: a prompt of n x
// 16 tokens whose prefix no other prompt of the test shares.
func blocks(from uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = from + uint64(i)
	}
	return out
}

// conversation is a saturated pool of replicas a and b (one slot each) for
// the locality tests: a conversation's first turn runs on one (its
// holder), another conversation's request on the other; then that
// conversation's second turn (its first turn's prompt and more) and a new
// conversation's first request are held, in that order, by a gate with
// first come, first served order and the given locality scan.
type conversation struct {
	b            *balancer.Balancer
	g            *Gate
	cfg          flowcontrol.Config
	first, other *balancer.Reservation
	turn2, fresh *Request
}

func newConversation(t *testing.T, scan int) *conversation {
	t.Helper()
	cfg := balancer.DefaultConfig()
	cfg.Saturation.MaxRunning = 1
	b, err := balancer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b"} {
		if err := b.AddReplica(balancer.ReplicaSpec{Name: name, URL: "http://" + name, Models: []string{"m"}}, t0); err != nil {
			t.Fatal(err)
		}
	}
	c := &conversation{b: b}
	if c.first, err = b.Select(&balancer.Profile{Model: "m", PromptTokens: 64 * 16, PromptBlocks: blocks(1000, 64)}, t0); err != nil {
		t.Fatal(err)
	}
	c.other, err = b.Select(&balancer.Profile{Model: "m", PromptTokens: 64 * 16, PromptBlocks: blocks(5000, 64)}, t0)
	if err != nil || c.other.Replica == c.first.Replica {
		t.Fatalf("second request on %v (err %v), want the replica other than %s", c.other, err, c.first.Replica)
	}
	if !b.Saturated("m", t0) {
		t.Fatal("two full replicas are not a saturated pool")
	}
	c.cfg = flowcontrol.DefaultConfig()
	c.cfg.LIFOAfter = 0 // first come, first served: the second turn's is the turn
	c.cfg.LocalityScan = scan
	c.g = New(b, c.cfg)
	c.turn2 = &Request{ID: 1, Profile: &balancer.Profile{Model: "m", PromptTokens: 80 * 16, PromptBlocks: append(blocks(1000, 64), blocks(2000, 16)...)}}
	c.fresh = &Request{ID: 2, Profile: &balancer.Profile{Model: "m", PromptTokens: 64 * 16, PromptBlocks: blocks(9000, 64)}}
	for _, r := range []*Request{c.turn2, c.fresh} {
		if d, _ := c.g.Admit(r, t0); d.Outcome != flowcontrol.Queued {
			t.Fatalf("request %d: %v, want queued", r.ID, d.Outcome)
		}
	}
	return c
}

// TestGatePrefersAHeldRequestWhoseCacheHasRoom: when a slot frees on a
// replica that does not hold the context of the request whose turn it is,
// and the replica that does is full, the slot goes to the next request of
// the same flow that loses nothing there (delay scheduling); the passed-over
// request goes to its own replica once that one has room, or anywhere once
// it has waited locality_wait.
func TestGatePrefersAHeldRequestWhoseCacheHasRoom(t *testing.T) {
	for _, waited := range []bool{false, true} {
		c := newConversation(t, 16)
		now := t0.Add(time.Second)
		if waited {
			now = t0.Add(c.cfg.LocalityWait)
		}
		c.b.Release(c.other, balancer.OutcomeOK, now) // a slot frees where turn2's context is not
		got := c.g.Pump(now)
		want := c.fresh
		if waited {
			want = c.turn2 // it has waited locality_wait: it goes where the slot is
		}
		if len(got) != 1 || got[0].Err != nil || got[0].Request != want || got[0].Res.Replica != c.other.Replica {
			t.Fatalf("waited %v: pump = %+v, want request %d on %s", waited, got, want.ID, c.other.Replica)
		}
		if waited {
			continue
		}
		c.b.Release(c.first, balancer.OutcomeOK, now) // now its holder has room
		got = c.g.Pump(now)
		if len(got) != 1 || got[0].Request != c.turn2 || got[0].Res.Replica != c.first.Replica {
			t.Fatalf("pump = %+v, want the second turn on its holder %s", got, c.first.Replica)
		}
	}
}

// TestGateTakesHeldRequestsInTurnWithoutLocality: locality_scan 0 (the
// default) keeps a flow's order whatever the caches hold.
func TestGateTakesHeldRequestsInTurnWithoutLocality(t *testing.T) {
	c := newConversation(t, 0)
	c.b.Release(c.other, balancer.OutcomeOK, t0)
	if got := c.g.Pump(t0); len(got) != 1 || got[0].Request != c.turn2 {
		t.Fatalf("pump = %+v, want the second turn (first in turn)", got)
	}
}

// TestGateKeepsKVForAHigherPriority: on a replica bound by its KV cache
// (30,000 tokens, no slot limit), while a higher priority has requests
// outstanding a lower one is held once the prompts sent there commit two
// thirds of the cache (saturation.kv_reserve_share): the rest is kept for
// the higher priority, whose requests start at once until the whole cache
// is committed.
func TestGateKeepsKVForAHigherPriority(t *testing.T) {
	cfg := balancer.DefaultConfig()
	cfg.Saturation.LowerPrefillBacklog = -1 // the prompts' prefill owed would hold them too
	b, err := balancer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.AddReplica(balancer.ReplicaSpec{Name: "a", URL: "http://a", Models: []string{"m"}}, t0); err != nil {
		t.Fatal(err)
	}
	b.ObserveScrape("a", balancer.Snapshot{KVCacheTokens: 30_000}, nil, t0)
	g := New(b, flowcontrol.DefaultConfig())
	next := uint64(0)
	admit := func(prio int) flowcontrol.Outcome {
		t.Helper()
		next++ // each prompt 5,000 tokens no other shares
		r := &Request{ID: next, Profile: &balancer.Profile{Model: "m", PromptTokens: 5_000, PromptBlocks: blocks(next*1000, 5_000/16)},
			Tenant: "one", Priority: prio}
		return admitAndRoute(t, g, b, r)
	}
	got := []flowcontrol.Outcome{admit(1)}
	for range 4 {
		got = append(got, admit(0))
	}
	for range 3 {
		got = append(got, admit(1))
	}
	D, Q := flowcontrol.Dispatch, flowcontrol.Queued
	want := []flowcontrol.Outcome{D, D, D, D, Q, D, D, Q} // 5K, 10K, 15K, 20K of 30K: held; 25K, 30K: full
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("outcomes (-want +got):\n%s", diff)
	}
}

// TestStandingKeepsTheMemoryReserveFromLowerPrioritiesOnly: a request a
// higher priority outranks may take no reserve; a tenant over its share
// keeps only the slots' reserve from others (not memory or prefill time);
// a favoured request takes every reserve.
func TestStandingKeepsTheMemoryReserveFromLowerPrioritiesOnly(t *testing.T) {
	for _, tc := range []struct {
		rank flowcontrol.Rank
		want balancer.Standing
	}{
		{flowcontrol.Rank{Favoured: true}, balancer.Favoured},
		{flowcontrol.Rank{Favoured: true, Contested: true}, balancer.Favoured},
		{flowcontrol.Rank{Contested: true}, balancer.OverShare},
		{flowcontrol.Rank{Outranked: true, Contested: true}, balancer.Outranked},
	} {
		if got := standing(tc.rank); got != tc.want {
			t.Errorf("standing(%+v) = %d, want %d", tc.rank, got, tc.want)
		}
	}
}
