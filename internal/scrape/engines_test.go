package scrape

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/llmlb/llmlb/internal/balancer"
)

// SGLang with --enable-metrics, one scheduler (no data parallelism), as
// prometheus_client writes it: the scheduler's gauges carry the rank
// labels, the tokenizer's counters only the model (multiprocess mode: no
// _created samples). Names from
// python/sglang/srt/observability/metrics_collector.py.
const metricsSGLang = `# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="Qwen/Qwen3-32B",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 7.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="Qwen/Qwen3-32B",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 2.0
# HELP sglang:num_grammar_queue_reqs The number of requests in the grammar waiting queue.
# TYPE sglang:num_grammar_queue_reqs gauge
sglang:num_grammar_queue_reqs{engine_type="unified",model_name="Qwen/Qwen3-32B",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="Qwen/Qwen3-32B",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.35
# HELP sglang:num_used_tokens The number of used tokens.
# TYPE sglang:num_used_tokens gauge
sglang:num_used_tokens{engine_type="unified",model_name="Qwen/Qwen3-32B",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 275251.0
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{engine_type="unified",model_name="Qwen/Qwen3-32B",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.61
# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool.
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{engine_type="unified",model_name="Qwen/Qwen3-32B",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 786432.0
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="Qwen/Qwen3-32B"} 8.128902e+06
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="Qwen/Qwen3-32B"} 7.557572e+06
# HELP sglang:cached_tokens_total Number of cached prompt tokens by source (device/host/storage).
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{cache_source="device",model_name="Qwen/Qwen3-32B"} 4.0e+06
sglang:cached_tokens_total{cache_source="host",model_name="Qwen/Qwen3-32B"} 1.0e+06
# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="Qwen/Qwen3-32B"} 10.0
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="Qwen/Qwen3-32B"} 11008.0
sglang:time_to_first_token_seconds_count{model_name="Qwen/Qwen3-32B"} 11008.0
sglang:time_to_first_token_seconds_sum{model_name="Qwen/Qwen3-32B"} 2.3518979474117756e+06
# HELP sglang:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE sglang:inter_token_latency_seconds histogram
sglang:inter_token_latency_seconds_bucket{le="0.02",model_name="Qwen/Qwen3-32B"} 5.0e+06
sglang:inter_token_latency_seconds_bucket{le="+Inf",model_name="Qwen/Qwen3-32B"} 7.5e+06
sglang:inter_token_latency_seconds_count{model_name="Qwen/Qwen3-32B"} 7.5e+06
sglang:inter_token_latency_seconds_sum{model_name="Qwen/Qwen3-32B"} 150000.0
`

// SGLang with two data-parallel ranks (DP attention, tp 4 each), priority
// scheduling and --enable-metrics-for-all-schedulers: every tensor-parallel
// rank of a data-parallel group repeats its scheduler's gauges, and the
// priority="" series is the total of the priority="<n>" breakdowns.
const metricsSGLangDP = `# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",model_name="m",pp_rank="0",priority="",tp_rank="0"} 5.0
sglang:num_running_reqs{dp_rank="0",model_name="m",pp_rank="0",priority="0",tp_rank="0"} 2.0
sglang:num_running_reqs{dp_rank="0",model_name="m",pp_rank="0",priority="1",tp_rank="0"} 3.0
sglang:num_running_reqs{dp_rank="0",model_name="m",pp_rank="0",priority="",tp_rank="1"} 5.0
sglang:num_running_reqs{dp_rank="1",model_name="m",pp_rank="0",priority="",tp_rank="4"} 4.0
sglang:num_running_reqs{dp_rank="1",model_name="m",pp_rank="0",priority="2",tp_rank="4"} 4.0
sglang:num_running_reqs{dp_rank="1",model_name="m",pp_rank="0",priority="",tp_rank="5"} 4.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{dp_rank="0",model_name="m",pp_rank="0",priority="",tp_rank="0"} 1.0
sglang:num_queue_reqs{dp_rank="0",model_name="m",pp_rank="0",priority="",tp_rank="1"} 1.0
sglang:num_queue_reqs{dp_rank="1",model_name="m",pp_rank="0",priority="",tp_rank="4"} 6.0
sglang:num_queue_reqs{dp_rank="1",model_name="m",pp_rank="0",priority="",tp_rank="5"} 6.0
# TYPE sglang:token_usage gauge
sglang:token_usage{dp_rank="0",model_name="m",pp_rank="0",priority="",tp_rank="0"} 0.2
sglang:token_usage{dp_rank="0",model_name="m",pp_rank="0",priority="",tp_rank="1"} 0.2
sglang:token_usage{dp_rank="1",model_name="m",pp_rank="0",priority="",tp_rank="4"} 0.6
sglang:token_usage{dp_rank="1",model_name="m",pp_rank="0",priority="",tp_rank="5"} 0.6
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{dp_rank="0",model_name="m",pp_rank="0",priority="",tp_rank="0"} 100000.0
sglang:max_total_num_tokens{dp_rank="0",model_name="m",pp_rank="0",priority="",tp_rank="1"} 100000.0
sglang:max_total_num_tokens{dp_rank="1",model_name="m",pp_rank="0",priority="",tp_rank="4"} 100000.0
sglang:max_total_num_tokens{dp_rank="1",model_name="m",pp_rank="0",priority="",tp_rank="5"} 100000.0
`

