package flowcontrol

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// step is one call on the queue at t0+at, with what it must return written
// compactly: Admit "dispatch", "queued" or "refused shed 1s"; Next "3" or
// "none"; Expire, Drain and Remove the ids handed back ("1 2", "" for none);
// Done "true" or "false"; NextExpiry "+12s" (since t0) or "none".
type step struct {
	at   time.Duration
	op   string // admit, next, remove, expire, nextexpiry, done, drain
	it   Item   // admit
	sat  bool   // admit: the pool is saturated
	id   uint64 // remove
	want string
}

func admit(at time.Duration, id uint64, prio int, tenant string, tokens int64, sat bool, want string) step {
	return step{at: at, op: "admit", it: Item{ID: id, Priority: prio, Tenant: tenant, Tokens: tokens, Bytes: 100}, sat: sat, want: want}
}

func next(at time.Duration, want string) step { return step{at: at, op: "next", want: want} }

func ids(items []Item) string {
	s := make([]string, len(items))
	for i, it := range items {
		s[i] = strconv.FormatUint(it.ID, 10)
	}
	return strings.Join(s, " ")
}

func run(t *testing.T, q *Queue, steps []step) {
	t.Helper()
	for i, s := range steps {
		now := t0.Add(s.at)
		var got string
		switch s.op {
		case "admit":
			d, err := q.Admit(s.it, s.sat, now)
			switch {
			case err != nil:
				got = "error " + err.Error()
			case d.Outcome == Refused:
				got = fmt.Sprintf("refused %s %s", d.Reason, d.RetryAfter)
			default:
				got = d.Outcome.String()
			}
		case "next":
			it, ok := q.Next(now)
			got = "none"
			if ok {
				got = strconv.FormatUint(it.ID, 10)
				if it.Enqueued.After(now) {
					t.Errorf("step %d: enqueued %v after now %v", i, it.Enqueued, now)
				}
			}
		case "remove":
			got = "missing"
			if it, ok := q.Remove(s.id); ok {
				got = strconv.FormatUint(it.ID, 10)
			}
		case "expire":
			got = ids(q.Expire(now))
		case "nextexpiry":
			got = "none"
			if at, ok := q.NextExpiry(); ok {
				got = "+" + at.Sub(t0).String()
			}
		case "drain":
			got = ids(q.Drain())
		case "done":
			got = strconv.FormatBool(q.Done(s.it.Tenant, s.it.Priority, now))
		default:
			t.Fatalf("step %d: unknown op %q", i, s.op)
		}
		if got != s.want {
			t.Errorf("step %d (%s at +%s): got %q, want %q", i, s.op, s.at, got, s.want)
		}
	}
}

