package scrape

import (
	"math"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"

	"github.com/llmlb/llmlb/internal/balancer"
)

// The engines whose /metrics ParseMetrics reads, as Result.Engine names them.
const (
	EngineVLLM     = "vllm"
	EngineSGLang   = "sglang"
	EngineTGI      = "tgi"
	EngineLlamaCpp = "llama.cpp"
)

// engine reads one inference server's load from a parsed /metrics page. ok
// is false when the page has neither the engine's running nor its waiting
// metric: it is then not that engine's page.
type engine struct {
	name string
	read func(families map[string]*dto.MetricFamily) (res Result, ok bool)
}

// engines are tried in this order; the first that recognizes the page
// wins. vLLM comes first and reads what it always read.
var engines = []engine{
	{EngineVLLM, readVLLM},
	{EngineSGLang, readSGLang},
	{EngineTGI, readTGI},
	{EngineLlamaCpp, readLlamaCpp},
}

// SGLang (sgl-project/sglang, served with --enable-metrics). The scheduler's
// gauges and the tokenizer's counters are defined in
// python/sglang/srt/observability/metrics_collector.py (earlier
// python/sglang/srt/metrics/collector.py); docs/references/production_metrics.md
// shows a page. SGLang 0.2-0.3 exported vLLM-like request gauges
// (python/sglang/srt/metrics/metrics_collector.py of that time).
const (
	sglangRunning    = "sglang:num_running_reqs"
	sglangWaiting    = "sglang:num_queue_reqs"
	sglangRunningOld = "sglang:num_requests_running" // SGLang 0.2-0.3
	sglangWaitingOld = "sglang:num_requests_waiting" // SGLang 0.2-0.3
	// Fraction of the KV token pool in use (0..1; the fullest pool on
	// hybrid SWA or Mamba models), the equivalent of vLLM's KV usage.
	sglangKVUsage = "sglang:token_usage"
	// The KV token pool's size in tokens, set once at start: the
	// equivalent of vLLM's num_gpu_blocks x block_size.
	sglangKVCapacity = "sglang:max_total_num_tokens"
	// Prompt tokens of finished requests, and how many of them came from
	// the prefix cache (by cache_source: device, host, storage_*). SGLang
	// counts when a request finishes, vLLM when it is prefilled: the same
	// totals, later. cached_tokens_total appears with the first cache hit.
	sglangPromptTokens = "sglang:prompt_tokens_total"
	sglangCachedTokens = "sglang:cached_tokens_total"
	// Time between output tokens: the sum in seconds, the count in tokens
	// (observe_inter_token_latency), as vLLM's inter-token histogram.
	sglangInterToken = "sglang:inter_token_latency_seconds"
)

// readSGLang reads SGLang's load. The scheduler's gauges carry rank labels:
// one scheduler reports per data-parallel rank (dp_rank), and the
// tensor-, pipeline- and expert-parallel ranks of that scheduler (tp_rank,
// pp_rank, moe_ep_rank) repeat its numbers when every rank reports
// (--enable-metrics-for-all-schedulers). With priority scheduling, the
// series with priority="" is the total and priority="<n>" a breakdown of it.
// So each scheduler counts once (sglangSchedulers), summed for requests and
// capacity and averaged for usage; the tokenizer's counters are summed.
// SGLang has no per-request prefill-time histogram (its time to first token
// includes the queue): PrefillSeconds and PrefillCount stay 0 and policy
// cost keeps its prefill prior.
func readSGLang(families map[string]*dto.MetricFamily) (Result, bool) {
	running, okR := sglangSchedulers(families[sglangRunning])
	if !okR {
		running, okR = sglangSchedulers(families[sglangRunningOld])
	}
	waiting, okW := sglangSchedulers(families[sglangWaiting])
	if !okW {
		waiting, okW = sglangSchedulers(families[sglangWaitingOld])
	}
	if !okR && !okW {
		return Result{}, false
	}
	var res Result
	res.Snapshot.Running = total(running)
	res.Snapshot.Waiting = total(waiting)
	if usage, ok := sglangSchedulers(families[sglangKVUsage]); ok {
		res.Snapshot.KVCacheUsage = total(usage) / float64(len(usage))
	}
	if capacity, ok := sglangSchedulers(families[sglangKVCapacity]); ok {
		res.Snapshot.KVCacheTokens = plausible(total(capacity))
	}
	prompt, _ := sumCount(families[sglangPromptTokens])
	res.Snapshot.PromptTokens = plausible(prompt)
	if hits, n := sumCount(families[sglangCachedTokens]); n > 0 {
		res.PrefixCacheQueries, res.PrefixCacheHits, res.PrefixCacheKnown = res.Snapshot.PromptTokens, plausible(hits), true
		res.Snapshot.PrefixHits = res.PrefixCacheHits
	}
	sumSec, count := histogramSums(families[sglangInterToken])
	res.Snapshot.DecodeSeconds, res.Snapshot.DecodeCount = plausible(sumSec), plausible(count)
	return res, true
}

