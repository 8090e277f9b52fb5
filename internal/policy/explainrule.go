package policy

// The rules that decide a cost choice, as its explanation names them.
const (
	// RuleCache: the chosen replica's estimate was the smallest because it
	// holds more of the prompt than the runner-up.
	RuleCache = "cache"
	// RuleLoad: the chosen replica's estimate was the smallest because less
	// work is queued ahead of the request there.
	RuleLoad = "load"
	// RuleBoundedLoad: a replica with a smaller estimate (the runner-up)
	// was over the bounded-load limit on in-flight requests.
	RuleBoundedLoad = "bounded load"
	// RuleTie: estimates within tie_steps decode steps count as equal; the
	// fewest in flight, then the most cached, then rotation decided.
	RuleTie = "tie"
	// RuleBurstSpread: a later request of a session's burst left the
	// burst's replica (the runner-up), where the burst would delay it.
	RuleBurstSpread = "burst spread"
	// RuleOnly: there was a single candidate.
	RuleOnly = "only candidate"
)

// costRule fills c's Rule, RunnerUp, RunnerUpEstimate and PendingPrefill
// from the scores of the decision just made (the scratch slices are still
// those of this Choose). It runs on every decision: one pass over the
// candidates, no allocation, and it changes nothing the routing reads.
func (p *Cost) costRule(c *Choice, d *costDecision, cands []Candidate, best int) {
	c.PendingPrefill = cands[best].PendingPrefill
	if len(cands) == 1 {
		c.Rule = RuleOnly
		return
	}
	ru := -1
	if d.spreadFrom >= 0 {
		ru = d.spreadFrom
	} else {
		for i := range cands {
			if i != best && (ru < 0 || p.estimates[i] < p.estimates[ru]) {
				ru = i
			}
		}
	}
	c.RunnerUp, c.RunnerUpEstimate = cands[ru].Name, p.reported(ru)
	switch {
	case d.spreadFrom >= 0:
		c.Rule = RuleBurstSpread
	case p.estimates[ru] < p.estimates[best] && p.overBound(&cands[ru], d.limit, p.prefills[ru], d.tokens):
		c.Rule = RuleBoundedLoad
	case p.estimates[ru] <= p.estimates[best]:
		c.Rule = RuleTie
	case p.prefills[best] < p.prefills[ru]:
		c.Rule = RuleCache
	default:
		c.Rule = RuleLoad
	}
}
