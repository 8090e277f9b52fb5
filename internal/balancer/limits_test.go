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
// is a full KV cache or a burst as often as the limit); then another
// replica's limit for one not known yet; flow control's, configured or
// learned over three scrapes, first.
func TestSlotLimitForCost(t *testing.T) {
	type scrape struct {
		replica          string
		running, waiting float64
	}
	for _, tc := range []struct {
		name       string
		maxRunning int // saturation.max_running
		scrapes    []scrape
		wantA      float64
		wantB      float64
	}{
		{"nothing seen", 0, nil, 0, 0},
		{"no queue", 0, []scrape{{"a", 12, 0}, {"a", 14, 0}}, 0, 0},
		{"one queued scrape", 0, []scrape{{"a", 12, 3}}, 0, 0},
		{"queue at a moving count", 0, []scrape{{"a", 12, 3}, {"a", 13, 2}, {"a", 11, 4}}, 0, 0},
		{"queue held at 16", 0, []scrape{{"a", 16, 3}, {"a", 16, 5}}, 16, 16},
		{"never below what ran freely", 0, []scrape{{"a", 20, 0}, {"a", 16, 3}, {"a", 16, 5}}, 20, 20},
		{"the highest held queue", 0, []scrape{{"a", 8, 3}, {"a", 8, 5}, {"a", 0, 0}, {"a", 16, 3}, {"a", 16, 5}}, 16, 16},
		{"each its own", 0, []scrape{{"a", 16, 3}, {"a", 16, 5}, {"b", 4, 1}, {"b", 4, 2}}, 16, 4},
		{"flow control's plateau", 0, []scrape{{"a", 16, 3}, {"a", 16, 5}, {"a", 16, 2}, {"a", 0, 0}, {"a", 4, 2}, {"a", 4, 2}}, 16, 16},
		{"configured", 32, []scrape{{"a", 16, 3}, {"a", 16, 5}}, 32, 32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newFleet(t, 2, func(c *Config) { c.Policy = "cost"; c.Saturation.MaxRunning = tc.maxRunning })
			for i, s := range tc.scrapes {
				b.ObserveScrape(s.replica, Snapshot{Running: s.running, Waiting: s.waiting}, nil, t0.Add(time.Duration(i+1)*3*time.Second))
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
