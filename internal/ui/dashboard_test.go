package ui

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/health"
	"github.com/llmlb/llmlb/internal/policy"
	"github.com/llmlb/llmlb/internal/request"
	"github.com/llmlb/llmlb/internal/scrape"
)

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

// clock is a settable virtual clock, safe to read from the server's
// goroutines while the test sets it.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// newTestDashboard returns a dashboard over a balancer with replicas a, b, c
// (scraped once, idle) and its clock at t0.
func newTestDashboard(t *testing.T, opts Options) (*Dashboard, *balancer.Balancer, *clock) {
	t.Helper()
	cfg := balancer.DefaultConfig()
	cfg.Policy = policy.NameLLMLB // a policy with pins, which the dashboard shows
	bal, err := balancer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b", "c"} {
		if err := bal.AddReplica(balancer.ReplicaSpec{Name: name, URL: "http://" + name}, t0); err != nil {
			t.Fatal(err)
		}
		bal.ObserveScrape(name, balancer.Snapshot{}, nil, t0)
	}
	c := &clock{t: t0}
	opts.Balancer, opts.Now = bal, c.now
	return New(opts), bal, c
}

// route selects for p at now, records the decision like the proxy does and
// releases at once.
func route(t *testing.T, d *Dashboard, bal *balancer.Balancer, p *request.Profile, now time.Time) string {
	t.Helper()
	res, err := bal.Select(p, now)
	if err != nil {
		t.Fatal(err)
	}
	d.Decision(now, res, p, 1)
	bal.Release(res, balancer.OutcomeOK, now)
	return res.Replica
}

func TestSnapshotFleetFigures(t *testing.T) {
	d, bal, clk := newTestDashboard(t, Options{})
	// 30 requests over 10 s (3/s), ten of one session.
	for i := range 30 {
		p := &request.Profile{Model: "m", PromptTokens: 100 + i}
		if i%3 == 0 {
			p.SessionKey = "sess-A"
		}
		route(t, d, bal, p, t0.Add(time.Duration(i)*time.Second/3))
	}
	// 100 first bytes of 1..100 ms: p50 50 ms, p99 99 ms.
	clk.set(t0.Add(9500 * time.Millisecond)) // the 10 s window holds seconds 0..9
	for i := 1; i <= 100; i++ {
		d.FirstByte("a", time.Duration(i)*time.Millisecond)
	}
	d.Request("a", balancer.ReasonLoad, 200)
	d.Request("b", balancer.ReasonLoad, 503)
	d.StreamError("b")

	s := d.Snapshot(clk.now())
	f := s.Fleet
	if f.RequestsPerSecond != 3 {
		t.Errorf("requests/s = %v, want 3", f.RequestsPerSecond)
	}
	if f.TTFTSamples != 100 || f.TTFTp50Seconds != 0.050 || f.TTFTp99Seconds != 0.099 {
		t.Errorf("TTFT = %d samples, p50 %v, p99 %v; want 100, 0.05, 0.099", f.TTFTSamples, f.TTFTp50Seconds, f.TTFTp99Seconds)
	}
	if f.AnsweredPerMinute != 2 || f.ServerErrors != 1 || f.StreamErrors != 1 {
		t.Errorf("errors = %+v, want 2 answered, 1 5xx, 1 broken stream", f)
	}
	if f.Live != 3 || f.Ejected != 0 {
		t.Errorf("states live %d ejected %d, want 3 and 0", f.Live, f.Ejected)
	}
	var shares float64
	for _, r := range s.Replicas {
		shares += r.Share
		if len(r.ShareHistory) != DefaultShareBuckets {
			t.Errorf("%s has %d share buckets, want %d", r.Name, len(r.ShareHistory), DefaultShareBuckets)
		}
	}
	if shares < 0.999 || shares > 1.001 {
		t.Errorf("shares sum to %v, want 1", shares)
	}
	if got := len(s.Decisions); got != 30 {
		t.Fatalf("%d decisions, want 30", got)
	}
	if first := s.Decisions[0]; first.Seq != 30 || first.PromptTokens != 129 || first.Why == "" {
		t.Errorf("newest decision = %+v, want seq 30 with 129 tokens and an explanation", first)
	}
	var sessA int
	for _, rs := range s.Pins.ByReplica {
		for _, tc := range rs.Top {
			if tc.Session == "sess-A" {
				sessA += tc.Requests
			}
		}
	}
	if sessA != 10 || s.Pins.Session != 1 {
		t.Errorf("sess-A counted %d times with %d session pins, want 10 and 1", sessA, s.Pins.Session)
	}

	// A minute later the window is empty again.
	s = d.Snapshot(t0.Add(2 * time.Minute))
	if s.Fleet.RequestsPerSecond != 0 || s.Fleet.TTFTSamples != 0 {
		t.Errorf("two minutes on: %v requests/s, %d TTFT samples; want 0, 0", s.Fleet.RequestsPerSecond, s.Fleet.TTFTSamples)
	}
}

