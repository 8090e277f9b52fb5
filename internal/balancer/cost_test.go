package balancer

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/llmlb/llmlb/internal/policy"
	"github.com/llmlb/llmlb/internal/testutil/policyspy"
	"github.com/llmlb/llmlb/internal/tokenize"
)

// costProfile is a request of n blocks: shared of family, then own ones.
func costProfile(family string, shared, own int) *Profile {
	keys := make([]uint64, 0, shared+own)
	for i := range shared {
		keys = append(keys, tokenize.KeyOfText(family+string(rune('A'+i))))
	}
	for i := range own {
		keys = append(keys, tokenize.KeyOfText(family+"/own/"+string(rune('a'+i))))
	}
	p := tokenize.FromBlockKeys(len(keys)*tokenize.BlockSize, keys)
	return &Profile{PromptTokens: p.Tokens, PromptBlocks: p.Blocks}
}

func costFleet(t *testing.T, n int) *Balancer {
	return newFleet(t, n, func(c *Config) { c.Policy = "cost" })
}

func TestCostPendingPrefillUntilFirstToken(t *testing.T) {
	b := costFleet(t, 2)
	res, err := b.Select(costProfile("x", 100, 0), t0)
	if err != nil {
		t.Fatal(err)
	}
	if res.Explanation.PrefillTokens != 1600 {
		t.Fatalf("prefill = %d, want 1600", res.Explanation.PrefillTokens)
	}
	pending := func(at time.Time) float64 {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.pending(res.rep, at)
	}
	if got := pending(t0); got != 1600 {
		t.Fatalf("pending at once = %v, want 1600", got)
	}
	// The fluid bound: at the prior 10K tokens/s plus a 30 ms step per
	// 2,048-token chunk, 1,600 tokens drain at 1/(30ms/2048 + 1/10000)
	// = 8,723 tokens/s: about 902 are left after 80 ms.
	if got := pending(t0.Add(80 * time.Millisecond)); got < 890 || got > 915 {
		t.Fatalf("pending after 80 ms = %v, want ~902", got)
	}
	if got := pending(t0.Add(time.Second)); got != 0 {
		t.Fatalf("pending after 1 s = %v, want 0", got)
	}
	b.FirstToken(res, time.Time{})
	b.FirstToken(res, time.Time{}) // twice is harmless
	if got := pending(t0); got != 0 {
		t.Fatalf("pending after the first token = %v, want 0", got)
	}
	// The computed prompt's KV stays held while the request runs.
	b.mu.Lock()
	if got := res.rep.heldPrefill; got != 1600 {
		b.mu.Unlock()
		t.Fatalf("held after the first token = %v, want 1600", got)
	}
	b.mu.Unlock()
	b.Release(res, OutcomeOK, t0)
	b.mu.Lock()
	defer b.mu.Unlock()
	if r := res.rep; r.pendingRequests != 0 || r.pendingPrefill != 0 || r.heldPrefill != 0 {
		t.Fatalf("after release: %d requests, %v tokens pending, %v held", r.pendingRequests, r.pendingPrefill, r.heldPrefill)
	}
}

func TestCostReleaseRetiresPending(t *testing.T) {
	b := costFleet(t, 1)
	res, _ := b.Select(costProfile("x", 10, 0), t0)
	b.Release(res, OutcomeCanceled, t0)
	b.mu.Lock()
	defer b.mu.Unlock()
	if res.rep.pendingRequests != 0 || res.rep.pendingPrefill != 0 {
		t.Fatal("a released request still counts as pending prefill")
	}
}

