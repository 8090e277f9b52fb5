// Command overload prints the tables of docs/benchmarks/LAB-2026.md's "Overload and flow
// control" from the runs scripts/overload.sh wrote into a directory:
//
//	go run ./scripts/overload /tmp/llmlb-overload
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/llmlb/llmlb/internal/bench"
	"github.com/llmlb/llmlb/internal/workload"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: overload DIR")
		os.Exit(2)
	}
	dir := os.Args[1]
	reps := map[string]*bench.Report{}
	paths, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			fail(err)
		}
		rep, err := bench.ReadJSON(f)
		f.Close()
		if err != nil {
			fail(fmt.Errorf("%s: %w", p, err))
		}
		reps[strings.TrimSuffix(filepath.Base(p), ".json")] = rep
	}
	traceTable(reps)
	floodTable(reps)
	priorityTable(reps)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "overload:", err)
	os.Exit(1)
}

func result(rep *bench.Report, policy string) (bench.Result, bool) {
	if rep == nil {
		return bench.Result{}, false
	}
	for _, r := range rep.Results {
		if r.Policy == policy {
			return r, true
		}
	}
	return bench.Result{}, false
}

// isCost reports whether policy is cost or cost+fc, with or without
// parameters (cost:rotation_start=1): not one of the others.
func isCost(policy string) bool {
	name, _, _ := strings.Cut(policy, ":")
	return name == "cost" || name == "cost+fc"
}

// rotated returns the medians of policy's TTFT p50 and P99 over its runs at
// every rotation start in rep (the policy itself and policy:rotation_start=N,
// as ROTATIONS in scripts/overload.sh adds them), and how many there are.
func rotated(rep *bench.Report, policy string) (p50, p99 float64, n int) {
	var a, b []float64
	for _, r := range rep.Results {
		if r.Policy == policy || strings.HasPrefix(r.Policy, policy+":rotation_start=") {
			a, b = append(a, r.TTFT.P50), append(b, r.TTFT.P99)
		}
	}
	return bench.Median(a), bench.Median(b), len(a)
}

// sec formats seconds: 850 ms, 4.21 s, 125 s.
func sec(s float64) string {
	switch {
	case s < 1:
		return fmt.Sprintf("%.0f ms", s*1000)
	case s < 100:
		return fmt.Sprintf("%.2f s", s)
	}
	return fmt.Sprintf("%.0f s", s)
}

func refusedPct(r bench.Result) string {
	return fmt.Sprintf("%.1f%%", 100*float64(r.FlowControl.RefusedTotal())/float64(max(r.Requests, 1)))
}

// limit is the learned limit's p50 (min-max) and the share of scrapes the
// pool was saturated.
func limit(r bench.Result) string {
	if r.FlowControl == nil || r.FlowControl.Saturation == nil {
		return "never saturated"
	}
	s := r.FlowControl.Saturation
	return fmt.Sprintf("%.0f (%.0f-%.0f), %.0f%%", s.LearnedMaxRunning.P50, s.LearnedMaxRunning.Min, s.LearnedMaxRunning.Max, 100*s.SaturatedShare)
}

// traceRun is a trace or workload run's name parsed: conv-4x1.5,
// wl-agentic-8x2.
type traceRun struct {
	name, trace string
	replicas    int
	speed       float64
	workload    bool
}

func traceRuns(reps map[string]*bench.Report) []traceRun {
	var out []traceRun
	for name := range reps {
		base, workload := strings.CutPrefix(name, "wl-")
		t, rest, ok := strings.Cut(base, "-")
		if !ok || strings.Contains(rest, "-") || (!workload && t != "conv" && t != "mc" && t != "az") {
			continue
		}
		n, s, ok := strings.Cut(rest, "x")
		replicas, err1 := strconv.Atoi(n)
		speed, err2 := strconv.ParseFloat(s, 64)
		if !ok || err1 != nil || err2 != nil {
			continue
		}
		out = append(out, traceRun{name, t, replicas, speed, workload})
	}
	order := map[string]int{"conv": 0, "mc": 1, "az": 2}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.workload != b.workload {
			return !a.workload
		}
		if a.trace != b.trace {
			if a.workload {
				return a.trace < b.trace
			}
			return order[a.trace] < order[b.trace]
		}
		if a.replicas != b.replicas {
			return a.replicas < b.replicas
		}
		return a.speed < b.speed
	})
	return out
}

