package balancer

import (
	"math"
	"slices"
	"time"

	"github.com/llmlb/llmlb/internal/policy"
)

// What the balancer learns about each replica for cost-aware policies
// (docs/ROUTING.md, policy cost): its prefill throughput and decode step
// from the differences of its /metrics counters between scrapes, and the
// prefill it still owes our own requests.

// rateSmoothing is the weight of a new scrape's sample in the moving
// averages of the learned rates.
const rateSmoothing = 0.2

// learnedRates holds one replica's measured decode step, zero until
// measured, and the counters of its last scrape.
type learnedRates struct {
	decode   float64 // seconds between two output tokens
	decodeAt float64 // the batch (running requests) that decode was measured at
	prev     Snapshot
	seen     bool
}

// decodeSlope fits, over the whole fleet, how much a decode step grows per
// request in the batch (least squares of step on batch size, samples
// decayed), so that a replica's step measured at the last scrape can be
// carried to the batch it has now: a stale step would make every request
// until the next scrape herd to whichever replica looked fastest then.
type decodeSlope struct {
	w, x, y, xx, xy float64
}

func (d *decodeSlope) add(batch, step float64) {
	d.w = d.w*fleetDecay + 1
	d.x = d.x*fleetDecay + batch
	d.y = d.y*fleetDecay + step
	d.xx = d.xx*fleetDecay + batch*batch
	d.xy = d.xy*fleetDecay + batch*step
}

// slope is the fitted seconds per request in the batch, never negative; 0
// until the batch sizes seen vary.
func (d *decodeSlope) slope() float64 {
	den := d.w*d.xx - d.x*d.x
	if d.w < 2 || den <= 1e-9*d.w*d.w {
		return 0
	}
	return max(0, (d.w*d.xy-d.x*d.y)/den)
}

// fleetPrefill learns the marginal prefill cost, seconds per computed
// prompt token, from every replica's prefill histogram. A request's prefill
// time is a fixed part (its steps' overhead: about a decode step for each,
// paid even by a 100-token prompt batched with 40 decoding requests) plus
// its tokens' part; dividing tokens by time would charge short prompts the
// whole step and make a cached prefix look worth seconds when it is worth
// milliseconds. So from each scrape interval's prefill seconds T, requests
// n and computed tokens k, the replica's decode step (its measured inter-
// token time) is taken out once per request: t = (T - n*step) / k, summed
// over the fleet with old samples decayed. It is pooled because one
// replica's samples depend on the prompts it happened to get; priced per
// replica, one that once served short prompts would look slow, get no
// traffic and never correct it. Decode steps stay per replica.
type fleetPrefill struct {
	tokens, seconds, overhead float64 // decayed sums of k, T and n*step
	requests, outputs         float64 // decayed sums of n and output tokens: the mean output
}

// defaultMeanOutput prices a batch slot until outputs are measured.
const defaultMeanOutput = 256

// meanOutput is the fleet's mean output tokens per request.
func (f *fleetPrefill) meanOutput() float64 {
	if f.requests < 1 || f.outputs <= 0 {
		return defaultMeanOutput
	}
	return f.outputs / f.requests
}

// fleetDecay is the weight the pooled sums keep at each new sample.
const fleetDecay = 0.98

// maxRateOverRaw bounds the marginal rate at this many times tokens over
// seconds: when prefills are tiny beside the step, T - n*step is mostly
// noise.
const maxRateOverRaw = 20

func (f *fleetPrefill) add(tokens, seconds, overhead float64) {
	f.tokens = f.tokens*fleetDecay + tokens
	f.seconds = f.seconds*fleetDecay + seconds
	f.overhead = f.overhead*fleetDecay + overhead
}

// rate is the marginal prefill throughput (tokens per second), 0 until
// measured.
func (f *fleetPrefill) rate() float64 {
	if f.seconds <= 0 || f.tokens <= 0 {
		return 0
	}
	raw := f.tokens / f.seconds
	tokenSeconds := f.seconds - f.overhead
	if tokenSeconds <= f.tokens/(maxRateOverRaw*raw) {
		return maxRateOverRaw * raw
	}
	return f.tokens / tokenSeconds
}

