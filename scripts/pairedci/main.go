// Command pairedci says whether one policy's TTFT and cache hit rate in a
// benchmark run differ from each other policy's by more than the run's own
// noise. It reads the request log `llmlb bench --requests FILE` writes and
// resamples the run: blocks of consecutive arrivals (the same requests for
// every policy, so the comparison is paired) are drawn with replacement,
// and each policy's p50, P99 and hit rate are computed again on its own
// answers to the drawn requests. A difference whose interval holds no
// difference at all is one the run shows; one whose interval straddles it
// is a tie as far as this run can tell.
//
//	llmlb bench --trace traces/azure_llm_inference_2023_code.csv --trace-speed 8 --speed 2 \
//	    --replicas 4 --policies least-request,prefix-tree,llmlb,cost+fc --requests /tmp/az.csv
//	go run ./scripts/pairedci -policy cost+fc /tmp/az.csv
//
// Blocks (-block, 5 s of arrivals by default) keep the queueing that ties
// neighbouring requests' latencies together inside one draw. A P99 is a
// few dozen requests of a run of thousands: its interval is wide, and a
// percentile interval of a tail quantile is itself approximate (docs/BENCH.md).
package main

import (
	"cmp"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/llmlb/llmlb/internal/bench"
)

func main() {
	policy := flag.String("policy", "", "the policy compared with every other (default: the first policy named cost+fc or cost, else the first)")
	block := flag.Duration("block", 5*time.Second, "length of a resampled `block` of arrivals")
	resamples := flag.Int("resamples", 1000, "bootstrap resamples")
	level := flag.Float64("level", 0.95, "confidence level of the intervals")
	seed := flag.Uint64("seed", 1, "random seed of the resampling")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: pairedci [flags] REQUESTS.csv   (written by llmlb bench --requests)")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	if *block <= 0 || *resamples < 100 || *level <= 0 || *level >= 1 {
		fail(errors.New("-block must be positive, -resamples at least 100, -level between 0 and 1"))
	}
	f, err := os.Open(flag.Arg(0))
	if err != nil {
		fail(err)
	}
	run, err := readRun(f, block.Seconds())
	f.Close()
	if err != nil {
		fail(fmt.Errorf("%s: %w", flag.Arg(0), err))
	}
	ours := *policy
	if ours == "" {
		ours = run.defaultPolicy()
	}
	cmps, err := run.compare(ours, *resamples, *level, *seed)
	if err != nil {
		fail(err)
	}
	fmt.Printf("%s: %d requests in %d blocks of %s, %d resamples, %.0f%% intervals\n",
		flag.Arg(0), run.requests(), len(run.blocks), block, *resamples, *level*100)
	fmt.Printf("%-26s %-30s %-30s %s\n", ours+" against", "p50 ratio", "P99 ratio", "hit rate, points")
	for _, c := range cmps {
		fmt.Printf("%-26s %-30s %-30s %s\n", c.Other, c.P50.ratio(), c.P99.ratio(), c.Hit.points())
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "pairedci:", err)
	os.Exit(1)
}

// sample is one routed request's outcome under one policy.
type sample struct {
	ttft           float64
	cached, prompt int
}

// run is a request log grouped by policy and by block of arrivals.
type run struct {
	policies []string     // in the order of the log
	blocks   [][][]sample // [block][policy] -> the policy's answers to the block's requests
}

// maxBlocks bounds the blocks a run is cut into (a day of 5 s blocks is
// 17,280): a log with arrivals far apart needs a longer -block, not memory
// for every empty block between them.
const maxBlocks = 1 << 20

// readRun reads a request log (bench.WriteRequestsCSV) into blocks of
// blockSeconds of arrivals.
func readRun(r io.Reader, blockSeconds float64) (*run, error) {
	cr := csv.NewReader(r)
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("reading the header: %w", err)
	}
	col := map[string]int{}
	for i, h := range header {
		col[h] = i
	}
	for _, need := range []string{"policy", "arrival_seconds", "ttft_seconds", "prompt_tokens", "cached_tokens"} {
		if _, ok := col[need]; !ok {
			return nil, fmt.Errorf("no %q column: not a request log of llmlb bench --requests", need)
		}
	}
	run := &run{}
	index := map[string]int{}
	line := 1
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		line++
		if err != nil {
			return nil, err
		}
		name := rec[col["policy"]]
		p, ok := index[name]
		if !ok {
			p = len(run.policies)
			index[name] = p
			run.policies = append(run.policies, name)
		}
		arrival, err1 := strconv.ParseFloat(rec[col["arrival_seconds"]], 64)
		ttft, err2 := strconv.ParseFloat(rec[col["ttft_seconds"]], 64)
		prompt, err3 := strconv.Atoi(rec[col["prompt_tokens"]])
		cached, err4 := strconv.Atoi(rec[col["cached_tokens"]])
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if arrival < 0 || math.IsNaN(arrival) || math.IsInf(arrival, 0) {
			return nil, fmt.Errorf("line %d: arrival %v", line, arrival)
		}
		if arrival/blockSeconds > maxBlocks {
			return nil, fmt.Errorf("line %d: arrival %.0f s is past %d blocks of %g s: use a longer -block", line, arrival, maxBlocks, blockSeconds)
		}
		b := int(arrival / blockSeconds)
		for len(run.blocks) <= b {
			run.blocks = append(run.blocks, nil)
		}
		for len(run.blocks[b]) <= p {
			run.blocks[b] = append(run.blocks[b], nil)
		}
		run.blocks[b][p] = append(run.blocks[b][p], sample{ttft: ttft, cached: cached, prompt: prompt})
	}
	if len(run.policies) < 2 {
		return nil, errors.New("fewer than two policies: nothing to compare")
	}
	run.blocks = slices.DeleteFunc(run.blocks, func(b [][]sample) bool { return len(b) == 0 })
	return run, nil
}

