package balancer

import (
	"math"
	"strings"
	"testing"
	"time"
)

// TestSaturationLearnsTheRunningLimit: a replica's running-slot limit is
// the number running, unchanged over three scrapes in a row while requests
// wait (an engine at its slot limit runs exactly that many; one waiting on
// its KV cache or prefill budget runs a number that moves, and a burst
// passes), it rises when more run with none waiting or a higher plateau
// shows (the probe below lets it show); it is never lowered, and a
// configured limit wins.
func TestSaturationLearnsTheRunningLimit(t *testing.T) {
	b := newFleet(t, 1, nil)
	s := 0
	scrape := func(running, waiting float64) {
		s++
		b.ObserveScrape("a", Snapshot{Running: running, Waiting: waiting}, nil, t0.Add(time.Duration(s)*time.Second))
	}
	limit := func() float64 { return b.Replicas(t0)[0].MaxRunning }

	for _, step := range []struct {
		name             string
		running, waiting float64
		want             float64
	}{
		{"a request caught between two steps", 3, 1, 0},
		{"none waiting", 0, 0, 0},
		{"a moving count while requests wait (KV or prefill budget)", 4, 2, 0},
		{"still moving", 5, 2, 0},
		{"moving again", 4, 3, 0},
		{"4 twice in a row", 4, 1, 0},
		{"4 three times in a row: the plateau", 4, 5, 4},
		{"more ran with none waiting", 6, 0, 6},
		{"a lower plateau (full KV cache), 1", 3, 4, 6},
		{"a lower plateau, 2", 3, 4, 6},
		{"a lower plateau, 3: not below what ran free", 3, 4, 6},
		{"a higher plateau, 1", 9, 2, 6},
		{"a higher plateau, 2", 9, 2, 6},
		{"a higher plateau, 3", 9, 2, 9},
		{"a plateau of 7, 1", 7, 5, 9},
		{"a plateau of 7, 2", 7, 5, 9},
		{"a plateau of 7, 3: the high-water mark stays", 7, 5, 9},
		{"one more than the limit ran with none waiting", 10, 0, 10},
		{"fewer run with none waiting: the limit stays", 5, 0, 10},
	} {
		scrape(step.running, step.waiting)
		if got := limit(); got != step.want {
			t.Fatalf("%s (running %v, waiting %v): limit %v, want %v", step.name, step.running, step.waiting, got, step.want)
		}
	}

	cfg := b.Config()
	cfg.Saturation.MaxRunning = 16
	if err := b.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	if limit() != 16 {
		t.Fatalf("limit %v with saturation.max_running 16", limit())
	}
}

// TestSaturationCountsOwnSendsSinceTheScrape: a replica fills with what
// the balancer sends between two scrapes, and empties as those requests
// end; the pool is saturated only when every replica is full, and Dispatch
// offers the policy only the replicas with room.
func TestSaturationCountsOwnSendsSinceTheScrape(t *testing.T) {
	b := newFleet(t, 2, func(c *Config) { c.Saturation.MaxRunning, c.Saturation.Headroom = 2, 1 }) // full at 2 + 1 headroom
	if b.Saturated("", t0) {
		t.Fatal("an idle pool is saturated")
	}
	held := selectN(t, b, 5, t0)
	if b.Saturated("", t0) {
		t.Fatal("saturated with 5 in flight on two replicas of 3 each")
	}
	res, err := b.Select(&Profile{}, t0)
	if err != nil {
		t.Fatal(err)
	}
	held = append(held, res)
	if !b.Saturated("", t0) {
		t.Fatal("not saturated with 3 in flight on each replica")
	}
	b.Release(held[0], OutcomeOK, t0)
	if b.Saturated("", t0) {
		t.Fatal("still saturated after a request ended")
	}
	freed := held[0].Replica
	for range 4 { // Select's policy may pick any; Dispatch only the one with room
		d, _, err := b.Dispatch(&Profile{}, t0, Favoured)
		if err != nil {
			t.Fatal(err)
		}
		if d.Replica != freed {
			t.Fatalf("Dispatch chose full %s, want %s", d.Replica, freed)
		}
		b.Release(d, OutcomeOK, t0)
	}
}