// sglangRankLabels are the labels that tell apart the ranks of one SGLang
// scheduler; every other label (dp_rank, model_name, engine_type, extra
// labels) tells apart schedulers.
var sglangRankLabels = map[string]bool{"tp_rank": true, "pp_rank": true, "moe_ep_rank": true}

// sglangSchedulers returns one value per SGLang scheduler of a gauge
// family, in the page's order: series that differ only in their rank
// labels are one scheduler (its largest value counts; a NaN is kept so
// that ParseMetrics rejects it), and per-priority breakdowns
// (priority other than "") are skipped. ok is false when nothing is left.
func sglangSchedulers(mf *dto.MetricFamily) (values []float64, ok bool) {
	if mf == nil {
		return nil, false
	}
	index := make(map[string]int)
	var key strings.Builder
	for _, m := range mf.GetMetric() {
		v, isValue := sampleValue(m)
		if !isValue {
			continue
		}
		key.Reset()
		breakdown := false
		for _, l := range m.GetLabel() {
			name := l.GetName()
			switch {
			case name == "priority":
				breakdown = l.GetValue() != ""
			case sglangRankLabels[name]:
			default:
				// Quoted: no name or value can run into the next.
				key.WriteString(strconv.Quote(name))
				key.WriteString(strconv.Quote(l.GetValue()))
			}
		}
		if breakdown {
			continue
		}
		i, seen := index[key.String()]
		switch {
		case !seen:
			index[key.String()] = len(values)
			values = append(values, v)
		case v > values[i] || math.IsNaN(v):
			values[i] = v
		}
	}
	return values, len(values) > 0
}

// total adds up values.
func total(values []float64) float64 {
	var s float64
	for _, v := range values {
		s += v
	}
	return s
}

// Hugging Face TGI's router (huggingface/text-generation-inference; the
// list is docs/source/reference/metrics.md, the gauges are set by the
// batching task and the queue in backends/v3/src and router/src/infer).
// TGI exports no KV cache usage or capacity and no token counters the
// balancer could learn rates from: only the batch and the queue are read.
const (
	tgiRunning = "tgi_batch_current_size" // requests in the running batch
	tgiWaiting = "tgi_queue_size"         // requests queued for the next batch
)

// readTGI reads TGI's load; the gauges are unlabelled (summed all the same).
func readTGI(families map[string]*dto.MetricFamily) (Result, bool) {
	running, waiting, ok := requests(families, tgiRunning, tgiWaiting)
	if !ok {
		return Result{}, false
	}
	return Result{Snapshot: balancer.Snapshot{Running: running, Waiting: waiting}}, true
}

// llama.cpp's server (ggml-org/llama.cpp tools/server, served with
// --metrics; the page is written by the /metrics handler in
// tools/server/server.cpp, before 2025 examples/server/server.cpp). A slot
// is a request being processed; a deferred task waits for a free slot.
// Its token counters count only the prompt tokens computed (not those
// reused from the cache) and the processing times of slots, not vLLM's
// quantities: they are not read.
const (
	llamaCppRunning = "llamacpp:requests_processing"
	llamaCppWaiting = "llamacpp:requests_deferred"
	// Used KV cells over the context size (0..1); exported until the KV
	// cache API change of 2025, absent from current servers.
	llamaCppKVUsage = "llamacpp:kv_cache_usage_ratio"
)

// readLlamaCpp reads llama.cpp's load.
func readLlamaCpp(families map[string]*dto.MetricFamily) (Result, bool) {
	running, waiting, ok := requests(families, llamaCppRunning, llamaCppWaiting)
	if !ok {
		return Result{}, false
	}
	var usage float64
	if kv, n := sumCount(families[llamaCppKVUsage]); n > 0 {
		usage = kv / float64(n)
	}
	return Result{Snapshot: balancer.Snapshot{Running: running, Waiting: waiting, KVCacheUsage: usage}}, true
}

// requests sums an engine's running and waiting gauges over their series;
// ok is false when the page has neither (it is not that engine's page).
func requests(families map[string]*dto.MetricFamily, running, waiting string) (r, w float64, ok bool) {
	r, okR := sum(families[running])
	w, okW := sum(families[waiting])
	return r, w, okR || okW
}