func TestSnapshotShowsEjectionTimesAndTransitions(t *testing.T) {
	d, bal, _ := newTestDashboard(t, Options{})
	at := t0.Add(5 * time.Second)
	ts := bal.ObserveScrape("c", balancer.Snapshot{}, errors.New("connection refused"), at)
	d.Transitions(ts)
	s := d.Snapshot(at.Add(10 * time.Second))
	c := s.Replicas[2]
	if c.Name != "c" || c.State != "EJECTED" || c.StateSeconds != 10 || c.CooldownLeftSeconds != 20 || c.Ejections != 1 {
		t.Errorf("c = %+v, want EJECTED for 10 s with 20 s of cooldown left", c)
	}
	if s.Fleet.Ejected != 1 || s.Fleet.Live != 2 {
		t.Errorf("fleet = %+v, want 2 LIVE and 1 EJECTED", s.Fleet)
	}
	if len(s.Transitions) != 1 {
		t.Fatalf("transitions = %+v, want one", s.Transitions)
	}
	tr := s.Transitions[0]
	if tr.Replica != "c" || tr.From != "LIVE" || tr.To != "EJECTED" || tr.CooldownSeconds != 30 || !strings.Contains(tr.Cause, "connection refused") {
		t.Errorf("transition = %+v", tr)
	}
}

func TestTransitionsRingKeepsTheLatest(t *testing.T) {
	d, _, _ := newTestDashboard(t, Options{})
	for i := range maxTransitions + 5 {
		d.Transitions([]balancer.Transition{{Replica: "a", Transition: health.Transition{
			From: health.Live, To: health.Ejected, Cause: string(rune('A' + i%26)), At: t0.Add(time.Duration(i) * time.Second)}}})
	}
	s := d.Snapshot(t0.Add(time.Hour))
	if len(s.Transitions) != maxTransitions {
		t.Fatalf("%d transitions, want %d", len(s.Transitions), maxTransitions)
	}
	if !s.Transitions[0].At.Equal(t0.Add(time.Duration(maxTransitions+4) * time.Second)) {
		t.Errorf("newest transition at %v, want the last one recorded", s.Transitions[0].At)
	}
}

func TestPrefixHitRate(t *testing.T) {
	d, _, _ := newTestDashboard(t, Options{})
	scr := func(name string, at time.Duration, q, h float64) {
		d.ScrapeResult(name, scrape.Result{PrefixCacheQueries: q, PrefixCacheHits: h, PrefixCacheKnown: true}, t0.Add(at))
	}
	scr("a", 0, 1000, 100)
	scr("a", 30*time.Second, 2000, 900) // 800 of 1000 new tokens cached
	scr("b", 0, 500, 0)                 // one sample: unknown yet
	scr("c", 0, 100, 50)
	scr("c", 3*time.Second, 100, 50) // nothing queried since
	s := d.Snapshot(t0.Add(30 * time.Second))
	if r := s.Replicas[0].PrefixHitRate; r == nil || *r != 0.8 {
		t.Errorf("a hit rate = %v, want 0.8", r)
	}
	for _, i := range []int{1, 2} {
		if r := s.Replicas[i].PrefixHitRate; r != nil {
			t.Errorf("%s hit rate = %v, want unknown", s.Replicas[i].Name, *r)
		}
	}
	// Older samples leave the window; a restart (counters going down)
	// starts over.
	scr("a", 2*time.Minute, 3000, 1900) // all 1000 new ones cached
	scr("a", 2*time.Minute+3*time.Second, 3100, 2000)
	s = d.Snapshot(t0.Add(2*time.Minute + 3*time.Second))
	if r := s.Replicas[0].PrefixHitRate; r == nil || *r != 1 {
		t.Errorf("a hit rate after a minute = %v, want 1 (the window's change)", r)
	}
	scr("a", 3*time.Minute, 10, 0)
	if r := d.Snapshot(t0.Add(3 * time.Minute)).Replicas[0].PrefixHitRate; r != nil {
		t.Errorf("a hit rate after a restart = %v, want unknown", *r)
	}
}

