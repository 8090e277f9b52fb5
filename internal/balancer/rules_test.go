package balancer

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// TestRules has one named case per rule of docs/ROUTING.md's "Effective
// load", "Selection" (steps 1-5) and "Pin life cycle"; the health rules are
// in package health (TestMachine, TestBackoffSequence, TestStreakReset) plus
// the balancer-level cases below and in TestHealthThroughBalancer; the
// alerts are in TestAlerts.
//
// load    effective_running = max(scraped_running, wlc_in_flight);
//
//	effective_waiting = scraped_waiting + max(0, wlc - scraped_running);
//	wlc weighted by tokens.
//
// steps   1. pool: LIVE and PROBING (EJECTED, draining: none; PROBING capped)
//  2. no-wait, else LIVE, else all routable
//  3. least-loaded, ties round-robin, LIVE over PROBING
//  4. pin: session first, then prefix; usable only if LIVE, no queue,
//     running <= min_r + slack (1 / 0); else spill
//  5. fallback random; none known: no_healthy_instances
//     pin life cycle: TTL 60 min / 5 min; 3 spills rebind; a used pin
//     resets its spills; gap >= 3 force rebind; a repeated prefix spill
//     deletes the key; a dead pin never blocks; PROBING takes no pins;
//     new pins only on LIVE.
func TestRules(t *testing.T) {
	s, m := time.Second, time.Minute
	tests := []struct {
		name     string
		replicas int
		steps    []ev
	}{
		// Effective load.
		{"load: WLC: the balancer's own in-flight requests count between scrapes", 3, []ev{
			{op: "select", want: "a"}, {op: "select", want: "b"}, {op: "select", want: "c"}, {op: "select", want: "a"},
		}},
		{"load: in-flight requests are weighted by tokens", 2, []ev{
			{op: "select", tokens: 100_000, want: "a"},
			{op: "scrape", r: "a", run: 1}, {op: "scrape", r: "b", run: 5},
			{op: "select", want: "b"}, // a: running max(1,100), waiting 99
		}},

		// Step 1: the pool.
		{"step 1 pool: an EJECTED replica gets no traffic", 2, []ev{
			{op: "fail", r: "a", state: "EJECTED"},
			{op: "select", want: "b", release: true}, {op: "select", want: "b", release: true},
		}},
		{"step 1 pool: a draining replica gets no new traffic", 2, []ev{
			{op: "drain", r: "a"},
			{op: "select", want: "b", release: true}, {op: "select", want: "b", release: true},
		}},
		{"step 1 pool: PROBING takes at most probing.max_in_flight", 2, []ev{
			{op: "fail", r: "a"}, {op: "fail", r: "b"}, {op: "probe", r: "b", state: "PROBING"},
			{at: 40 * s, op: "select", want: "b"}, {at: 40 * s, op: "select", want: "b"},
			{at: 40 * s, op: "select", want: "any", reason: ReasonFallback},
		}},

		// Step 2: no-wait.
		{"step 2 no-wait: a LIVE replica without queue beats a less loaded queued one", 3, []ev{
			{op: "scrape", r: "a", run: 1, wait: 2}, {op: "scrape", r: "b", run: 5}, {op: "scrape", r: "c", run: 9, wait: 1},
			{op: "select", want: "b", reason: ReasonLoad},
		}},
		{"step 2 otherwise LIVE ones: a queued LIVE replica beats an idle PROBING one", 2, []ev{
			{op: "fail", r: "b"}, {op: "probe", r: "b", state: "PROBING"},
			{at: 40 * s, op: "scrape", r: "a", run: 4, wait: 1},
			{at: 40 * s, op: "select", want: "a"},
		}},
		{"step 2 otherwise all routable: PROBING when no replica is LIVE", 2, []ev{
			{op: "fail", r: "a"}, {op: "fail", r: "b"}, {op: "probe", r: "b"},
			{at: 40 * s, op: "select", want: "b", reason: ReasonLoad},
		}},

		// Step 3: least-loaded.
		{"step 3 least-loaded: the minimum effective_running wins", 3, []ev{
			{op: "scrape", r: "a", run: 3}, {op: "scrape", r: "b", run: 1}, {op: "scrape", r: "c", run: 2},
			{op: "select", want: "b"},
		}},
		{"step 3 ties are broken round-robin", 3, []ev{
			{op: "select", want: "a", release: true}, {op: "select", want: "b", release: true},
			{op: "select", want: "c", release: true}, {op: "select", want: "a", release: true},
		}},
		{"step 3 LIVE is preferred over PROBING on a tie", 2, []ev{
			{op: "fail", r: "b"}, {op: "probe", r: "b", state: "PROBING"},
			{at: 40 * s, op: "select", want: "a", release: true}, {at: 40 * s, op: "select", want: "a", release: true},
			{at: 40 * s, op: "select", want: "a", release: true},
		}},

		// Step 4: pins.
		{"step 4 a new session is pinned where it lands", 3, []ev{
			{op: "select", sess: "s1", want: "a", pin: "session new", release: true},
			{op: "pinned", sess: "s1", want: "a"},
		}},
		{"step 4 a usable session pin routes there (affinity)", 3, []ev{
			{op: "select", sess: "s1", want: "a", release: true},
			{op: "select", sess: "s1", want: "a", reason: ReasonAffinity, pin: "session used"},
		}},
		{"step 4 session key first, then prefix key", 3, []ev{
			{op: "select", pfx: "p1", want: "a", release: true},
			{op: "select", sess: "s1", want: "b", release: true},
			{op: "select", sess: "s1", pfx: "p1", want: "b", reason: ReasonAffinity, pin: "session used"},
		}},
		{"step 4 usable only if LIVE (a PROBING pin spills)", 2, []ev{
			{op: "select", sess: "s1", want: "a", release: true},
			{at: 1 * s, op: "fail", r: "a"}, {at: 1 * s, op: "probe", r: "a", state: "PROBING"},
			{at: 40 * s, op: "select", sess: "s1", want: "b", reason: ReasonLoad, pin: "spill: not LIVE"},
		}},
		{"step 4 usable only if effective_waiting == 0", 3, []ev{
			{op: "select", sess: "s1", want: "a", release: true},
			{op: "scrape", r: "a", wait: 1},
			{op: "select", sess: "s1", want: "b", pin: "spill: queue"},
		}},
		{"step 4 session pin usable within min_r + 1", 3, []ev{
			{op: "select", sess: "s1", want: "a", release: true},
			{op: "scrape", r: "a", run: 1},
			{op: "select", sess: "s1", want: "a", reason: ReasonAffinity},
		}},
		{"step 4 session pin not usable above min_r + 1", 3, []ev{
			{op: "select", sess: "s1", want: "a", release: true},
			{op: "scrape", r: "a", run: 2},
			{op: "select", sess: "s1", want: "b", reason: ReasonLoad, pin: "spill: running > min_r+slack"},
		}},
		{"step 4 prefix pin usable at min_r (slack 0)", 3, []ev{
			{op: "select", pfx: "p1", want: "a", pin: "prefix new", release: true},
			{op: "select", pfx: "p1", want: "a", reason: ReasonAffinity, pin: "prefix used"},
		}},
		{"step 4 prefix pin not usable above min_r", 3, []ev{
			{op: "select", pfx: "p1", want: "a", release: true},
			{op: "scrape", r: "a", run: 1},
			{op: "select", pfx: "p1", want: "b", pin: "prefix spill"},
		}},

		// The pin life cycle (against crystallization).
		{"pins: spills are counted and a used pin resets them", 2, []ev{
			{op: "select", sess: "s1", want: "a", release: true},
			{op: "scrape", r: "a", run: 2},
			{op: "select", sess: "s1", want: "b", pin: "spill", release: true},
			{op: "select", sess: "s1", want: "b", pin: "spill", release: true},
			{op: "scrape", r: "a", run: 0},
			{op: "select", sess: "s1", want: "a", pin: "used", release: true},
			{op: "scrape", r: "a", run: 2},
			{op: "select", sess: "s1", want: "b", pin: "spill", release: true},
			{op: "select", sess: "s1", want: "b", pin: "spill", release: true},
			{op: "pinned", sess: "s1", want: "a"},
		}},
		{"pins: 3 consecutive spills rebind the session to the replica chosen", 2, []ev{
			{op: "select", sess: "s1", want: "a", release: true},
			{op: "scrape", r: "a", run: 2},
			{op: "select", sess: "s1", want: "b", pin: "spill", release: true},
			{op: "select", sess: "s1", want: "b", pin: "spill", release: true},
			{op: "select", sess: "s1", want: "b", pin: "rebind", release: true},
			{op: "pinned", sess: "s1", want: "b"},
			{op: "select", sess: "s1", want: "b", reason: ReasonAffinity},
		}},
		{"pins: running(pin) - min_r >= 3 rebinds at once", 2, []ev{
			{op: "select", sess: "s1", want: "a", release: true},
			{op: "scrape", r: "a", run: 3},
			{op: "select", sess: "s1", want: "b", pin: "force rebind", release: true},
			{op: "pinned", sess: "s1", want: "b"},
		}},
		{"pins: a repeated prefix spill deletes the key", 2, []ev{
			{op: "select", pfx: "p1", want: "a", release: true},
			{op: "scrape", r: "a", run: 1},
			{op: "select", pfx: "p1", want: "b", pin: "prefix spill", release: true},
			{op: "pinned", pfx: "p1", want: "a"},
			{op: "select", pfx: "p1", want: "b", pin: "prefix dropped", release: true},
			{op: "pinned", pfx: "p1", want: ""},
		}},
		{"pins: session pins expire 60 min after their last use", 3, []ev{
			{op: "select", sess: "s1", want: "a", release: true},
			{at: 59 * m, op: "select", sess: "s1", want: "a", pin: "used", release: true},
			{at: 118 * m, op: "select", sess: "s1", want: "a", pin: "used", release: true},
			{at: 178 * m, op: "select", sess: "s1", want: "any", pin: "session new", release: true},
		}},
		{"pins: prefix pins expire 5 min after their last use", 3, []ev{
			{op: "select", pfx: "p1", want: "a", release: true},
			{at: 4 * m, op: "select", pfx: "p1", want: "a", pin: "used", release: true},
			{at: 9*m + s, op: "select", pfx: "p1", want: "any", pin: "prefix new", release: true},
		}},
		{"pins: a pin on an EJECTED replica never blocks", 2, []ev{
			{op: "select", sess: "s1", want: "a", release: true},
			{at: 1 * s, op: "fail", r: "a"},
			{at: 2 * s, op: "select", sess: "s1", want: "b", pin: "dead: rebind"},
			{at: 2 * s, op: "pinned", sess: "s1", want: "b"},
		}},
		{"pins: PROBING replicas accept no new pins", 2, []ev{
			{op: "fail", r: "a"}, {op: "fail", r: "b"}, {op: "probe", r: "b"},
			{at: 40 * s, op: "select", sess: "s1", pfx: "p1", want: "b"},
			{at: 40 * s, op: "pinned", sess: "s1", want: ""}, {at: 40 * s, op: "pinned", pfx: "p1", want: ""},
		}},
		{"pins: new pins only on LIVE replicas (not by fallback)", 2, []ev{
			{op: "fail", r: "a"}, {op: "fail", r: "b"}, {op: "alive", r: "a"}, {op: "alive", r: "b"},
			{op: "select", sess: "s1", want: "any", reason: ReasonFallback},
			{op: "pinned", sess: "s1", want: ""},
		}},

		// Step 5: fallback.
		{"step 5 fallback: a random known replica when none is LIVE or PROBING", 3, []ev{
			{op: "fail", r: "a"}, {op: "fail", r: "b"}, {op: "fail", r: "c"},
			{op: "alive", r: "a"}, {op: "alive", r: "b"}, {op: "alive", r: "c"},
			{op: "select", want: "any", reason: ReasonFallback},
		}},
		{"step 5 fallback only to replicas answering their scrapes", 3, []ev{
			{op: "fail", r: "a"}, {op: "fail", r: "b"}, {op: "fail", r: "c"}, {op: "alive", r: "b"},
			{op: "select", want: "b", reason: ReasonFallback},
		}},
		{"step 5 all replicas dead by their scrapes: no_healthy_instances at once", 3, []ev{
			{op: "fail", r: "a"}, {op: "fail", r: "b"}, {op: "fail", r: "c"},
			{op: "select", want: "err:no healthy instances"},
		}},
		{"step 5 no_healthy_instances when no replica is known", 0, []ev{
			{op: "select", want: "err:no healthy instances"},
		}},
		{"step 5 no_healthy_instances when every replica is draining", 1, []ev{
			{op: "drain", r: "a"}, {op: "select", want: "err:no healthy instances"},
		}},

		// Health through the balancer.
		{"health: 3 consecutive 5xx of proxied requests eject", 1, []ev{
			{op: "5xx", r: "a", state: "LIVE"}, {op: "5xx", r: "a", state: "LIVE"}, {op: "5xx", r: "a", state: "EJECTED"},
		}},
		{"health: one failed scrape ejects; 2 scrapes after the cooldown probe; 15 s clean -> LIVE", 1, []ev{
			{op: "fail", r: "a", state: "EJECTED"},
			{op: "probe", r: "a", state: "PROBING"}, // scrapes at 30 s and 33 s
			{at: 47 * s, op: "tick", r: "a", state: "PROBING"},
			{at: 48 * s, op: "tick", r: "a", state: "LIVE"},
		}},
		{"health: a 5xx inside the PROBING window sends it back to EJECTED", 1, []ev{
			{op: "fail", r: "a", state: "EJECTED"},
			{op: "probe", r: "a", state: "PROBING"},
			{at: 40 * s, op: "5xx", r: "a", state: "EJECTED"},
		}},
		{"health: a 4xx inside the PROBING window is no failure: LIVE after 15 s", 1, []ev{
			{op: "fail", r: "a", state: "EJECTED"},
			{op: "probe", r: "a", state: "PROBING"},
			{at: 40 * s, op: "4xx", r: "a", state: "PROBING"},
			{at: 48 * s, op: "tick", r: "a", state: "LIVE"},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			play(t, newFleet(t, tc.replicas, nil), tc.steps)
		})
	}
}

