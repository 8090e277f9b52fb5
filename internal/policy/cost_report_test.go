package policy

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"
)

// TestReportClass: the class tells apart idle from loaded decisions, the
// place in a burst, the batch's fullness, the requests ahead and their
// work, and keeps every input, however odd, within the table; its coarse
// class is idle or not and the fullness.
func TestReportClass(t *testing.T) {
	seen := map[int]string{}
	for _, idle := range []bool{true, false} {
		for burst := range reportPlaces {
			for _, inFlight := range []float64{0, 8, 16} {
				for req := range reportRequests {
					for _, ahead := range []float64{0, 256, 1000, 2000, 4000, 1e6} { // buckets 0-5 of 2048-token steps
						c := reportClass(idle, burst, inFlight, 16, float64(req), ahead, 2048)
						key := fmt.Sprint(idle, burst, inFlight, req, ahead)
						if c < 0 || c >= reportClasses {
							t.Fatalf("%s: class %d out of [0, %d)", key, c, reportClasses)
						}
						if other, ok := seen[c]; ok {
							t.Fatalf("%s and %s share class %d", key, other, c)
						}
						seen[c] = key
						full := 0
						if inFlight >= 8 {
							full = 1 + int(inFlight/16)
						}
						wantCoarse := full
						if !idle {
							wantCoarse += reportFull
						}
						if got := reportCoarse(c); got != wantCoarse {
							t.Errorf("%s: coarse class %d, want %d", key, got, wantCoarse)
						}
					}
				}
			}
		}
	}
	nan, inf := math.NaN(), math.Inf(1)
	for _, tc := range []struct {
		in, same [6]float64 // burst, in flight, slots, requests, ahead, batch; the bucket it falls in
	}{
		{[6]float64{burstBuckets - 1, 0, 16, 0, 0, 2048}, [6]float64{reportPlaces - 1, 0, 16, 0, 0, 2048}},
		{[6]float64{-3, 0, 16, 0, 0, 2048}, [6]float64{0, 0, 16, 0, 0, 2048}},
		{[6]float64{0, 500, 16, 0, 0, 2048}, [6]float64{0, 16, 16, 0, 0, 2048}},
		{[6]float64{0, 0, 16, 99, 0, 2048}, [6]float64{0, 0, 16, reportRequests - 1, 0, 2048}},
		{[6]float64{0, 0, 16, nan, 0, 2048}, [6]float64{0, 0, 16, 0, 0, 2048}},
		{[6]float64{0, 0, 16, 0.5, 0, 2048}, [6]float64{0, 0, 16, 0, 0, 2048}},
		{[6]float64{0, 3, 0, 0, 0, 2048}, [6]float64{0, 16, 16, 0, 0, 2048}}, // slots unknown (0): 3 in flight fill it
		{[6]float64{0, 0, 16, 0, inf, 2048}, [6]float64{0, 0, 16, 0, 1e6, 2048}},
		{[6]float64{0, 0, 16, 0, nan, 2048}, [6]float64{0, 0, 16, 0, 0, 2048}},
		{[6]float64{0, 0, 16, 0, 1000, 0}, [6]float64{0, 0, 16, 0, 0, 2048}}, // no budget known: no work told apart
		{[6]float64{0, 0, 16, 0, 500, 1024}, [6]float64{0, 0, 16, 0, 1000, 2048}},
	} {
		got := reportClass(false, int(tc.in[0]), tc.in[1], tc.in[2], tc.in[3], tc.in[4], tc.in[5])
		want := reportClass(false, int(tc.same[0]), tc.same[1], tc.same[2], tc.same[3], tc.same[4], tc.same[5])
		if got != want {
			t.Errorf("reportClass(%v) = %d, want %d", tc, got, want)
		}
	}
}