// observe folds a successful scrape into the rates and the fleet's pooled
// prefill. It reports whether the replica's counters went back (a
// restart), which also resets the baseline.
func (l *learnedRates) observe(s Snapshot, fleet *fleetPrefill, slope *decodeSlope) (restarted bool) {
	p := l.prev
	l.prev = s
	if !l.seen {
		l.seen = true
		return false
	}
	if s.PromptTokens < p.PromptTokens || s.PrefillCount < p.PrefillCount || s.DecodeCount < p.DecodeCount {
		return true
	}
	// Samples outside what any GPU does are a misbehaving exporter's, and
	// would otherwise herd traffic to it (a decode step of 1 ns) or poison
	// the fleet's pooled rate.
	if dn, dt := s.DecodeCount-p.DecodeCount, s.DecodeSeconds-p.DecodeSeconds; dn > 0 && dt > 0 && dt/dn >= minDecodeStep && dt/dn <= maxDecodeStep {
		batch := (s.Running + p.Running) / 2 // the interval's batch, roughly
		l.decode = smooth(l.decode, dt/dn)
		l.decodeAt = smooth(l.decodeAt, batch)
		slope.add(batch, dt/dn)
	}
	if dn, do := s.PrefillCount-p.PrefillCount, s.DecodeCount-p.DecodeCount; dn > 0 && do >= 0 {
		// Each request's first token is not an inter-token sample.
		fleet.requests = fleet.requests*fleetDecay + dn
		fleet.outputs = fleet.outputs*fleetDecay + do + dn
	}
	if dn, dt := s.PrefillCount-p.PrefillCount, s.PrefillSeconds-p.PrefillSeconds; dn > 0 && dt > 0 && l.decode > 0 {
		if computed := (s.PromptTokens - p.PromptTokens) - max(0, s.PrefixHits-p.PrefixHits); computed > 0 && computed/dt <= maxPrefillRate {
			fleet.add(computed, dt, dn*l.decode)
		}
	}
	return false
}

// smooth is an exponential moving average that starts at its first sample.
func smooth(avg, sample float64) float64 {
	if avg == 0 {
		return sample
	}
	return avg + rateSmoothing*(sample-avg)
}

// withDefaults fills the policy settings a caller left at their zero value
// (a Config built by hand rather than from DefaultConfig).
func (c Config) withDefaults() Config {
	c.Settings = c.Settings.WithDefaults()
	if c.Policy == "" {
		c.Policy = policy.DefaultName
	}
	return c
}

// prefillRate is the fleet's pooled prefill throughput (fleetPrefill), or
// the configured prior until measured.
func (b *Balancer) prefillRate(*replica) float64 {
	if r := b.fleetPrefill.rate(); r > 0 {
		return r
	}
	return b.cfg.Cost.PrefillRate
}

// decodeStep is r's learned time per output token; until then the fleet's
// median, or the configured prior (a new replica priced at a pessimistic
// prior would get no traffic to learn from).
func (b *Balancer) decodeStep(r *replica) float64 {
	switch {
	case r.rates.decode > 0:
		// Carried from the batch it was measured at to the batch now.
		now := max(r.snap.Running, float64(r.inFlight))
		return max(r.rates.decode+b.decodeSlope.slope()*(now-r.rates.decodeAt), r.rates.decode/4)
	case b.fleetDecode > 0:
		return b.fleetDecode
	}
	return b.cfg.Cost.DecodeStep.Seconds()
}

// updateFleetDecode recomputes the median of the replicas' decode steps.
func (b *Balancer) updateFleetDecode() {
	var dec []float64
	for _, r := range b.replicas {
		if r.rates.decode > 0 {
			dec = append(dec, r.rates.decode)
		}
	}
	b.fleetDecode = median(dec)
}

// median of xs (0 for none); sorts xs.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	m := len(xs) / 2
	if len(xs)%2 == 1 {
		return xs[m]
	}
	return (xs[m-1] + xs[m]) / 2
}

// pending is the prefill r still owes our requests: what is not past its
// first token, but no more than r can still have to do at its rate since
// the work was sent (streams tell us their first token; buffered answers
// do not, so the fluid bound retires their prefill in time).
func (b *Balancer) pending(r *replica, now time.Time) float64 {
	if r.pendingPrefill <= 0 {
		return 0
	}
	return b.pendingAt(r, now, b.decodeStep(r), b.prefillRate(r))
}