func TestLearnedRates(t *testing.T) {
	b := costFleet(t, 2)
	snap := Snapshot{KVCacheTokens: 160_000}
	b.ObserveScrape("a", snap, nil, t0)
	// 3 s later: 40,000 prompt tokens of which 10,000 hit, in 1.5 s of
	// prefill; 1,000 output tokens 25 s apart in all.
	snap.PromptTokens, snap.PrefixHits, snap.PrefillSeconds, snap.PrefillCount = 40_000, 10_000, 1.5, 10
	snap.DecodeSeconds, snap.DecodeCount = 25, 1000
	b.ObserveScrape("a", snap, nil, t0.Add(3*time.Second))
	b.mu.Lock()
	ra, rb := b.byName["a"], b.byName["b"]
	rate, stepA, stepB := b.prefillRate(ra), b.decodeStep(ra), b.decodeStep(rb)
	b.mu.Unlock()
	// 30,000 computed tokens in 1.5 s of prefill, less one 25 ms step for
	// each of the 10 requests: 30,000 / 1.25 s.
	if rate != 24_000 {
		t.Fatalf("prefill rate = %v, want 30,000 computed / (1.5 s - 10 x 25 ms) = 24,000", rate)
	}
	if stepA != 0.025 || stepB != 0.025 {
		t.Fatalf("decode steps = %v, %v; want a's 25 ms, and the fleet median for b", stepA, stepB)
	}
	res, _ := b.Select(costProfile("y", 4, 0), t0.Add(3*time.Second))
	if res.Explanation.Estimate <= 0 {
		t.Fatal("no estimate in the explanation")
	}
}

func TestCostRestartForgetsTheCache(t *testing.T) {
	b := costFleet(t, 2)
	snap := Snapshot{PromptTokens: 5000, PrefillCount: 5, PrefillSeconds: 1}
	for _, n := range []string{"a", "b"} {
		b.ObserveScrape(n, snap, nil, t0)
		b.ObserveScrape(n, snap, nil, t0)
	}
	first, _ := b.Select(costProfile("x", 50, 0), t0)
	b.Release(first, OutcomeOK, t0)
	again, _ := b.Select(costProfile("x", 50, 1), t0)
	b.Release(again, OutcomeOK, t0)
	if again.Replica != first.Replica || again.Explanation.CachedTokens == 0 {
		t.Fatalf("the second request did not follow the cache: %+v", again.Explanation)
	}
	// The replica restarts: its counters start again from 0.
	b.ObserveScrape(first.Replica, Snapshot{}, nil, t0.Add(time.Second))
	after, _ := b.Select(costProfile("x", 50, 2), t0.Add(time.Second))
	if after.Explanation.CachedTokens != 0 {
		t.Fatalf("matched %d tokens on a replica whose counters went back", after.Explanation.CachedTokens)
	}
}

func TestCostExplainDetail(t *testing.T) {
	b := costFleet(t, 3)
	res, _ := b.Select(costProfile("x", 5, 0), t0)
	if res.Explanation.Detail != "" {
		t.Fatal("detail without SetExplain")
	}
	b.SetExplain(true)
	res, _ = b.Select(costProfile("x", 5, 1), t0)
	for _, name := range []string{"a ttft=", "b ttft=", "c ttft="} {
		if !strings.Contains(res.Explanation.Detail, name) {
			t.Fatalf("detail %q lacks %q", res.Explanation.Detail, name)
		}
	}
	var keys []string
	for _, a := range res.Explanation.LogAttrs() {
		keys = append(keys, a.Key)
	}
	if !strings.Contains(strings.Join(keys, ","), "estimate") || !strings.Contains(strings.Join(keys, ","), "candidates_detail") {
		t.Fatalf("log attributes %v lack the estimate and the candidates' detail", keys)
	}
}

// TestLyingMetricsAreIgnored: a replica exporting an absurd decode step,
// prefill rate or KV capacity teaches the balancer nothing from it.
func TestLyingMetricsAreIgnored(t *testing.T) {
	b := costFleet(t, 2)
	lie := Snapshot{KVCacheTokens: 1e30}
	b.ObserveScrape("a", lie, nil, t0)
	lie.PromptTokens, lie.PrefillSeconds, lie.PrefillCount = 1e15, 1e-6, 1
	lie.DecodeSeconds, lie.DecodeCount = 1e-9, 1000 // 1 ps a token
	b.ObserveScrape("a", lie, nil, t0.Add(3*time.Second))
	b.mu.Lock()
	defer b.mu.Unlock()
	a := b.byName["a"]
	if a.rates.decode != 0 || b.fleetPrefill.rate() != 0 {
		t.Fatalf("learned decode step %v, prefill rate %v from absurd samples", a.rates.decode, b.fleetPrefill.rate())
	}
	if a.snap.KVCacheTokens != maxKVCacheTokens {
		t.Fatalf("KV capacity %v, want it capped at %v", a.snap.KVCacheTokens, float64(maxKVCacheTokens))
	}
}