func TestUnknownModel(t *testing.T) {
	b := newFleet(t, 2, nil)
	b.SetModels("a", []string{"llama"})
	b.SetModels("b", []string{"qwen", "llama"})
	tests := []struct {
		model string
		want  error
	}{
		{"llama", nil}, {"qwen", nil}, {"", nil}, {"gpt-5", ErrUnknownModel},
	}
	for _, tc := range tests {
		t.Run(tc.model, func(t *testing.T) {
			res, err := b.Select(&Profile{Model: tc.model}, t0)
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			if err == nil {
				b.Release(res, OutcomeOK, t0)
			}
		})
	}
	if got := b.Models(); len(got) != 2 || got[0] != "llama" || got[1] != "qwen" {
		t.Fatalf("models %v", got)
	}
}

func TestHealthThroughBalancer(t *testing.T) {
	tests := []struct {
		name     string
		outcomes []Outcome
		want     string
	}{
		{"client cancels say nothing about the replica", []Outcome{OutcomeCanceled, OutcomeCanceled, OutcomeCanceled, OutcomeCanceled}, "LIVE"},
		{"transport errors eject like 5xx", []Outcome{OutcomeTransportError, OutcomeServerError, OutcomeTransportError}, "EJECTED"},
		{"a success between failures resets the count", []Outcome{OutcomeServerError, OutcomeServerError, OutcomeOK, OutcomeServerError, OutcomeServerError}, "LIVE"},
		{"a 4xx answer is the replica's success too", []Outcome{OutcomeServerError, OutcomeServerError, OutcomeRejected, OutcomeServerError, OutcomeServerError}, "LIVE"},
		{"4xx answers never eject", []Outcome{OutcomeRejected, OutcomeRejected, OutcomeRejected, OutcomeRejected}, "LIVE"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newFleet(t, 1, nil)
			for _, o := range tc.outcomes {
				res, err := b.Select(&Profile{}, t0)
				if err != nil {
					t.Fatal(err)
				}
				b.Release(res, o, t0)
			}
			if got := statusOf(t, b, "a", t0).State; got != tc.want {
				t.Fatalf("state %s, want %s", got, tc.want)
			}
		})
	}
}

