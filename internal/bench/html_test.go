package bench

import (
	"bytes"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestHTMLChartsUseThePageWidth checks that every chart scales to the page
// (width 100% and a viewBox) instead of a fixed pixel width.
func TestHTMLChartsUseThePageWidth(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleReport().WriteHTML(&buf); err != nil {
		t.Fatal(err)
	}
	svgs := regexp.MustCompile(`<svg [^>]*>`).FindAllString(buf.String(), -1)
	if len(svgs) < 4 {
		t.Fatalf("%d charts, want at least 4", len(svgs))
	}
	for _, s := range svgs {
		if !strings.Contains(s, `width="100%"`) || !strings.Contains(s, `viewBox="0 0 1100 `) || strings.Contains(s, "height=") {
			t.Errorf("chart %s: want width 100%%, a viewBox and no fixed height", s)
		}
	}
}

// TestShareChartHasALegend checks that each traffic-share chart names every
// replica in its colour, and says how the colours run for large fleets.
func TestShareChartHasALegend(t *testing.T) {
	r := sampleReport().Results[0]
	svg := shareSVG(r, 4)
	for i := range 4 {
		want := `fill="` + replicaColor(i, 4) + `"/><text x="`
		if !strings.Contains(svg, want) || !strings.Contains(svg, ">"+replicaName(i)+"</text>") {
			t.Errorf("legend lacks %s in %s", replicaName(i), replicaColor(i, 4))
		}
	}
	big := shareSVG(r, 32)
	if !strings.Contains(big, ">replica-16</text>") || strings.Contains(big, ">replica-17</text>") ||
		!strings.Contains(big, "and 16 more") || !strings.Contains(big, "replica-32") {
		t.Error("a 32-replica legend should name 16 replicas and say how the other 16 are coloured")
	}
}

// TestBarAxis checks the hit-rate axis: from 0 unless every value is high,
// then from a round value below the smallest.
func TestBarAxis(t *testing.T) {
	tests := []struct {
		name   string
		values []float64
		zoom   bool
		lo, hi float64
	}{
		{"low rates start at 0", []float64{0.1, 0.6}, true, 0, 0.6},
		{"high rates zoom", []float64{0.86, 0.93, 0.91}, true, 0.7, 0.93},
		{"equal rates still show bars", []float64{0.95, 0.95}, true, 0.8, 0.95},
		{"up to 100%", []float64{0.9, 1}, true, 0.8, 1},
		{"no zoom for times", []float64{4.2, 4.5}, false, 0, 4.5},
		{"all zero", []float64{0, 0}, true, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var rs []Result
			for _, v := range tc.values {
				rs = append(rs, Result{PrefixHitRate: v})
			}
			lo, hi := barAxis(rs, func(r Result) float64 { return r.PrefixHitRate }, tc.zoom)
			if diff := lo - tc.lo; diff > 1e-9 || diff < -1e-9 || hi != tc.hi {
				t.Errorf("axis [%v, %v], want [%v, %v]", lo, hi, tc.lo, tc.hi)
			}
		})
	}
	rep := sampleReport()
	rep.Results[0].PrefixHitRate, rep.Results[1].PrefixHitRate = 0.86, 0.93
	svg := rep.barSVG("hit rate", func(r Result) float64 { return r.PrefixHitRate }, pct, true)
	if !strings.Contains(svg, ">70.0%</text>") {
		t.Errorf("the zoomed axis does not say where it starts:\n%s", svg)
	}
}

// TestCDFCurvesHaveDistinctDashes checks that no two of the first eight
// policies draw the same colour and dash, so identical curves stay visible.
func TestCDFCurvesHaveDistinctDashes(t *testing.T) {
	seen := map[string]bool{}
	for i := range len(dashes) {
		key := policyColor(i) + policyDash(i)
		if seen[key] {
			t.Errorf("policy %d draws like an earlier one (%s)", i, key)
		}
		seen[key] = true
		if seen[policyDash(i)+"dash"] {
			t.Errorf("policy %d repeats a dash pattern", i)
		}
		seen[policyDash(i)+"dash"] = true
	}
}

func TestNiceTicks(t *testing.T) {
	tests := []struct {
		lo, hi float64
		want   string
	}{
		{0, 0.775, "0 0.2 0.4 0.6"},
		{0.7, 0.954, "0.7 0.8 0.9"},
		{0, 4.5, "0 2 4"},
		{0, 0, ""},
	}
	for _, tc := range tests {
		var got []string
		for _, v := range niceTicks(tc.lo, tc.hi) {
			got = append(got, strconv.FormatFloat(math.Round(v*1e6)/1e6, 'g', -1, 64))
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("niceTicks(%v, %v) = %v, want %s", tc.lo, tc.hi, got, tc.want)
		}
	}
}
