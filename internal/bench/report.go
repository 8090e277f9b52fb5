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
	// Speed is llmlb bench --speed: the workload's arrival rate, or the
	// trace's replay speed, times this (omitted at 1).
	Speed float64 `json:"speed,omitempty"`
	// PriorityMix is --priority-mix: the shares of high-priority and
	// sheddable requests ("0.1,0.2"), omitted when none.
	PriorityMix string   `json:"priority_mix,omitempty"`
	Results     []Result `json:"results"`
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

// TurnStats are the figures of turns 2+ of sessioned workloads (what session
// affinity is meant to improve: TTFT and prefill work on later turns).
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

	// IndexAccuracy is, for a policy that keeps a block index (cost), the
	// cached prompt tokens the engines found over those its index expected
	// (each request's found capped at its expected); omitted for others.
	IndexAccuracy float64 `json:"index_accuracy,omitempty"`
	// TTFTPrediction is, for a policy that estimates each request's time
	// to first token (cost), how well the estimates held; omitted for
	// others.
	TTFTPrediction *PredictionStats `json:"ttft_prediction,omitempty"`

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

	// FlowControl is what flow control did, for a policy behind it
	// (Options.FlowControl, "+fc") that held or refused anything; nil
	// otherwise (unsaturated, it changes nothing).
	FlowControl *FlowStats `json:"flow_control,omitempty"`
	// Tenants has each tenant's figures when the workload has tenants
	// (flood), with TenantFairness, Jain's index over them (tenantFairness
	// says how); Priorities each priority class's when requests carry
	// several (--priority-mix).
	Tenants        []TenantStats   `json:"tenants,omitempty"`
	TenantFairness float64         `json:"tenant_fairness,omitempty"`
	Priorities     []PriorityStats `json:"priorities,omitempty"`

	TTFTQuantiles      []Quantile  `json:"ttft_quantiles"`
	ShareWindowSeconds float64     `json:"share_window_seconds"`
	Share              [][]float64 `json:"share"` // [window][replica]: share of routed prompt tokens

	WallSeconds         float64 `json:"wall_seconds"` // not deterministic
	SimulatedSecPerWall float64 `json:"simulated_seconds_per_wall_second"`

	// RequestLog is every routed request, by id, when Options.KeepRequests
	// (WriteRequestsCSV); not in the JSON report.
	RequestLog []RequestRecord `json:"-"`
}

// FlowStats is what flow control did in a run. Requests it refused (429,
// by reason) have no TTFT: they are left out of every latency figure and
// counted here.
type FlowStats struct {
	Queued    int `json:"queued"`     // requests that waited in the balancer's queue
	MaxQueued int `json:"max_queued"` // the most held at once
	// QueueWait is how long the queued requests that were dispatched
	// waited in the queue (their TTFT includes it).
	QueueWait Waits `json:"queue_wait_seconds"`
	// Refused counts 429s by reason: shed (sheddable at saturation),
	// queue_full, tenant_limit, queue_timeout (waited max_queue_time).
	Refused map[string]int `json:"refused,omitempty"`
	// StillQueued were held when the drain ended: counted unfinished, their
	// TTFT censored there.
	StillQueued int `json:"still_queued,omitempty"`
	// Saturation is the signal flow control held requests on, sampled at
	// every scrape.
	Saturation *SaturationStats `json:"saturation,omitempty"`
}

// RefusedTotal is the number of requests flow control refused (nil: 0).
func (f *FlowStats) RefusedTotal() int {
	if f == nil {
		return 0
	}
	n := 0
	for _, v := range f.Refused {
		n += v
	}
	return n
}

// Waits is a distribution of waits in seconds: mean and nearest-rank
// percentiles.
type Waits struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
}

