package balancer

import "log/slog"

// LogAttrs returns the explanation as slog attributes for the debug log of
// a routing decision (it allocates; call it only when debug is enabled).
func (e Explanation) LogAttrs() []slog.Attr {
	attrs := []slog.Attr{
		slog.String("policy", e.Policy),
		slog.Int("candidates", e.Candidates),
		slog.String("candidate_set", e.CandidateSet),
		slog.Float64("min_running", e.MinRunning),
		slog.Float64("effective_running", e.EffectiveRunning),
		slog.Float64("effective_waiting", e.EffectiveWaiting),
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
			slog.Int("prefill_tokens", e.PrefillTokens))
	}
	if e.Queued > 0 {
		attrs = append(attrs, slog.Int64("queue_wait_ms", e.Queued.Milliseconds()))
	}
	if e.Detail != "" {
		attrs = append(attrs, slog.String("candidates_detail", e.Detail))
	}
	return attrs
}