// oneReplicaWith returns a balancer with policy p and one LIVE replica "a".
func oneReplicaWith(t *testing.T, p policy.Policy) *Balancer {
	t.Helper()
	b, err := NewWithPolicy(DefaultConfig(), p)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.AddReplica(ReplicaSpec{Name: "a", URL: "http://a"}, t0); err != nil {
		t.Fatal(err)
	}
	b.ObserveScrape("a", Snapshot{}, nil, t0)
	return b
}

func TestReleaseTellsThePolicyOnlyWhatFinished(t *testing.T) {
	spy := &policyspy.Finishes{}
	b := oneReplicaWith(t, spy)
	// A 4xx (OutcomeRejected) served nothing: the replica's cache did not
	// take the prompt.
	for _, o := range []Outcome{OutcomeOK, OutcomeServerError, OutcomeTransportError, OutcomeCanceled, OutcomeRejected, OutcomeOK} {
		res, err := b.Select(costProfile("x", 3, 0), t0)
		if err != nil {
			t.Fatal(err)
		}
		b.Release(res, o, t0)
		b.Release(res, o, t0) // twice: once
	}
	// A request without blocks tells nothing.
	res, _ := b.Select(&Profile{PromptTokens: 10}, t0)
	b.Release(res, OutcomeOK, t0)
	if diff := cmp.Diff([]string{"a:3", "a:3"}, spy.Calls()); diff != "" {
		t.Fatalf("Finished calls (-want +got):\n%s", diff)
	}
}

// runSpy records the RunObserver calls.
type runSpy struct {
	policyspy.Finishes
	next  uint64
	calls []string
}

func (s *runSpy) Started(replica string, blocks []uint64) uint64 {
	s.next++
	s.calls = append(s.calls, fmt.Sprintf("start %s:%d -> %d", replica, len(blocks), s.next))
	return s.next
}

func (s *runSpy) Ended(token uint64) { s.calls = append(s.calls, fmt.Sprintf("end %d", token)) }

func TestRunningRequestsArePinnedFromFirstTokenToRelease(t *testing.T) {
	spy := &runSpy{}
	b := oneReplicaWith(t, spy)
	// Started once at the first token, Ended at release whatever the
	// outcome; none for a request released before it ran or without blocks.
	for _, o := range []Outcome{OutcomeOK, OutcomeServerError, OutcomeCanceled} {
		res, _ := b.Select(costProfile("x", 3, 0), t0)
		b.FirstToken(res, time.Time{})
		b.FirstToken(res, time.Time{})
		b.Release(res, o, t0)
		b.Release(res, o, t0)
		b.FirstToken(res, time.Time{}) // after release: nothing
	}
	waited, _ := b.Select(costProfile("x", 3, 0), t0)
	b.Release(waited, OutcomeCanceled, t0)
	b.FirstToken(waited, time.Time{})
	bare, _ := b.Select(&Profile{PromptTokens: 10}, t0)
	b.FirstToken(bare, time.Time{})
	b.Release(bare, OutcomeOK, t0)
	want := []string{"start a:3 -> 1", "end 1", "start a:3 -> 2", "end 2", "start a:3 -> 3", "end 3"}
	if diff := cmp.Diff(want, spy.calls); diff != "" {
		t.Fatalf("RunObserver calls (-want +got):\n%s", diff)
	}
}

// abortSpy records the AbortFollower calls.
type abortSpy struct {
	policyspy.Finishes
	aborted []string
}

func (s *abortSpy) Aborted(replica string, blocks []uint64) {
	s.aborted = append(s.aborted, fmt.Sprintf("%s:%d", replica, len(blocks)))
}

