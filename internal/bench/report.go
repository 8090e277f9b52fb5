package bench

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Report is the outcome of one `llmlb bench` run: one Result per policy, all
// on the same workload, fleet and seed. It is what --json prints.
type Report struct {
	Workload        string  `json:"workload"`
	Replicas        int     `json:"replicas"`
	Profile         string  `json:"profile"`
	DurationSeconds float64 `json:"duration_seconds"`
	Seed            int64   `json:"seed"`
	// Balancers is the number of routing cores (1 unless --balancers); with
	// more, each policy has two results, "<policy> xN independent" and
	// "<policy> xN shared".
	Balancers int      `json:"balancers,omitempty"`
	Flaps     []string `json:"flaps,omitempty"`
	Slow      []string `json:"slow,omitempty"` // slower replicas, NAME:FACTOR
	Results   []Result `json:"results"`
}

// Percentiles of a latency distribution, in seconds (nearest rank).
type Percentiles struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
}

// Quantile is one point of a distribution: the value at probability P.
type Quantile struct {
	P       float64 `json:"p"`
	Seconds float64 `json:"seconds"`
}

// TurnStats are the figures of turns 2+ of sessioned workloads (the seeds'
// session-affinity claim: TTFT and prefill work on later turns).
type TurnStats struct {
	Requests      int         `json:"requests"`
	TTFT          Percentiles `json:"ttft_seconds"`
	PromptTokens  uint64      `json:"prompt_tokens"`
	CachedTokens  uint64      `json:"cached_tokens"`
	PrefillTokens uint64      `json:"prefill_tokens"` // prompt - cached, of finished turns 2+
}

// Result is one policy's figures. docs/BENCH.md defines every field.
type Result struct {
	Policy string `json:"policy"`

	Requests   int `json:"requests"`   // arrived in [0, duration)
	Completed  int `json:"completed"`  // finished by the end of the duration
	Finished   int `json:"finished"`   // finished, including the drain
	Unfinished int `json:"unfinished"` // still running when the drain ended
	Failed     int `json:"failed"`     // no replica accepted it (503)
	Rejected   int `json:"rejected"`   // the engine refused it (prompt too long)
	Refused    int `json:"refused"`    // attempts refused by a down replica (retried)

	TTFT               Percentiles `json:"ttft_seconds"`
	E2E                Percentiles `json:"e2e_seconds"`
	OutputTokensPerSec float64     `json:"output_tokens_per_second"`
	PrefixHitRate      float64     `json:"prefix_cache_hit_rate"`
	// CacheCeiling is the hit rate of one LRU cache as large as the whole
	// fleet's KV cache, fed this run's routed prompts in arrival order: the
	// most any routing could reach on this traffic.
	CacheCeiling    float64    `json:"cache_ceiling_hit_rate"`
	PrefillTokens   uint64     `json:"prefill_tokens_computed"`
	Preemptions     uint64     `json:"preemptions"`
	ImbalanceIndex  float64    `json:"imbalance_index"`
	MaxReplicaShare float64    `json:"max_replica_share"`
	Turns2          *TurnStats `json:"turns_2plus,omitempty"`

	// TTFTSlowdown is each request's TTFT divided by its TTFT alone on an
	// idle replica with an empty cache (engine.Profile.IsolatedTTFT): how
	// much routing and queueing added. A ratio, not seconds; below 1 when a
	// cache hit beat the cold prefill.
	TTFTSlowdown Percentiles `json:"ttft_slowdown"`
	// TTFTShort and TTFTLong split TTFT by prompt size (LongPromptTokens).
	TTFTShort     Percentiles `json:"ttft_short_seconds"`
	TTFTLong      Percentiles `json:"ttft_long_seconds"`
	ShortRequests int         `json:"short_requests"`
	LongRequests  int         `json:"long_requests"`

	RouteAffinity int    `json:"route_affinity"`
	RouteLoad     int    `json:"route_load"`
	RouteFallback int    `json:"route_fallback"`
	Spills        uint64 `json:"spills"`
	Rebinds       uint64 `json:"rebinds"`
	Ejections     uint64 `json:"ejections"`
	// PinDecisions counts the core's pin decisions ("session: used",
	// "prefix: spill: queue", ...) from each Select's Explanation.
	PinDecisions map[string]int `json:"pin_decisions,omitempty"`

	TTFTQuantiles      []Quantile  `json:"ttft_quantiles"`
	ShareWindowSeconds float64     `json:"share_window_seconds"`
	Share              [][]float64 `json:"share"` // [window][replica]: share of routed prompt tokens

	WallSeconds         float64 `json:"wall_seconds"` // not deterministic
	SimulatedSecPerWall float64 `json:"simulated_seconds_per_wall_second"`

	// RequestLog is every routed request, by id, when Options.KeepRequests
	// (WriteRequestsCSV); not in the JSON report.
	RequestLog []RequestRecord `json:"-"`
}

