package balancer

import (
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
	decode float64 // seconds between two output tokens
	prev   Snapshot
	seen   bool
}

// fleetPrefill pools every replica's prefill counters into one throughput:
// computed prompt tokens over prefill seconds, both decayed per sample. It
// is pooled because a single replica's ratio depends on the prompts it
// happened to get (short ones pay a whole step each): priced per replica, a
// replica that once served short prompts looks slow, gets no traffic and
// never corrects it. Decode steps, well measured per token, stay per replica.
type fleetPrefill struct {
	tokens, seconds float64
}

// fleetDecay is the weight the pooled sums keep at each new sample.
const fleetDecay = 0.98

func (f *fleetPrefill) add(tokens, seconds float64) {
	f.tokens = f.tokens*fleetDecay + tokens
	f.seconds = f.seconds*fleetDecay + seconds
}

// rate is the pooled prefill throughput, 0 until measured.
func (f *fleetPrefill) rate() float64 {
	if f.seconds <= 0 || f.tokens <= 0 {
		return 0
	}
	return f.tokens / f.seconds
}

// observe folds a successful scrape into the rates and the fleet's pooled
// prefill. It reports whether the replica's counters went back (a
// restart), which also resets the baseline.
func (l *learnedRates) observe(s Snapshot, fleet *fleetPrefill) (restarted bool) {
	p := l.prev
	l.prev = s
	if !l.seen {
		l.seen = true
		return false
	}
	if s.PromptTokens < p.PromptTokens || s.PrefillCount < p.PrefillCount || s.DecodeCount < p.DecodeCount {
		return true
	}
	if dn, dt := s.DecodeCount-p.DecodeCount, s.DecodeSeconds-p.DecodeSeconds; dn > 0 && dt > 0 {
		l.decode = smooth(l.decode, dt/dn)
	}
	if dn, dt := s.PrefillCount-p.PrefillCount, s.PrefillSeconds-p.PrefillSeconds; dn > 0 && dt > 0 {
		if computed := (s.PromptTokens - p.PromptTokens) - max(0, s.PrefixHits-p.PrefixHits); computed > 0 {
			fleet.add(computed, dt)
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
	if c.Cost == (policy.CostConfig{}) {
		c.Cost = policy.DefaultCostConfig()
	}
	if c.PrefixTree == (policy.PrefixTreeConfig{}) {
		c.PrefixTree = policy.DefaultPrefixTreeConfig()
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
		return r.rates.decode
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
	left := r.prefillBusyUntil.Sub(now).Seconds() * b.prefillRate(r)
	return max(0, min(r.pendingPrefill, left))
}

// addPending records that res makes its replica compute tokens of prefill.
func (b *Balancer) addPending(res *Reservation, tokens float64, now time.Time) {
	r := res.rep
	res.prefill = tokens
	r.pendingPrefill += tokens
	r.pendingRequests++
	start := r.prefillBusyUntil
	if start.Before(now) {
		start = now
	}
	r.prefillBusyUntil = start.Add(time.Duration(tokens / b.prefillRate(r) * float64(time.Second)))
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

// FirstToken records that res's replica produced its first token (the
// proxy's first streamed token, the benchmark's engine event): its prefill
// is no longer ahead of later requests. Safe to call more than once and
// after Release.
func (b *Balancer) FirstToken(res *Reservation) {
	if res == nil || res.rep == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.donePending(res)
}

// SetExplain asks the policy to describe every candidate in each decision's
// Explanation.Detail (an allocation per decision: turn it on when decisions
// are logged at debug level or recorded).
func (b *Balancer) SetExplain(on bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e, ok := b.policy.(policy.Explainer); ok {
		e.SetExplain(on)
	}
}
