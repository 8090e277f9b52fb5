package simreplica

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlb/llmlb/internal/engine"
)

// metricNames are the vLLM metric names that differ between vLLM versions:
// V1 from 0.12 on, and the pre-0.12 "gpu_" names that real fleets still run.
type metricNames struct {
	kvUsage, prefixQueries, prefixHits string
	interToken, interTokenHelp         string
}

var (
	currentNames = metricNames{
		kvUsage:        "vllm:kv_cache_usage_perc",
		prefixQueries:  "vllm:prefix_cache_queries_total",
		prefixHits:     "vllm:prefix_cache_hits_total",
		interToken:     "vllm:inter_token_latency_seconds",
		interTokenHelp: "Histogram of inter-token latency in seconds.",
	}
	legacyNames = metricNames{
		kvUsage:        "vllm:gpu_cache_usage_perc",
		prefixQueries:  "vllm:gpu_prefix_cache_queries_total",
		prefixHits:     "vllm:gpu_prefix_cache_hits_total",
		interToken:     "vllm:time_per_output_token_seconds",
		interTokenHelp: "Histogram of time per output token in seconds.",
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
	queueTime, prefillTime, interToken          *prometheus.Desc
	cacheConfig                                 *prometheus.Desc
}

// cacheConfigLabels are the labels of vllm:cache_config_info: vLLM exports
// every field of its CacheConfig as a string label (CacheConfig.metrics_info,
// Python's str() of each value) plus engine, and no model_name. The values
// are vLLM's defaults except the two a router reads: block_size and
// num_gpu_blocks (the profile's KV capacity in blocks).
func cacheConfigLabels(p engine.Profile) prometheus.Labels {
	return prometheus.Labels{
		"block_size":               "16",
		"gpu_memory_utilization":   "0.9",
		"swap_space":               "4",
		"cache_dtype":              "auto",
		"is_attention_free":        "False",
		"num_gpu_blocks_override":  "None",
		"sliding_window":           "None",
		"enable_prefix_caching":    "True",
		"prefix_caching_hash_algo": "sha256",
		"cpu_offload_gb":           "0",
		"calculate_kv_scales":      "False",
		"kv_sharing_fast_prefill":  "False",
		"mamba_page_size_padded":   "None",
		"mamba_block_size":         "None",
		"mamba_cache_dtype":        "auto",
		"mamba_ssm_cache_dtype":    "auto",
		"kv_cache_memory_bytes":    "None",
		"kv_offloading_size":       "None",
		"kv_offloading_backend":    "native",
		"num_gpu_blocks":           strconv.Itoa(p.Blocks()),
		"num_cpu_blocks":           "0",
		"engine":                   "0",
	}
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
		queueTime:        desc("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."),
		prefillTime:      desc("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request."),
		interToken:       desc(names.interToken, names.interTokenHelp),
		cacheConfig: prometheus.NewDesc("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
			nil, cacheConfigLabels(r.profile)),
	}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.running, c.waiting, c.kvUsage, c.prefixQueries, c.prefixHits, c.promptTokens,
		c.generationTokens, c.preemptions, c.requestSuccess, c.ttft, c.e2e,
		c.queueTime, c.prefillTime, c.interToken, c.cacheConfig,
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
	ch <- constHistogram(c.queueTime, st.QueueTime)
	ch <- constHistogram(c.prefillTime, st.PrefillTime)
	ch <- constHistogram(c.interToken, st.InterTokenLatency)
	gauge(c.cacheConfig, 1)
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
