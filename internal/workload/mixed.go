package workload

import (
	"fmt"
	"time"
)

// part is a generator a mixed workload can blend.
type part interface {
	Workload
	completer
}

// mixShare is one part of the mixed workload and its share of the load.
type mixShare struct {
	name  string
	share float64 // share of the fleet's capacity at the default rate
}

// mixedShares is the blend: shares of load (replica time), not of requests.
var mixedShares = []mixShare{
	{"agentic", 0.40},
	{"chat", 0.30},
	{"oneshot", 0.15},
	{"longshort", 0.15},
}

// mixedGen interleaves its parts' requests in arrival order.
type mixedGen struct {
	parts []part
	// tenants, when set, names the tenant of each part's requests (the
	// flood workload); the mixed workload's parts have none.
	tenants []string
}

// newMixed builds the blend. Each part runs at its share of its own default
// rate (so the blend, like every workload, uses ~70% of a round-robin fleet);
// a Rate scales all parts alike, read as the blend's total arrivals per
// second of new sessions and one-shot requests.
func newMixed(p Params) (*mixedGen, error) {
	p, err := p.normalized("mixed", false)
	if err != nil {
		return nil, err
	}
	rates := make([]float64, len(mixedShares))
	total := 0.0
	for i, m := range mixedShares {
		rates[i] = m.share * defaultRateOf(m.name, p.Replicas)
		total += rates[i]
	}
	scale := 1.0
	if p.Rate > 0 {
		scale = p.Rate / total
	}
	scale *= p.speed()
	g := &mixedGen{}
	shared := newIDs()
	for i, m := range mixedShares {
		sub := Params{Seed: int64(mix(uint64(p.Seed), uint64(i))), Duration: p.Duration, Rate: rates[i] * scale, Replicas: p.Replicas}
		var w part
		var err error
		switch m.name {
		case "agentic":
			w, err = newSessions(agenticSpec, sub, shared)
		case "chat":
			w, err = newSessions(chatSpec, sub, shared)
		case "oneshot":
			w, err = newOpen(oneshotSpec, sub, shared)
		case "longshort":
			w, err = newOpen(longshortSpec, sub, shared)
		}
		if err != nil {
			return nil, fmt.Errorf("workload: mixed: %w", err)
		}
		g.parts = append(g.parts, w)
	}
	return g, nil
}

// defaultRateOf returns a blendable workload's default rate.
func defaultRateOf(name string, replicas int) float64 {
	switch name {
	case "agentic":
		return agenticSpec.defaultRate(replicas)
	case "chat":
		return chatSpec.defaultRate(replicas)
	case "oneshot":
		return oneshotSpec.defaultRate(replicas)
	case "longshort":
		return longshortSpec.defaultRate(replicas)
	}
	return 0
}

// first returns the part with the earliest pending request (ties: the
// earlier part in mixedShares), or -1.
func (g *mixedGen) first() (int, time.Duration) {
	best, bestAt := -1, time.Duration(0)
	for i, w := range g.parts {
		if at, ok := w.Peek(); ok && (best < 0 || at < bestAt) {
			best, bestAt = i, at
		}
	}
	return best, bestAt
}

// Peek implements Workload.
func (g *mixedGen) Peek() (time.Duration, bool) {
	i, at := g.first()
	return at, i >= 0
}

// Pop implements Workload.
func (g *mixedGen) Pop() *Request {
	i, _ := g.first()
	if i < 0 {
		return nil
	}
	r := g.parts[i].Pop()
	if r != nil && g.tenants != nil {
		r.Tenant = g.tenants[i]
	}
	return r
}

// Complete implements Workload by passing the completion to the part that
// made the request.
func (g *mixedGen) Complete(r *Request, at time.Duration) {
	if r == nil || r.owner == nil {
		return
	}
	for _, w := range g.parts {
		if r.owner == completer(w) {
			w.complete(r, at)
			return
		}
	}
}

// Done implements Workload.
func (g *mixedGen) Done() bool {
	for _, w := range g.parts {
		if !w.Done() {
			return false
		}
	}
	return true
}
