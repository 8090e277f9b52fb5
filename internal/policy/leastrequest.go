package policy

import "time"

// LeastRequest routes to the candidate with the fewest of the router's own
// in-flight requests (least connections); ties are rotated so an idle fleet
// is filled evenly rather than always from the first replica.
type LeastRequest struct {
	Base
	next uint64
}

// NewLeastRequest returns a least-request policy.
func NewLeastRequest() *LeastRequest { return &LeastRequest{} }

// Name returns "least-request".
func (p *LeastRequest) Name() string { return NameLeastRequest }

// Choose returns a candidate with the minimum Candidate.InFlight.
func (p *LeastRequest) Choose(_ *Request, cands []Candidate, _ time.Time) Choice {
	low, ties := cands[0].InFlight, 0
	for _, c := range cands {
		switch {
		case c.InFlight < low:
			low, ties = c.InFlight, 1
		case c.InFlight == low:
			ties++
		}
	}
	k := int(p.next % uint64(ties))
	p.next++
	for i, c := range cands {
		if c.InFlight != low {
			continue
		}
		if k == 0 {
			return Choice{Index: i, Reason: ReasonLoad, Detail: "least in-flight", Rule: "fewest in flight"}
		}
		k--
	}
	return Choice{Index: 0, Reason: ReasonLoad, Detail: "least in-flight", Rule: "fewest in flight"} // unreachable
}