func traceTable(reps map[string]*bench.Report) {
	runs := traceRuns(reps)
	if len(runs) == 0 {
		return
	}
	fmt.Println("| run | cost p50 / P99 | cost+fc p50 / P99, refused | best other P99 | fc P99 / best other | fc p50 / cost p50 | learned limit p50 (min-max), saturated | cost+fc, max_running 64: p50 / P99, refused |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	var met, goal, p50met, runsN, mrMet, mrP50met, mrN [2]int // traces, workloads
	var rotMet, rotGoal, rotP50met, rotN [2]int               // the same over rotation starts
	rotStarts := 0
	for _, tr := range runs {
		k := 0
		if tr.workload {
			k = 1
		}
		rep := reps[tr.name]
		cost, ok1 := result(rep, "cost")
		fc, ok2 := result(rep, "cost+fc")
		if !ok1 || !ok2 {
			continue
		}
		best, bestName := 0.0, ""
		for _, r := range rep.Results {
			if isCost(r.Policy) {
				continue
			}
			if bestName == "" || r.TTFT.P99 < best {
				best, bestName = r.TTFT.P99, r.Policy
			}
		}
		mr := "-"
		if m, ok := result(reps[tr.name+"-mr64"], "cost+fc"); ok {
			mr = fmt.Sprintf("%s / %s, %s", sec(m.TTFT.P50), sec(m.TTFT.P99), refusedPct(m))
			if tr.speed > 1 {
				mrN[k]++
				if m.TTFT.P99 <= best {
					mrMet[k]++
				}
				if m.TTFT.P50 <= 1.05*cost.TTFT.P50 {
					mrP50met[k]++
				}
			}
		}
		p99r, p50r := fc.TTFT.P99/best, fc.TTFT.P50/cost.TTFT.P50
		if c50, _, n := rotated(rep, "cost"); n > 1 && tr.speed > 1 {
			f50, f99, _ := rotated(rep, "cost+fc")
			rotN[k]++
			rotStarts = n
			if f99 <= best {
				rotMet[k]++
			}
			if f99 <= 0.8*best {
				rotGoal[k]++
			}
			if f50 <= 1.05*c50 {
				rotP50met[k]++
			}
		}
		if tr.speed > 1 { // the overload runs
			runsN[k]++
			if p99r <= 1 {
				met[k]++
			}
			if p99r <= 0.8 {
				goal[k]++
			}
			if p50r <= 1.05 {
				p50met[k]++
			}
		}
		fmt.Printf("| %s %d x %gx | %s / %s | %s / %s, %s | %s (%s) | %.2fx | %.2fx | %s | %s |\n",
			tr.trace, tr.replicas, tr.speed, sec(cost.TTFT.P50), sec(cost.TTFT.P99),
			sec(fc.TTFT.P50), sec(fc.TTFT.P99), refusedPct(fc), sec(best), bestName, p99r, p50r, limit(fc), mr)
	}
	fmt.Println()
	for k, what := range []string{"Trace", "Workload"} {
		if runsN[k] == 0 {
			continue
		}
		fmt.Printf("%s overload runs (1.5x-3x): cost+fc P99 <= the best other's on %d of %d (<= 0.8x on %d), p50 <= 1.05x cost's on %d of %d",
			what, met[k], runsN[k], goal[k], p50met[k], runsN[k])
		if mrN[k] > 0 {
			fmt.Printf("; with max_running 64: %d and %d of %d", mrMet[k], mrP50met[k], mrN[k])
		}
		fmt.Println()
		if rotN[k] > 0 {
			fmt.Printf("%s overload runs, medians over %d rotation starts of cost and cost+fc: P99 <= the best other's on %d of %d (<= 0.8x on %d), p50 <= 1.05x cost's on %d of %d\n",
				what, rotStarts, rotMet[k], rotN[k], rotGoal[k], rotP50met[k], rotN[k])
		}
	}
	fmt.Println()
	for _, name := range []string{"conv-4x2", "az-4x2"} {
		if fc, ok := result(reps[name], "cost+fc"); ok && fc.FlowControl != nil && fc.FlowControl.Saturation != nil {
			seriesTable(name, fc.FlowControl.Saturation)
		}
	}
}

// politeP90 is the worst polite tenant's TTFT P90 and the polite tenants'
// refusals.
func politeP90(r bench.Result) (float64, int) {
	var p90 float64
	var refused int
	for _, t := range r.Tenants {
		if t.Tenant == workload.FloodTenant {
			continue
		}
		p90 = max(p90, t.TTFT.P90)
		refused += t.Refused
	}
	return p90, refused
}

func floodTable(reps map[string]*bench.Report) {
	if reps["flood-4"] == nil && reps["flood-8"] == nil {
		return
	}
	fmt.Println("| fleet | polite P90 alone (cost) | flood, cost: polite P90, Jain | flood, cost+fc: polite P90, Jain, flood refused | flood, cost+fc with no engine queue (max_running 63, headroom 0): polite P90, Jain | best other without fc: polite P90 |")
	fmt.Println("|---|---|---|---|---|---|")
	for _, n := range []int{4, 8} {
		flood, alone := reps[fmt.Sprintf("flood-%d", n)], reps[fmt.Sprintf("polite-%d", n)]
		a, ok1 := result(alone, "cost")
		c, ok2 := result(flood, "cost")
		f, ok3 := result(flood, "cost+fc")
		if !ok1 || !ok2 || !ok3 {
			continue
		}
		pa, _ := politeP90(a)
		pc, _ := politeP90(c)
		pf, pfRef := politeP90(f)
		var floodRef, floodReq int
		for _, t := range f.Tenants {
			if t.Tenant == workload.FloodTenant {
				floodRef, floodReq = t.Refused, t.Requests
			}
		}
		mr := "-"
		if m, ok := result(reps[fmt.Sprintf("flood-%d-mr63h0", n)], "cost+fc"); ok {
			pm, _ := politeP90(m)
			mr = fmt.Sprintf("%s (%.1fx alone), %.3f", sec(pm), pm/pa, m.TenantFairness)
		}
		best, bestName := 0.0, ""
		for _, r := range flood.Results {
			if r.Policy == "cost+fc" {
				continue
			}
			if p, _ := politeP90(r); bestName == "" || p < best {
				best, bestName = p, r.Policy
			}
		}
		fmt.Printf("| %d | %s | %s (%.0fx alone), %.3f | %s (%.1fx alone), %.3f, %.1f%% of its requests (polite: %d) | %s | %s (%s) |\n",
			n, sec(pa), sec(pc), pc/pa, c.TenantFairness, sec(pf), pf/pa, f.TenantFairness,
			100*float64(floodRef)/float64(max(floodReq, 1)), pfRef, mr, sec(best), bestName)
	}
	fmt.Println()
}

func byPriority(r bench.Result) map[int]bench.PriorityStats {
	m := map[int]bench.PriorityStats{}
	for _, p := range r.Priorities {
		m[p.Priority] = p
	}
	return m
}

func priorityTable(reps map[string]*bench.Report) {
	if reps["prio-oneshot-4x1"] == nil {
		return
	}
	fmt.Println("| run | high P99 at 1x (cost) | at 2x, cost | at 2x, cost+fc | at 2x, cost+fc, no engine queue | cost+fc at 2x: refused by class (high / default / sheddable) |")
	fmt.Println("|---|---|---|---|---|---|")
	for _, wl := range []string{"oneshot", "conv"} {
		for _, n := range []int{4, 8} {
			run := fmt.Sprintf("prio-%s-%dx", wl, n)
			suffix := map[string]string{"oneshot": "", "conv": "-seed1"}[wl] // seed 1's start 0
			one, _ := result(reps[run+"1"+suffix], "cost")
			two := reps[run+"2"+suffix]
			c, ok1 := result(two, "cost")
			f, ok2 := result(two, "cost+fc")
			if !ok1 || !ok2 || len(one.Priorities) == 0 {
				continue
			}
			base := byPriority(one)[1].TTFT.P99
			hc, hf := byPriority(c)[1].TTFT.P99, byPriority(f)[1]
			mr := "-"
			if m, ok := result(reps[fmt.Sprintf("prio-%s-%dx2-mr63h0", wl, n)], "cost+fc"); ok {
				h := byPriority(m)[1].TTFT.P99
				mr = fmt.Sprintf("%s (%.1fx)", sec(h), h/base)
			}
			fp := byPriority(f)
			share := func(p bench.PriorityStats) string {
				return fmt.Sprintf("%.0f%%", 100*float64(p.Refused)/float64(max(p.Requests, 1)))
			}
			fmt.Printf("| %s %d replicas | %s | %s (%.1fx) | %s (%.1fx) | %s | %s / %s / %s |\n", wl, n, sec(base),
				sec(hc), hc/base, sec(hf.TTFT.P99), hf.TTFT.P99/base, mr, share(fp[1]), share(fp[0]), share(fp[-1]))
		}
	}
	fmt.Println()
	for _, n := range []int{4, 8} {
		convRuns(reps, n)
	}
}

// convRuns prints, for the conversation trace on n replicas, the high
// class's P99 under cost+fc at 2x over cost's at 1x (the unloaded
// reference) run by run, over the two seeds and three rotation starts:
// one run's P99 is the 3rd-slowest of ~300 requests.
func convRuns(reps map[string]*bench.Report, n int) {
	var ratios []float64
	for _, seed := range []int{1, 2} {
		one, two := reps[fmt.Sprintf("prio-conv-%dx1-seed%d", n, seed)], reps[fmt.Sprintf("prio-conv-%dx2-seed%d", n, seed)]
		for _, start := range []string{"", ":rotation_start=1", ":rotation_start=2"} {
			c, ok1 := result(one, "cost"+start)
			f, ok2 := result(two, "cost+fc"+start)
			if !ok1 || !ok2 {
				continue
			}
			if base := byPriority(c)[1].TTFT.P99; base > 0 {
				ratios = append(ratios, byPriority(f)[1].TTFT.P99/base)
			}
		}
	}
	if len(ratios) == 0 {
		return
	}
	slices.Sort(ratios)
	met := 0
	for _, r := range ratios {
		if r <= 1.5 {
			met++
		}
	}
	fmt.Printf("conv %d replicas, %d runs: high class's P99, cost+fc at 2x / cost at 1x: median %.2f (%.2f-%.2f), within 1.5x on %d\n\n",
		n, len(ratios), ratios[len(ratios)/2]/2+ratios[(len(ratios)-1)/2]/2, ratios[0], ratios[len(ratios)-1], met)
}

// seriesTable prints a run's saturation series every few windows: the
// learned limit beside the engines' running and waiting counts.
func seriesTable(name string, s *bench.SaturationStats) {
	fmt.Printf("%s, cost+fc: learned limit vs the engines (means over the window's scrapes; max_num_seqs %d)\n\n", name, s.EngineMaxNumSeqs)
	fmt.Println("| t | learned limit | running | waiting | replicas full | pool saturated |")
	fmt.Println("|---|---|---|---|---|---|")
	step := max(1, len(s.Series)/12)
	for i := 0; i < len(s.Series); i += step {
		p := s.Series[i]
		fmt.Printf("| %.0f s | %.1f | %.1f | %.1f | %.0f%% | %.0f%% |\n", p.Seconds, p.Learned, p.Running, p.Waiting, 100*p.FullShare, 100*p.SaturatedShare)
	}
	fmt.Println()
}
