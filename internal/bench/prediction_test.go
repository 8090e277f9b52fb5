package bench

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/internal/balancer"
)

func TestPredictionStats(t *testing.T) {
	var p predictions
	if p.stats() != nil {
		t.Fatal("stats without samples, want nil")
	}
	idle := balancer.Explanation{Estimate: 1}
	loaded := balancer.Explanation{Estimate: 1, PendingPrefill: 500}
	for _, s := range []struct {
		e        balancer.Explanation
		measured float64
	}{
		{idle, 1}, {idle, 2}, {idle, 0.8}, // ratios 1, 0.5, 1.25: errors 0, 0.5, 0.25
		{loaded, 4}, {loaded, 4}, // ratio 0.25: error 0.75
		{balancer.Explanation{}, 1}, // no estimate: skipped
		{idle, 0},                   // no time: skipped
	} {
		p.add(s.e, s.measured)
	}
	got := p.stats()
	want := PredictionStats{Samples: 5, ErrorMedian: 0.5, RatioMedian: 0.5,
		IdleSamples: 3, IdleErrorMedian: 0.25, LoadedSamples: 2, LoadedErrorMedian: 0.75}
	if math.Abs(got.ErrorMedian-want.ErrorMedian) > 1e-9 || math.Abs(got.IdleErrorMedian-want.IdleErrorMedian) > 1e-9 ||
		got.Samples != want.Samples || got.IdleSamples != want.IdleSamples || got.LoadedSamples != want.LoadedSamples ||
		math.Abs(got.RatioMedian-want.RatioMedian) > 1e-9 || math.Abs(got.LoadedErrorMedian-want.LoadedErrorMedian) > 1e-9 {
		t.Errorf("stats = %+v, want %+v", *got, want)
	}
	rep := &Report{Results: []Result{{Policy: "rr"}, {Policy: "cost", TTFTPrediction: got}}}
	var b bytes.Buffer
	if err := rep.writePredictionTable(&b); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !strings.Contains(out, "cost") || strings.Contains(out, "rr ") || !strings.Contains(out, "50%") {
		t.Errorf("table:\n%s", out)
	}
}