func TestExplain(t *testing.T) {
	tests := []struct {
		name    string
		reason  balancer.Reason
		attempt int
		e       balancer.Explanation
		want    string
	}{
		{"affinity", balancer.ReasonAffinity, 1,
			balancer.Explanation{Policy: "llmlb", Candidates: 3, CandidateSet: "no-wait", PinKind: "session", PinReplica: "a", PinDecision: "used", EffectiveRunning: 1},
			"session pin on a used; a had running 1.0, waiting 0.0 [policy llmlb]"},
		{"load with a spilled pin", balancer.ReasonLoad, 1,
			balancer.Explanation{Policy: "llmlb", Candidates: 2, CandidateSet: "live", MinRunning: 2, EffectiveRunning: 2, EffectiveWaiting: 1, PinKind: "prefix", PinReplica: "b", PinDecision: "spill: queue"},
			"least loaded of 2 (live), min running 2.0; a had running 2.0, waiting 1.0; prefix pin on b: spill: queue [policy llmlb]"},
		{"retry under another policy", balancer.ReasonLoad, 2,
			balancer.Explanation{Policy: "rr", Candidates: 4, CandidateSet: "routable"},
			"least loaded of 4 (routable), min running 0.0; a had running 0.0, waiting 0.0; attempt 2 after a failure before the first byte [policy rr]"},
		{"held by flow control", balancer.ReasonLoad, 1,
			balancer.Explanation{Policy: "cost", Candidates: 1, CandidateSet: "routable", EffectiveRunning: 3, Queued: 1250 * time.Millisecond},
			"least loaded of 1 (routable), min running 0.0; a had running 3.0, waiting 0.0; queued 1250 ms (every replica was full) [policy cost]"},
		{"fallback", balancer.ReasonFallback, 1, balancer.Explanation{Policy: "llmlb", CandidateSet: "fallback"},
			"fallback: no LIVE or PROBING replica, picked at random; a had running 0.0, waiting 0.0 [policy llmlb]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Explain(tc.reason, tc.attempt, "a", tc.e); got != tc.want {
				t.Errorf("Explain =\n %q\nwant\n %q", got, tc.want)
			}
		})
	}
}

func TestRedactedHidesSessionKeys(t *testing.T) {
	d, bal, _ := newTestDashboard(t, Options{Token: "secret"})
	route(t, d, bal, &request.Profile{SessionKey: "user_alice_session_1"}, t0)
	s := d.Snapshot(t0)
	r := s.redacted()
	if r.Authorized || !s.Authorized {
		t.Errorf("authorized: full %v, redacted %v", s.Authorized, r.Authorized)
	}
	if got := r.Decisions[0].Session; got != fingerprint("user_alice_session_1") || strings.Contains(got, "alice") {
		t.Errorf("redacted session = %q", got)
	}
	if s.Decisions[0].Session != "user_alice_session_1" {
		t.Errorf("redacting changed the full snapshot: %q", s.Decisions[0].Session)
	}
	for _, rs := range r.Pins.ByReplica {
		for _, tc := range rs.Top {
			if !strings.HasPrefix(tc.Session, "#") {
				t.Errorf("top session %q not redacted", tc.Session)
			}
		}
	}
}

// TestDecisionDoesNotAllocate guards the hot path: recording a decision is a
// copy into the ring (the profile's strings are cloned only when non-empty).
func TestDecisionDoesNotAllocate(t *testing.T) {
	d, bal, _ := newTestDashboard(t, Options{})
	p := &request.Profile{PromptTokens: 10}
	res, err := bal.Select(p, t0)
	if err != nil {
		t.Fatal(err)
	}
	d.Decision(t0, res, p, 1) // the bucket's map is made once
	if n := testing.AllocsPerRun(100, func() { d.Decision(t0, res, p, 1) }); n != 0 {
		t.Errorf("%v allocations per Decision, want 0", n)
	}
}

// BenchmarkDecision measures the dashboard's cost on the request path: one
// decision recorded, from every proxy goroutine at once.
func BenchmarkDecision(b *testing.B) {
	bal, err := balancer.New(balancer.DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	if err := bal.AddReplica(balancer.ReplicaSpec{Name: "a", URL: "http://a"}, t0); err != nil {
		b.Fatal(err)
	}
	d := New(Options{Balancer: bal})
	p := &request.Profile{Model: "m", SessionKey: "session-1", PromptTokens: 1000}
	res, err := bal.Select(p, t0)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			d.Decision(t0, res, p, 1)
		}
	})
}