func TestQueueSteps(t *testing.T) {
	sec := time.Second
	cases := []struct {
		name  string
		cfg   func(*Config)
		steps []step
	}{
		{name: "unsaturated and empty dispatches at once", steps: []step{
			admit(0, 1, 0, "a", 10, false, "dispatch"),
			admit(0, 2, -1, "a", 10, false, "dispatch"),
			next(0, "none"),
		}},
		{name: "saturated queues, next dispatches", steps: []step{
			admit(0, 1, 0, "a", 10, true, "queued"),
			next(sec, "1"),
			next(sec, "none"),
		}},
		{name: "unsaturated waits behind queued requests of its priority or higher", steps: []step{
			admit(0, 1, 0, "a", 10, true, "queued"),
			admit(sec, 2, 0, "b", 10, false, "queued"),
			admit(sec, 3, 1, "b", 10, false, "dispatch"),
			admit(sec, 4, -1, "b", 10, false, "queued"),
			next(2*sec, "1"), next(2*sec, "2"), next(2*sec, "4"),
		}},
		{name: "higher priority first", steps: []step{
			admit(0, 1, 0, "a", 10, true, "queued"),
			admit(sec, 2, 5, "a", 10, true, "queued"),
			admit(2*sec, 3, 1, "a", 10, true, "queued"),
			admit(3*sec, 4, 5, "b", 10, true, "queued"),
			next(4*sec, "2"), next(4*sec, "4"), next(4*sec, "3"), next(4*sec, "1"), next(4*sec, "none"),
		}},
		{name: "first come first served within a tenant", steps: []step{
			admit(0, 3, 0, "a", 500, true, "queued"),
			admit(sec, 1, 0, "a", 10, true, "queued"),
			admit(2*sec, 2, 0, "a", 9000, true, "queued"),
			next(3*sec, "3"), next(3*sec, "1"), next(3*sec, "2"),
		}},
		{name: "tenants alternate by tokens served", steps: []step{
			// a's first request costs 300 tokens: b, which arrived later,
			// gets three 100-token requests in before a's second.
			admit(0, 1, 0, "a", 300, true, "queued"),
			admit(0, 2, 0, "a", 300, true, "queued"),
			admit(0, 11, 0, "b", 100, true, "queued"),
			admit(0, 12, 0, "b", 100, true, "queued"),
			admit(0, 13, 0, "b", 100, true, "queued"),
			admit(0, 14, 0, "b", 100, true, "queued"),
			next(sec, "1"), next(sec, "11"), next(sec, "12"), next(sec, "13"), next(sec, "2"), next(sec, "14"),
		}},
		{name: "a tenant that empties and returns keeps its finish tag", steps: []step{
			admit(0, 1, 0, "a", 1000, true, "queued"),
			admit(0, 11, 0, "b", 100, true, "queued"),
			admit(0, 12, 0, "b", 100, true, "queued"),
			admit(0, 13, 0, "b", 100, true, "queued"),
			next(sec, "1"),
			// Without its finish tag (1000) a would start at the virtual
			// time (0) and go before b's second request.
			admit(sec, 2, 0, "a", 1000, true, "queued"),
			next(sec, "11"), next(sec, "12"), next(sec, "13"), next(sec, "2"),
		}},
		{name: "sheddable refused at saturation", steps: []step{
			admit(0, 1, -1, "a", 10, true, "refused shed 1s"),
			admit(0, 2, -5, "a", 10, false, "dispatch"),
			next(0, "none"),
		}},
		{name: "queue full by count", cfg: func(c *Config) { c.MaxQueued = 2 }, steps: []step{
			admit(0, 1, 0, "a", 10, true, "queued"),
			admit(0, 2, 0, "b", 10, true, "queued"),
			admit(0, 3, 9, "c", 10, true, "refused queue_full 1s"),
			admit(0, 4, 0, "c", 10, false, "refused queue_full 1s"),
			next(sec, "1"),
			admit(sec, 3, 0, "c", 10, true, "queued"),
		}},
		{name: "queue full by bytes", cfg: func(c *Config) { c.MaxQueuedBytes = 250 }, steps: []step{
			admit(0, 1, 0, "a", 10, true, "queued"),
			admit(0, 2, 0, "a", 10, true, "queued"),
			admit(0, 3, 0, "a", 10, true, "refused queue_bytes_full 1s"),
			admit(0, 4, 0, "a", 10, false, "refused queue_bytes_full 1s"),
			next(0, "1"),
			admit(0, 3, 0, "a", 10, true, "queued"),
		}},
		{name: "tenant concurrency counts queued and running until done", cfg: func(c *Config) { c.Tenant.MaxConcurrent = 2 }, steps: []step{
			admit(0, 1, 0, "a", 10, false, "dispatch"),
			admit(0, 2, 0, "a", 10, true, "queued"),
			admit(0, 3, 0, "a", 10, true, "refused tenant_concurrency 1s"),
			admit(0, 4, 0, "b", 10, true, "queued"),
			next(sec, "2"),
			admit(sec, 3, 0, "a", 10, true, "refused tenant_concurrency 1s"),
			{at: 2 * sec, op: "done", it: Item{Tenant: "a"}, want: "true"},
			admit(2*sec, 3, 0, "a", 10, true, "queued"),
			{at: 3 * sec, op: "remove", id: 3, want: "3"},
			admit(3*sec, 5, 0, "a", 10, true, "queued"),
			{at: 3 * sec, op: "done", it: Item{Tenant: "nobody"}, want: "false"},
		}},
		{name: "per-tenant override", cfg: func(c *Config) {
			c.Tenant.MaxConcurrent = 1
			c.Tenants = map[string]TenantLimits{"vip": {}}
		}, steps: []step{
			admit(0, 1, 0, "vip", 10, true, "queued"),
			admit(0, 2, 0, "vip", 10, true, "queued"),
			admit(0, 3, 0, "a", 10, true, "queued"),
			admit(0, 4, 0, "a", 10, true, "refused tenant_concurrency 1s"),
		}},
		{name: "tenant tokens per minute with retry after", cfg: func(c *Config) { c.Tenant.TokensPerMinute = 600 }, steps: []step{
			// 600 a minute is 10 a second with a burst of 600.
			admit(0, 1, 0, "a", 500, false, "dispatch"),
			admit(0, 2, 0, "a", 200, false, "refused tenant_rate 10s"),
			admit(0, 3, 0, "b", 200, true, "queued"),
			admit(5*sec, 2, 0, "a", 200, true, "refused tenant_rate 5s"),
			admit(10*sec, 2, 0, "a", 200, true, "queued"),
			// A request larger than the burst costs the whole burst.
			admit(10*sec, 4, 0, "c", 5000, true, "queued"),
			admit(10*sec, 5, 0, "c", 1, true, "refused tenant_rate 100ms"),
		}},
		{name: "expiry hands back the oldest, in admission order", cfg: func(c *Config) { c.MaxQueueTime, c.StandingQueueTime = 10*sec, 0 }, steps: []step{
			admit(0, 1, 0, "a", 10, true, "queued"),
			admit(sec, 2, 5, "b", 10, true, "queued"),
			admit(2*sec, 3, 0, "a", 10, true, "queued"),
			{at: 9 * sec, op: "expire", want: ""},
			{at: 11 * sec, op: "expire", want: "1 2"},
			next(11*sec, "3"),
			{at: 30 * sec, op: "expire", want: ""},
		}},
		{name: "a standing backlog shortens the wait", cfg: func(c *Config) {
			c.MaxQueueTime, c.StandingAfter, c.StandingQueueTime = 60*sec, 20*sec, 5*sec
		}, steps: []step{
			// Queued from 0 without a break: until +20s requests wait up
			// to 60s, then those that waited 5s go at once.
			admit(0, 1, 0, "a", 10, true, "queued"),
			{at: sec, op: "nextexpiry", want: "+20s"},
			admit(10*sec, 2, 0, "a", 10, true, "queued"),
			admit(18*sec, 3, 0, "a", 10, true, "queued"),
			{at: 19 * sec, op: "expire", want: ""},
			{at: 20 * sec, op: "expire", want: "1 2"},
			{at: 20 * sec, op: "nextexpiry", want: "+23s"},
			{at: 23 * sec, op: "expire", want: "3"},
			{at: 23 * sec, op: "nextexpiry", want: "none"},
			// Emptied, the queue starts a new backlog: 60s again until it
			// has stood 20s.
			admit(30*sec, 4, 0, "a", 10, true, "queued"),
			{at: 31 * sec, op: "nextexpiry", want: "+50s"},
			next(32*sec, "4"),
			admit(40*sec, 5, 0, "a", 10, true, "queued"),
			{at: 59 * sec, op: "expire", want: ""},
			{at: 60 * sec, op: "expire", want: "5"},
		}},
		{name: "a standing backlog goes newest first", cfg: func(c *Config) {
			c.MaxQueueTime, c.StandingAfter, c.StandingQueueTime, c.LIFOAfter = 60*sec, 10*sec, 5*sec, 30*sec
		}, steps: []step{
			admit(0, 1, 0, "a", 10, true, "queued"),
			admit(6*sec, 2, 0, "a", 10, true, "queued"),
			admit(7*sec, 3, 0, "a", 10, true, "queued"),
			next(8*sec, "1"), // a burst: first come, first served
			admit(9*sec, 4, 0, "a", 10, true, "queued"),
			next(10*sec+sec/2, "4"), // standing since 10s: newest first
			{at: 11 * sec, op: "expire", want: "2"},
			next(11*sec, "3"),
		}},
		{name: "removal from the head, middle and tail", steps: []step{
			admit(0, 1, 0, "a", 10, true, "queued"),
			admit(0, 2, 0, "a", 10, true, "queued"),
			admit(0, 3, 0, "a", 10, true, "queued"),
			admit(0, 4, 0, "a", 10, true, "queued"),
			admit(0, 5, 0, "b", 10, true, "queued"),
			{at: sec, op: "remove", id: 2, want: "2"},
			{at: sec, op: "remove", id: 1, want: "1"},
			{at: sec, op: "remove", id: 4, want: "4"},
			{at: sec, op: "remove", id: 4, want: "missing"},
			next(sec, "3"), next(sec, "5"), next(sec, "none"),
			{at: sec, op: "remove", id: 5, want: "missing"},
		}},
		{name: "a tenant whose oldest waited lifo_after goes newest first", cfg: func(c *Config) { c.LIFOAfter = 5 * sec }, steps: []step{
			admit(0, 1, 0, "a", 10, true, "queued"),
			admit(sec, 2, 0, "a", 10, true, "queued"),
			admit(2*sec, 3, 0, "a", 10, true, "queued"),
			admit(2*sec, 4, 0, "b", 10, true, "queued"),
			next(3*sec, "1"), // waited 3 s: first come, first served
			next(6*sec, "4"), // the fair share: b's turn
			next(6*sec, "3"), // a's oldest (2) waited 5 s: its newest first
			next(6*sec, "2"),
			next(6*sec, "none"),
		}},
		{name: "lifo_after 0 keeps arrival order however long the wait", cfg: func(c *Config) { c.LIFOAfter = 0 }, steps: []step{
			admit(0, 1, 0, "a", 10, true, "queued"),
			admit(sec, 2, 0, "a", 10, true, "queued"),
			next(50*sec, "1"), next(50*sec, "2"),
		}},
		{name: "drain in dispatch order", steps: []step{
			admit(0, 1, 0, "a", 10, true, "queued"),
			admit(0, 2, 0, "a", 10, true, "queued"),
			admit(0, 3, 0, "b", 10, true, "queued"),
			admit(0, 4, 2, "c", 10, true, "queued"),
			admit(0, 5, -1, "c", 10, false, "queued"),
			{at: sec, op: "drain", want: "4 1 3 2 5"},
			next(sec, "none"),
			{at: sec, op: "drain", want: ""},
		}},
		{name: "duplicate and bad items", steps: []step{
			admit(0, 1, 0, "a", 10, true, "queued"),
			admit(0, 1, 0, "a", 10, true, "error "+ErrDuplicateID.Error()),
			admit(0, 2, 0, "a", -1, true, "error "+ErrBadItem.Error()),
		}},
		{name: "disabled dispatches everything", cfg: func(c *Config) {
			c.Enabled = false
			c.Tenant.MaxConcurrent = 1
		}, steps: []step{
			admit(0, 1, -1, "a", 10, true, "dispatch"),
			admit(0, 2, 0, "a", 10, true, "dispatch"),
			next(0, "none"),
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := DefaultConfig()
			if c.cfg != nil {
				c.cfg(&cfg)
			}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			run(t, New(cfg), c.steps)
		})
	}
}