// SaturationStats describe the saturation signal over a run's scrapes (of
// routing core 0, after each replica's scrape): the running-slot limit the
// balancer learned for the replica (routing.saturation, package balancer's
// capacity.go) beside the engine's max_num_seqs and the number the engine
// ran while requests waited in it.
type SaturationStats struct {
	Scrapes          int `json:"scrapes"`
	EngineMaxNumSeqs int `json:"engine_max_num_seqs"`
	// LearnedShare: scrapes after which the replica's limit was known;
	// FullShare: the replica counted as full; SaturatedShare: every replica
	// did (the pool was saturated); WaitingShare: the engine had requests
	// waiting.
	LearnedShare   float64 `json:"learned_share"`
	FullShare      float64 `json:"full_share"`
	SaturatedShare float64 `json:"saturated_share"`
	WaitingShare   float64 `json:"waiting_share"`
	// LearnedMaxRunning is the learned limit over the scrapes it was known;
	// EngineRunningWaiting the engine's running count over the scrapes
	// that saw requests waiting in it.
	LearnedMaxRunning    Spread `json:"learned_max_running"`
	EngineRunningWaiting Spread `json:"engine_running_while_waiting"`
	// Series is the same over time: means over each window's scrapes.
	Series []LimitPoint `json:"series,omitempty"`
}

// Spread is the minimum, deciles and maximum of some values.
type Spread struct {
	Min float64 `json:"min"`
	P10 float64 `json:"p10"`
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	Max float64 `json:"max"`
}

// LimitPoint is one window of SaturationStats.Series: from Seconds, the
// mean learned limit (0: none known yet), the engines' running and waiting
// counts, and the shares of scrapes after which a replica was full and the
// pool saturated.
type LimitPoint struct {
	Seconds        float64 `json:"t"`
	Learned        float64 `json:"learned"`
	Running        float64 `json:"running"`
	Waiting        float64 `json:"waiting"`
	FullShare      float64 `json:"full"`
	SaturatedShare float64 `json:"saturated"`
}

// TenantStats are one tenant's figures. Tokens are prompt plus output
// tokens; DemandTokens those of every request the tenant sent during the
// run, ServedTokens those of its requests that finished within it, and
// FairShareTokens its max-min fair share of all tenants' served tokens.
type TenantStats struct {
	Tenant          string      `json:"tenant"`
	Requests        int         `json:"requests"`
	Refused         int         `json:"refused"` // flow control's 429s, every reason
	TTFT            Percentiles `json:"ttft_seconds"`
	DemandTokens    uint64      `json:"demand_tokens"`
	ServedTokens    uint64      `json:"served_tokens"`
	FairShareTokens float64     `json:"fair_share_tokens"`
}

// PriorityStats are one priority class's figures.
type PriorityStats struct {
	Priority int         `json:"priority"`
	Requests int         `json:"requests"`
	Refused  int         `json:"refused"` // flow control's 429s, every reason
	TTFT     Percentiles `json:"ttft_seconds"`
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
	// Priority is the request's flow control priority; Sent is when a
	// replica was chosen (after Arrival by its wait in flow control).
	Priority int
	Sent     float64
	Tenant   string
}

