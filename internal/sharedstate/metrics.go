package sharedstate

import "github.com/prometheus/client_golang/prometheus"

var (
	descUp = prometheus.NewDesc("llmlb_shared_state_up",
		"1 while the last operation on the shared-state Redis succeeded, 0 while it fails (routing then uses this instance's own state only).", nil, nil)
	descErrors = prometheus.NewDesc("llmlb_shared_state_errors_total",
		"Failed or timed-out operations on the shared-state Redis, by operation (publish, read).", []string{"op"}, nil)
	descPublished = prometheus.NewDesc("llmlb_shared_state_published_total",
		"Affinity changes (pins, prompt blocks) this instance wrote for its peers.", nil, nil)
	descApplied = prometheus.NewDesc("llmlb_shared_state_applied_total",
		"Peers' changes and loads this instance applied to its routing.", nil, nil)
	descDropped = prometheus.NewDesc("llmlb_shared_state_dropped_total",
		"Affinity changes not shared because the queue was full or Redis was failing; routing was not affected.", nil, nil)
	descInvalid = prometheus.NewDesc("llmlb_shared_state_invalid_total",
		"Entries read from the shared-state stream that could not be parsed and were skipped.", nil, nil)
)

// Describe implements prometheus.Collector.
func (s *Redis) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descUp, descErrors, descPublished, descApplied, descDropped, descInvalid} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: the counters are read, not kept
// twice.
func (s *Redis) Collect(ch chan<- prometheus.Metric) {
	up := 0.0
	if s.up.Load() {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, up)
	ch <- prometheus.MustNewConstMetric(descErrors, prometheus.CounterValue, float64(s.publishErrors.Load()), "publish")
	ch <- prometheus.MustNewConstMetric(descErrors, prometheus.CounterValue, float64(s.readErrors.Load()), "read")
	ch <- prometheus.MustNewConstMetric(descPublished, prometheus.CounterValue, float64(s.published.Load()))
	ch <- prometheus.MustNewConstMetric(descApplied, prometheus.CounterValue, float64(s.applied.Load()))
	ch <- prometheus.MustNewConstMetric(descDropped, prometheus.CounterValue, float64(s.dropped.Load()))
	ch <- prometheus.MustNewConstMetric(descInvalid, prometheus.CounterValue, float64(s.badInput.Load()))
}
