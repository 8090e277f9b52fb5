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