// SGLang 0.2-0.3 (python/sglang/srt/metrics/metrics_collector.py):
// vLLM-like request gauges under the sglang: prefix, labelled by name.
const metricsSGLangOld = `# HELP sglang:max_total_num_tokens Maximum total number of tokens
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{name="google/gemma-2-9b-it"} 161721.0
# HELP sglang:num_requests_running Number of requests currently running on GPU
# TYPE sglang:num_requests_running gauge
sglang:num_requests_running{name="google/gemma-2-9b-it"} 4.0
# HELP sglang:num_requests_waiting Number of requests waiting to be processed.
# TYPE sglang:num_requests_waiting gauge
sglang:num_requests_waiting{name="google/gemma-2-9b-it"} 0.0
# HELP sglang:token_usage Total token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{name="google/gemma-2-9b-it"} 0.12
`

// Hugging Face TGI's router (metrics-exporter-prometheus): unlabelled
// gauges for the batch and the queue, histograms per method.
const metricsTGI = `# HELP tgi_request_count Total number of requests
# TYPE tgi_request_count counter
tgi_request_count 1234
# HELP tgi_request_success Number of successful requests
# TYPE tgi_request_success counter
tgi_request_success 1200
# HELP tgi_queue_size Current queue size
# TYPE tgi_queue_size gauge
tgi_queue_size 4
# HELP tgi_batch_current_size Current batch size
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 12
# HELP tgi_batch_current_max_tokens Maximum tokens for the current batch
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 9000
# HELP tgi_batch_forward_duration Batch forward duration per method (prefill or decode)
# TYPE tgi_batch_forward_duration histogram
tgi_batch_forward_duration_bucket{method="prefill",le="0.01"} 3
tgi_batch_forward_duration_bucket{method="prefill",le="+Inf"} 40
tgi_batch_forward_duration_sum{method="prefill"} 2.5
tgi_batch_forward_duration_count{method="prefill"} 40
tgi_batch_forward_duration_bucket{method="decode",le="0.01"} 900
tgi_batch_forward_duration_bucket{method="decode",le="+Inf"} 1000
tgi_batch_forward_duration_sum{method="decode"} 9.1
tgi_batch_forward_duration_count{method="decode"} 1000
# HELP tgi_request_input_length Input token length per request
# TYPE tgi_request_input_length histogram
tgi_request_input_length_bucket{le="100"} 20
tgi_request_input_length_bucket{le="+Inf"} 1234
tgi_request_input_length_sum 987654
tgi_request_input_length_count 1234
`

// llama.cpp's server with --metrics, current (tools/server: no KV metric
// since the KV cache API changed in 2025).
const metricsLlamaCpp = `# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 12000
# HELP llamacpp:prompt_seconds_total Prompt process time
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 8
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 3000
# HELP llamacpp:tokens_predicted_seconds_total Predict process time
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 60
# HELP llamacpp:n_decode_total Total number of llama_decode() calls
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 2900
# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call
# TYPE llamacpp:n_busy_slots_per_decode counter
llamacpp:n_busy_slots_per_decode 1.7
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s.
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 1500
# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s.
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 50
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
`

