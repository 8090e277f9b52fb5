package admin

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlb/llmlb/internal/kvevents"
)

// KV cache events' metrics (docs/KV_EVENTS.md), read from the feed at
// collection time: one series per subscribed replica, so an operator can
// see which replicas publish, how much each holds, and whose events have
// stopped.
var (
	descKVSubscribed = prometheus.NewDesc("llmlb_kv_events_subscribed", "1 for each replica whose KV cache events llmlb subscribes to (replicas[].kv_events, the admin API, discovery).", []string{"replica"}, nil)
	descKVBlocks     = prometheus.NewDesc("llmlb_kv_events_blocks", "Blocks the replica's events say it holds (any medium), as recorded in the index.", []string{"replica"}, nil)
	descKVApplied    = prometheus.NewDesc("llmlb_kv_events_applied_total", "KV cache events applied to the index from the replica (stored, removed, cleared).", []string{"replica"}, nil)
	descKVRefused    = prometheus.NewDesc("llmlb_kv_events_refused_blocks_total", "Stored blocks the index refused because the replica's share of the index budget was full.", []string{"replica"}, nil)
	descKVUnkeyed    = prometheus.NewDesc("llmlb_kv_events_unkeyed_blocks_total", "Stored blocks the index could not key by their token ids (with tokenizers configured): a parent it never saw, a LoRA adapter, a block size that is not a multiple of 16.", []string{"replica"}, nil)
	descKVAge        = prometheus.NewDesc("llmlb_kv_events_last_batch_age_seconds", "Seconds since the replica's last batch of events was applied (no series before its first batch, or after its entries were forgotten).", []string{"replica"}, nil)
)

// KVEventsSource is what the KV events metrics read: the subscriptions
// and the index they feed (kvevents.Feed).
type KVEventsSource interface {
	Sources() []kvevents.Source
	Index() *kvevents.Index
}

// RegisterKVEvents exposes the KV cache events' subscriptions and index
// figures read from src at collection time. Call it once.
func (m *Metrics) RegisterKVEvents(src KVEventsSource) {
	m.reg.MustRegister(&kvCollector{m: m, src: src})
}

type kvCollector struct {
	m   *Metrics
	src KVEventsSource
}

// Describe implements prometheus.Collector.
func (c *kvCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descKVSubscribed, descKVBlocks, descKVApplied, descKVRefused, descKVUnkeyed, descKVAge} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *kvCollector) Collect(ch chan<- prometheus.Metric) {
	idx := c.src.Index()
	now := c.m.now()
	for _, s := range c.src.Sources() {
		name := label(s.Replica)
		ch <- prometheus.MustNewConstMetric(descKVSubscribed, prometheus.GaugeValue, 1, name)
		st, ok := idx.Stats(s.Replica)
		if !ok {
			continue
		}
		ch <- prometheus.MustNewConstMetric(descKVBlocks, prometheus.GaugeValue, float64(st.Blocks), name)
		ch <- prometheus.MustNewConstMetric(descKVApplied, prometheus.CounterValue, float64(st.Events), name)
		ch <- prometheus.MustNewConstMetric(descKVRefused, prometheus.CounterValue, float64(st.Refused), name)
		ch <- prometheus.MustNewConstMetric(descKVUnkeyed, prometheus.CounterValue, float64(st.Unkeyed), name)
		if !st.Last.IsZero() {
			ch <- prometheus.MustNewConstMetric(descKVAge, prometheus.GaugeValue, max(0, now.Sub(st.Last).Seconds()), name)
		}
	}
}