// pendingAt is pending with r's decode step and prefill rate already known
// (step 1 computes them once per candidate).
func (b *Balancer) pendingAt(r *replica, now time.Time, step, rate float64) float64 {
	if r.pendingPrefill <= 0 {
		return 0
	}
	left := r.prefillBusyUntil.Sub(now).Seconds() * b.drainRateAt(step, rate)
	return max(0, min(r.pendingPrefill, left))
}

// addPending records that res makes its replica compute tokens of prefill.
func (b *Balancer) addPending(res *Reservation, tokens float64, now time.Time) {
	r := res.rep
	res.prefill = tokens
	r.pendingPrefill += tokens
	r.heldPrefill += tokens
	r.sent = r.sendRate(now) + tokens/sendRateWindow.Seconds()
	r.sentAt = now
	r.pendingRequests++
	r.pace.sent++
	res.sent = r.pace.sent
	start := r.prefillBusyUntil
	if start.Before(now) {
		start = now
	}
	r.prefillBusyUntil = start.Add(time.Duration(tokens / b.drainRate(r) * float64(time.Second)))
}

// drainRate is how fast r works through prefill, in tokens per second:
// the marginal rate with each batch_tokens chunk's step overhead added, so
// that a 100K-token prompt is not believed done in a third of its time.
func (b *Balancer) drainRate(r *replica) float64 {
	return b.drainRateAt(b.decodeStep(r), b.prefillRate(r))
}

// drainRateAt is drainRate for a decode step and a prefill rate.
func (b *Balancer) drainRateAt(step, rate float64) float64 {
	return 1 / (step/float64(b.cfg.Cost.BatchTokens) + 1/rate)
}

// donePending retires res's prefill (first token or end), under the lock.
func (b *Balancer) donePending(res *Reservation) {
	if res.firstToken || res.prefill == 0 {
		res.firstToken = true
		return
	}
	res.firstToken = true
	r := res.rep
	r.pendingPrefill -= res.prefill
	r.pendingRequests--
	if r.pendingRequests <= 0 {
		r.pendingPrefill, r.pendingRequests = 0, 0
	}
}

// FirstToken records that res's replica produced its first token at now
// (the proxy's first streamed token, the benchmark's engine event): the
// policy's estimate is checked against it (limits.go), its prefill
// is no longer ahead of later requests, and the request runs, holding its
// prompt's blocks until it ends (the policy's Started hook). Safe to
// call more than once and after Release.
func (b *Balancer) FirstToken(res *Reservation, now time.Time) {
	if res == nil || res.rep == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !res.firstToken && !res.released && !res.rep.removed && len(res.blocks) > 0 && any(res.policy) == any(b.policy) {
		res.run = b.policy.Started(res.rep.name, res.blocks)
	}
	if !res.released {
		b.observeFirstToken(res, now)
	}
	owed := !res.firstToken && res.prefill > 0
	b.donePending(res)
	if owed {
		b.restartPrefillBound(res, now)
	}
}

// The pending prefill's time bound (pendingAt) runs from when the work was
// sent, at the drain rate. A replica that gets through prompts faster than
// that rate says falls ever further ahead of its bound while it stays busy,
// so the bound never retires anything and the prompt being computed counts
// in full until its first token: on longshort (8 replicas at
// 1.5x) short prompts were sent behind a 97K-token prompt 0.2 s from done as
// if it had just started. So at each first token on a replica whose measured
// pace is above the drain rate, the bound restarts: what it still owes, from
// now, at the drain rate. Not on every replica: the overloaded conversation
// trace lost where a replica waiting for KV memory, slower than its drain
// rate, was credited that rate. And only while the replica's first tokens
// come in the order its requests were sent, as an engine that computes one
// prompt at a time gives them: where prefills share the steps, short prompts
// overtake long ones, the owed prefill is being computed all at once, and the
// restart raised the P99 on such engines (64 slots, 16 partial prefills:
// 0.57 -> 0.77 s; docs/benchmarks/LAB-2026.md, "The pending prefill's bound
// restarted").
//
// prefillPace is that measured pace: the prompt tokens computed over the
// seconds they took, each first token's tokens against the time since the
// later of the replica's previous first token and the request's dispatch,
// both sums decayed so that about the latest paceMemory first tokens count
// (a first token at the same instant as the previous one is left out, which
// errs toward the bound as it was); and the share of first tokens that came
// after a later request's.
type prefillPace struct {
	last            time.Time // the latest first token
	tokens, seconds float64
	samples         int
	// sent numbers the replica's requests with prefill in dispatch order
	// (Reservation.sent); firstSent is the highest that had its first token.
	sent, firstSent uint64
	// overtaken is the running share of first tokens that came after a
	// later-sent request's, over about paceMemory.
	overtaken float64
}

