// Package scrape reads each replica's /metrics (vLLM's, or SGLang's, TGI's
// or llama.cpp's; engines.go) and /v1/models and feeds the results to the
// routing core (docs/ROUTING.md: load and health). A replica without a
// Prometheus endpoint is scraped for liveness only (GET /v1/models). The
// Fetcher does the I/O for one replica; the Scraper is the loop that `llmlb
// serve` owns: one goroutine per replica, started by Run and stopped by its
// context. EJECTED replicas keep being scraped: a scrape is their only way back
// (docs/ROUTING.md "Health").
package scrape

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/llmlb/llmlb/internal/balancer"
)

// ErrNoMetrics: the response parsed but holds neither the running nor the
// waiting metric of any engine llmlb knows (wrong port, an engine whose
// metrics are off, or a server to configure with `metrics: none`).
var ErrNoMetrics = errors.New("scrape: no load metrics of vLLM, SGLang, TGI or llama.cpp in response")

// errImplausible: a load metric is negative, NaN or infinite.
var errImplausible = errors.New("scrape: implausible metric value")

// ErrBodyTooLarge: a response body exceeded the configured limit.
var ErrBodyTooLarge = errors.New("scrape: response body too large")

// Result is one successful scrape of a replica's /metrics.
type Result struct {
	Snapshot balancer.Snapshot
	// Engine is the engine whose metric names the page had (EngineVLLM,
	// ...); "" for a liveness check, which reads no metrics.
	Engine string
	// Legacy is true when the KV cache usage came from vLLM's pre-0.12 name
	// (vllm:gpu_cache_usage_perc).
	Legacy bool
	// PrefixCacheQueries and PrefixCacheHits are vLLM's prefix-cache
	// counters (tokens queried and found cached since the replica started),
	// for the dashboard's hit rate; PrefixCacheKnown is false when the
	// replica exports neither.
	PrefixCacheQueries, PrefixCacheHits float64
	PrefixCacheKnown                    bool
}

// Fetcher reads one replica's load. It is the seam between the scraper loop
// and the network; Fake is an in-memory implementation for tests.
type Fetcher interface {
	Fetch(ctx context.Context, replicaURL string) (Result, error)
}

// ModelFetcher reads the models a replica serves (OpenAI GET /v1/models). A
// Fetcher that also implements it lets the Scraper learn models for replicas
// whose models were not declared in the configuration.
type ModelFetcher interface {
	FetchModels(ctx context.Context, replicaURL string) ([]string, error)
}

// LivenessChecker checks that a replica answers without reading its load:
// the scrape of a replica that exports no Prometheus metrics (Ollama, LM
// Studio, many OpenAI-compatible shims). A Fetcher that also implements it
// can scrape Targets with LivenessOnly set.
type LivenessChecker interface {
	CheckLive(ctx context.Context, replicaURL string) error
}

// vLLM's metric names, current (vLLM >= 0.12) first, then the names older
// versions export. Values are summed over the engine and model_name labels.
const (
	metricRunning       = "vllm:num_requests_running"
	metricWaiting       = "vllm:num_requests_waiting"
	metricKVUsage       = "vllm:kv_cache_usage_perc"
	metricKVUsageOld    = "vllm:gpu_cache_usage_perc" // before vLLM 0.12
	metricPrefixQ       = "vllm:prefix_cache_queries_total"
	metricPrefixH       = "vllm:prefix_cache_hits_total"
	metricPrefixQOld    = "vllm:gpu_prefix_cache_queries_total" // before vLLM 0.12
	metricPrefixHOld    = "vllm:gpu_prefix_cache_hits_total"
	metricPromptTokens  = "vllm:prompt_tokens_total"
	metricPrefillTime   = "vllm:request_prefill_time_seconds"
	metricInterToken    = "vllm:inter_token_latency_seconds"
	metricInterTokenOld = "vllm:time_per_output_token_seconds" // before vLLM 0.11
	metricCacheConfig   = "vllm:cache_config_info"
	metricPreemptions   = "vllm:num_preemptions_total"
	defaultTimeout      = time.Second
	defaultMaxBodySize  = 4 << 20
)

// HTTPOptions configures an HTTPFetcher (config.Scrape carries the values).
type HTTPOptions struct {
	Timeout      time.Duration // whole request, body included (default 1s)
	MaxBodyBytes int64         // larger bodies are an error (default 4 MiB)
	HealthCheck  bool          // also GET /health; non-200 fails the scrape
	// Transport overrides the HTTP transport (tests); nil clones
	// http.DefaultTransport.
	Transport http.RoundTripper
}

// ErrRedirect: a replica answered a scrape with a redirect. Redirects are
// never followed: a replica judged on another host's /metrics would be LIVE
// on someone else's health (docs/SECURITY.md), and the api_key would go
// along with the request.
var ErrRedirect = errors.New("scrape: redirect not followed")

// HTTPFetcher scrapes replicas over HTTP with its own client (never
// http.DefaultClient), a timeout, a bounded body read and no redirects.
type HTTPFetcher struct {
	client      *http.Client
	maxBody     int64
	healthCheck bool
}

