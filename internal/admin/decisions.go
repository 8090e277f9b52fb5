package admin

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/request"
)

// decisionMetrics are what routing decisions expected, per replica: the
// prompt tokens sent, those the policy expected the replica to find in its
// prefix cache (policy cost), and cost's expected time to first token, to
// set beside the measured llmlb_time_to_first_byte_seconds.
type decisionMetrics struct {
	promptTokens *prometheus.CounterVec
	cachedTokens *prometheus.CounterVec
	expectedTTFT *prometheus.HistogramVec
}

func newDecisionMetrics() decisionMetrics {
	return decisionMetrics{
		promptTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_routed_prompt_tokens_total",
			Help: "Prompt tokens of the requests routed to the replica (every attempt).",
		}, []string{"replica"}),
		cachedTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_routed_cached_tokens_total",
			Help: "Prompt tokens the routing expected the replica to find in its prefix cache (policy cost; 0 under the others). Divided by llmlb_routed_prompt_tokens_total: the expected hit rate.",
		}, []string{"replica"}),
		expectedTTFT: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "llmlb_expected_ttft_seconds",
			Help:    "Policy cost's expected time to first token on the replica it chose; compare with llmlb_time_to_first_byte_seconds, the measured one.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 18), // as llmlb_time_to_first_byte_seconds
		}, []string{"replica"}),
	}
}

func (d decisionMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{d.promptTokens, d.cachedTokens, d.expectedTTFT}
}

// init creates replica r's series at zero.
func (d decisionMetrics) init(r string) {
	d.promptTokens.WithLabelValues(r)
	d.cachedTokens.WithLabelValues(r)
	d.expectedTTFT.WithLabelValues(r)
}

func (d decisionMetrics) forget(l prometheus.Labels) {
	d.promptTokens.DeletePartialMatch(l)
	d.cachedTokens.DeletePartialMatch(l)
	d.expectedTTFT.DeletePartialMatch(l)
}

// Decision counts one routing decision (proxy.Options.Decisions).
func (m *Metrics) Decision(_ time.Time, res *balancer.Reservation, prof *request.Profile, _ int) {
	if res == nil {
		return
	}
	replica, c := res.Replica, &m.cache
	if prof != nil && prof.PromptTokens > 0 {
		c.promptTokens.get(&c.mu, replica, func() prometheus.Counter {
			return m.decided.promptTokens.WithLabelValues(label(replica))
		}).Add(float64(prof.PromptTokens))
	}
	if e := &res.Explanation; e.Estimate > 0 {
		c.cachedTokens.get(&c.mu, replica, func() prometheus.Counter {
			return m.decided.cachedTokens.WithLabelValues(label(replica))
		}).Add(float64(max(e.CachedTokens, 0)))
		c.expectedTTFT.get(&c.mu, replica, func() prometheus.Observer {
			return m.decided.expectedTTFT.WithLabelValues(label(replica))
		}).Observe(e.Estimate)
	}
}