func TestReleaseTwiceIsHarmless(t *testing.T) {
	b := newFleet(t, 1, nil)
	r1, _ := b.Select(&Profile{}, t0)
	r2, _ := b.Select(&Profile{}, t0)
	b.Release(r1, OutcomeServerError, t0)
	b.Release(r1, OutcomeServerError, t0)
	b.Release(r1, OutcomeServerError, t0)
	st := statusOf(t, b, "a", t0)
	if st.InFlight != 1 || st.InFlightWeight != 1 || st.State != "LIVE" {
		t.Fatalf("after a triple release: %+v", st)
	}
	b.Release(r2, OutcomeOK, t0)
	b.Release(nil, OutcomeOK, t0)
	if st := statusOf(t, b, "a", t0); st.InFlight != 0 || st.EffectiveRunning != 0 || st.EffectiveWaiting != 0 {
		t.Fatalf("after all releases: %+v", st)
	}
}

func TestExcludeForFailover(t *testing.T) {
	b := newFleet(t, 2, nil)
	res, err := b.Select(&Profile{}, t0, "a")
	if err != nil || res.Replica != "b" {
		t.Fatalf("got %v %v, want b", res, err)
	}
	if _, err := b.Select(&Profile{}, t0, "a", "b"); !errors.Is(err, ErrNoHealthyInstances) {
		t.Fatalf("all excluded: %v", err)
	}
}

