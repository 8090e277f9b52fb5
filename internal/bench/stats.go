package bench

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/engine"
	"github.com/llmlb/llmlb/internal/policy"
	"github.com/llmlb/llmlb/internal/workload"
)

// chartPoints bounds the number of windows kept for the traffic-share chart.
const chartPoints = 120

// LongPromptTokens splits requests into classes for ttft_short_seconds and
// ttft_long_seconds: a prompt of at least this many tokens is long (seed
// 000's picture: short requests stuck behind long prefills).
const LongPromptTokens = 8192

// accumulator collects one run's measurements as events happen.
type accumulator struct {
	replicas int
	window   time.Duration

	arrived, turn2Arrived            int
	completedInDuration, finishedAll int
	failed, rejected, refused        int
	reasons                          map[balancer.Reason]int
	pinDecisions                     map[string]int

	ttft, e2e, ttft2 []float64 // seconds
	ttftShort        []float64 // seconds, prompts under LongPromptTokens
	ttftLong         []float64 // seconds, the others
	slowdown         []float64 // TTFT / the prompt's TTFT alone on an idle, empty replica

	profile engine.Profile // for the isolated TTFT
	ceiling *ceilingCache  // the cache ceiling, fed every routed request

	turn2Prompt, turn2Cached uint64 // prompt / cached tokens of finished turns 2+

	// routedTokens[w][i]: prompt tokens routed to replica i in window w.
	routedTokens [][]float64
	perReplica   []float64 // total routed prompt tokens per replica

	generatedAtEnd uint64 // output tokens generated in [0, Duration]

	keep bool            // Options.KeepRequests
	log  []RequestRecord // every routed request, when keep
}

func (a *accumulator) init(n int, o *Options) {
	a.replicas = n
	a.window = o.ShareWindow
	a.perReplica = make([]float64, n)
	a.reasons = map[balancer.Reason]int{}
	a.pinDecisions = map[string]int{}
	a.profile = o.Profile
	a.keep = o.KeepRequests
	a.ceiling = newCeilingCache(n * o.Profile.Blocks())
	windows := int((o.Duration + o.ShareWindow - 1) / o.ShareWindow)
	a.routedTokens = make([][]float64, 0, windows)
}

func (a *accumulator) routed(i int, at time.Duration, req *workload.Request, res *balancer.Reservation) {
	w := int(at / a.window)
	for len(a.routedTokens) <= w {
		a.routedTokens = append(a.routedTokens, make([]float64, a.replicas))
	}
	tok := float64(req.Prompt.Tokens)
	a.routedTokens[w][i] += tok
	a.perReplica[i] += tok
	a.reasons[res.Reason]++
	a.ceiling.feed(req.Prompt)
	if ex := &res.Explanation; ex.PinKind != "" || ex.PinDecision != "" {
		a.pinDecisions[ex.PinKind+": "+ex.PinDecision]++
	}
}

func (a *accumulator) done(f *flight, at time.Duration, ev engine.Event, duration time.Duration) {
	a.finishedAll++
	if at <= duration {
		a.completedInDuration++
	}
	a.firstToken(f.req, f.firstToken)
	a.e2e = append(a.e2e, (at - f.arrived).Seconds())
	if f.req.Turn >= 2 {
		a.ttft2 = append(a.ttft2, f.firstToken.Seconds())
		a.turn2Prompt += uint64(f.req.Prompt.Tokens)
		a.turn2Cached += uint64(min(ev.CachedTokens, f.req.Prompt.Tokens))
	}
	a.record(f, f.firstToken, at, max(ev.CachedTokens, 0), ev.OutputTokens, true)
}