// TestReportFit: a class's factor is the median of measured / modelled:
// a replica's own once it has reportMin first tokens, the fleet's for a
// replica that has not, weighed against a prior (1 before the coarse
// class has reportMin, then the coarse class's) that its first samples
// barely move; outliers move it no further than any sample; a restart
// forgets the replica's cells but not the fleet's; samples without a time
// are skipped.
func TestReportFit(t *testing.T) {
	var f reportFit
	class := reportClass(true, 1, 0, 16, 0, 0, 2048)
	other := reportClass(false, 1, 0, 16, 1, 3000, 2048)
	if got := f.factor(0, class); got != 1 {
		t.Fatalf("factor %.3f before any sample, want 1", got)
	}
	for i := range reportMin - 1 {
		f.add(0, class, 1, 2)
		n := float64(i + 1)
		if got, most := f.factor(0, class), math.Pow(2, n/(n+reportPrior)); got < 1 || got > most*(1+1e-6) {
			t.Fatalf("factor %.3f after %.0f samples of 2, want within [1, %.3f]", got, n, most)
		}
	}
	// Six of ten first tokens 1.5x the model, four a thousand times it
	// (clipped to e^2): the median is 1.5 (the mean of the logs would
	// be 2.3x).
	for i := range 2000 {
		measured := 1.5
		if i%10 >= 6 {
			measured = 1000
		}
		f.add(0, class, 1, measured)
	}
	if got := f.factor(0, class); math.Abs(got/1.5-1) > 0.05 {
		t.Errorf("replica 0's factor %.3f, want the median 1.5", got)
	}
	if got := f.factor(0, other); got != 1 {
		t.Errorf("another class's factor %.3f, want 1 (no samples)", got)
	}
	// A class without samples of its own has its coarse class's: idle,
	// with the batch as full.
	if got := f.factor(0, reportClass(true, 4, 0, 16, 2, 0, 2048)); math.Abs(got/1.5-1) > 0.05 {
		t.Errorf("a cold class's factor %.3f, want its coarse class's 1.5", got)
	}
	// A replica without samples of the class has the fleet's; one with
	// its own has its own.
	if got := f.factor(7, class); math.Abs(got/1.5-1) > 0.05 {
		t.Errorf("new replica's factor %.3f, want the fleet's 1.5", got)
	}
	for range 1000 {
		f.add(1, class, 2, 1)
	}
	if got := f.factor(1, class); math.Abs(got/0.5-1) > 0.05 {
		t.Errorf("replica 1's factor %.3f, want its own 0.5", got)
	}
	// Samples that say nothing are skipped.
	before := f.fleet[class]
	for _, s := range [][2]float64{{0, 1}, {1, 0}, {-1, 1}, {math.NaN(), 1}, {1, math.Inf(1)}, {math.Inf(1), 1}} {
		f.add(0, class, s[0], s[1])
	}
	f.add(-1, class, 1, 1)
	f.add(0, -1, 1, 1)
	f.add(0, reportClasses, 1, 1)
	if f.fleet[class] != before {
		t.Errorf("fleet cell %+v after samples that say nothing, want %+v", f.fleet[class], before)
	}
	if got := f.factor(0, -1) * f.factor(0, reportClasses); got != 1 {
		t.Errorf("factor of a class out of range %.3f, want 1", got)
	}
	// A restart forgets the replica's own cells: it falls back on the
	// fleet's (which holds both replicas' samples).
	f.forget(1)
	if f.cells[1][class].n != 0 {
		t.Errorf("replica 1's cell %+v after a restart, want empty", f.cells[1][class])
	}
	if got, fleet := f.factor(1, class), math.Exp(float64(f.fleet[class].log)); math.Abs(got/fleet-1) > 0.02 {
		t.Errorf("restarted replica's factor %.3f, want the fleet's %.3f", got, fleet)
	}
}

// TestCostReportedEstimate: on a replica whose idle decisions take less
// than the prefill model says and whose loaded ones take more (an engine
// sharing its steps: idle requests run alone, loaded ones share them with
// the work ahead), the reported estimate learns each class's factor and
// meets both; the routing and the model do not move: a twin taught the
// same first tokens through the prefill model alone chooses the same
// replicas with the same scores and the same modelled times.
func TestCostReportedEstimate(t *testing.T) {
	p, twin := newCost(t, nil), newCost(t, nil)
	const idleFactor, loadedFactor = 0.7, 1.4
	var idleErr, loadedErr []float64
	for i := range 3000 {
		cands := costCands(2)
		loaded := i%2 == 1
		if loaded {
			cands[0].PendingPrefill, cands[0].PendingRequests = 3000, 1
			cands[1].PendingPrefill, cands[1].PendingRequests = 4000, 1
		}
		now := t0.Add(time.Duration(i) * time.Second)
		r := costPrompt(fmt.Sprintf("r%d/", i), 8, 0, "")
		ch := p.Choose(r, slices.Clone(cands), now)
		tw := twin.Choose(r, slices.Clone(cands), now)
		if ch.Index != tw.Index || ch.Shape.Modelled != tw.Shape.Modelled || ch.Shape.Modelled != tw.Estimate ||
			!slices.Equal(p.estimates, twin.estimates) {
			t.Fatalf("decision %d: chose %d (modelled %.4f, scores %v), twin %d (%.4f, %v)", i,
				ch.Index, ch.Shape.Modelled, p.estimates, tw.Index, tw.Shape.Modelled, twin.estimates)
		}
		// The engine: the model's time, shorter idle and longer loaded,
		// with noise symmetric in log (a factor of 1.1 either way).
		truth := ch.Shape.Modelled * idleFactor
		if loaded {
			truth = ch.Shape.Modelled * loadedFactor
		}
		truth *= math.Pow(1.1, float64(i%3-1))
		if i >= 2000 {
			e := math.Abs(ch.Estimate/truth - 1)
			if loaded {
				loadedErr = append(loadedErr, e)
			} else {
				idleErr = append(idleErr, e)
			}
		}
		name := cands[ch.Index].Name
		p.ObserveFirstToken(name, ch.Shape, truth)
		twin.prefill.add(twin.ids[name], tw.Shape, truth)
	}
	for _, tc := range []struct {
		name string
		errs []float64
	}{{"idle", idleErr}, {"loaded", loadedErr}} {
		slices.Sort(tc.errs)
		if e := tc.errs[len(tc.errs)/2]; e > 0.1 {
			t.Errorf("%s: median reported error %.3f, want at most 0.1 (the noise)", tc.name, e)
		}
	}
}