// jain is Jain's fairness index of xs: 1 when all are equal, 1/n when one
// has everything.
func jain(xs []float64) float64 {
	var s, s2 float64
	for _, x := range xs {
		s += x
		s2 += x * x
	}
	return s * s / (float64(len(xs)) * s2)
}

// TestFairnessEqualBacklog: tenants with equal backlogs but requests of
// very different sizes receive equal tokens, where first come first served
// (the same arrivals, interleaved) gives them equal request counts.
func TestFairnessEqualBacklog(t *testing.T) {
	sizes := map[string]func(k int) int64{
		"small":  func(int) int64 { return 100 },
		"medium": func(int) int64 { return 1000 },
		"mixed":  func(k int) int64 { return int64(50 + (k*7919)%4000) },
		"large":  func(int) int64 { return 8000 },
	}
	names := []string{"small", "medium", "mixed", "large"}
	cfg := DefaultConfig()
	cfg.MaxQueued = 100_000
	q := New(cfg)
	var id uint64
	backlog := map[string]int64{}
	fcfs := map[string]float64{}
	var fcfsTotal float64
	for k := 0; k < 100_000; k++ {
		for _, n := range names {
			if backlog[n] >= 1_000_000 {
				continue
			}
			id++
			tok := sizes[n](k)
			backlog[n] += tok
			if _, err := q.Admit(Item{ID: id, Tenant: n, Tokens: tok}, true, t0.Add(time.Duration(id)*time.Millisecond)); err != nil {
				t.Fatal(err)
			}
			if fcfsTotal < 2_000_000 {
				fcfs[n] += float64(tok)
				fcfsTotal += float64(tok)
			}
		}
	}
	served := map[string]float64{}
	var total float64
	for k := 0; total < 2_000_000; k++ {
		it, ok := q.Next(t0.Add(time.Hour + time.Duration(k)*time.Millisecond))
		if !ok {
			t.Fatal("queue ran dry")
		}
		served[it.Tenant] += float64(it.Tokens)
		total += float64(it.Tokens)
	}
	var got, ref []float64
	for _, n := range names {
		got = append(got, served[n])
		ref = append(ref, fcfs[n])
	}
	j, jf := jain(got), jain(ref)
	t.Logf("tokens served after 2M: fair %v (Jain %.4f), first come first served %v (Jain %.4f)", got, j, ref, jf)
	if j < 0.999 {
		t.Errorf("Jain's index %.4f < 0.999", j)
	}
	if jf > 0.7 {
		t.Errorf("first come first served reference Jain %.4f: the test does not discriminate", jf)
	}
}