// NewHTTPFetcher returns a fetcher; zero options take the defaults.
func NewHTTPFetcher(o HTTPOptions) *HTTPFetcher {
	if o.Timeout <= 0 {
		o.Timeout = defaultTimeout
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = defaultMaxBodySize
	}
	rt := o.Transport
	if rt == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 4
		rt = t
	}
	return &HTTPFetcher{
		client: &http.Client{Timeout: o.Timeout, Transport: rt,
			// A 3xx comes back as the response; get turns it into ErrRedirect.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		maxBody:     o.MaxBodyBytes,
		healthCheck: o.HealthCheck,
	}
}

// apiKeyKey is the context key of WithAPIKey.
type apiKeyKey struct{}

// WithAPIKey returns a context whose HTTP scrapes carry
// "Authorization: Bearer key" (a replica's configured api_key). The Scraper
// sets it per replica; an empty key sends no header.
func WithAPIKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, apiKeyKey{}, key)
}

func apiKeyFrom(ctx context.Context) string {
	k, _ := ctx.Value(apiKeyKey{}).(string)
	return k
}

// Fetch GETs replicaURL/metrics (and /health first when configured) and
// parses the load metrics of whichever engine exports them (ParseMetrics).
func (f *HTTPFetcher) Fetch(ctx context.Context, replicaURL string) (Result, error) {
	if f.healthCheck {
		if _, err := f.get(ctx, replicaURL, "/health", "*/*"); err != nil {
			return Result{}, err
		}
	}
	body, err := f.get(ctx, replicaURL, "/metrics", "text/plain;version=0.0.4;q=1,*/*;q=0.1")
	if err != nil {
		return Result{}, err
	}
	return ParseMetrics(bytes.NewReader(body))
}

// CheckLive GETs replicaURL/v1/models (and /health first when configured):
// a 200 means the replica is live. The body is read within the size limit
// but not judged: the models are learned separately (FetchModels), and a
// server that answers there is up. Same timeout, redirect rule and api key
// as Fetch.
func (f *HTTPFetcher) CheckLive(ctx context.Context, replicaURL string) error {
	if f.healthCheck {
		if _, err := f.get(ctx, replicaURL, "/health", "*/*"); err != nil {
			return err
		}
	}
	_, err := f.get(ctx, replicaURL, "/v1/models", "application/json")
	return err
}

// FetchModels GETs replicaURL/v1/models and returns the model ids, in the
// replica's order, with the same timeout and body limit as Fetch.
func (f *HTTPFetcher) FetchModels(ctx context.Context, replicaURL string) ([]string, error) {
	body, err := f.get(ctx, replicaURL, "/v1/models", "application/json")
	if err != nil {
		return nil, err
	}
	return ParseModels(body)
}

// get performs one bounded GET and returns the body of a 200 response.
func (f *HTTPFetcher) get(ctx context.Context, base, path, accept string) ([]byte, error) {
	u := strings.TrimRight(base, "/") + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("scrape: %s: %w", path, err)
	}
	req.Header.Set("Accept", accept)
	req.Header.Set("User-Agent", "llmlb-scraper")
	if key := apiKeyFrom(ctx); key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		// url.Error already names the method and URL.
		return nil, fmt.Errorf("scrape: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		// Location is the replica's text: quoted, so it cannot forge log lines.
		return nil, fmt.Errorf("%w: GET %s: status %s to %q (give the replica's final URL in the configuration)",
			ErrRedirect, u, resp.Status, resp.Header.Get("Location"))
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, f.maxBody+1))
	if err != nil {
		return nil, fmt.Errorf("scrape: GET %s: reading body: %w", u, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape: GET %s: status %s", u, resp.Status)
	}
	if int64(len(body)) > f.maxBody {
		return nil, fmt.Errorf("%w: GET %s: over %d bytes", ErrBodyTooLarge, u, f.maxBody)
	}
	return body, nil
}

// ParseMetrics reads a Prometheus text exposition and extracts the load of
// the first engine (engines: vLLM, then SGLang, TGI, llama.cpp) whose
// running or waiting metric is on the page. A page with none of them is
// ErrNoMetrics; a negative, NaN or infinite load is an error too.
func ParseMetrics(r io.Reader) (Result, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Result{}, fmt.Errorf("scrape: parsing metrics: %w", err)
	}
	for _, e := range engines {
		res, ok := e.read(families)
		if !ok {
			continue
		}
		res.Engine = e.name
		for _, v := range []float64{res.Snapshot.Running, res.Snapshot.Waiting, res.Snapshot.KVCacheUsage} {
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				return Result{}, fmt.Errorf("%w %v (%s)", errImplausible, v, e.name)
			}
		}
		return res, nil
	}
	return Result{}, ErrNoMetrics
}