func TestRemovedReplicaReleasesSafely(t *testing.T) {
	b := newFleet(t, 2, nil)
	res, _ := b.Select(&Profile{SessionKey: "s"}, t0)
	if !b.RemoveReplica(res.Replica, t0) {
		t.Fatal("remove failed")
	}
	if tr := b.Release(res, OutcomeServerError, t0); tr != nil {
		t.Fatalf("transitions for a removed replica: %v", tr)
	}
	if got := pinOf(b, "session", "s", t0); got != "" {
		t.Fatalf("pin survived its replica: %s", got)
	}
}

// TestBaselinesShareStepsOneAndFive checks that every baseline policy runs
// behind the same pool, reservation and fallback as llmlb.
func TestBaselinesShareStepsOneAndFive(t *testing.T) {
	for _, name := range []string{"rr", "least-request", "sticky", "prefix-tree"} {
		t.Run(name, func(t *testing.T) {
			b := newFleet(t, 3, func(c *Config) { c.Policy = name })
			if b.Policy() != name {
				t.Fatalf("policy %s, want %s", b.Policy(), name)
			}
			b.ObserveScrape("a", Snapshot{}, errors.New("refused"), t0)
			for range 6 {
				res, err := b.Select(&Profile{SessionKey: "s", PrefixKey: "p", PromptTokens: 100, PromptBlocks: []uint64{1, 2, 3}}, t0)
				if err != nil {
					t.Fatal(err)
				}
				if res.Replica == "a" {
					t.Fatalf("%s routed to the EJECTED replica", name)
				}
				if res.Explanation.Policy != name || res.Explanation.CandidateSet != "routable" || res.Explanation.Candidates != 2 {
					t.Fatalf("explanation %+v", res.Explanation)
				}
				b.Release(res, OutcomeOK, t0)
			}
			b.ObserveScrape("b", Snapshot{}, errors.New("refused"), t0)
			b.ObserveScrape("c", Snapshot{}, errors.New("refused"), t0)
			b.ObserveScrape("c", Snapshot{}, nil, t0) // answering again, in its cooldown
			if res, err := b.Select(&Profile{}, t0); err != nil || res.Reason != ReasonFallback {
				t.Fatalf("fallback: %v %v", res, err)
			}
		})
	}
	if _, err := New(Config{Policy: "nope"}); err == nil {
		t.Fatal("unknown policy accepted")
	}
}