// TestSaturationFromTheEngineQueue: a replica whose last scrape showed
// requests waiting for memory in its own queue (its KV cache at least
// SaturationConfig.KVFullUsage used; below, they wait for a step's token budget and start
// as prefills progress) is full, whatever its limit, until as
// many of the requests it holds have ended as waited then (plus the
// headroom); one that has queued so and has no limit learned yet is full at
// twice the most it ran with none waiting, so a held pool fills it by
// doublings rather than all at once.
func TestSaturationFromTheEngineQueue(t *testing.T) {
	for _, headroom := range []int{0, 1} {
		b := newFleet(t, 1, func(c *Config) { c.Saturation.Headroom = headroom })
		full := func() bool { return b.Replicas(t0)[0].Full }
		held := selectN(t, b, 5, t0)
		if full() {
			t.Fatalf("headroom %d: full with no limit and nothing waiting", headroom)
		}
		// Of the 5 sent, 3 run and 2 wait in the engine's queue, with
		// the KV cache below SaturationConfig.KVFullUsage: they wait for a step's token
		// budget, and start as prefills progress.
		b.ObserveScrape("a", Snapshot{Running: 3, Waiting: 2, KVCacheUsage: 0.5}, nil, t0.Add(time.Second))
		if full() {
			t.Fatalf("headroom %d: full with requests waiting for the token budget", headroom)
		}
		// The same with the KV cache full: they wait for memory.
		b.ObserveScrape("a", Snapshot{Running: 3, Waiting: 2, KVCacheUsage: 0.95}, nil, t0.Add(time.Second))
		// Full until 3 - headroom of them end: each end lets one of the
		// 2 waiting start, and the third frees a slot (headroom 0) or
		// leaves room for one to wait (headroom 1).
		ends := 3 - headroom
		for i := range ends {
			if !full() {
				t.Fatalf("headroom %d: room after %d of %d ends", headroom, i, ends)
			}
			b.Release(held[i], OutcomeOK, t0.Add(time.Second))
		}
		if full() {
			t.Fatalf("headroom %d: full with the engine's queue below the headroom", headroom)
		}
		// It has queued: with none waiting now and the most it ran
		// with none waiting, r, its limit is 2r until one is learned.
		held = held[ends:]
		r := len(held)
		b.ObserveScrape("a", Snapshot{Running: float64(r)}, nil, t0.Add(2*time.Second))
		for len(held) < 2*r+headroom {
			if full() {
				t.Fatalf("headroom %d: full holding %d, want room below %d", headroom, len(held), 2*r+headroom)
			}
			res, err := b.Select(&Profile{}, t0.Add(2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, res)
		}
		if !full() {
			t.Fatalf("headroom %d: room holding %d, twice the %d it ran free plus the headroom", headroom, len(held), r)
		}
	}
}

// TestSaturationProbesPastTheLimit: after three scrapes that show a replica
// running its limit with none waiting, one request more than the limit may
// be sent, until a scrape shows otherwise.
func TestSaturationProbesPastTheLimit(t *testing.T) {
	b := newFleet(t, 1, nil)
	for i := range 3 { // a plateau of 2 with requests waiting: limit 2
		b.ObserveScrape("a", Snapshot{Running: 2, Waiting: 1}, nil, t0.Add(time.Duration(i)*time.Second))
	}
	full := func() bool { return b.Replicas(t0)[0].Full }
	send := func() *Reservation {
		res, err := b.Select(&Profile{}, t0)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	// It drained: nothing held, none waiting, running 0.
	b.ObserveScrape("a", Snapshot{}, nil, t0.Add(3*time.Second))
	send()
	send()
	if !full() {
		t.Fatal("room at the limit of 2 with no probe")
	}
	// Three scrapes show the 2 running and none waiting: one more may go.
	for i := range 3 {
		if !full() {
			t.Fatalf("a probe after %d scrapes at the limit, want 3", i)
		}
		b.ObserveScrape("a", Snapshot{Running: 2}, nil, t0.Add(time.Duration(4+i)*time.Second))
	}
	if full() {
		t.Fatal("no probe after the limit ran with none waiting")
	}
	send()
	if !full() {
		t.Fatal("room past the probe")
	}
	// The probe waited in the engine's queue: the limit holds, no probe.
	b.ObserveScrape("a", Snapshot{Running: 2, Waiting: 1}, nil, t0.Add(7*time.Second))
	if got := b.Replicas(t0)[0].MaxRunning; got != 2 || !full() {
		t.Fatalf("limit %v, full %v after the probe waited: want 2, full", got, full())
	}
}

// TestSaturationKVFullUsageIsConfigured: the KV cache usage from which
// requests waiting in a replica's queue are taken as waiting for memory is
// saturation.kv_full_usage: the same scrape (usage 0.6) is full at 0.5 and
// not at the default; out of range is refused.
func TestSaturationKVFullUsageIsConfigured(t *testing.T) {
	for _, tc := range []struct {
		usage float64
		full  bool
	}{{0, false}, {0.5, true}, {0.6, true}, {0.61, false}} {
		b := newFleet(t, 1, func(c *Config) { c.Saturation.KVFullUsage = tc.usage })
		selectN(t, b, 3, t0)
		b.ObserveScrape("a", Snapshot{Running: 2, Waiting: 1, KVCacheUsage: 0.6}, nil, t0.Add(time.Second))
		if got := b.Replicas(t0)[0].Full; got != tc.full {
			t.Errorf("kv_full_usage %g, usage 0.6 with one waiting: full %v, want %v", tc.usage, got, tc.full)
		}
	}
	for _, bad := range []float64{-0.1, 1.5} {
		if err := (SaturationConfig{KVFullUsage: bad}).Validate(); err == nil || !strings.Contains(err.Error(), "saturation.kv_full_usage") {
			t.Errorf("kv_full_usage %g: Validate() = %v, want an error naming saturation.kv_full_usage", bad, err)
		}
	}
}

// TestDispatchDoesNotEmptyTheQueueIntoAnUnknownReplica: a replica whose
// limit is not known (it has never run with none waiting) is never full by
// its limit, and below the KV threshold its waiting requests do not make it
// full either, so the pool is not saturated; but it has no room a held
// request can count on. Dispatch then chooses among every replica and
// reports no room left, so a pump sends one request, not the whole queue,
// into that engine's queue.
func TestDispatchDoesNotEmptyTheQueueIntoAnUnknownReplica(t *testing.T) {
	b := newFleet(t, 2, func(c *Config) { c.Saturation.MaxRunning = 0 })
	selectN(t, b, 8, t0)
	at := t0.Add(time.Second)
	// a has queued for memory and runs 3 with 1 waiting: full. b has
	// requests waiting for what may be a step's budget and no known limit.
	b.ObserveScrape("a", Snapshot{Running: 3, Waiting: 1, KVCacheUsage: 0.9}, nil, at)
	b.ObserveScrape("b", Snapshot{Running: 2, Waiting: 2, KVCacheUsage: 0.5}, nil, at)
	if b.Saturated("", at) {
		t.Fatal("saturated, with b not full")
	}
	if _, roomLeft, err := b.Dispatch(&Profile{}, at, Favoured); err != nil || roomLeft {
		t.Fatalf("Dispatch: room left %v (err %v), want none: b's room is not known", roomLeft, err)
	}
	// Once b has shown its queue empty it has room again.
	b.ObserveScrape("b", Snapshot{Running: 4}, nil, at.Add(time.Second))
	if _, roomLeft, err := b.Dispatch(&Profile{}, at.Add(time.Second), Favoured); err != nil || !roomLeft {
		t.Fatalf("Dispatch after b showed none waiting: room left %v (err %v), want room", roomLeft, err)
	}
}

// TestSaturationReserve: a request flow control does not favour finds a
// replica full at its limit less the reserve, ceil(share x limit); a
// favoured one at the limit; a negative share keeps none; a share above
// half is refused.
func TestSaturationReserve(t *testing.T) {
	for _, tc := range []struct {
		share      float64
		barredFull bool // with 19 of 20 slots taken
	}{{0, true}, {0.05, true}, {-1, false}} {
		b := newFleet(t, 1, func(c *Config) { c.Saturation.MaxRunning, c.Saturation.ReserveShare = 20, tc.share })
		selectN(t, b, 19, t0)
		if b.SaturatedFor("", Favoured, t0) {
			t.Errorf("share %g: 19 of 20 slots taken, saturated for a favoured request", tc.share)
		}
		if got := b.SaturatedFor("", OverShare, t0); got != tc.barredFull {
			t.Errorf("share %g: 19 of 20 slots taken, saturated for a barred request %v, want %v", tc.share, got, tc.barredFull)
		}
	}
	if err := (SaturationConfig{ReserveShare: 0.6}).Validate(); err == nil || !strings.Contains(err.Error(), "saturation.reserve_share") {
		t.Errorf("reserve_share 0.6: Validate() = %v, want an error naming saturation.reserve_share", err)
	}
}

// TestSaturationTentativeLimitForContestedRequests: while flow control
// holds requests it does not favour (several priorities or tenants), a
// replica whose limit is not learned yet is full for those requests at the
// number running at the first scrape that shows requests waiting, when that
// is at least the most it ran with none waiting; favoured requests, and
// every request while nothing is contested, still see no limit. Held at
// that number with none waiting, one more may go; more running with none
// waiting ends it; the learned limit replaces it.
func TestSaturationTentativeLimitForContestedRequests(t *testing.T) {
	b := newFleet(t, 1, nil)
	s := 0
	scrape := func(running, waiting float64) time.Time {
		s++
		at := t0.Add(time.Duration(s) * time.Second)
		b.ObserveScrape("a", Snapshot{Running: running, Waiting: waiting}, nil, at)
		return at
	}
	held := selectN(t, b, 8, t0)
	now := scrape(6, 0)
	now = scrape(8, 2)
	if b.SaturatedFor("", OverShare, now) {
		t.Fatal("saturated for a contested request before anything was contested")
	}
	// From now on flow control asks about requests it does not favour.
	now = scrape(8, 2)
	if !b.SaturatedFor("", OverShare, now) {
		t.Fatal("not saturated for a request flow control does not favour, 8 in flight at a tentative limit of 8")
	}
	if b.SaturatedFor("", Favoured, now) {
		t.Fatal("saturated for a favoured request: no limit is learned")
	}
	if st := b.Replicas(now)[0]; st.MaxRunning != 0 || st.TentativeMaxRunning != 8 {
		t.Fatalf("max_running %v, tentative_max_running %v: want 0 (policy cost would price it) and 8", st.MaxRunning, st.TentativeMaxRunning)
	}
	// Held at 8 with none waiting, one request ending: 7 in flight. The
	// request flow control does not favour may not take the reserve (1
	// slot of 8); one more than the tentative limit may go.
	now = scrape(8, 0)
	b.Release(held[0], OutcomeOK, now)
	if b.SaturatedFor("", OverShare, now) {
		t.Fatal("no probe past a tentative limit the replica holds with none waiting")
	}
	now = scrape(9, 0) // more ran with none waiting: not the limit
	selectN(t, b, 4, now)
	if b.SaturatedFor("", OverShare, now) {
		t.Fatal("the tentative limit outlived a scrape showing more running with none waiting")
	}
	for range 3 {
		now = scrape(10, 3)
	}
	if got := b.Replicas(now)[0].MaxRunning; got != 10 {
		t.Fatalf("learned limit %v after a plateau of 10 over three scrapes, want 10", got)
	}
}

// TestSaturationTentativeLimitIgnoresLowPlateaus: a queue with fewer
// running than the replica has run free is a long prefill holding a step's
// budget or a full KV cache, not its slot limit: no tentative limit.
func TestSaturationTentativeLimitIgnoresLowPlateaus(t *testing.T) {
	b := newFleet(t, 1, nil)
	selectN(t, b, 6, t0)
	b.SaturatedFor("", OverShare, t0) // contested
	b.ObserveScrape("a", Snapshot{Running: 6}, nil, t0.Add(time.Second))
	b.ObserveScrape("a", Snapshot{Running: 4, Waiting: 2}, nil, t0.Add(2*time.Second))
	if b.SaturatedFor("", OverShare, t0.Add(2*time.Second)) {
		t.Fatal("a plateau below what ran free was taken as a tentative limit")
	}
}

// TestScrapeSoonWhileContestedReplicasFill: the balancer asks for a
// replica's next scrape soon only while requests are contested, its limit
// is unknown and its last scrape showed more running than ever before with
// none waiting.
func TestScrapeSoonWhileContestedReplicasFill(t *testing.T) {
	b := newFleet(t, 1, nil)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	b.ObserveScrape("a", Snapshot{Running: 4}, nil, at(1))
	if b.ScrapeSoon("a", at(1)) {
		t.Fatal("scrape soon with nothing contested")
	}
	b.SaturatedFor("", OverShare, at(1))
	b.ObserveScrape("a", Snapshot{Running: 6}, nil, at(2))
	if !b.ScrapeSoon("a", at(2)) {
		t.Fatal("no follow-up while a contested replica of unknown limit fills")
	}
	b.ObserveScrape("a", Snapshot{Running: 5}, nil, at(3))
	if b.ScrapeSoon("a", at(3)) {
		t.Fatal("follow-up although fewer run than before")
	}
	b.ObserveScrape("a", Snapshot{Running: 7}, nil, at(4))
	if b.ScrapeSoon("a", at(4).Add(contestWindow)) {
		t.Fatal("follow-up after the contest ended")
	}
	if b.ScrapeSoon("nobody", at(4)) {
		t.Fatal("follow-up for an unknown replica")
	}
}

// TestSaturationConfiguredLimitHasNoTentativeOne: with
// saturation.max_running set, contested requests are held at it less the
// reserve, never at a tentative limit taken from a scrape.
func TestSaturationConfiguredLimitHasNoTentativeOne(t *testing.T) {
	b := newFleet(t, 1, func(c *Config) { c.Saturation.MaxRunning = 16 })
	selectN(t, b, 10, t0)
	b.SaturatedFor("", OverShare, t0) // contested
	b.ObserveScrape("a", Snapshot{Running: 8, Waiting: 2}, nil, t0.Add(time.Second))
	now := t0.Add(time.Second)
	if st := b.Replicas(now)[0]; st.TentativeMaxRunning != 0 {
		t.Fatalf("tentative_max_running %v with max_running configured", st.TentativeMaxRunning)
	}
	if b.SaturatedFor("", OverShare, now) {
		t.Fatal("held at a tentative limit of 8 below the configured 16")
	}
}

// TestScrapeSoonIsBounded: a replica that claims a higher running count on
// every scrape gets at most maxFollowUps follow-ups in a row, then its
// interval; one that stops rising may ask again later.
func TestScrapeSoonIsBounded(t *testing.T) {
	b := newFleet(t, 1, nil)
	b.SaturatedFor("", OverShare, t0)
	soon := 0
	for i := 1; i <= 3*maxFollowUps; i++ {
		at := t0.Add(time.Duration(i) * time.Millisecond)
		b.ObserveScrape("a", Snapshot{Running: float64(i)}, nil, at)
		if b.ScrapeSoon("a", at) {
			soon++
		}
	}
	if soon != maxFollowUps {
		t.Fatalf("%d follow-ups for a replica rising on every scrape, want %d", soon, maxFollowUps)
	}
	at := t0.Add(time.Second)
	b.ObserveScrape("a", Snapshot{Running: 1}, nil, at) // no longer rising
	b.ObserveScrape("a", Snapshot{Running: 1000}, nil, at)
	if !b.ScrapeSoon("a", at) {
		t.Fatal("no follow-up after the replica stopped rising and rose again")
	}
}

// holdLongPrompts routes a 64,000-token prompt to each replica of a
// two-replica cost fleet at t0 and returns their reservations.
func holdLongPrompts(t *testing.T, b *Balancer) []*Reservation {
	t.Helper()
	var held []*Reservation
	for _, key := range []string{"x", "y"} {
		res, err := b.Select(costProfile(key, 4000, 0), t0)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, res)
	}
	return held
}

// committedFleet is two replicas under policy cost, configured by
// configure, each sent one 64K-token prompt at t0 (holdLongPrompts; 7.3 s
// of prefill at the priors) and then scraped as snap after that, which it
// returns as now.
func committedFleet(t *testing.T, configure func(*Config), after time.Duration, snap Snapshot) (b *Balancer, held []*Reservation, now time.Time) {
	t.Helper()
	b = newFleet(t, 2, func(c *Config) {
		c.Policy = "cost"
		configure(c)
	})
	held = holdLongPrompts(t, b)
	now = t0.Add(after)
	for _, name := range []string{"a", "b"} {
		b.ObserveScrape(name, snap, nil, now)
	}
	return b, held, now
}

// TestSaturationFromCommittedKV: a replica is full while the KV the
// balancer's own requests there hold or will hold (their prompts less cache
// hits, plus half the mean output each) reaches saturation.kv_commit of the
// KV capacity its scrape exports; not when it exports none, not with the
// signal off, and no longer once the requests end.
func TestSaturationFromCommittedKV(t *testing.T) {
	for _, tc := range []struct {
		name     string
		commit   float64
		capacity float64 // KV tokens the scrape exports
		full     bool
	}{
		{"default: 64K tokens held of 60K", 0, 60_000, true},
		{"default: 64K tokens held of 100K", 0, 100_000, false},
		{"capacity not exported", 0, 0, false},
		{"off", -1, 60_000, false},
		{"half of 100K", 0.5, 100_000, true},
	} {
		b, held, now := committedFleet(t, func(c *Config) { c.Saturation.KVCommit = tc.commit }, time.Second,
			Snapshot{Running: 1, KVCacheUsage: 0.3, KVCacheTokens: tc.capacity})
		for _, r := range b.Replicas(now) {
			if r.Full != tc.full {
				t.Errorf("%s: replica %s full %v, want %v", tc.name, r.Name, r.Full, tc.full)
			}
			if want := map[bool]string{true: "kv_commit"}[tc.full]; r.FullBy != want {
				t.Errorf("%s: replica %s full by %q, want %q", tc.name, r.Name, r.FullBy, want)
			}
			if r.KVCommitted < 64_000 || r.KVCommitted > 65_000 {
				t.Errorf("%s: replica %s KV committed %.0f tokens, want 64,000 and half a mean output", tc.name, r.Name, r.KVCommitted)
			}
		}
		if got := b.Saturated("", now); got != tc.full {
			t.Errorf("%s: saturated %v, want %v", tc.name, got, tc.full)
		}
		for _, res := range held {
			b.Release(res, OutcomeOK, now)
		}
		if b.Saturated("", now) {
			t.Errorf("%s: saturated once the requests ended", tc.name)
		}
	}
	if err := (SaturationConfig{KVCommit: 5}).Validate(); err == nil || !strings.Contains(err.Error(), "saturation.kv_commit") {
		t.Errorf("kv_commit 5: Validate() = %v, want an error naming saturation.kv_commit", err)
	}
}

// fullOnlyForLower checks that b's pool is saturated at now for a request
// a higher priority outranks, and every replica full for it by signal,
// exactly when signal is not "", and never for a favoured request or a
// tenant over its share.
func fullOnlyForLower(t *testing.T, name string, b *Balancer, now time.Time, signal string) {
	t.Helper()
	for _, s := range []struct {
		standing Standing
		want     bool
	}{{Favoured, false}, {OverShare, false}, {Outranked, signal != ""}} {
		if got := b.SaturatedFor("", s.standing, now); got != s.want {
			t.Errorf("%s: saturated for standing %d: %v, want %v", name, s.standing, got, s.want)
		}
	}
	for _, r := range b.Replicas(now) {
		if r.Full || r.FullForLowerBy != signal {
			t.Errorf("%s: replica %s full %v, for lower priorities by %q, want false and %q", name, r.Name, r.Full, r.FullForLowerBy, signal)
		}
	}
}

// TestKVReserveKeptFromLowerPriorities: while a higher priority has
// requests outstanding, a lower one finds a replica full once the
// balancer's requests commit its KV capacity less the reserve
// (saturation.kv_reserve_share, a third by default); the favoured request
// and a tenant over its share (who keeps only the slots' reserve from
// others) find room up to the whole capacity.
func TestKVReserveKeptFromLowerPriorities(t *testing.T) {
	for _, tc := range []struct {
		name      string
		reserve   float64
		outranked bool // full for a request a higher priority outranks
	}{
		{"default: 64K tokens held of 80K, a third kept", 0, true},
		{"a tenth kept", 0.1, false},
		{"none kept", -1, false},
	} {
		b, held, now := committedFleet(t, func(c *Config) {
			c.Saturation.KVReserveShare = tc.reserve
			c.Saturation.LowerPrefillBacklog = -1 // the prompts' prefill owed would hold them too
		}, time.Second, Snapshot{Running: 1, KVCacheUsage: 0.6, KVCacheTokens: 80_000})
		fullOnlyForLower(t, tc.name, b, now, map[bool]string{true: "kv_commit"}[tc.outranked])
		if got := b.Local(costProfile("x", 4000, 0), Outranked, now); got == tc.outranked {
			t.Errorf("%s: the holder has room for a lower priority: %v, want %v", tc.name, got, !tc.outranked)
		}
		for _, res := range held {
			b.Release(res, OutcomeOK, now)
		}
		if b.SaturatedFor("", Outranked, now) {
			t.Errorf("%s: saturated for a lower priority once the requests ended", tc.name)
		}
	}
	if err := (SaturationConfig{KVReserveShare: 0.6}).Validate(); err == nil || !strings.Contains(err.Error(), "saturation.kv_reserve_share") {
		t.Errorf("kv_reserve_share 0.6: Validate() = %v, want an error naming saturation.kv_reserve_share", err)
	}
}

// TestSaturationFromAPrefillBacklog: a replica whose engine queues requests
// with slots and memory to spare is full while the prefill the balancer
// sent it and has not seen done takes longer than saturation.prefill_backlog
// to compute; never while its scrape shows none waiting, and never with the
// signal off.
func TestSaturationFromAPrefillBacklog(t *testing.T) {
	for _, tc := range []struct {
		name    string
		backlog time.Duration
		waiting float64
		at      time.Duration // after the prompts were sent
		full    bool
	}{
		{"default 5s, 6.3s owed, requests waiting", 0, 1, time.Second, true},
		{"none waiting", 0, 0, time.Second, false},
		{"off", -1, 1, time.Second, false},
		{"10s", 10 * time.Second, 1, time.Second, false},
		{"worked off below 5s", 0, 1, 3 * time.Second, false},
	} {
		// A 64,000-token prompt each: at the prior 10K tokens/s and a
		// 30 ms step per 2,048-token chunk, 7.3 s of prefill.
		b, _, now := committedFleet(t, func(c *Config) { c.Saturation.PrefillBacklog = tc.backlog }, tc.at,
			Snapshot{Running: 1, Waiting: tc.waiting, KVCacheUsage: 0.3})
		for _, r := range b.Replicas(now) {
			if r.Full != tc.full {
				t.Errorf("%s: replica %s (%.0f tokens owed) full %v, want %v", tc.name, r.Name, r.PendingPrefill, r.Full, tc.full)
			}
			if want := map[bool]string{true: "prefill_backlog"}[tc.full]; r.FullBy != want {
				t.Errorf("%s: replica %s full by %q, want %q", tc.name, r.Name, r.FullBy, want)
			}
		}
		if got := b.Saturated("", now); got != tc.full {
			t.Errorf("%s: saturated %v, want %v", tc.name, got, tc.full)
		}
	}
	for _, bad := range []time.Duration{11 * time.Minute} {
		if err := (SaturationConfig{PrefillBacklog: bad}).Validate(); err == nil || !strings.Contains(err.Error(), "saturation.prefill_backlog") {
			t.Errorf("prefill_backlog %v: Validate() = %v, want an error naming saturation.prefill_backlog", bad, err)
		}
	}
}

// TestLowerPriorityHeldBehindAPrefillBacklog: while a higher priority has
// requests outstanding, a lower one finds a replica full once the prefill
// the balancer sent it and has not seen done takes longer than
// saturation.lower_prefill_backlog (2s) to compute, though its scrape shows
// no queue; the higher one, and a tenant over its share, do not.
func TestLowerPriorityHeldBehindAPrefillBacklog(t *testing.T) {
	for _, tc := range []struct {
		name      string
		backlog   time.Duration
		at        time.Duration // after the prompts were sent
		outranked bool          // full for a request a higher priority outranks
	}{
		{"default 2s, 6.3s owed", 0, time.Second, true},
		{"off", -1, time.Second, false},
		{"10s", 10 * time.Second, time.Second, false},
		{"worked off below 2s", 0, 6 * time.Second, false},
	} {
		b, _, now := committedFleet(t, func(c *Config) { c.Saturation.LowerPrefillBacklog = tc.backlog }, tc.at,
			Snapshot{Running: 1, KVCacheUsage: 0.3})
		fullOnlyForLower(t, tc.name, b, now, map[bool]string{true: "prefill_backlog"}[tc.outranked])
	}
	if err := (SaturationConfig{LowerPrefillBacklog: 11 * time.Minute}).Validate(); err == nil || !strings.Contains(err.Error(), "saturation.lower_prefill_backlog") {
		t.Errorf("lower_prefill_backlog 11m: Validate() = %v, want an error naming saturation.lower_prefill_backlog", err)
	}
}

// TestReplicaStatusSaysWhyItIsFull: the status names the signal that makes
// a replica full: its slot limit, or its own queue waiting for memory.
func TestReplicaStatusSaysWhyItIsFull(t *testing.T) {
	b := newFleet(t, 1, func(c *Config) { c.Saturation.MaxRunning = 2 })
	if st := b.Replicas(t0)[0]; st.Full || st.FullBy != "" {
		t.Fatalf("idle replica: full %v by %q", st.Full, st.FullBy)
	}
	selectN(t, b, 2, t0)
	if st := b.Replicas(t0)[0]; !st.Full || st.FullBy != "slots" {
		t.Fatalf("at its slot limit: full %v by %q, want slots", st.Full, st.FullBy)
	}
	now := t0.Add(time.Second)
	b.ObserveScrape("a", Snapshot{Running: 1, Waiting: 1, KVCacheUsage: 0.9}, nil, now)
	if st := b.Replicas(now)[0]; !st.Full || st.FullBy != "memory" {
		t.Fatalf("queueing for memory: full %v by %q, want memory", st.Full, st.FullBy)
	}
}

// TestCommittedKVSharedByPeers: with shared state, the KV another
// instance's requests commit on a replica counts towards the committed-KV
// signal as that instance published it (Load, SetPeerLoad), so that an
// instance with no request of its own there sees the replica full; a
// peer's load that expires stops counting, and hostile values count as
// nothing or are bounded.
func TestCommittedKVSharedByPeers(t *testing.T) {
	cfg := func(c *Config) { c.Policy = "cost" }
	sender, peer := newFleet(t, 2, cfg), newFleet(t, 2, cfg)
	held := holdLongPrompts(t, sender)
	now := t0.Add(time.Second)
	for _, b := range []*Balancer{sender, peer} {
		for _, name := range []string{"a", "b"} {
			b.ObserveScrape(name, Snapshot{Running: 1, KVCacheUsage: 0.3, KVCacheTokens: 60_000}, nil, now)
		}
	}
	loads := sender.Load()
	for _, l := range loads {
		if l.Held != 64_000 {
			t.Errorf("published load of %s holds %.0f tokens, want 64,000", l.Replica, l.Held)
		}
	}
	if peer.Saturated("", now) {
		t.Fatal("the peer saw the pool saturated before any load was shared")
	}
	expires := now.Add(2 * time.Second)
	peer.SetPeerLoad("sender", loads, expires, now)
	for _, r := range peer.Replicas(now) {
		if r.FullBy != "kv_commit" || r.KVCommitted < 64_000 {
			t.Errorf("peer: replica %s full by %q with %.0f tokens committed, want kv_commit and 64,000", r.Name, r.FullBy, r.KVCommitted)
		}
	}
	if !peer.Saturated("", now) {
		t.Error("the peer did not see the pool saturated by the sender's committed KV")
	}
	if peer.Saturated("", expires) {
		t.Error("the sender's load still counted once it expired")
	}
	// The sender's load has expired: only the hostile peer's counts now.
	later := expires.Add(time.Second)
	for _, bad := range []float64{math.NaN(), math.Inf(-1), -5e6} {
		peer.SetPeerLoad("hostile", []ReplicaLoad{{Replica: "a", InFlight: 1, Held: bad}}, later.Add(time.Second), later)
		if r := peer.Replicas(later)[0]; r.FullBy != "" {
			t.Errorf("a peer claiming %v tokens held made replica a full by %q", bad, r.FullBy)
		}
	}
	peer.SetPeerLoad("hostile", []ReplicaLoad{{Replica: "a", InFlight: 1, Held: math.Inf(1)}}, later.Add(time.Second), later)
	if r := peer.Replicas(later)[0]; r.Name != "a" || r.FullBy != "kv_commit" || math.IsInf(r.KVCommitted, 0) {
		t.Errorf("a peer claiming infinite KV: replica a full by %q with %v committed, want kv_commit and a bounded count", r.FullBy, r.KVCommitted)
	}
	for _, res := range held {
		sender.Release(res, OutcomeOK, now)
	}
	for _, l := range sender.Load() {
		if l.Held != 0 {
			t.Errorf("published load of %s holds %.0f tokens once its requests ended, want 0", l.Replica, l.Held)
		}
	}
}

// TestCommittedKVOfOtherClients: without shared state, a scrape that shows
// requests which are not this balancer's, with the cache more used than its
// own requests account for, adds the difference to the KV counted as
// committed until the next scrape; without such requests, or with none of
// its own there, it adds nothing.
func TestCommittedKVOfOtherClients(t *testing.T) {
	for _, tc := range []struct {
		name    string
		running float64 // scraped; one of them is the balancer's
		usage   float64
		full    bool
	}{
		{"others' requests fill the cache", 3, 1, true},
		{"others' requests, room left", 3, 0.7, false},
		{"no others: the usage is the balancer's own", 1, 1, false},
		{"a usage over 1 counts as a full cache, no more", 3, 50, true},
	} {
		b := newFleet(t, 1, func(c *Config) { c.Policy = "cost" })
		res, err := b.Select(costProfile("x", 2000, 0), t0) // 32,000 tokens
		if err != nil {
			t.Fatal(err)
		}
		now := t0.Add(time.Second)
		b.ObserveScrape("a", Snapshot{Running: tc.running, KVCacheUsage: tc.usage, KVCacheTokens: 60_000}, nil, now)
		r := b.Replicas(now)[0]
		if got := r.FullBy == "kv_commit"; got != tc.full {
			t.Errorf("%s: full by %q with %.0f tokens committed, want kv_commit %v", tc.name, r.FullBy, r.KVCommitted, tc.full)
		}
		if tc.full && (r.KVCommitted < 60_000 || r.KVCommitted > 61_000) {
			t.Errorf("%s: %.0f tokens committed, want the cache's 60,000 and half a mean output", tc.name, r.KVCommitted)
		}
		b.Release(res, OutcomeOK, now)
		if r := b.Replicas(now)[0]; r.KVCommitted != 0 || r.FullBy == "kv_commit" {
			t.Errorf("%s: with none of its own requests there, %.0f tokens committed, full by %q", tc.name, r.KVCommitted, r.FullBy)
		}
	}
}

// TestCommittedKVCountsPeersUnseenSends: with live peers, the KV counted
// as committed on a replica adds, for each peer, what this instance sent
// there at its recent rate for as long as that peer's load is old: the
// peers are taken to send as much, and their sends are not seen yet.
func TestCommittedKVCountsPeersUnseenSends(t *testing.T) {
	b := newFleet(t, 1, func(c *Config) { c.Policy = "cost" })
	b.ObserveScrape("a", Snapshot{Running: 0, KVCacheTokens: 1_000_000}, nil, t0)
	committed := func(at time.Time) float64 { return b.Replicas(at)[0].KVCommitted }
	if _, err := b.Select(costProfile("x", 2000, 0), t0); err != nil { // 32,000 tokens
		t.Fatal(err)
	}
	alone := committed(t0.Add(500 * time.Millisecond))
	// Two peers whose loads (nothing on a) arrived at t0 and last 2 s.
	for _, peer := range []string{"p1", "p2"} {
		b.SetPeerLoad(peer, []ReplicaLoad{{Replica: "a"}}, t0.Add(2*time.Second), t0)
	}
	// At 0.5 s, each peer is taken to have sent 32,000 x e^-0.5 tokens/s
	// for 0.5 s.
	want := alone + 2*32_000*math.Exp(-0.5)*0.5
	if got := committed(t0.Add(500 * time.Millisecond)); math.Abs(got-want) > 1 {
		t.Errorf("with two peers 0.5 s old: %.0f tokens committed, want %.0f (%.0f alone)", got, want, alone)
	}
	if got := committed(t0.Add(3 * time.Second)); got != alone {
		t.Errorf("once the peers' loads expired: %.0f tokens committed, want %.0f as alone", got, alone)
	}
}