// record adds f to the request log (when kept): its first token after ttft,
// its end (or the run's, unfinished) at end.
func (a *accumulator) record(f *flight, ttft, end time.Duration, cached, output int, finished bool) {
	if !a.keep {
		return
	}
	a.log = append(a.log, RequestRecord{ID: f.req.ID, Session: f.req.Session, Turn: f.req.Turn,
		Arrival: f.arrived.Seconds(), Replica: replicaName(f.replica), PromptTokens: f.req.Prompt.Tokens,
		CachedTokens: min(cached, f.req.Prompt.Tokens), OutputTokens: output,
		TTFT: ttft.Seconds(), E2E: (end - f.arrived).Seconds(), Finished: finished,
		ExpectedCachedTokens: f.res.Explanation.CachedTokens, ExpectedTTFT: f.res.Explanation.Estimate})
}

// firstToken records a request's TTFT in the overall, per-class and
// slowdown distributions.
func (a *accumulator) firstToken(req *workload.Request, ttft time.Duration) {
	a.ttft = append(a.ttft, ttft.Seconds())
	if req.Prompt.Tokens < LongPromptTokens {
		a.ttftShort = append(a.ttftShort, ttft.Seconds())
	} else {
		a.ttftLong = append(a.ttftLong, ttft.Seconds())
	}
	if alone := a.profile.IsolatedTTFT(req.Prompt.Tokens); alone > 0 {
		a.slowdown = append(a.slowdown, float64(ttft)/float64(alone))
	}
}

// result turns the run's measurements into its Result. Requests still in an
// engine at the end are counted as unfinished, their latencies censored at
// end (a lower bound, so an overloaded policy is not flattered by dropping
// its slowest requests).
func (r *run) result(end time.Duration, wall time.Duration) Result {
	a := &r.acc
	unfinished := 0
	for _, f := range r.flights {
		unfinished++
		ttft := f.firstToken
		if ttft < 0 {
			ttft = end - f.arrived
		}
		a.firstToken(f.req, ttft)
		a.e2e = append(a.e2e, (end - f.arrived).Seconds())
		if f.req.Turn >= 2 {
			a.ttft2 = append(a.ttft2, ttft.Seconds())
		}
		a.record(f, ttft, end, f.cached, 0, false)
	}
	slices.SortFunc(a.log, func(x, y RequestRecord) int { return cmp.Compare(x.ID, y.ID) })
	slices.Sort(a.ttft)
	slices.Sort(a.e2e)
	slices.Sort(a.ttft2)
	slices.Sort(a.ttftShort)
	slices.Sort(a.ttftLong)
	slices.Sort(a.slowdown)

	var hit, query, prefill, preempt uint64
	for _, e := range r.eng {
		st := e.Stats()
		hit += st.PrefixHitTokens
		query += st.PrefixQueryTokens
		prefill += st.PrefillComputed
		preempt += st.Preemptions
	}
	var c balancer.Counters
	var pc policy.PinCounters
	for _, b := range r.bals {
		bc := b.Counters()
		c.Ejections += bc.Ejections
		c.Fallbacks += bc.Fallbacks
		b.Inspect(func(p policy.Policy) {
			if t, ok := p.(policy.PinTable); ok {
				k := t.PinCounters()
				pc.Spills += k.Spills
				pc.Rebinds += k.Rebinds
				pc.ForceRebinds += k.ForceRebinds
			}
		})
	}
	res := Result{
		Policy:             r.label,
		Requests:           a.arrived,
		Completed:          a.completedInDuration,
		Finished:           a.finishedAll,
		Unfinished:         unfinished,
		Failed:             a.failed,
		Rejected:           a.rejected,
		Refused:            a.refused,
		TTFT:               percentiles(a.ttft),
		E2E:                percentiles(a.e2e),
		OutputTokensPerSec: float64(a.generatedAtEnd) / r.opts.Duration.Seconds(),
		PrefixHitRate:      ratio(float64(hit), float64(query)),
		CacheCeiling:       a.ceiling.hitRate(),
		TTFTSlowdown:       percentiles(a.slowdown),
		TTFTShort:          percentiles(a.ttftShort),
		TTFTLong:           percentiles(a.ttftLong),
		ShortRequests:      len(a.ttftShort),
		LongRequests:       len(a.ttftLong),
		PrefillTokens:      prefill,
		Preemptions:        preempt,
		ImbalanceIndex:     imbalanceIndex(a.routedTokens, a.replicas),
		MaxReplicaShare:    maxShare(a.perReplica),
		RouteAffinity:      a.reasons[balancer.ReasonAffinity],
		RouteLoad:          a.reasons[balancer.ReasonLoad],
		RouteFallback:      a.reasons[balancer.ReasonFallback],
		Spills:             pc.Spills,
		Rebinds:            pc.Rebinds + pc.ForceRebinds,
		Ejections:          c.Ejections,
		PinDecisions:       a.pinDecisions,
		TTFTQuantiles:      quantileCurve(a.ttft),
		WallSeconds:        wall.Seconds(),
		RequestLog:         a.log,
	}
	if wall > 0 {
		res.SimulatedSecPerWall = r.now.Seconds() / wall.Seconds()
	}
	res.ShareWindowSeconds, res.Share = shareSeries(a.routedTokens, a.replicas, a.window, r.opts.Duration)
	if a.turn2Arrived > 0 {
		res.Turns2 = &TurnStats{
			Requests:      len(a.ttft2),
			TTFT:          percentiles(a.ttft2),
			PromptTokens:  a.turn2Prompt,
			CachedTokens:  a.turn2Cached,
			PrefillTokens: a.turn2Prompt - a.turn2Cached,
		}
	}
	return res
}