// TestReleaseTellsThePolicyWhatRanAndAborted: a request that had its first
// token and ended other than well is reported aborted (the engine freed
// its blocks), once; one that ended well, or never ran, is not. (Two
// errors in a row would eject the replica, and a fallback choice is no
// policy's: one of each.)
func TestReleaseTellsThePolicyWhatRanAndAborted(t *testing.T) {
	spy := &abortSpy{}
	b := oneReplicaWith(t, spy)
	for _, o := range []Outcome{OutcomeOK, OutcomeServerError, OutcomeTransportError, OutcomeCanceled} {
		ran, err := b.Select(costProfile("x", 3, 0), t0)
		if err != nil {
			t.Fatalf("%v: %v", o, err)
		}
		b.FirstToken(ran, t0)
		b.Release(ran, o, t0)
		b.Release(ran, o, t0) // twice: once
	}
	// No first token: cancelled (PendingFollower), not aborted.
	waited, _ := b.Select(costProfile("y", 2, 0), t0)
	b.Release(waited, OutcomeCanceled, t0)
	if diff := cmp.Diff([]string{"a:3", "a:3", "a:3"}, spy.aborted); diff != "" {
		t.Fatalf("Aborted calls (-want +got):\n%s", diff)
	}
}

// TestCostKeepsARunningPromptCached: a running request's blocks stay in the
// replica's cache (vLLM does not evict them) while other prompts churn it,
// so its session's next turn still finds them there.
func TestCostKeepsARunningPromptCached(t *testing.T) {
	b := newFleet(t, 1, func(c *Config) {
		c.Policy = "cost"
		c.Cost.KVCacheTokens = 64 * tokenize.BlockSize
	})
	long, _ := b.Select(costProfile("long", 40, 0), t0)
	b.FirstToken(long, time.Time{})
	for i := range 4 { // 80 new blocks through a 64-block cache
		other, _ := b.Select(costProfile(fmt.Sprintf("churn%d", i), 20, 0), t0)
		b.FirstToken(other, time.Time{})
		b.Release(other, OutcomeOK, t0)
	}
	next, _ := b.Select(costProfile("long", 40, 1), t0)
	if got := next.Explanation.CachedTokens; got != 40*tokenize.BlockSize {
		t.Fatalf("the running prompt's next turn found %d cached tokens, want %d", got, 40*tokenize.BlockSize)
	}
	b.Release(next, OutcomeOK, t0)
	b.Release(long, OutcomeOK, t0)
}

// Each release gives back its own request's held KV: with two requests on
// one replica, the one left still holds its prefill.
func TestCostReleaseReturnsItsHeldKV(t *testing.T) {
	b := costFleet(t, 1)
	first, err := b.Select(costProfile("x", 100, 0), t0)
	if err != nil {
		t.Fatal(err)
	}
	second, err := b.Select(costProfile("y", 50, 0), t0)
	if err != nil {
		t.Fatal(err)
	}
	b.Release(first, OutcomeCanceled, t0)
	b.mu.Lock()
	defer b.mu.Unlock()
	if got, want := second.rep.heldPrefill, float64(second.Explanation.PrefillTokens); got != want || want == 0 {
		t.Fatalf("held after releasing the first = %v, want the second's %v", got, want)
	}
}

// TestCostForgetsPromptsTheReplicaTurnedAway: a prompt whose request the
// replica refused or rejected before its first token is not expected in
// that replica's cache; one that ran (a first token, then a broken stream)
// is, and so is one the client gave up on.
func TestCostForgetsPromptsTheReplicaTurnedAway(t *testing.T) {
	for _, c := range []struct {
		name    string
		started bool
		outcome Outcome
		cached  bool
	}{
		{"rejected 4xx", false, OutcomeRejected, false},
		{"5xx", false, OutcomeServerError, false},
		{"refused", false, OutcomeTransportError, false},
		{"broken after its first token", true, OutcomeTransportError, true},
		{"cancelled by the client", false, OutcomeCanceled, true},
		{"served", false, OutcomeOK, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := costFleet(t, 1)
			first, err := b.Select(costProfile("x", 8, 2), t0)
			if err != nil {
				t.Fatal(err)
			}
			if c.started {
				b.FirstToken(first, time.Time{})
			}
			b.Release(first, c.outcome, t0)
			again, err := b.Select(costProfile("x", 8, 4), t0)
			if err != nil {
				t.Fatal(err)
			}
			want := 0
			if c.cached {
				want = 10 * tokenize.BlockSize
			}
			if got := again.Explanation.CachedTokens; got != want {
				t.Fatalf("cached tokens after %s = %d, want %d", c.name, got, want)
			}
		})
	}
}

