package policy

import "time"

// RoundRobin is plain rotation over the candidates, what NGINX does by
// default: no load, no affinity.
type RoundRobin struct {
	Base
	next uint64
}

// NewRoundRobin returns a round-robin policy starting at the first candidate.
func NewRoundRobin() *RoundRobin { return &RoundRobin{} }

// Name returns "rr".
func (p *RoundRobin) Name() string { return NameRR }

// Choose returns the next candidate in rotation.
func (p *RoundRobin) Choose(_ *Request, cands []Candidate, _ time.Time) Choice {
	i := int(p.next % uint64(len(cands)))
	p.next++
	return Choice{Index: i, Reason: ReasonLoad, Detail: "rotation", Rule: "rotation"}
}