// percentile is the nearest-rank percentile of sorted values (0 when empty).
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	k := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	k = max(0, min(k, len(sorted)-1))
	return sorted[k]
}

func percentiles(sorted []float64) Percentiles {
	return Percentiles{
		P50: percentile(sorted, 50),
		P90: percentile(sorted, 90),
		P99: percentile(sorted, 99),
	}
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// quantileProbs are the probabilities of the stored TTFT curve: every percent,
// then a finer tail up to the maximum (the tail is what differs).
var quantileProbs = func() []float64 {
	var ps []float64
	for i := range 99 {
		ps = append(ps, float64(i+1)/100)
	}
	for _, p := range []float64{0.993, 0.995, 0.997, 0.999, 1} {
		ps = append(ps, p)
	}
	return ps
}()

// quantileCurve samples the TTFT distribution for the CDF chart.
func quantileCurve(sorted []float64) []Quantile {
	if len(sorted) == 0 {
		return nil
	}
	out := make([]Quantile, len(quantileProbs))
	for i, p := range quantileProbs {
		out[i] = Quantile{P: p, Seconds: percentile(sorted, p*100)}
	}
	return out
}

// imbalanceIndex is the mean, over the share windows in which anything was
// routed, of max_i tokens_i / (sum_i tokens_i / N): 1 is perfectly even, N
// is everything on one replica. docs/BENCH.md defines it for users.
func imbalanceIndex(windows [][]float64, n int) float64 {
	var sum float64
	var count int
	for _, w := range windows {
		var total, top float64
		for _, v := range w {
			total += v
			top = max(top, v)
		}
		if total == 0 {
			continue
		}
		sum += top * float64(n) / total
		count++
	}
	return ratio(sum, float64(count))
}

// maxShare is the largest replica's share of all routed prompt tokens.
func maxShare(per []float64) float64 {
	var total, top float64
	for _, v := range per {
		total += v
		top = max(top, v)
	}
	return ratio(top, total)
}

// shareSeries merges share windows into at most chartPoints chart windows and
// returns each window's per-replica share of routed prompt tokens.
func shareSeries(windows [][]float64, n int, window, duration time.Duration) (float64, [][]float64) {
	total := int((duration + window - 1) / window)
	merge := max(1, (total+chartPoints-1)/chartPoints)
	var out [][]float64
	for start := 0; start < total; start += merge {
		sums := make([]float64, n)
		var all float64
		for w := start; w < start+merge && w < len(windows); w++ {
			for i, v := range windows[w] {
				sums[i] += v
				all += v
			}
		}
		for i := range sums {
			sums[i] = ratio(sums[i], all)
		}
		out = append(out, sums)
	}
	return (window * time.Duration(merge)).Seconds(), out
}