// TestFairnessFlooder: one tenant sends 10x the polite tenant's rate into a
// saturated pool that serves 4 requests a step; the polite tenant, asking
// for less than its half, is served as it arrives while the flood absorbs
// the wait. First come first served would make it wait behind the flood.
func TestFairnessFlooder(t *testing.T) {
	for _, floodTokens := range []int64{1000, 10_000} {
		t.Run(fmt.Sprintf("flood requests of %d tokens", floodTokens), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.MaxQueued = 1_000_000
			cfg.MaxQueuedBytes = 1 << 40
			q := New(cfg)
			const d = 100 * time.Millisecond
			var id uint64
			var maxWait time.Duration
			var politeServed, politeSent int
			for k := range 500 {
				now := t0.Add(time.Duration(k) * d)
				for range 10 {
					id++
					q.Admit(Item{ID: id, Tenant: "flood", Tokens: floodTokens}, true, now)
				}
				id++
				politeSent++
				q.Admit(Item{ID: id, Tenant: "polite", Tokens: 1000}, true, now)
				for range 4 {
					it, ok := q.Next(now)
					if !ok {
						t.Fatal("empty queue under a flood")
					}
					if it.Tenant == "polite" {
						politeServed++
						maxWait = max(maxWait, now.Sub(it.Enqueued))
					}
					q.Done(it.Tenant, it.Priority, now)
				}
			}
			st := q.Stats(t0.Add(500 * d))
			t.Logf("polite served %d of %d, longest wait %s; flood backlog %d", politeServed, politeSent, maxWait, st.Queued)
			if politeServed != politeSent {
				t.Errorf("polite served %d of %d", politeServed, politeSent)
			}
			if maxWait > 0 {
				t.Errorf("polite waited %s, want 0 (served in the step it arrived)", maxWait)
			}
		})
	}
}

