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

	// Cached tokens the policy's index expected, and how many of them the
	// engine found (at most the expected, per request): index_accuracy.
	indexExpected, indexFound uint64
	// The policy's TTFT estimates against the first tokens (cost).
	pred predictions

	// routedTokens[w][i]: prompt tokens routed to replica i in window w.
	routedTokens [][]float64
	perReplica   []float64 // total routed prompt tokens per replica

	generatedAtEnd uint64 // output tokens generated in [0, Duration]

	keep bool            // Options.KeepRequests
	log  []RequestRecord // every routed request, when keep

	// Flow control's counts (runs behind it).
	queuedN   int            // requests queued
	maxHeld   int            // most held at once
	waits     []float64      // seconds queued, of those dispatched
	refusedFC map[string]int // 429s by reason code
	// Per tenant and per priority class.
	tenants map[string]*classAcc
	prios   map[int]*classAcc
}

// classAcc collects one tenant's or priority class's figures.
type classAcc struct {
	requests, refused int
	ttft              []float64
	demand, served    uint64 // tokens: of every arrival, of those finished within the duration
}

func (a *accumulator) init(n int, o *Options) {
	a.replicas = n
	a.window = o.ShareWindow
	a.perReplica = make([]float64, n)
	a.reasons = map[balancer.Reason]int{}
	a.pinDecisions = map[string]int{}
	a.profile = o.Profile
	a.keep = o.KeepRequests
	a.refusedFC = map[string]int{}
	a.tenants = map[string]*classAcc{}
	a.prios = map[int]*classAcc{}
	a.ceiling = newCeilingCache(n * o.Profile.Blocks())
	windows := int((o.Duration + o.ShareWindow - 1) / o.ShareWindow)
	a.routedTokens = make([][]float64, 0, windows)
}

// tokensOf is a request's size for fair shares: prompt plus output tokens.
func tokensOf(req *workload.Request) uint64 {
	return uint64(req.Prompt.Tokens) + uint64(max(req.Output, 0))
}

// classes returns req's tenant and priority accumulators.
func (a *accumulator) classes(req *workload.Request) (*classAcc, *classAcc) {
	t := a.tenants[req.Tenant]
	if t == nil {
		t = &classAcc{}
		a.tenants[req.Tenant] = t
	}
	p := a.prios[req.Priority]
	if p == nil {
		p = &classAcc{}
		a.prios[req.Priority] = p
	}
	return t, p
}

// arrive counts an arrival.
func (a *accumulator) arrive(req *workload.Request) {
	a.arrived++
	t, p := a.classes(req)
	t.requests++
	p.requests++
	t.demand += tokensOf(req)
}

// queued counts a request flow control holds; held are held now.
func (a *accumulator) queued(held int) {
	a.queuedN++
	a.maxHeld = max(a.maxHeld, held)
}

// waited records how long a held request waited before its dispatch.
func (a *accumulator) waited(d time.Duration) { a.waits = append(a.waits, d.Seconds()) }

// refuse counts a 429 of flow control's (code: the error code).
func (a *accumulator) refuse(req *workload.Request, code string) {
	a.refusedFC[code]++
	t, p := a.classes(req)
	t.refused++
	p.refused++
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
	if at <= duration {
		t, _ := a.classes(f.req)
		t.served += tokensOf(f.req)
	}
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
		ExpectedCachedTokens: f.res.Explanation.CachedTokens, ExpectedTTFT: f.res.Explanation.Estimate,
		Priority: f.req.Priority, Sent: f.sent.Seconds(), Tenant: f.req.Tenant})
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
	t, p := a.classes(req)
	t.ttft = append(t.ttft, ttft.Seconds())
	p.ttft = append(p.ttft, ttft.Seconds())
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
	var stillHeld int
	if r.fc != nil {
		// Requests still held never reached a replica: unfinished, their
		// latencies censored at end like the others'.
		for _, h := range r.fc.stillHeld() {
			stillHeld++
			unfinished++
			ttft := end - h.arrived
			a.firstToken(h.req, ttft)
			a.e2e = append(a.e2e, ttft.Seconds())
			if h.req.Turn >= 2 {
				a.ttft2 = append(a.ttft2, ttft.Seconds())
			}
		}
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
	if r.fc != nil && (a.queuedN > 0 || len(a.refusedFC) > 0) {
		res.FlowControl = a.flowStats(stillHeld, r.fc.limits.stats())
	}
	if a.indexExpected > 0 {
		res.IndexAccuracy = float64(a.indexFound) / float64(a.indexExpected)
	}
	res.TTFTPrediction = a.pred.stats()
	res.Tenants, res.TenantFairness = a.tenantStats()
	res.Priorities = a.priorityStats()
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

// Percentile is the nearest-rank percentile (0-100) of sorted values, the
// one every figure of a Report uses (0 when empty).
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	k := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	k = max(0, min(k, len(sorted)-1))
	return sorted[k]
}

