package balancer

import (
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

// learnedRates holds one replica's measured rates; zero until measured.
type learnedRates struct {
	prefill float64 // prompt tokens computed per second of prefill
	decode  float64 // seconds between two output tokens
	prev    Snapshot
	seen    bool
}

// observe folds a successful scrape into the rates. It reports whether the
// replica's counters went back (a restart), which also resets the rates'
// baseline.
func (l *learnedRates) observe(s Snapshot) (restarted bool) {
	p := l.prev
	l.prev = s
	if !l.seen {
		l.seen = true
		return false
	}
	if s.PromptTokens < p.PromptTokens || s.PrefillCount < p.PrefillCount || s.DecodeCount < p.DecodeCount {
		return true
	}
	if dn, dt := s.PrefillCount-p.PrefillCount, s.PrefillSeconds-p.PrefillSeconds; dn > 0 && dt > 0 {
		computed := (s.PromptTokens - p.PromptTokens) - max(0, s.PrefixHits-p.PrefixHits)
		if computed > 0 {
			l.prefill = smooth(l.prefill, computed/dt)
		}
	}
	if dn, dt := s.DecodeCount-p.DecodeCount, s.DecodeSeconds-p.DecodeSeconds; dn > 0 && dt > 0 {
		l.decode = smooth(l.decode, dt/dn)
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

// prefillRate is r's learned prefill throughput, or the configured prior.
func (b *Balancer) prefillRate(r *replica) float64 {
	if r.rates.prefill > 0 {
		return r.rates.prefill
	}
	return b.cfg.Cost.PrefillRate
}

// decodeStep is r's learned time per output token, or the configured prior.
func (b *Balancer) decodeStep(r *replica) float64 {
	if r.rates.decode > 0 {
		return r.rates.decode
	}
	return b.cfg.Cost.DecodeStep.Seconds()
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