// TestHundredThousand queues 100,000 requests of 3 priorities and 50
// tenants and drains them with Next: priorities never rise, each tenant's
// requests of a priority come out in admission order, and everything is
// forgotten afterwards.
func TestHundredThousand(t *testing.T) {
	const n = 100_000
	cfg := DefaultConfig()
	cfg.MaxQueued = n
	q := New(cfg)
	for i := range n {
		it := Item{ID: uint64(i), Priority: i % 3, Tenant: "t" + strconv.Itoa(i%50), Tokens: int64(100 + i%1000), Bytes: 1000}
		d, err := q.Admit(it, true, t0.Add(time.Duration(i)*time.Microsecond))
		if err != nil || d.Outcome != Queued {
			t.Fatalf("item %d: %+v %v", i, d, err)
		}
	}
	if d, _ := q.Admit(Item{ID: n, Tenant: "x"}, true, t0.Add(time.Second)); d.Reason != QueueFull {
		t.Fatalf("item past the bound: %+v", d)
	}
	st := q.Stats(t0.Add(time.Second))
	if st.Queued != n || st.Bytes != n*1000 || len(st.Classes) != 3 || len(st.ByTenant) != 50 {
		t.Fatalf("stats: %d queued, %d bytes, %d classes, %d tenants", st.Queued, st.Bytes, len(st.Classes), len(st.ByTenant))
	}
	last := map[string]uint64{}
	prio := 2
	seen := make([]bool, n)
	for k := range n {
		now := t0.Add(time.Second + time.Duration(k)*time.Microsecond)
		it, ok := q.Next(now)
		if !ok {
			t.Fatalf("empty after %d", k)
		}
		if it.Priority > prio {
			t.Fatalf("priority rose from %d to %d", prio, it.Priority)
		}
		prio = it.Priority
		key := it.Tenant + "/" + strconv.Itoa(it.Priority)
		if l, ok := last[key]; ok && it.ID <= l {
			t.Fatalf("%s: %d after %d", key, it.ID, l)
		}
		last[key] = it.ID
		seen[it.ID] = true
		q.Done(it.Tenant, it.Priority, now)
	}
	if i := slices.Index(seen, false); i >= 0 {
		t.Fatalf("item %d never dispatched", i)
	}
	if _, ok := q.Next(t0.Add(time.Hour)); ok {
		t.Fatal("queue not empty")
	}
	st = q.Stats(t0.Add(time.Hour))
	if st.Queued != 0 || st.Bytes != 0 || st.Tenants != 0 || len(q.bands) != 3 || len(q.ids) != 0 || q.idleF.n != 150 {
		t.Fatalf("left over: %+v, %d bands, %d ids, %d idle flows", st, len(q.bands), len(q.ids), q.idleF.n)
	}
}