// waitingSpy records what each decision's candidate was told of requests
// queued by others.
type waitingSpy struct {
	policyspy.Finishes
	others []float64
}

func (s *waitingSpy) Choose(r *policy.Request, cands []policy.Candidate, now time.Time) policy.Choice {
	s.others = append(s.others, cands[0].OthersWaiting)
	c := s.Finishes.Choose(r, cands, now)
	c.PrefillTokens = r.PromptTokens // pending until its first token, as cost's
	return c
}

// A scrape's queue is compared with the requests the balancer had pending
// at that scrape: own requests that got their first token since do not
// turn the scrape's waiting ones into phantom requests of others.
func TestOthersWaitingIsFixedAtTheScrape(t *testing.T) {
	spy := &waitingSpy{}
	b := oneReplicaWith(t, spy)
	var mine []*Reservation
	for range 3 {
		res, err := b.Select(costProfile("x", 2, 0), t0)
		if err != nil {
			t.Fatal(err)
		}
		mine = append(mine, res)
	}
	// The engine shows our three waiting, plus one from elsewhere.
	b.ObserveScrape("a", Snapshot{Waiting: 4}, nil, t0.Add(time.Second))
	for _, res := range mine {
		b.FirstToken(res, t0.Add(2*time.Second))
	}
	if _, err := b.Select(costProfile("y", 2, 0), t0.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]float64{0, 0, 0, 1}, spy.others); diff != "" {
		t.Fatalf("others waiting per decision (-want +got):\n%s", diff)
	}
}

// A replica that gets through prompts faster than the drain rate, in the
// order they were sent, has its pending prefill's bound restarted at each
// first token; one slower, or whose later prompts overtake earlier ones (an
// engine sharing its steps among prefills), keeps the bound it had.
func TestPendingPrefillBoundRestartsOnAFastReplica(t *testing.T) {
	for _, tc := range []struct {
		name  string
		gap   time.Duration // between first tokens
		order []int         // of the first five sent, by first token
		want  float64       // pending 1 s after the requests were sent
	}{
		// Five first tokens 100 ms apart: 16,000 tokens/s, above the
		// 8,723 drain rate (TestCostPendingPrefillUntilFirstToken). At
		// 0.5 s 8,000 tokens are owed, drained from then: 8,000 - 0.5 s
		// x 8,723 = 3,638 left at 1 s.
		{"fast", 100 * time.Millisecond, []int{0, 1, 2, 3, 4}, 3638},
		// 200 ms apart: 8,000 tokens/s. The bound stays where the ten
		// requests put it, 16,000 tokens from t0: 16,000 - 8,723 = 7,277
		// left at 1 s.
		{"slow", 200 * time.Millisecond, []int{0, 1, 2, 3, 4}, 7277},
		// As fast, but the second sent came first: out of order.
		{"overtaken", 100 * time.Millisecond, []int{1, 0, 2, 3, 4}, 7277},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := costFleet(t, 1)
			var sent []*Reservation
			for i := range 10 {
				res, err := b.Select(costProfile(fmt.Sprint("p", i), 100, 0), t0)
				if err != nil {
					t.Fatal(err)
				}
				if res.Explanation.PrefillTokens != 1600 {
					t.Fatalf("prefill = %d, want 1600", res.Explanation.PrefillTokens)
				}
				sent = append(sent, res)
			}
			for i, k := range tc.order {
				b.FirstToken(sent[k], t0.Add(time.Duration(i+1)*tc.gap))
			}
			b.mu.Lock()
			got := b.pending(sent[0].rep, t0.Add(time.Second))
			b.mu.Unlock()
			if got < tc.want-5 || got > tc.want+5 {
				t.Fatalf("pending at 1 s = %.0f, want about %.0f", got, tc.want)
			}
		})
	}
}