// TestTickSweepIsBounded: housekeeping deletes at most affinity.sweep_budget
// expired pins per Tick, and an expired pin is never used meanwhile.
func TestTickSweepIsBounded(t *testing.T) {
	b := newFleet(t, 2, func(c *Config) { c.Affinity.SweepBudget = 10 })
	for i := range 25 {
		res, err := b.Select(&Profile{PrefixKey: string(rune('A' + i))}, t0)
		if err != nil {
			t.Fatal(err)
		}
		b.Release(res, OutcomeOK, t0)
	}
	later := t0.Add(6 * time.Minute)
	for i, want := range []int{15, 5, 0} {
		b.Tick(later)
		if got := pinCount(b); got != want {
			t.Fatalf("after tick %d: %d pins, want %d", i+1, got, want)
		}
	}
}

// TestModelsFollowTheFleet: the sorted union of the replicas' models (kept
// between calls, so a lookup per request costs no copy or sort) follows
// every change of a replica's models and of the replica set.
func TestModelsFollowTheFleet(t *testing.T) {
	b := newFleet(t, 2, nil)
	rank := func(model string) int {
		if i, ok := b.ModelRank(model); ok {
			return i
		}
		return -1
	}
	check := func(step string, want ...string) {
		t.Helper()
		if got := b.Models(); !slices.Equal(got, want) {
			t.Fatalf("%s: Models() = %v, want %v", step, got, want)
		}
		for i, m := range want {
			if rank(m) != i {
				t.Fatalf("%s: ModelRank(%q) = %d, want %d", step, m, rank(m), i)
			}
		}
	}
	check("no models known")
	b.SetModels("a", []string{"qwen", "llama"})
	check("a's models", "llama", "qwen")
	b.SetModels("b", []string{"mistral", "qwen"})
	check("b's models", "llama", "mistral", "qwen")
	b.SetModels("a", []string{"qwen"})
	check("a dropped llama", "mistral", "qwen")
	if rank("llama") != -1 {
		t.Fatal("ModelRank finds a model no replica serves")
	}
	if err := b.AddReplica(ReplicaSpec{Name: "c", URL: "http://c", Models: []string{"gemma"}}, t0); err != nil {
		t.Fatal(err)
	}
	check("c added", "gemma", "mistral", "qwen")
	b.RemoveReplica("b", t0)
	check("b removed", "gemma", "qwen")
}
