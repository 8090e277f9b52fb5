package workload

import (
	"errors"
	"fmt"
	"math"
)

// The flood workload: politeTenants tenants each sending oneshot-shaped
// requests at one rate, and one more tenant (FloodTenant) sending the same
// kind of requests at floodFactor times that rate: the picture flow
// control's fair shares are for, one client flooding a shared fleet.
const (
	politeTenants = 3
	floodFactor   = 10
	// FloodTenant names the flooding tenant; the polite ones are
	// tenant-1..tenant-3.
	FloodTenant = "flood"
	// floodLoad is the flood workload's default load as a multiple of
	// oneshot's default (70% of round-robin's saturation): 2.0 offers
	// 1.4x what round-robin sustains, nearly all of it the flooder's; the
	// polite tenants alone (flood-polite) offer 0.46x oneshot's default.
	floodLoad = 2.0
)

// politeName names polite tenant i (0-based).
func politeName(i int) string { return fmt.Sprintf("tenant-%d", i+1) }

// newTenants builds the flood workload, or with flood false its polite
// tenants alone (flood-polite): the same requests of theirs, arriving at
// the same instants, without the flooder. Each tenant is its own oneshot
// generator (its own seed, scenarios and request ids), so a polite
// tenant's traffic does not depend on whether the flooder is there.
// A Rate is read as the whole flood workload's arrivals per second, in
// flood-polite too.
func newTenants(p Params, flood bool) (*mixedGen, error) {
	name := "flood"
	if !flood {
		name = "flood-polite"
	}
	p, err := p.normalized(name, false)
	if err != nil {
		return nil, err
	}
	total := p.Rate
	if total == 0 {
		total = floodLoad * oneshotSpec.defaultRate(p.Replicas)
	}
	total *= p.speed()
	unit := total / (politeTenants + floodFactor) // one polite tenant's rate
	g := &mixedGen{}
	for i := range politeTenants + 1 {
		rate, tenant := unit, politeName(i)
		if i == politeTenants {
			if !flood {
				break
			}
			rate, tenant = unit*floodFactor, FloodTenant
		}
		sub := Params{Seed: int64(mix(uint64(p.Seed), uint64(i))), Duration: p.Duration, Rate: rate, Replicas: p.Replicas}
		w, err := newOpen(oneshotSpec, sub, &ids{next: uint64(i+1) << 40})
		if err != nil {
			return nil, fmt.Errorf("workload: %s: %w", name, err)
		}
		g.parts = append(g.parts, w)
		g.tenants = append(g.tenants, tenant)
	}
	return g, nil
}

// priorities assigns flow-control priorities to another workload's
// requests.
type priorities struct {
	Workload
	salt       uint64
	high, shed float64
}

// Priority classes WithPriorities assigns.
const (
	PriorityHigh  = 1
	PriorityShed  = -1
	PriorityBasic = 0
)

// WithPriorities returns w with a share high of its requests at priority
// PriorityHigh, a share shed sheddable (PriorityShed) and the rest at 0.
// The class is drawn from seed and what the request is, not when it came:
// a session's requests share its class (the session key decides), and a
// request without one is classed by its arrival instant and prompt length,
// so every policy of a run sees the same classes.
func WithPriorities(w Workload, seed int64, high, shed float64) (Workload, error) {
	switch {
	case math.IsNaN(high) || math.IsNaN(shed) || high < 0 || shed < 0 || high+shed > 1:
		return nil, fmt.Errorf("workload: priority mix: shares must be >= 0 and sum to at most 1, got high %v, sheddable %v", high, shed)
	case w == nil:
		return nil, errors.New("workload: priority mix: no workload")
	}
	return &priorities{Workload: w, salt: saltOf("priorities", seed), high: high, shed: shed}, nil
}

// Pop implements Workload.
func (p *priorities) Pop() *Request {
	r := p.Workload.Pop()
	if r == nil {
		return nil
	}
	var key uint64
	if r.Session != "" {
		key = saltOf(r.Session, 0)
	} else {
		key = mix(uint64(r.At), uint64(r.Prompt.Tokens))
	}
	u := float64(mix(p.salt, key)>>11) / (1 << 53)
	switch {
	case u < p.high:
		r.Priority = PriorityHigh
	case u < p.high+p.shed:
		r.Priority = PriorityShed
	default:
		r.Priority = PriorityBasic
	}
	return r
}