// RequestRecord is one routed request of a run: what it asked, where it
// went and what it got. Times are virtual seconds from the run's start.
type RequestRecord struct {
	ID      uint64
	Session string // "" for requests without a session
	Turn    int
	Arrival float64
	Replica string
	// PromptTokens and CachedTokens: the prompt, and the part the replica
	// found in its prefix cache (0 when it never started).
	PromptTokens, CachedTokens int
	OutputTokens               int     // generated (0 when unfinished)
	TTFT, E2E                  float64 // censored at the drain's end when unfinished
	Finished                   bool
	// ExpectedCachedTokens and ExpectedTTFT are what the policy expected
	// when it chose the replica (policy cost; 0 for policies that estimate
	// nothing): beside CachedTokens and TTFT they show how well its block
	// index follows the replica's cache and its estimate the replica's
	// time.
	ExpectedCachedTokens int
	ExpectedTTFT         float64
}

// requestsHeader is the header row of WriteRequestsCSV.
var requestsHeader = []string{"policy", "request", "session", "turn", "arrival_seconds", "replica",
	"prompt_tokens", "cached_tokens", "output_tokens", "ttft_seconds", "e2e_seconds", "finished",
	"expected_cached_tokens", "expected_ttft_seconds"}

// WriteRequestsCSV writes every policy's request log (Options.KeepRequests)
// as CSV, one row per routed request, policies in the report's order.
// Requests that no replica took (failed) or that the engine rejected are
// not routed and have no row; the report counts them.
func (rep *Report) WriteRequestsCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(requestsHeader); err != nil {
		return fmt.Errorf("bench: requests csv: %w", err)
	}
	f := func(x float64) string { return strconv.FormatFloat(x, 'f', 6, 64) }
	for _, res := range rep.Results {
		for _, q := range res.RequestLog {
			row := []string{res.Policy, strconv.FormatUint(q.ID, 10), q.Session, strconv.Itoa(q.Turn), f(q.Arrival), q.Replica,
				strconv.Itoa(q.PromptTokens), strconv.Itoa(q.CachedTokens), strconv.Itoa(q.OutputTokens),
				f(q.TTFT), f(q.E2E), strconv.FormatBool(q.Finished),
				strconv.Itoa(q.ExpectedCachedTokens), f(q.ExpectedTTFT)}
			if err := cw.Write(row); err != nil {
				return fmt.Errorf("bench: requests csv: %w", err)
			}
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("bench: requests csv: %w", err)
	}
	return nil
}

// WriteJSON writes the report as indented JSON.
func (rep *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		return fmt.Errorf("bench: json: %w", err)
	}
	return nil
}

// ReadJSON parses a report written by WriteJSON.
func ReadJSON(r io.Reader) (*Report, error) {
	var rep Report
	if err := json.NewDecoder(r).Decode(&rep); err != nil {
		return nil, fmt.Errorf("bench: json: %w", err)
	}
	return &rep, nil
}