// TestTenantBound: a client inventing tenant names fills MaxTenants and the
// rest share the overflow tenant, which gets one fair share: a tenant known
// before the flood still gets its half.
func TestTenantBound(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxTenants = 100
	cfg.MaxQueued = 20_000
	q := New(cfg)
	q.Admit(Item{ID: 0, Tenant: "polite", Tokens: 100}, true, t0)
	for i := 1; i <= 10_000; i++ {
		q.Admit(Item{ID: uint64(i), Tenant: "bot" + strconv.Itoa(i), Tokens: 100}, true, t0)
	}
	for i := 1; i <= 10; i++ {
		q.Admit(Item{ID: uint64(100_000 + i), Tenant: "polite", Tokens: 100}, true, t0)
	}
	if len(q.tenants) != 100 {
		t.Fatalf("%d tenants remembered, want 100", len(q.tenants))
	}
	st := q.Stats(t0)
	var over TenantStats
	for _, ts := range st.ByTenant {
		if ts.Tenant == OverflowTenant {
			over = ts
		}
	}
	if over.Queued != 10_000-99 {
		t.Fatalf("overflow holds %d, want %d", over.Queued, 10_000-99)
	}
	polite := 0
	var out []Item
	for k := range 200 {
		it, _ := q.Next(t0.Add(time.Duration(k) * time.Millisecond))
		out = append(out, it)
		if it.Tenant == "polite" {
			polite++
		}
	}
	if polite != 11 {
		t.Errorf("polite got %d of its 11 in the first 200 dispatches", polite)
	}
	if n := len(q.Drain()); n != 10_011-200 {
		t.Errorf("drained %d", n)
	}
	// Dispatched requests hold their tenants until Done; then, without a
	// rate limiter, they are forgotten.
	for _, it := range out {
		if !q.Done(it.Tenant, it.Priority, t0.Add(time.Second)) {
			t.Errorf("done %s: no slot", it.Tenant)
		}
	}
	if st := q.Stats(t0.Add(time.Second)); st.Tenants != 0 || len(st.ByTenant) != 0 {
		t.Fatalf("after Done: %d tenants, %+v", st.Tenants, st.ByTenant)
	}
	if q.idleF.n > cfg.MaxTenants {
		t.Fatalf("%d idle flows", q.idleF.n)
	}
}