// llama.cpp's server before the 2025 KV cache change
// (examples/server/server.cpp): also the KV cache's fill.
const metricsLlamaCppOld = `# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.25
# HELP llamacpp:kv_cache_tokens KV-cache tokens.
# TYPE llamacpp:kv_cache_tokens gauge
llamacpp:kv_cache_tokens 2048
# HELP llamacpp:requests_processing Number of request processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 4
# HELP llamacpp:requests_deferred Number of request deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 0
`

// TestParseEngines: each engine's page maps onto the Snapshot (a field the
// engine has no true equivalent for stays 0 and the balancer keeps its
// prior); vLLM is tried first; a page of none of them is ErrNoMetrics.
func TestParseEngines(t *testing.T) {
	tests := []struct {
		name    string
		page    string
		want    Result
		wantErr error
	}{
		{name: "vLLM", page: metricsCurrent,
			want: Result{Engine: EngineVLLM, Snapshot: balancer.Snapshot{Running: 3, Waiting: 1, KVCacheUsage: 0.25},
				PrefixCacheQueries: 12345, PrefixCacheKnown: true}},
		{name: "SGLang", page: metricsSGLang,
			want: Result{Engine: EngineSGLang, Snapshot: balancer.Snapshot{Running: 7, Waiting: 2, KVCacheUsage: 0.35,
				KVCacheTokens: 786432, PromptTokens: 8128902, PrefixHits: 5e6, DecodeSeconds: 150000, DecodeCount: 7.5e6},
				PrefixCacheQueries: 8128902, PrefixCacheHits: 5e6, PrefixCacheKnown: true}},
		{name: "SGLang, data-parallel ranks, priorities, every scheduler reporting", page: metricsSGLangDP,
			want: Result{Engine: EngineSGLang, Snapshot: balancer.Snapshot{Running: 9, Waiting: 7, KVCacheUsage: 0.4,
				KVCacheTokens: 200000}}},
		{name: "SGLang 0.2-0.3 names", page: metricsSGLangOld,
			want: Result{Engine: EngineSGLang, Snapshot: balancer.Snapshot{Running: 4, KVCacheUsage: 0.12, KVCacheTokens: 161721}}},
		{name: "TGI", page: metricsTGI,
			want: Result{Engine: EngineTGI, Snapshot: balancer.Snapshot{Running: 12, Waiting: 4}}},
		{name: "llama.cpp", page: metricsLlamaCpp,
			want: Result{Engine: EngineLlamaCpp, Snapshot: balancer.Snapshot{Running: 2, Waiting: 1}}},
		{name: "llama.cpp before 2025", page: metricsLlamaCppOld,
			want: Result{Engine: EngineLlamaCpp, Snapshot: balancer.Snapshot{Running: 4, KVCacheUsage: 0.25}}},
		{name: "only a waiting metric is enough", page: "tgi_queue_size 3\n",
			want: Result{Engine: EngineTGI, Snapshot: balancer.Snapshot{Waiting: 3}}},
		{name: "vLLM first on a page with several engines' names", page: metricsSGLang + metricsTGI + metricsCurrent,
			want: Result{Engine: EngineVLLM, Snapshot: balancer.Snapshot{Running: 3, Waiting: 1, KVCacheUsage: 0.25},
				PrefixCacheQueries: 12345, PrefixCacheKnown: true}},
		{name: "SGLang priority breakdowns alone are not a total", page: `sglang:num_running_reqs{priority="1"} 3` + "\n",
			wantErr: ErrNoMetrics},
		{name: "an engine's other metrics without running or waiting", page: "sglang:token_usage 0.5\nllamacpp:kv_cache_usage_ratio 0.5\ntgi_request_count 3\n",
			wantErr: ErrNoMetrics},
		{name: "none of them", page: "# HELP go_goroutines Number of goroutines.\n# TYPE go_goroutines gauge\ngo_goroutines 12\n",
			wantErr: ErrNoMetrics},
		{name: "implausible SGLang value", page: "sglang:num_running_reqs NaN\n", wantErr: errImplausible},
		{name: "implausible TGI value", page: "tgi_queue_size -1\n", wantErr: errImplausible},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseMetrics(strings.NewReader(tt.page))
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("result mismatch (-want +got):\n%s", d)
			}
		})
	}
}
