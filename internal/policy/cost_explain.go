package policy

import (
	"fmt"
	"strings"
)

// explainChoice is Choice.Detail: every candidate's estimate (detail),
// then the move of a burst's request, if spread made one.
func (p *Cost) explainChoice(d *costDecision, cands []Candidate) string {
	detail := p.detail(cands, d.limit, d.tokens)
	if d.spreadFrom >= 0 {
		detail += fmt.Sprintf("; burst_spread: from %s, where the burst added %.3fs", cands[d.spreadFrom].Name, d.burstAdded)
	}
	return detail
}

// detail lists every candidate's estimate for the debug log and decision
// records.
func (p *Cost) detail(cands []Candidate, limit, tokens int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "limit=%d", limit)
	for i, c := range cands {
		fmt.Fprintf(&b, "; %s ttft=%.3fs score=%.3fs prefill=%.0f held_up=%.2f pending=%.0f kv_held=%.0f in_flight=%d rate=%.0f step=%.3fs",
			c.Name, p.ttfts[i], p.estimates[i], p.prefills[i], p.delayed[i], c.PendingPrefill, c.HeldPrefill, c.InFlight, c.PrefillRate, c.DecodeStep)
		scale, shared := p.prefill.model(p.candID[i])
		fmt.Fprintf(&b, " prefill_scale=%.2f prefill_shared=%.2f prefill_size_exp=%.2f prefill_burst=%.2f", scale, shared,
			p.prefill.sizeExp(p.candID[i]), p.prefill.burstFactor(p.candID[i], p.burst))
		fmt.Fprintf(&b, " ttft_reported=%.3fs", p.reported(i))
		if c.PeerHeldPrefill > 0 {
			fmt.Fprintf(&b, " peer_kv_held=%.0f", c.PeerHeldPrefill)
		}
		if p.unsched[i] > 0 {
			fmt.Fprintf(&b, " unscheduled_hit=%.0f recomputed_share=%.3f", p.unsched[i], p.inflight.shareOf(p.candID[i]))
		}
		if p.copyShares[i] > 0 {
			fmt.Fprintf(&b, " hot_copy_shared_by=%.1f", p.copyShares[i])
		}
		if p.evictions[i] > 0 {
			fmt.Fprintf(&b, " eviction=%.3fs", p.evictions[i])
			if m, ok := p.marginalReuse(p.candID[i]); ok && p.cfg.MarginWindow > 0 && p.fresh > 0 {
				fmt.Fprintf(&b, " marginal_reuse=%.3f", m)
			}
		}
		if c.InFlight+1 > limit {
			if p.overBound(&cands[i], limit, p.prefills[i], tokens) {
				b.WriteString(" over_limit")
			} else {
				b.WriteString(" over_limit_exempt")
			}
		}
	}
	return b.String()
}