// TestInventedPriorities: each priority in use has its state, but once
// emptied only keptBands priorities are remembered.
func TestInventedPriorities(t *testing.T) {
	q := New(DefaultConfig())
	for i := range 1000 {
		q.Admit(Item{ID: uint64(i), Priority: i, Tenant: "t" + strconv.Itoa(i%3)}, true, t0)
	}
	if len(q.bands) != 1000 {
		t.Fatalf("%d bands", len(q.bands))
	}
	prio := 1000
	for k := range 1000 {
		it, ok := q.Next(t0.Add(time.Duration(k)))
		if !ok || it.Priority >= prio {
			t.Fatalf("next %d: %+v %v after priority %d", k, it, ok, prio)
		}
		prio = it.Priority
		q.Done(it.Tenant, it.Priority, t0)
	}
	if len(q.bands) != keptBands || q.idleF.n > keptBands*3 {
		t.Fatalf("%d bands, %d idle flows remembered", len(q.bands), q.idleF.n)
	}
}

// TestRateLimitedTenantForgottenWhenRefilled: a tenant's limiter is kept
// while it owes tokens and dropped once a fresh one would be the same, so a
// tenant cannot reset its limit by going idle, and idle tenants do not pile up.
func TestRateLimitedTenantForgottenWhenRefilled(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Tenant.TokensPerMinute = 6000
	q := New(cfg)
	steps := []struct {
		at      time.Duration
		tenants int
	}{{0, 1}, {30 * time.Second, 1}, {59 * time.Second, 1}, {61 * time.Second, 0}}
	q.Admit(Item{ID: 1, Tenant: "a", Tokens: 6000}, false, t0)
	q.Done("a", 0, t0)
	for _, s := range steps {
		q.Next(t0.Add(s.at))
		if got := q.Stats(t0.Add(s.at)).Tenants; got != s.tenants {
			t.Errorf("at +%s: %d tenants, want %d", s.at, got, s.tenants)
		}
	}
}