func (r *run) requests() int {
	n := 0
	for _, b := range r.blocks {
		if len(b) > 0 {
			n += len(b[0])
		}
	}
	return n
}

func (r *run) defaultPolicy() string {
	for _, want := range []string{"cost+fc", "cost"} {
		if slices.Contains(r.policies, want) {
			return want
		}
	}
	return r.policies[0]
}

// stats are one policy's figures over a set of blocks.
type stats struct{ p50, p99, hit float64 }

// stats computes policy p's figures over the blocks drawn (indices into
// r.blocks), with buf as scratch space; ok is false when p answered none.
func (r *run) stats(p int, drawn []int, buf []float64) (s stats, ok bool, _ []float64) {
	buf = buf[:0]
	var cached, prompt int
	for _, b := range drawn {
		if p >= len(r.blocks[b]) {
			continue
		}
		for _, x := range r.blocks[b][p] {
			buf = append(buf, x.ttft)
			cached += x.cached
			prompt += x.prompt
		}
	}
	if len(buf) == 0 {
		return stats{}, false, buf
	}
	slices.Sort(buf)
	s = stats{p50: bench.Percentile(buf, 50), p99: bench.Percentile(buf, 99)}
	if prompt > 0 {
		s.hit = float64(cached) / float64(prompt)
	}
	return s, true, buf
}

// estimate is a figure of the whole run with its bootstrap interval.
type estimate struct{ point, lo, hi float64 }

// ratio prints a ratio with its interval and what the run shows.
func (e estimate) ratio() string {
	return fmt.Sprintf("%.3f [%.3f, %.3f] %s", e.point, e.lo, e.hi, e.verdict(1))
}

// points prints a difference of hit rates in percentage points.
func (e estimate) points() string {
	return fmt.Sprintf("%+.2f [%+.2f, %+.2f] %s", e.point*100, e.lo*100, e.hi*100, e.verdict(0))
}

// verdict: "lower" or "higher" where the interval leaves out none (no
// difference), "tie" where it holds it.
func (e estimate) verdict(none float64) string {
	switch {
	case e.hi < none:
		return "lower"
	case e.lo > none:
		return "higher"
	}
	return "tie"
}

// comparison is one policy against another: ratios of p50 and P99 (ours
// over theirs: below 1 is ours faster) and the difference of hit rates
// (ours minus theirs).
type comparison struct {
	Other         string
	P50, P99, Hit estimate
}

// compare resamples the run and compares ours with every other policy.
func (r *run) compare(ours string, resamples int, level float64, seed uint64) ([]comparison, error) {
	o := slices.Index(r.policies, ours)
	if o < 0 {
		return nil, fmt.Errorf("policy %q is not in the run (it has %s)", ours, strings.Join(r.policies, ", "))
	}
	all := make([]int, len(r.blocks))
	for i := range all {
		all[i] = i
	}
	var buf []float64
	point := make([]stats, len(r.policies))
	for p := range r.policies {
		var ok bool
		if point[p], ok, buf = r.stats(p, all, buf); !ok {
			return nil, fmt.Errorf("policy %q routed no request", r.policies[p])
		}
	}
	rng := rand.New(rand.NewPCG(seed, 0x9a17ed))
	draws := make([][3][]float64, len(r.policies)) // per other policy: p50, P99, hit
	drawn := make([]int, len(r.blocks))
	cur := make([]stats, len(r.policies))
	okp := make([]bool, len(r.policies))
	for range resamples {
		for i := range drawn {
			drawn[i] = rng.IntN(len(r.blocks))
		}
		for p := range r.policies {
			cur[p], okp[p], buf = r.stats(p, drawn, buf)
		}
		if !okp[o] {
			continue
		}
		for p := range r.policies {
			if p == o || !okp[p] || cur[p].p50 <= 0 || cur[p].p99 <= 0 {
				continue
			}
			draws[p][0] = append(draws[p][0], cur[o].p50/cur[p].p50)
			draws[p][1] = append(draws[p][1], cur[o].p99/cur[p].p99)
			draws[p][2] = append(draws[p][2], cur[o].hit-cur[p].hit)
		}
	}
	var out []comparison
	for p, name := range r.policies {
		if p == o {
			continue
		}
		c := comparison{Other: name,
			P50: interval(ratioOf(point[o].p50, point[p].p50), draws[p][0], level),
			P99: interval(ratioOf(point[o].p99, point[p].p99), draws[p][1], level),
			Hit: interval(point[o].hit-point[p].hit, draws[p][2], level),
		}
		out = append(out, c)
	}
	return out, nil
}

func ratioOf(a, b float64) float64 {
	if b <= 0 {
		return math.NaN()
	}
	return a / b
}

// interval is the percentile interval of the draws around point.
func interval(point float64, draws []float64, level float64) estimate {
	if len(draws) == 0 {
		return estimate{point: point, lo: math.NaN(), hi: math.NaN()}
	}
	slices.SortFunc(draws, cmp.Compare[float64])
	tail := (1 - level) / 2
	lo := draws[min(len(draws)-1, int(math.Floor(tail*float64(len(draws)))))]
	hi := draws[max(0, int(math.Ceil((1-tail)*float64(len(draws))))-1)]
	return estimate{point: point, lo: lo, hi: hi}
}
