// Command barcheck judges `llmlb bench --json` results by the benchmark bar (BENCHMARKS.md, "Policy comparison"): for
// the policy under test (-policy, default cost), TTFT p50 and P99 at most
// 1.10x the best other policy's, prefix-cache hit rate at least 0.97x the
// best other's (when the best other's is at least 1%: runs without prefix
// sharing are not judged on it), P99 no worse than rr's, and on longshort a
// short-request P99 of rr over the policy's of at least 6.5x. It prints one
// line per run and how many runs meet the rule; scripts/heldout.sh runs the
// benchmark sets of docs/benchmarks/LAB-2026.md and calls it. A run may be given as several
// files of the same run joined by "+" (FULL.json+VARIANT.json): their results
// are judged together, so that a variant run alone (`--policies cost:...`) is
// compared with the other policies' rows of a full run.
//
//	go run ./scripts/barcheck [-policy cost] [-exclude llmlb-warm] FILE.json[+MORE.json]...
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// report is the part of `llmlb bench --json` the rule reads.
type report struct {
	Workload string   `json:"workload"`
	Replicas int      `json:"replicas"`
	Results  []result `json:"results"`
}

type result struct {
	Policy     string    `json:"policy"`
	TTFT       quantiles `json:"ttft_seconds"`
	TTFTShort  quantiles `json:"ttft_short_seconds"`
	HitRate    float64   `json:"prefix_cache_hit_rate"`
	ShortCount int       `json:"short_requests"`
}

type quantiles struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
}

// verdict is one run judged.
type verdict struct {
	P50, P99, Hit float64 // ratios to the best other's; Hit is NaN when not judged
	ShortRatio    float64 // rr's short-request P99 over the policy's; NaN unless longshort
	Misses        []string
}

// Bar limits (the benchmark bar).
const (
	maxTTFTRatio   = 1.10
	minHitRatio    = 0.97
	minHitJudged   = 0.01 // best other's hit rate below which a run has no sharing to judge
	minShortRatio  = 6.5
	shortWorkload  = "longshort"
	roundRobinName = "rr"
)

// judge applies the bar to one run's report.
func judge(r report, policy string, exclude map[string]bool) (verdict, error) {
	var self *result
	var others []result
	var rr *result
	for i := range r.Results {
		res := &r.Results[i]
		switch {
		case res.Policy == policy:
			self = res
		case !exclude[res.Policy]:
			others = append(others, *res)
		}
		if res.Policy == roundRobinName {
			rr = res
		}
	}
	if self == nil {
		return verdict{}, fmt.Errorf("no results for policy %q", policy)
	}
	if len(others) == 0 {
		return verdict{}, fmt.Errorf("no other policy to compare %q with", policy)
	}
	for _, res := range r.Results {
		if (res.Policy == policy || !exclude[res.Policy]) && !(res.TTFT.P50 > 0 && res.TTFT.P99 > 0) {
			return verdict{}, fmt.Errorf("policy %q has no TTFT measured (no request finished?)", res.Policy)
		}
	}
	best50, best99, bestHit := math.Inf(1), math.Inf(1), 0.0
	for _, o := range others {
		best50 = min(best50, o.TTFT.P50)
		best99 = min(best99, o.TTFT.P99)
		bestHit = max(bestHit, o.HitRate)
	}
	v := verdict{P50: self.TTFT.P50 / best50, P99: self.TTFT.P99 / best99, Hit: math.NaN(), ShortRatio: math.NaN()}
	if v.P50 > maxTTFTRatio {
		v.Misses = append(v.Misses, "p50")
	}
	if v.P99 > maxTTFTRatio {
		v.Misses = append(v.Misses, "P99")
	}
	if bestHit >= minHitJudged {
		v.Hit = self.HitRate / bestHit
		if v.Hit < minHitRatio {
			v.Misses = append(v.Misses, "hit rate")
		}
	}
	if rr != nil && rr != self && self.TTFT.P99 > rr.TTFT.P99 {
		v.Misses = append(v.Misses, "worse than rr")
	}
	if r.Workload == shortWorkload && rr != nil && rr != self && self.TTFTShort.P99 > 0 {
		v.ShortRatio = rr.TTFTShort.P99 / self.TTFTShort.P99
		if v.ShortRatio < minShortRatio {
			v.Misses = append(v.Misses, "short ratio")
		}
	}
	return v, nil
}