// readVLLM reads vLLM's load: running and waiting requests summed over all
// series (engines, models), KV cache usage averaged over them (each engine
// reports its own fraction), and the counters of readRates.
func readVLLM(families map[string]*dto.MetricFamily) (Result, bool) {
	running, waiting, ok := requests(families, metricRunning, metricWaiting)
	if !ok {
		return Result{}, false
	}
	var res Result
	res.Snapshot.Running = running
	res.Snapshot.Waiting = waiting
	if kv, n := sumCount(families[metricKVUsage]); n > 0 {
		res.Snapshot.KVCacheUsage = kv / float64(n)
	} else if kv, n := sumCount(families[metricKVUsageOld]); n > 0 {
		res.Snapshot.KVCacheUsage = kv / float64(n)
		res.Legacy = true
	}
	if q, n := sumCount(families[metricPrefixQ]); n > 0 {
		h, _ := sumCount(families[metricPrefixH])
		res.PrefixCacheQueries, res.PrefixCacheHits, res.PrefixCacheKnown = q, h, true
	} else if q, n := sumCount(families[metricPrefixQOld]); n > 0 {
		h, _ := sumCount(families[metricPrefixHOld])
		res.PrefixCacheQueries, res.PrefixCacheHits, res.PrefixCacheKnown = q, h, true
	}
	res.Snapshot.PrefixHits = res.PrefixCacheHits
	readRates(families, &res.Snapshot)
	return res, true
}

// readRates reads what policy cost learns each replica's rates from (the
// balancer takes differences between scrapes): the prompt-token counter,
// the sums and counts of the prefill-time and inter-token histograms, the
// preemption counter (a KV-bound batch, limits.go), and
// the KV capacity of vllm:cache_config_info (num_gpu_blocks x block_size,
// summed over engines). Missing or implausible values stay 0.
func readRates(families map[string]*dto.MetricFamily, snap *balancer.Snapshot) {
	tokens, _ := sumCount(families[metricPromptTokens])
	snap.PromptTokens = plausible(tokens)
	sumSec, count := histogramSums(families[metricPrefillTime])
	snap.PrefillSeconds, snap.PrefillCount = plausible(sumSec), plausible(count)
	itl := families[metricInterToken]
	if itl == nil {
		itl = families[metricInterTokenOld]
	}
	sumSec, count = histogramSums(itl)
	snap.DecodeSeconds, snap.DecodeCount = plausible(sumSec), plausible(count)
	preemptions, _ := sumCount(families[metricPreemptions])
	snap.Preemptions = plausible(preemptions)
	if mf := families[metricCacheConfig]; mf != nil {
		var capacity float64
		for _, m := range mf.GetMetric() {
			var blocks, size float64
			for _, l := range m.GetLabel() {
				v, err := strconv.ParseFloat(l.GetValue(), 64)
				if err != nil {
					continue
				}
				switch l.GetName() {
				case "num_gpu_blocks":
					blocks = v
				case "block_size":
					size = v
				}
			}
			capacity += blocks * size
		}
		snap.KVCacheTokens = plausible(capacity)
	}
}

// plausible is v, or 0 for a negative, NaN or infinite counter (the
// balancer then keeps its prior rather than learn from a broken exporter).
func plausible(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0
	}
	return v
}

// histogramSums adds up the sample sums and counts of a histogram family.
func histogramSums(mf *dto.MetricFamily) (sum, count float64) {
	if mf == nil {
		return 0, 0
	}
	for _, m := range mf.GetMetric() {
		if h := m.GetHistogram(); h != nil {
			sum += h.GetSampleSum()
			count += float64(h.GetSampleCount())
		}
	}
	return sum, count
}

func sum(mf *dto.MetricFamily) (float64, bool) {
	s, n := sumCount(mf)
	return s, n > 0
}

// sumCount adds up every sample of a gauge, counter or untyped family.
func sumCount(mf *dto.MetricFamily) (float64, int) {
	if mf == nil {
		return 0, 0
	}
	var s float64
	var n int
	for _, m := range mf.GetMetric() {
		v, ok := sampleValue(m)
		if !ok {
			continue
		}
		s += v
		n++
	}
	return s, n
}

// sampleValue is the value of a gauge, counter or untyped sample; ok is
// false for histograms and summaries.
func sampleValue(m *dto.Metric) (float64, bool) {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue(), true
	case m.Untyped != nil:
		return m.GetUntyped().GetValue(), true
	case m.Counter != nil:
		return m.GetCounter().GetValue(), true
	}
	return 0, false
}

// ParseModels decodes an OpenAI model list ({"object":"list","data":[{"id":..}]})
// and returns the ids, skipping empty and repeated ones.
func ParseModels(body []byte) ([]string, error) {
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("scrape: parsing /v1/models: %w", err)
	}
	if list.Data == nil {
		return nil, errors.New(`scrape: parsing /v1/models: no "data" list`)
	}
	seen := make(map[string]bool, len(list.Data))
	models := make([]string, 0, len(list.Data))
	for _, m := range list.Data {
		if m.ID == "" || seen[m.ID] {
			continue
		}
		seen[m.ID] = true
		models = append(models, m.ID)
	}
	return models, nil
}