func percentiles(sorted []float64) Percentiles {
	return Percentiles{
		P50: Percentile(sorted, 50),
		P90: Percentile(sorted, 90),
		P99: Percentile(sorted, 99),
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
		out[i] = Quantile{P: p, Seconds: Percentile(sorted, p*100)}
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

// flowStats are flow control's figures.
func (a *accumulator) flowStats(stillHeld int, sat *SaturationStats) *FlowStats {
	slices.Sort(a.waits)
	fs := &FlowStats{Queued: a.queuedN, MaxQueued: a.maxHeld, StillQueued: stillHeld, Saturation: sat}
	if len(a.waits) > 0 {
		var sum float64
		for _, w := range a.waits {
			sum += w
		}
		fs.QueueWait = Waits{Mean: sum / float64(len(a.waits)), P50: Percentile(a.waits, 50),
			P90: Percentile(a.waits, 90), P99: Percentile(a.waits, 99)}
	}
	if len(a.refusedFC) > 0 {
		fs.Refused = a.refusedFC
	}
	return fs
}

// DefaultTenant names the one tenant of requests that carry none, in the
// per-tenant figures.
const DefaultTenant = "default"

// tenantStats are the per-tenant figures and their fairness, when the
// workload has tenants (nil, 0 when every request is the one unnamed
// tenant's).
func (a *accumulator) tenantStats() ([]TenantStats, float64) {
	if len(a.tenants) == 0 || len(a.tenants) == 1 && a.tenants[""] != nil {
		return nil, 0
	}
	names := make([]string, 0, len(a.tenants))
	for name := range a.tenants {
		names = append(names, name)
	}
	slices.Sort(names)
	out := make([]TenantStats, len(names))
	demand := make([]float64, len(names))
	var served float64
	for i, name := range names {
		c := a.tenants[name]
		slices.Sort(c.ttft)
		label := name
		if label == "" {
			label = DefaultTenant
		}
		out[i] = TenantStats{Tenant: label, Requests: c.requests, Refused: c.refused, TTFT: percentiles(c.ttft),
			DemandTokens: c.demand, ServedTokens: c.served}
		demand[i] = float64(c.demand)
		served += float64(c.served)
	}
	fair := maxMinShares(demand, served)
	x := make([]float64, 0, len(out))
	for i := range out {
		out[i].FairShareTokens = fair[i]
		if fair[i] > 0 {
			x = append(x, float64(out[i].ServedTokens)/fair[i])
		}
	}
	return out, jain(x)
}

// The fairness of a run across tenants is Jain's index J = (Σx)² / (n Σx²)
// over x_i = T_i / O_i, tenant i's served tokens over its max-min fair
// share O_i of everything served (Jain, Chiu and Hawe, 1984, who normalize
// by the "optimal" allocation when the fair one is not equal shares).
// Why not raw throughput (x_i = T_i): tenants ask for different amounts,
// and a polite tenant served all it asked beside a flooder served the rest
// would score far below 1. Why not T_i / demand_i: that is 1 whenever every
// tenant gets the same fraction of its demand, which is what first come
// first served gives a flooder, 10 times the polite tenant's service for 10
// times its demand, while the polite tenant waits behind it; the index
// would call the unfair outcome fair. The max-min fair share is the
// allocation fair queueing aims at (start-time fair queueing in tokens
// between tenants of equal weight): a tenant asking less than an equal
// split of what was served gets all it asked, the others split the rest
// equally. J is 1 when every tenant got its fair share and falls towards
// 1/n as service concentrates. Served and demand count the tokens of the
// requests that arrived within the run's duration, served only those
// finished by its end, so a backlog still queued at the end counts as not
// served.
func jain(x []float64) float64 {
	var sum, sq float64
	for _, v := range x {
		sum += v
		sq += v * v
	}
	if sq == 0 {
		return 0
	}
	return sum * sum / (float64(len(x)) * sq)
}

// maxMinShares divides total between claims demand max-min fairly (water
// filling): each claim gets min(its demand, an equal split of what the
// smaller claims left).
func maxMinShares(demand []float64, total float64) []float64 {
	order := make([]int, len(demand))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(i, j int) int { return cmp.Compare(demand[i], demand[j]) })
	out := make([]float64, len(demand))
	left := total
	for k, i := range order {
		share := left / float64(len(order)-k)
		out[i] = min(demand[i], share)
		left -= out[i]
	}
	return out
}

// priorityStats are the per-priority figures when requests carry more
// than the default priority (nil otherwise).
func (a *accumulator) priorityStats() []PriorityStats {
	if len(a.prios) == 0 || len(a.prios) == 1 && a.prios[0] != nil {
		return nil
	}
	prios := make([]int, 0, len(a.prios))
	for p := range a.prios {
		prios = append(prios, p)
	}
	slices.Sort(prios)
	slices.Reverse(prios)
	out := make([]PriorityStats, len(prios))
	for i, p := range prios {
		c := a.prios[p]
		slices.Sort(c.ttft)
		out[i] = PriorityStats{Priority: p, Requests: c.requests, Refused: c.refused, TTFT: percentiles(c.ttft)}
	}
	return out
}
