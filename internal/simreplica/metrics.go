package simreplica

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlb/llmlb/internal/engine"
)

// metricNames are the vLLM metric names that differ between vLLM versions:
// V1 from 0.12 on, and the pre-0.12 "gpu_" names that real fleets still run.
type metricNames struct {
	kvUsage, prefixQueries, prefixHits string
}

var (
	currentNames = metricNames{
		kvUsage:       "vllm:kv_cache_usage_perc",
		prefixQueries: "vllm:prefix_cache_queries_total",
		prefixHits:    "vllm:prefix_cache_hits_total",
	}
	legacyNames = metricNames{
		kvUsage:       "vllm:gpu_cache_usage_perc",
		prefixQueries: "vllm:gpu_prefix_cache_queries_total",
		prefixHits:    "vllm:gpu_prefix_cache_hits_total",
	}
)

// finishReasons are the request_success_total label values, in vLLM's order.
var finishReasons = [...]string{"stop", "length", "abort"}

// collector is a prometheus.Collector that emits the replica's engine
// counters as const metrics, labelled as vLLM V1 labels them (model_name,
// engine="0"). It reads the replica's state under the replica's lock at
// scrape time, so /metrics always shows the engine as of now.
type collector struct {
	r *Replica

	running, waiting, kvUsage                   *prometheus.Desc
	prefixQueries, prefixHits                   *prometheus.Desc
	promptTokens, generationTokens, preemptions *prometheus.Desc
	requestSuccess, ttft, e2e                   *prometheus.Desc
}

func newCollector(r *Replica, legacy bool) *collector {
	names := currentNames
	if legacy {
		names = legacyNames
	}
	labels := prometheus.Labels{"model_name": r.model, "engine": "0"}
	desc := func(name, help string, extra ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, extra, labels)
	}
	return &collector{
		r:                r,
		running:          desc("vllm:num_requests_running", "Number of requests in model execution batches."),
		waiting:          desc("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		kvUsage:          desc(names.kvUsage, "KV-cache usage. 1 means 100 percent usage."),
		prefixQueries:    desc(names.prefixQueries, "Prefix cache queries, in terms of number of queried tokens."),
		prefixHits:       desc(names.prefixHits, "Prefix cache hits, in terms of number of cached tokens."),
		promptTokens:     desc("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		generationTokens: desc("vllm:generation_tokens_total", "Number of generation tokens processed."),
		preemptions:      desc("vllm:num_preemptions_total", "Cumulative number of preemption from the engine."),
		requestSuccess:   desc("vllm:request_success_total", "Count of successfully processed requests.", "finished_reason"),
		ttft:             desc("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds."),
		e2e:              desc("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
	}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.running, c.waiting, c.kvUsage, c.prefixQueries, c.prefixHits, c.promptTokens,
		c.generationTokens, c.preemptions, c.requestSuccess, c.ttft, c.e2e,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st, finished := c.r.snapshot()
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(c.running, float64(st.Running))
	gauge(c.waiting, float64(st.Waiting))
	gauge(c.kvUsage, st.KVCacheUsage)
	counter(c.prefixQueries, st.PrefixQueryTokens)
	counter(c.prefixHits, st.PrefixHitTokens)
	counter(c.promptTokens, st.PromptTokens)
	counter(c.generationTokens, st.GenerationTokens)
	counter(c.preemptions, st.Preemptions)
	for i, reason := range finishReasons {
		counter(c.requestSuccess, finished[i], reason)
	}
	ch <- constHistogram(c.ttft, st.TTFT)
	ch <- constHistogram(c.e2e, st.E2E)
}

// constHistogram converts the engine's cumulative histogram.
func constHistogram(d *prometheus.Desc, h engine.Histogram) prometheus.Metric {
	buckets := make(map[float64]uint64, len(h.Bounds))
	for i, b := range h.Bounds {
		if i < len(h.Counts) {
			buckets[b] = h.Counts[i]
		}
	}
	return prometheus.MustNewConstHistogram(d, h.Count, h.Sum, buckets)
}
