package balancer

import (
	"fmt"
	"log/slog"
	"strings"
)

// LogAttrs returns the explanation as slog attributes for the debug log of
// a routing decision (it allocates; call it only when debug is enabled).
// Its "why" is the same text the dashboard and /admin/replicas show.
func (e Explanation) LogAttrs() []slog.Attr {
	attrs := []slog.Attr{
		slog.String("policy", e.Policy),
		slog.String("why", e.Why()),
		slog.Int("candidates", e.Candidates),
		slog.String("candidate_set", e.CandidateSet),
		slog.Float64("min_running", e.MinRunning),
		slog.Float64("effective_running", e.EffectiveRunning),
		slog.Float64("effective_waiting", e.EffectiveWaiting),
	}
	if e.Rule != "" {
		attrs = append(attrs, slog.String("rule", e.Rule))
	}
	if e.PinKind != "" {
		attrs = append(attrs,
			slog.String("pin_kind", e.PinKind),
			slog.String("pin_replica", e.PinReplica),
			slog.String("pin_decision", e.PinDecision))
	}
	if e.Estimate > 0 {
		attrs = append(attrs,
			slog.Float64("estimate_seconds", e.Estimate),
			slog.Int("cached_tokens", e.CachedTokens),
			slog.Int("prefill_tokens", e.PrefillTokens),
			slog.Float64("pending_prefill_tokens", e.PendingPrefill))
	}
	if e.RunnerUp != "" {
		attrs = append(attrs,
			slog.String("runner_up", e.RunnerUp),
			slog.Float64("runner_up_estimate_seconds", e.RunnerUpEstimate))
	}
	if e.Queued > 0 {
		attrs = append(attrs, slog.Int64("queue_wait_ms", e.Queued.Milliseconds()))
	}
	if e.Detail != "" {
		attrs = append(attrs, slog.String("candidates_detail", e.Detail))
	}
	return attrs
}

// Why puts the decision into words in the terms of the policy that made it:
// for cost, the chosen replica's expected time to first token against the
// runner-up's, its cached tokens and pending prefill, and the rule that
// decided; for the pin policies (llmlb, llmlb-warm), the pin and the load;
// for the others, their rule. It allocates: the dashboard and the debug log
// call it when they show a decision, never the routing itself.
func (e Explanation) Why() string {
	var b strings.Builder
	switch {
	case e.Reason == ReasonFallback:
		b.WriteString("fallback: no LIVE or PROBING replica, picked at random")
	case e.Policy == "cost" && e.Rule != "":
		e.whyCost(&b)
		return b.String()
	case e.Policy == "llmlb" || e.Policy == "llmlb-warm" || e.Rule == "":
		e.whyPin(&b)
	default:
		fmt.Fprintf(&b, "%s of %d", e.Rule, e.Candidates)
		if e.CandidateSet != "" {
			fmt.Fprintf(&b, " (%s)", e.CandidateSet)
		}
	}
	fmt.Fprintf(&b, "; %s had running %.1f, waiting %.1f", e.Replica, e.EffectiveRunning, e.EffectiveWaiting)
	if e.PinKind != "" && e.Reason != ReasonAffinity {
		fmt.Fprintf(&b, "; %s pin", e.PinKind)
		if e.PinReplica != "" && e.PinReplica != e.Replica {
			fmt.Fprintf(&b, " on %s", e.PinReplica)
		}
		fmt.Fprintf(&b, ": %s", e.PinDecision)
	}
	return b.String()
}

// whyPin is the pin policies' words: a pin used, or the least loaded.
func (e Explanation) whyPin(b *strings.Builder) {
	if e.Reason == ReasonAffinity {
		kind := e.PinKind
		if kind == "" {
			kind = "affinity"
		}
		fmt.Fprintf(b, "%s pin on %s used", kind, e.Replica)
		return
	}
	fmt.Fprintf(b, "least loaded of %d", e.Candidates)
	if e.CandidateSet != "" {
		fmt.Fprintf(b, " (%s)", e.CandidateSet)
	}
	fmt.Fprintf(b, ", min running %.1f", e.MinRunning)
}

// whyCost is cost's words: "by cache: a expected TTFT 0.120s vs 0.480s on
// b (runner-up); 1024 cached tokens, 512 to compute, 300 pending prefill".
func (e Explanation) whyCost(b *strings.Builder) {
	fmt.Fprintf(b, "by %s: %s expected TTFT %.3fs", e.Rule, e.Replica, e.Estimate)
	if e.RunnerUp != "" {
		fmt.Fprintf(b, " vs %.3fs on %s (runner-up)", e.RunnerUpEstimate, e.RunnerUp)
	}
	fmt.Fprintf(b, "; %d cached tokens, %d to compute, %.0f pending prefill; %d candidates",
		e.CachedTokens, e.PrefillTokens, e.PendingPrefill, e.Candidates)
}
