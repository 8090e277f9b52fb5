package balancer

import (
	"math"
	"testing"
	"time"
)

func TestTTFTTrackSummary(t *testing.T) {
	for _, tc := range []struct {
		name              string
		samples           [][2]float64 // predicted, measured
		wantErr, wantBias float64
		wantTotal         uint64
	}{
		{"none", nil, 0, 0, 0},
		{"exact", [][2]float64{{1, 1}, {0.2, 0.2}}, 0, 1, 2},
		// Ratios 0.5, 1, 2: errors 0.5, 0, 1.
		{"mixed", [][2]float64{{1, 2}, {1, 1}, {2, 1}}, 0.5, 1, 3},
		{"too slow", [][2]float64{{1, 4}, {1, 4}, {1, 2}}, 0.75, 0.25, 3},
		// No estimate (a policy without one), no time, or a bad value: skipped.
		{"skipped", [][2]float64{{0, 1}, {1, 0}, {math.NaN(), 1}, {math.Inf(1), 1}, {1, -1}}, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tr ttftTrack
			for _, s := range tc.samples {
				tr.add(s[0], s[1])
			}
			gotErr, gotBias := tr.summary()
			if math.Abs(gotErr-tc.wantErr) > 1e-9 || math.Abs(gotBias-tc.wantBias) > 1e-9 || tr.total != tc.wantTotal {
				t.Errorf("summary = %v, %v (%d samples), want %v, %v (%d)", gotErr, gotBias, tr.total, tc.wantErr, tc.wantBias, tc.wantTotal)
			}
		})
	}
}

func TestTTFTTrackWindow(t *testing.T) {
	var tr ttftTrack
	for range ttftWindow {
		tr.add(1, 4) // far off
	}
	for range ttftWindow {
		tr.add(1, 1) // then right: the old ones are forgotten
	}
	if e, r := tr.summary(); e != 0 || r != 1 || tr.total != 2*ttftWindow {
		t.Errorf("after a full window of exact estimates: error %v ratio %v total %d", e, r, tr.total)
	}
}

// TestPredictionErrorPerReplica: each streamed first token checks cost's
// estimate from the decision to the token, per replica; a second call, a
// call after release or one with a clock gone back adds nothing.
func TestPredictionErrorPerReplica(t *testing.T) {
	b := costFleet(t, 2)
	res, err := b.Select(costProfile("x", 100, 0), t0)
	if err != nil {
		t.Fatal(err)
	}
	est := res.Explanation.Estimate
	if est <= 0 {
		t.Fatalf("cost gave no estimate: %+v", res.Explanation)
	}
	at := t0.Add(time.Duration(2 * est * float64(time.Second))) // twice as slow as estimated
	b.FirstToken(res, at)
	b.FirstToken(res, at.Add(time.Hour))
	other, err := b.Select(costProfile("y", 10, 0), t0)
	if err != nil {
		t.Fatal(err)
	}
	b.FirstToken(other, t0.Add(-time.Second)) // clock went back: no sample
	late, err := b.Select(costProfile("z", 10, 0), t0)
	if err != nil {
		t.Fatal(err)
	}
	b.Release(late, OutcomeOK, t0.Add(time.Second))
	b.FirstToken(late, t0.Add(time.Second))

	for _, st := range b.Replicas(t0) {
		want := uint64(0)
		if st.Name == res.Replica {
			want = 1
		}
		if st.TTFTPredictions != want {
			t.Errorf("%s: %d predictions checked, want %d", st.Name, st.TTFTPredictions, want)
		}
		if st.Name == res.Replica && (math.Abs(st.TTFTPredictionError-0.5) > 1e-6 || math.Abs(st.TTFTPredictionRatio-0.5) > 1e-6) {
			t.Errorf("%s: error %v ratio %v, want 0.5 and 0.5", st.Name, st.TTFTPredictionError, st.TTFTPredictionRatio)
		}
	}
}