// requestsHeader is the header row of WriteRequestsCSV.
var requestsHeader = []string{"policy", "request", "session", "turn", "arrival_seconds", "replica",
	"prompt_tokens", "cached_tokens", "output_tokens", "ttft_seconds", "e2e_seconds", "finished",
	"expected_cached_tokens", "expected_ttft_seconds", "priority", "sent_seconds", "tenant"}

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
				strconv.Itoa(q.ExpectedCachedTokens), f(q.ExpectedTTFT),
				strconv.Itoa(q.Priority), f(q.Sent), q.Tenant}
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
	if rep.Speed != 0 && rep.Speed != 1 {
		fmt.Fprintf(w, ", speed %gx", rep.Speed)
	}
	if rep.PriorityMix != "" {
		fmt.Fprintf(w, ", priority mix (high, sheddable) %s", rep.PriorityMix)
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
	if err := rep.writePredictionTable(w); err != nil {
		return err
	}
	if err := rep.writeFlowTables(w); err != nil {
		return err
	}
	var notes []string
	for _, r := range rep.Results {
		if r.Unfinished+r.Failed+r.Rejected+r.Refused > 0 {
			notes = append(notes, fmt.Sprintf("%s: %d unfinished, %d failed, %d rejected, %d refused attempts",
				r.Policy, r.Unfinished, r.Failed, r.Rejected, r.Refused))
		}
		if n := r.FlowControl.RefusedTotal(); n > 0 {
			notes = append(notes, fmt.Sprintf("%s: flow control refused %d of %d requests (429; %.1f%%), not in its latency figures",
				r.Policy, n, r.Requests, 100*ratio(float64(n), float64(r.Requests))))
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

// writeFlowTables writes the flow-control, tenant and priority tables of
// the results that have them.
func (rep *Report) writeFlowTables(w io.Writer) error {
	var fc, tenants, prios bool
	for _, r := range rep.Results {
		fc = fc || r.FlowControl != nil
		tenants = tenants || len(r.Tenants) > 0
		prios = prios || len(r.Priorities) > 0
	}
	if fc {
		fmt.Fprintln(w, "\nflow control (requests held while every replica was full; refused = 429, left out of the TTFT figures):")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "policy\tqueued\twait mean\tp99\tmax held\tshed\tqueue full\ttenant limit\ttimeout\tsaturated\tlearned limit p50 (min-max)\tmax_num_seqs\t")
		for _, r := range rep.Results {
			f := r.FlowControl
			if f == nil {
				continue
			}
			sat, limit, seqs := "-", "-", "-"
			if s := f.Saturation; s != nil {
				sat = fmt.Sprintf("%.1f%%", 100*s.SaturatedShare)
				if s.LearnedShare > 0 {
					limit = fmt.Sprintf("%.0f (%.0f-%.0f)", s.LearnedMaxRunning.P50, s.LearnedMaxRunning.Min, s.LearnedMaxRunning.Max)
				}
				seqs = fmt.Sprint(s.EngineMaxNumSeqs)
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t\n", r.Policy, f.Queued,
				fmtClass(f.Queued, f.QueueWait.Mean), fmtClass(f.Queued, f.QueueWait.P99), f.MaxQueued,
				f.Refused["shed"], f.Refused["queue_full"], f.Refused["tenant_limit"], f.Refused["queue_timeout"],
				sat, limit, seqs)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if tenants {
		fmt.Fprintln(w, "\ntenants (tokens = prompt + output; served = finished within the duration; fair = max-min fair share of all served; Jain's index over served / fair):")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "policy\ttenant\trequests\trefused\tTTFT p50\tp90\tp99\tdemand tok\tserved tok\tserved/fair\tJain\t")
		for _, r := range rep.Results {
			for i, t := range r.Tenants {
				jain := ""
				if i == 0 {
					jain = fmt.Sprintf("%.3f", r.TenantFairness)
				}
				n := t.Requests - t.Refused
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%.2f\t%s\t\n", r.Policy, t.Tenant, t.Requests, t.Refused,
					fmtClass(n, t.TTFT.P50), fmtClass(n, t.TTFT.P90), fmtClass(n, t.TTFT.P99),
					fmtTokens(t.DemandTokens), fmtTokens(t.ServedTokens), ratio(float64(t.ServedTokens), t.FairShareTokens), jain)
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if prios {
		fmt.Fprintln(w, "\npriorities (higher first; below 0 sheddable):")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "policy\tpriority\trequests\trefused\tTTFT p50\tp90\tp99\t")
		for _, r := range rep.Results {
			for _, p := range r.Priorities {
				n := p.Requests - p.Refused
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t%s\t\n", r.Policy, p.Priority, p.Requests, p.Refused,
					fmtClass(n, p.TTFT.P50), fmtClass(n, p.TTFT.P90), fmtClass(n, p.TTFT.P99))
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}