// WriteTable writes the terminal table: one row per policy.
func (rep *Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "workload %s, %d x %s, %s virtual, seed %d", rep.Workload, rep.Replicas, rep.Profile,
		fmtDur(rep.DurationSeconds), rep.Seed)
	if rep.Balancers > 1 {
		fmt.Fprintf(w, ", %d balancers (each request to one at random)", rep.Balancers)
	}
	if len(rep.Flaps) > 0 {
		fmt.Fprintf(w, ", flaps %s", strings.Join(rep.Flaps, ","))
	}
	if len(rep.Slow) > 0 {
		fmt.Fprintf(w, ", slow %s", strings.Join(rep.Slow, ","))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tTTFT p50\tp90\tp99\te2e p50\tp99\tout tok/s\tcompleted\thit rate\tceiling\tprefill tok\tpreempt\timbalance\tmax share\t")
	for _, r := range rep.Results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.0f\t%d\t%.1f%%\t%.1f%%\t%s\t%d\t%.2f\t%.1f%%\t\n",
			r.Policy, fmtSec(r.TTFT.P50), fmtSec(r.TTFT.P90), fmtSec(r.TTFT.P99),
			fmtSec(r.E2E.P50), fmtSec(r.E2E.P99), r.OutputTokensPerSec, r.Completed,
			100*r.PrefixHitRate, 100*r.CacheCeiling, fmtTokens(r.PrefillTokens), r.Preemptions,
			r.ImbalanceIndex, 100*r.MaxReplicaShare)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nTTFT by prompt size (short < %d tokens) and slowdown (TTFT / TTFT alone on an idle replica):\n", LongPromptTokens)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tshort\tTTFT p50\tp99\tlong\tTTFT p50\tp99\tslowdown p50\tp90\tp99\t")
	for _, r := range rep.Results {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", r.Policy,
			r.ShortRequests, fmtClass(r.ShortRequests, r.TTFTShort.P50), fmtClass(r.ShortRequests, r.TTFTShort.P99),
			r.LongRequests, fmtClass(r.LongRequests, r.TTFTLong.P50), fmtClass(r.LongRequests, r.TTFTLong.P99),
			fmtRatio(r.TTFTSlowdown.P50), fmtRatio(r.TTFTSlowdown.P90), fmtRatio(r.TTFTSlowdown.P99))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if rep.hasTurns() {
		fmt.Fprintln(w, "\nturns 2+ (sessioned requests after their first turn):")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "policy\trequests\tTTFT p50\tp99\tprefill tok\tcached share\t")
		for _, r := range rep.Results {
			t := r.Turns2
			if t == nil {
				continue
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%.1f%%\t\n", r.Policy, t.Requests,
				fmtSec(t.TTFT.P50), fmtSec(t.TTFT.P99), fmtTokens(t.PrefillTokens),
				100*ratio(float64(t.CachedTokens), float64(t.PromptTokens)))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	var notes []string
	for _, r := range rep.Results {
		if r.Unfinished+r.Failed+r.Rejected+r.Refused > 0 {
			notes = append(notes, fmt.Sprintf("%s: %d unfinished, %d failed, %d rejected, %d refused attempts",
				r.Policy, r.Unfinished, r.Failed, r.Rejected, r.Refused))
		}
	}
	for _, n := range notes {
		fmt.Fprintln(w, "note:", n)
	}
	return nil
}

func (rep *Report) hasTurns() bool {
	for _, r := range rep.Results {
		if r.Turns2 != nil {
			return true
		}
	}
	return false
}

// fmtSec formats seconds compactly: 850ms, 4.21s, 2m05s.
func fmtSec(s float64) string {
	switch {
	case s < 1:
		return fmt.Sprintf("%.0fms", s*1000)
	case s < 100:
		return fmt.Sprintf("%.2fs", s)
	default:
		return fmt.Sprintf("%dm%02ds", int(s)/60, int(s)%60)
	}
}

// fmtClass formats a class's latency, "-" for an empty class.
func fmtClass(n int, s float64) string {
	if n == 0 {
		return "-"
	}
	return fmtSec(s)
}

// fmtRatio formats a slowdown: 1.0x, 12x, 1234x.
func fmtRatio(x float64) string {
	if x < 10 {
		return fmt.Sprintf("%.1fx", x)
	}
	return fmt.Sprintf("%.0fx", x)
}

func fmtDur(s float64) string {
	if s >= 3600 && int(s)%60 == 0 {
		return fmt.Sprintf("%gh", s/3600)
	}
	if s >= 60 {
		return fmt.Sprintf("%gm", s/60)
	}
	return fmt.Sprintf("%gs", s)
}

func fmtTokens(n uint64) string {
	switch {
	case n >= 10_000_000_000:
		return fmt.Sprintf("%.0fG", float64(n)/1e9)
	case n >= 10_000_000:
		return fmt.Sprintf("%.0fM", float64(n)/1e6)
	case n >= 10_000:
		return fmt.Sprintf("%.0fK", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}