// TestSlotLimitForCost: what cost is told of each replica's running-slot
// limit, scrape by scrape: nothing at first; a queue held at the same
// running count over two scrapes (a queue at one, or at a moving count,
// is a full KV cache or a burst as often as the limit); while a replica
// preempts, the most it ran then (its KV-bound batch, its own only, until
// kvBoundScrapes scrapes pass without a preemption); then another
// replica's limit for one not known yet; flow control's, configured or
// learned over three scrapes, first.
func TestSlotLimitForCost(t *testing.T) {
	type scrape struct {
		replica          string
		running, waiting float64
		preemptions      float64 // vllm:num_preemptions_total
	}
	// quiet is kvBoundScrapes-1 scrapes of replica a without a preemption.
	quiet := func(running float64) []scrape {
		out := make([]scrape, kvBoundScrapes-1)
		for i := range out {
			out[i] = scrape{"a", running, 0, 9}
		}
		return out
	}
	for _, tc := range []struct {
		name       string
		maxRunning int // saturation.max_running
		scrapes    []scrape
		wantA      float64
		wantB      float64
	}{
		{"nothing seen", 0, nil, 0, 0},
		{"no queue", 0, []scrape{{"a", 12, 0, 0}, {"a", 14, 0, 0}}, 0, 0},
		{"one queued scrape", 0, []scrape{{"a", 12, 3, 0}}, 0, 0},
		{"queue at a moving count", 0, []scrape{{"a", 12, 3, 0}, {"a", 13, 2, 0}, {"a", 11, 4, 0}}, 0, 0},
		{"queue held at 16", 0, []scrape{{"a", 16, 3, 0}, {"a", 16, 5, 0}}, 16, 16},
		{"never below what ran freely", 0, []scrape{{"a", 20, 0, 0}, {"a", 16, 3, 0}, {"a", 16, 5, 0}}, 20, 20},
		{"the highest held queue", 0, []scrape{{"a", 8, 3, 0}, {"a", 8, 5, 0}, {"a", 0, 0, 0}, {"a", 16, 3, 0}, {"a", 16, 5, 0}}, 16, 16},
		{"each its own", 0, []scrape{{"a", 16, 3, 0}, {"a", 16, 5, 0}, {"b", 4, 1, 0}, {"b", 4, 2, 0}}, 16, 4},
		{"flow control's plateau", 0, []scrape{{"a", 16, 3, 0}, {"a", 16, 5, 0}, {"a", 16, 2, 0}, {"a", 0, 0, 0}, {"a", 4, 2, 0}, {"a", 4, 2, 0}}, 16, 16},
		{"configured", 32, []scrape{{"a", 16, 3, 0}, {"a", 16, 5, 0}}, 32, 32},
		{"preempting at 40", 0, []scrape{{"a", 30, 0, 0}, {"a", 40, 2, 5}}, 40, 0},
		{"the most run while preempting", 0, []scrape{{"a", 30, 0, 0}, {"a", 40, 2, 5}, {"a", 33, 6, 9}}, 40, 0},
		{"preempting, never below what ran freely", 0, []scrape{{"a", 48, 0, 0}, {"a", 40, 2, 5}}, 48, 0},
		{"held while it preempts", 0, append([]scrape{{"a", 30, 0, 0}, {"a", 40, 2, 5}, {"a", 33, 6, 9}}, quiet(30)...), 40, 0},
		{"ends after quiet scrapes", 0, append(append([]scrape{{"a", 30, 0, 0}, {"a", 40, 2, 5}, {"a", 33, 6, 9}}, quiet(30)...), scrape{"a", 30, 0, 9}), 0, 0},
		{"a held queue first", 0, []scrape{{"a", 20, 0, 0}, {"a", 24, 3, 5}, {"a", 24, 3, 9}}, 24, 24},
		{"not lent to others", 0, []scrape{{"a", 30, 0, 0}, {"a", 40, 2, 5}, {"b", 8, 1, 0}, {"b", 8, 2, 0}}, 40, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newFleet(t, 2, func(c *Config) { c.Policy = "cost"; c.Saturation.MaxRunning = tc.maxRunning })
			for i, s := range tc.scrapes {
				b.ObserveScrape(s.replica, Snapshot{Running: s.running, Waiting: s.waiting, Preemptions: s.preemptions}, nil, t0.Add(time.Duration(i+1)*3*time.Second))
			}
			b.mu.Lock()
			gotA, gotB := b.slotLimit(b.byName["a"]), b.slotLimit(b.byName["b"])
			b.mu.Unlock()
			if gotA != tc.wantA || gotB != tc.wantB {
				t.Errorf("slot limits a %v b %v, want %v and %v", gotA, gotB, tc.wantA, tc.wantB)
			}
		})
	}
}