func main() {
	policy := flag.String("policy", "cost", "the policy judged against all the others in each file")
	excludeList := flag.String("exclude", "", "comma-separated policies not counted as others")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: barcheck [-policy cost] [-exclude a,b] FILE.json[+MORE.json]...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	exclude := map[string]bool{}
	for _, name := range strings.Split(*excludeList, ",") {
		if name = strings.TrimSpace(name); name != "" {
			exclude[name] = true
		}
	}
	if err := run(os.Stdout, flag.Args(), *policy, exclude); err != nil {
		fmt.Fprintln(os.Stderr, "barcheck:", err)
		os.Exit(1)
	}
}

// run judges every file and prints a line per run and the totals, with the
// geometric means of the ratios.
func run(w io.Writer, files []string, policy string, exclude map[string]bool) error {
	met := 0
	var logP50, logP99, logHit float64
	hits := 0
	for _, file := range files {
		r, err := load(file)
		if err != nil {
			return err
		}
		v, err := judge(r, policy, exclude)
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		logP50 += math.Log(v.P50)
		logP99 += math.Log(v.P99)
		hit := "no sharing"
		if !math.IsNaN(v.Hit) {
			hit = fmt.Sprintf("%.3f", v.Hit)
			logHit += math.Log(v.Hit)
			hits++
		}
		extra := ""
		if !math.IsNaN(v.ShortRatio) {
			extra = fmt.Sprintf("  short P99 rr/%s %.1fx", policy, v.ShortRatio)
		}
		outcome := "meets"
		if len(v.Misses) > 0 {
			outcome = "misses: " + strings.Join(v.Misses, ", ")
		} else {
			met++
		}
		name := strings.TrimSuffix(filepath.Base(strings.Split(file, "+")[0]), ".json")
		fmt.Fprintf(w, "%-28s p50 %.2fx  P99 %.2fx  hit %s%s  %s\n", name, v.P50, v.P99, hit, extra, outcome)
	}
	n := float64(len(files))
	hitMean := "-"
	if hits > 0 {
		hitMean = fmt.Sprintf("%.4f", math.Exp(logHit/float64(hits)))
	}
	fmt.Fprintf(w, "%s meets the bar on %d of %d runs; geometric means over the best other's: p50 %.3f, P99 %.3f, hit rate %s\n",
		policy, met, len(files), math.Exp(logP50/n), math.Exp(logP99/n), hitMean)
	return nil
}

// load reads one run: a report, or several reports of the same run joined by
// "+", whose results are judged together (a policy in two of them is an
// error: which row counts would be ambiguous).
func load(arg string) (report, error) {
	var merged report
	files := strings.Split(arg, "+")
	owner := map[string]string{} // policy -> the file it came from
	for i, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			return report{}, err
		}
		var r report
		if err := json.Unmarshal(data, &r); err != nil {
			return report{}, fmt.Errorf("%s: %w", file, err)
		}
		if i == 0 {
			merged.Workload, merged.Replicas = r.Workload, r.Replicas
		} else if r.Workload != merged.Workload || r.Replicas != merged.Replicas {
			return report{}, fmt.Errorf("%s: workload %q at %d replicas, %s: %q at %d: not the same run",
				file, r.Workload, r.Replicas, files[0], merged.Workload, merged.Replicas)
		}
		for _, res := range r.Results {
			if other, dup := owner[res.Policy]; dup {
				return report{}, fmt.Errorf("policy %q is in both %s and %s", res.Policy, other, file)
			}
			owner[res.Policy] = file
			merged.Results = append(merged.Results, res)
		}
	}
	return merged, nil
}