func TestStats(t *testing.T) {
	q := New(DefaultConfig())
	q.Admit(Item{ID: 1, Priority: 1, Tenant: "a", Bytes: 10}, true, t0)
	q.Admit(Item{ID: 2, Priority: 0, Tenant: "b", Bytes: 20}, true, t0.Add(time.Second))
	q.Admit(Item{ID: 3, Priority: 0, Tenant: "a", Bytes: 30}, true, t0.Add(2*time.Second))
	q.Admit(Item{ID: 4, Priority: -1, Tenant: "a"}, true, t0.Add(2*time.Second))
	q.Admit(Item{ID: 5, Priority: 2, Tenant: "c"}, false, t0.Add(2*time.Second))
	got := q.Stats(t0.Add(5 * time.Second))
	want := Stats{Queued: 3, Bytes: 60, OldestWait: 5 * time.Second, Tenants: 3,
		Classes: []ClassStats{{1, 1, 10, 5 * time.Second}, {0, 2, 50, 4 * time.Second}},
		ByTenant: []TenantStats{{"a", 2, 40, 0, 5 * time.Second}, {"b", 1, 20, 0, 4 * time.Second},
			{"c", 0, 0, 1, 0}},
		Admitted: 4, Dispatched: 1, Refused: map[Reason]uint64{Shed: 1}}
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

// TestOverflowNameCollision: a tenant really named OverflowTenant shares
// the overflow's flow, but each request is counted against its own tenant.
func TestOverflowNameCollision(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxTenants = 1
	q := New(cfg)
	q.Admit(Item{ID: 1, Tenant: OverflowTenant, Bytes: 5}, true, t0)
	q.Admit(Item{ID: 2, Tenant: "late", Bytes: 7}, true, t0)
	q.Admit(Item{ID: 3, Tenant: OverflowTenant, Bytes: 11}, true, t0)
	var got []string
	for range 3 {
		it, _ := q.Next(t0)
		got = append(got, strconv.FormatUint(it.ID, 10))
		if !q.Done(it.Tenant, it.Priority, t0) {
			t.Errorf("done %q: no slot", it.Tenant)
		}
	}
	if strings.Join(got, " ") != "1 2 3" {
		t.Errorf("order %v", got)
	}
	if st := q.Stats(t0); st.Queued != 0 || len(st.ByTenant) != 0 || st.Tenants != 0 || q.overflow.queued != 0 {
		t.Errorf("left over: %+v", st)
	}
}

// TestFavoured: a tenant over an equal share of the requests in flight, or
// a request while a higher priority has some outstanding (Outranked), may
// not take the reserve; once the higher one is done it may again.
func TestFavoured(t *testing.T) {
	q := New(DefaultConfig())
	dispatch := func(id uint64, prio int, tenant string) {
		t.Helper()
		if d, err := q.Admit(Item{ID: id, Priority: prio, Tenant: tenant, Tokens: 10}, false, t0); err != nil || d.Outcome != Dispatch {
			t.Fatalf("admit %d: %v, %v", id, d.Outcome, err)
		}
	}
	type fav struct{ favoured, contested bool }
	check := func(what, tenant string, prio int, want fav) {
		t.Helper()
		r := q.Rank(tenant, prio)
		if got := (fav{r.Favoured, r.Contested}); got != want {
			t.Errorf("%s: Rank(%q, %d) = %+v, want %+v", what, tenant, prio, got, want)
		}
		// Outranked is the priority's part of not being favoured.
		if r.Outranked != strings.HasPrefix(what, "below") {
			t.Errorf("%s: Rank(%q, %d).Outranked = %v", what, tenant, prio, r.Outranked)
		}
	}
	check("empty queue", "a", 0, fav{true, false})
	dispatch(1, 0, "a")
	dispatch(2, 0, "a")
	check("the only tenant", "a", 0, fav{true, false})
	check("a second tenant", "b", 0, fav{true, true})
	dispatch(3, 0, "b")
	check("two of three in flight", "a", 0, fav{false, true})
	check("one of three in flight", "b", 0, fav{true, true})
	dispatch(4, 5, "b")
	check("below a higher priority", "b", 0, fav{false, true})
	check("the higher priority", "b", 5, fav{true, true})
	q.Done("b", 5, t0)
	check("the higher priority done", "b", 0, fav{true, true})
}

// TestPeekAndTake: Peek lists the request Next would return and those
// behind it in its flow, in the order Next would reach them; Take
// dispatches one of them out of turn, leaving the others in order, and
// refuses a request of a flow whose turn it is not.
func TestPeekAndTake(t *testing.T) {
	q := New(DefaultConfig())
	for i, tenant := range []string{"x", "x", "x", "y"} {
		if _, err := q.Admit(Item{ID: uint64(i + 1), Tenant: tenant, Tokens: 1, Enqueued: t0}, true, t0); err != nil {
			t.Fatal(err)
		}
	}
	ids := func(items []Item) []uint64 {
		var out []uint64
		for _, it := range items {
			out = append(out, it.ID)
		}
		return out
	}
	if got := ids(q.Peek(t0, 8, nil)); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Fatalf("Peek = %v, want [1 2 3] (tenant x's flow)", got)
	}
	if got := ids(q.Peek(t0, 2, nil)); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("Peek(2) = %v, want [1 2]", got)
	}
	if _, ok := q.Take(t0, 4); ok {
		t.Fatal("took tenant y's request while it is x's turn")
	}
	if it, ok := q.Take(t0, 2); !ok || it.ID != 2 {
		t.Fatalf("Take(2) = %v, %v", it.ID, ok)
	}
	var order []uint64
	for {
		it, ok := q.Next(t0)
		if !ok {
			break
		}
		order = append(order, it.ID)
	}
	if !slices.Equal(order, []uint64{4, 1, 3}) {
		t.Fatalf("then Next gave %v, want [4 1 3]: y's turn after x's dispatch, then x in order", order)
	}
	// Newest first once the oldest has waited lifo_after: Peek follows.
	q2 := New(DefaultConfig())
	for i := range 3 {
		q2.Admit(Item{ID: uint64(i + 1), Tenant: "x", Tokens: 1, Enqueued: t0}, true, t0)
	}
	late := t0.Add(DefaultLIFOAfter)
	if got := ids(q2.Peek(late, 8, nil)); !slices.Equal(got, []uint64{3, 2, 1}) {
		t.Fatalf("Peek after lifo_after = %v, want [3 2 1]", got)
	}
}