// TestKVBoundCounter: the preemption counter on a replica's first scrape
// is its history, not a preemption seen (a balancer that starts beside a
// long-running engine), and one that went back is a restart.
func TestKVBoundCounter(t *testing.T) {
	var s slotSeen
	s.observe(Snapshot{Running: 40, Waiting: 2, Preemptions: 500})
	if s.kvBound != 0 {
		t.Fatalf("KV-bound batch %v after the first scrape, want 0", s.kvBound)
	}
	s.observe(Snapshot{Running: 40, Waiting: 2, Preemptions: 3})
	if s.kvBound != 0 {
		t.Fatalf("KV-bound batch %v after the counter went back, want 0", s.kvBound)
	}
	s.observe(Snapshot{Running: 36, Waiting: 2, Preemptions: 501})
	if s.kvBound != 36 {
		t.Fatalf("KV-bound batch %v after a preemption at 36 running, want 36", s.kvBound)
	}
}

// TestCostPricesAPreemptingReplicaByItsBatch: a replica that preempts with
// 12 running (its KV cache, not its slots, bounds the batch) is priced by
// policy cost as a 12-slot one, full with 12 running and 2 waiting, while
// the other, its limit unknown, is priced as a 256-slot one: requests go to
// the other until the first has gone kvBoundScrapes scrapes without a
// preemption.
func TestCostPricesAPreemptingReplicaByItsBatch(t *testing.T) {
	b := costFleet(t, 2)
	at := t0
	scrape := func(name string, running, waiting, preemptions float64) {
		at = at.Add(3 * time.Second)
		b.ObserveScrape(name, Snapshot{Running: running, Waiting: waiting, Preemptions: preemptions}, nil, at)
	}
	choices := func() map[string]int {
		got := map[string]int{}
		for i := range 4 {
			res, err := b.Select(costProfile(string(rune('p'+i)), 10, 0), at)
			if err != nil {
				t.Fatal(err)
			}
			got[res.Replica]++
			b.Release(res, OutcomeOK, at)
		}
		return got
	}
	scrape("a", 12, 0, 0)
	scrape("b", 12, 0, 0)
	if got := choices(); got["a"] == 0 || got["b"] == 0 {
		t.Fatalf("alike replicas: choices %v, want both", got)
	}
	scrape("a", 12, 2, 4) // a preempted with 12 running
	scrape("b", 12, 0, 0)
	b.mu.Lock()
	limit := b.slotLimit(b.byName["a"])
	b.mu.Unlock()
	if limit != 12 {
		t.Fatalf("a's slot limit after preempting at 12 running = %v, want 12", limit)
	}
	if got := choices(); got["b"] != 4 {
		t.Fatalf("a preempts at 12 running: choices %v, want all on b", got)
	}
	for range kvBoundScrapes {
		scrape("a", 12, 0, 4)
		scrape("b", 12, 0, 0)
	}
	if got := choices(); got["a"] == 0 || got["b"] == 0 {
		t.Fatalf("a no longer preempts: choices %v, want both", got)
	}
}
