package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func res(policy string, p50, p99, hit, shortP99 float64) result {
	return result{Policy: policy, TTFT: quantiles{P50: p50, P99: p99}, TTFTShort: quantiles{P99: shortP99}, HitRate: hit}
}

// writeReport writes r as dir/name and returns its path.
func writeReport(t *testing.T, dir, name string, r report) string {
	t.Helper()
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestJudgeAppliesEachLimit(t *testing.T) {
	base := func(cost result) report {
		return report{Workload: "chat", Results: []result{
			res("rr", 0.100, 1.00, 0.05, 0),
			res("sticky", 0.200, 2.00, 0.20, 0),
			cost,
		}}
	}
	cases := []struct {
		name string
		cost result
		want []string
	}{
		{"meets", res("cost", 0.110, 0.90, 0.194, 0), nil},
		{"p50 over 1.10x the best", res("cost", 0.111, 0.90, 0.20, 0), []string{"p50"}},
		{"P99 over 1.10x the best and rr's", res("cost", 0.100, 1.11, 0.20, 0), []string{"P99", "worse than rr"}},
		{"worse than rr only", res("cost", 0.100, 1.01, 0.20, 0), []string{"worse than rr"}},
		{"hit rate under 0.97x the best", res("cost", 0.100, 0.90, 0.193, 0), []string{"hit rate"}},
	}
	for _, c := range cases {
		v, err := judge(base(c.cost), "cost", nil)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(c.want, v.Misses); diff != "" {
			t.Errorf("%s: misses (-want +got):\n%s", c.name, diff)
		}
	}
}

func TestJudgeSkipsHitRateWithoutSharing(t *testing.T) {
	r := report{Workload: "longshort", Results: []result{
		res("rr", 0.1, 15, 0.001, 15),
		res("cost", 0.1, 5, 0, 2.4),
	}}
	v, err := judge(r, "cost", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Misses) != 1 || v.Misses[0] != "short ratio" {
		t.Fatalf("misses %v, want only the short ratio (15/2.4 = 6.25x < 6.5x); no hit-rate judgement without sharing", v.Misses)
	}
}

func TestJudgeExcludesAndReportsMissingPolicy(t *testing.T) {
	r := report{Results: []result{res("rr", 0.1, 1, 0.5, 0), res("llmlb-warm", 0.05, 0.5, 0.9, 0), res("cost", 0.1, 1, 0.5, 0)}}
	v, err := judge(r, "cost", map[string]bool{"llmlb-warm": true})
	if err != nil || len(v.Misses) != 0 {
		t.Fatalf("with llmlb-warm excluded: %v, %v", v.Misses, err)
	}
	if _, err := judge(r, "nope", nil); err == nil {
		t.Fatal("a policy missing from the results was judged")
	}
	empty := report{Results: []result{res("rr", 0.1, 1, 0.5, 0), res("cost", 0, 0, 0, 0)}}
	if _, err := judge(empty, "cost", nil); err == nil || !strings.Contains(err.Error(), "no TTFT") {
		t.Fatalf("a run where nothing finished was judged: %v", err)
	}
}

func TestRunCountsRunsMeetingTheBar(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, r report) string { return writeReport(t, dir, name, r) }
	good := write("good.json", report{Results: []result{res("rr", 0.1, 1, 0.5, 0), res("cost", 0.1, 0.9, 0.5, 0)}})
	bad := write("bad.json", report{Results: []result{res("rr", 0.1, 1, 0.5, 0), res("cost", 0.2, 0.9, 0.5, 0)}})
	var out bytes.Buffer
	if err := run(&out, []string{good, bad}, "cost", nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "cost meets the bar on 1 of 2 runs") {
		t.Fatalf("output:\n%s", out.String())
	}
	broken := filepath.Join(dir, "broken.json")
	if err := os.WriteFile(broken, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(&out, []string{broken}, "cost", nil); err == nil || !strings.Contains(err.Error(), "broken.json") {
		t.Fatalf("malformed JSON: %v", err)
	}
}

// A variant run alone is judged against a full run's other rows.
func TestRunJudgesAVariantAgainstAFullRun(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, r report) string { return writeReport(t, dir, name, r) }
	full := write("run.json", report{Workload: "trace", Replicas: 4,
		Results: []result{res("rr", 0.1, 1, 0.5, 0), res("cost", 0.1, 0.9, 0.5, 0)}})
	variant := write("variant.json", report{Workload: "trace", Replicas: 4,
		Results: []result{res("cost:eviction_weight=1,tie_steps=2", 0.1, 0.8, 0.5, 0)}})
	var out bytes.Buffer
	err := run(&out, []string{full + "+" + variant}, "cost:eviction_weight=1,tie_steps=2", map[string]bool{"cost": true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "run ") || !strings.Contains(out.String(), "meets the bar on 1 of 1 runs") {
		t.Fatalf("output:\n%s", out.String())
	}
	again := write("again.json", report{Workload: "trace", Replicas: 4, Results: []result{res("cost", 0.1, 0.9, 0.5, 0)}})
	if err := run(&out, []string{full + "+" + again}, "cost", nil); err == nil || !strings.Contains(err.Error(), `policy "cost" is in both`) {
		t.Fatalf("a policy in both files: %v", err)
	}
	other := write("other.json", report{Workload: "trace", Replicas: 8, Results: []result{res("x", 0.1, 0.9, 0.5, 0)}})
	if err := run(&out, []string{full + "+" + other}, "cost", nil); err == nil || !strings.Contains(err.Error(), "not the same run") {
		t.Fatalf("two different runs: %v", err)
	}
}