// Pace bounds.
const (
	// paceMemory is about how many first tokens the pace remembers.
	paceMemory = 16
	// minPaceSamples is the first tokens a pace needs before it counts.
	minPaceSamples = 4
	// maxOvertaken is the overtaken share at or above which the bound is
	// not restarted: one overtaken first token keeps it so for about the
	// next 28.
	maxOvertaken = 0.01
)

// add folds in a first token at now of a request dispatched at sent that
// made the replica compute tokens, and returns the pace in tokens per
// second (0 until minPaceSamples).
func (p *prefillPace) add(sent, now time.Time, tokens float64) float64 {
	start := sent
	if p.last.After(start) {
		start = p.last
	}
	if dt := now.Sub(start).Seconds(); dt > 0 {
		keep := 1 - 1.0/paceMemory
		p.tokens = p.tokens*keep + tokens
		p.seconds = p.seconds*keep + dt
		p.samples++
	}
	if now.After(p.last) {
		p.last = now
	}
	if p.samples < minPaceSamples || p.seconds <= 0 {
		return 0
	}
	return p.tokens / p.seconds
}

// restartPrefillBound measures res's replica's pace and order at res's
// first token and, where the pace is above the drain rate and no first
// token came out of order lately, restarts the replica's pending prefill
// bound from now.
func (b *Balancer) restartPrefillBound(res *Reservation, now time.Time) {
	r := res.rep
	drain := b.drainRate(r)
	overtaken := 0.0
	if res.sent < r.pace.firstSent {
		overtaken = 1
	}
	r.pace.firstSent = max(r.pace.firstSent, res.sent)
	r.pace.overtaken += (overtaken - r.pace.overtaken) / paceMemory
	if r.pace.add(res.at, now, res.prefill) <= drain {
		return
	}
	if r.pace.overtaken >= maxOvertaken {
		return
	}
	r.prefillBusyUntil = now.Add(time.Duration(r.pendingPrefill / drain * float64(time.Second)))
}

// Cached records the prompt tokens res's replica reported the request
// found in its prefix cache (vLLM's usage.prompt_tokens_details.cached_tokens,
// the simulator's first-token event), for a policy that learns from them
// (policy.CacheObserver). Once per reservation; safe after Release.
func (b *Balancer) Cached(res *Reservation, tokens int) {
	if res == nil || res.rep == nil || tokens < 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if res.cachedSeen || res.rep.removed {
		return
	}
	res.cachedSeen = true
	if o, ok := res.policy.(policy.CacheObserver); ok && any(res.policy) == any(b.policy) {
		o.ObserveCached(res.rep.name, res.shape, tokens)
	}
}

// SetExplain asks the policy to describe every candidate in each decision's
// Explanation.Detail (an allocation per decision: turn it on when decisions
// are logged at debug level or recorded).
func (b *Balancer) SetExplain(on bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.policy.SetExplain(on)
}

// Plausible bounds of what a replica's /metrics may teach; samples outside
// are a misbehaving exporter's and are ignored (a decode step of 1 ns would
// herd traffic to it; an absurd prefill rate would poison the fleet's).
const (
	minDecodeStep    = 1e-4             // seconds between two tokens (10,000 tokens/s for one sequence)
	maxDecodeStep    = 60               // seconds
	maxPrefillRate   = 1e7              // prompt tokens per second of one replica
	maxKVCacheTokens = MaxKVCacheTokens // KV capacity in tokens (kvclaim.go)
)

// sendRateWindow is the time constant of a replica's send rate: the
// prompt tokens sent there, each counting for e^(-age/window).
const sendRateWindow = time.Second

// sendRate is the prompt tokens (less expected cache hits) this balancer
// has lately sent the replica per second, decayed to now.
func (r *replica) sendRate(now time.Time) float64 {
	if r.sent <= 0 || !now.After(r.sentAt) {
		return r.sent
	}
	return r.sent * math.Exp(-now.Sub(r.sentAt).Seconds()/sendRateWindow.Seconds())
}
