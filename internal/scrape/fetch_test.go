package scrape

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/llmlb/llmlb/internal/balancer"
)

// vLLM >= 0.12, one engine, with the histogram and counters real servers
// export around the gauges we read.
const metricsCurrent = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="qwen"} 0.25
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="qwen"} 12345.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="qwen"} 4.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="qwen"} 9.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="qwen"} 9.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="qwen"} 2.5
`

// What prometheus_client (Python) writes for vLLM: counters typed under the
// base name with _total and _created samples, info metrics, histograms with
// _created.
const metricsPython = `# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 1.2e+04
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="27000"} 1.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-32B"} 5.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-32B"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-32B"} 0.8125
# HELP vllm:prompt_tokens Number of prefill tokens processed.
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="Qwen/Qwen3-32B"} 123456.0
vllm:prompt_tokens_created{engine="0",model_name="Qwen/Qwen3-32B"} 1.7e+09
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="Qwen/Qwen3-32B"} 0.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-32B"} 7.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="Qwen/Qwen3-32B"} 7.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="Qwen/Qwen3-32B"} 30.5
vllm:e2e_request_latency_seconds_created{engine="0",model_name="Qwen/Qwen3-32B"} 1.7e+09
`

// The counters and histograms policy cost learns rates from, over two
// engines (vLLM's data-parallel ranks).
const metricsRates = `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0"} 1
vllm:num_requests_running{engine="1"} 1
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0"} 4000
vllm:prompt_tokens_total{engine="1"} 5000
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_bucket{engine="0",le="+Inf"} 2
vllm:request_prefill_time_seconds_sum{engine="0"} 0.5
vllm:request_prefill_time_seconds_count{engine="0"} 2
vllm:request_prefill_time_seconds_bucket{engine="1",le="+Inf"} 4
vllm:request_prefill_time_seconds_sum{engine="1"} 1
vllm:request_prefill_time_seconds_count{engine="1"} 4
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf"} 400
vllm:inter_token_latency_seconds_sum{engine="0"} 12
vllm:inter_token_latency_seconds_count{engine="0"} 400
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1000"} 1
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0"} 3
vllm:num_preemptions_total{engine="1"} 4
`

// Before vLLM 0.12: gpu_cache_usage_perc instead of kv_cache_usage_perc.
const metricsLegacy = `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="llama"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="llama"} 0.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="llama"} 0.5
`

// Data-parallel engines and two models: running/waiting sum, KV averages.
const metricsEngines = `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="a"} 3.0
vllm:num_requests_running{engine="1",model_name="a"} 4.0
vllm:num_requests_running{engine="0",model_name="b"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="a"} 2.0
vllm:num_requests_waiting{engine="1",model_name="a"} 5.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="a"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="a"} 0.6
`

// Both names (vLLM 0.10-0.11 exported both): the current one wins.
const metricsBoth = `vllm:num_requests_running 1
vllm:num_requests_waiting 0
vllm:kv_cache_usage_perc 0.3
vllm:gpu_cache_usage_perc 0.9
`

func TestFetch(t *testing.T) {
	// Another host with healthy metrics: a redirect must never reach it.
	otherHits := 0
	otherMetrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		otherHits++
		text(metricsCurrent)(w, r)
	}))
	defer otherMetrics.Close()
	defer func() {
		if otherHits != 0 {
			t.Errorf("the other host was asked %d times: a redirect was followed", otherHits)
		}
	}()
	tests := []struct {
		name    string
		handler http.HandlerFunc
		opt     HTTPOptions
		want    Result
		wantErr string   // substring; "" = success
		isErr   error    // errors.Is target, optional
		models  []string // when set, FetchModels is checked instead
	}{
		{name: "current names", handler: text(metricsCurrent),
			want: Result{Snapshot: balancer.Snapshot{Running: 3, Waiting: 1, KVCacheUsage: 0.25},
				PrefixCacheQueries: 12345, PrefixCacheKnown: true}},
		{name: "prefix-cache counters", handler: text("vllm:num_requests_running 1\n" +
			"vllm:prefix_cache_queries_total{engine=\"0\"} 800\nvllm:prefix_cache_queries_total{engine=\"1\"} 200\n" +
			"vllm:prefix_cache_hits_total{engine=\"0\"} 600\nvllm:prefix_cache_hits_total{engine=\"1\"} 150\n"),
			want: Result{Snapshot: balancer.Snapshot{Running: 1, PrefixHits: 750}, PrefixCacheQueries: 1000, PrefixCacheHits: 750, PrefixCacheKnown: true}},
		{name: "prefix-cache counters, legacy names", handler: text("vllm:num_requests_running 1\n" +
			"vllm:gpu_prefix_cache_queries_total 40\nvllm:gpu_prefix_cache_hits_total 10\n"),
			want: Result{Snapshot: balancer.Snapshot{Running: 1, PrefixHits: 10}, PrefixCacheQueries: 40, PrefixCacheHits: 10, PrefixCacheKnown: true}},
		{name: "rates for policy cost", handler: text(metricsRates),
			want: Result{Snapshot: balancer.Snapshot{Running: 2, PromptTokens: 9000, PrefillSeconds: 1.5, PrefillCount: 6,
				DecodeSeconds: 12, DecodeCount: 400, Preemptions: 7, KVCacheTokens: 2 * 1000 * 16}}},
		{name: "rates, pre-0.11 inter-token name", handler: text("vllm:num_requests_running 0\n" +
			"# TYPE vllm:time_per_output_token_seconds histogram\n" +
			"vllm:time_per_output_token_seconds_bucket{le=\"+Inf\"} 10\nvllm:time_per_output_token_seconds_sum 0.5\nvllm:time_per_output_token_seconds_count 10\n"),
			want: Result{Snapshot: balancer.Snapshot{DecodeSeconds: 0.5, DecodeCount: 10}}},
		{name: "prometheus_client output", handler: text(metricsPython),
			want: Result{Snapshot: balancer.Snapshot{Running: 5, Waiting: 2, KVCacheUsage: 0.8125, PromptTokens: 123456, KVCacheTokens: 432000}}},
		{name: "legacy names", handler: text(metricsLegacy),
			want: Result{Snapshot: balancer.Snapshot{Running: 2, Waiting: 0, KVCacheUsage: 0.5}, Legacy: true}},
		{name: "engines and models summed", handler: text(metricsEngines),
			want: Result{Snapshot: balancer.Snapshot{Running: 8, Waiting: 7, KVCacheUsage: 0.4}}},
		{name: "current name preferred over legacy", handler: text(metricsBoth),
			want: Result{Snapshot: balancer.Snapshot{Running: 1, KVCacheUsage: 0.3}}},
		{name: "only waiting is enough", handler: text("vllm:num_requests_waiting 4\n"),
			want: Result{Snapshot: balancer.Snapshot{Waiting: 4}}},
		{name: "not an inference server", handler: text("# TYPE go_goroutines gauge\ngo_goroutines 12\n"),
			wantErr: "no load metrics of vLLM, SGLang, TGI or llama.cpp", isErr: ErrNoMetrics},
		{name: "empty body", handler: text(""), wantErr: "no load metrics", isErr: ErrNoMetrics},
		{name: "garbage body", handler: text("<html>this is not prometheus{{{\n"),
			wantErr: "scrape: parsing metrics"},
		{name: "negative value", handler: text("vllm:num_requests_running -3\n"),
			wantErr: "implausible metric value"},
		{name: "non-200", handler: func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "overloaded", http.StatusServiceUnavailable)
		}, wantErr: "status 503 Service Unavailable"},
		// docs/SECURITY.md [15]: a replica redirecting /metrics to another host must not
		// be judged on that host's metrics; a redirect to itself is not
		// followed either (the configured URL is the one scraped).
		{name: "redirect to another host", handler: redirect(otherMetrics.URL + "/metrics"),
			wantErr: "redirect not followed", isErr: ErrRedirect},
		{name: "redirect to the same host", handler: redirect("/metrics-real"),
			wantErr: `status 302 Found to "/metrics-real"`, isErr: ErrRedirect},
		{name: "permanent redirect", handler: func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, otherMetrics.URL+"/metrics", http.StatusPermanentRedirect)
		}, wantErr: "status 308", isErr: ErrRedirect},
		{name: "models redirect", handler: redirect(otherMetrics.URL + "/v1/models"),
			models: []string{}, wantErr: "redirect not followed", isErr: ErrRedirect},
		{name: "body too large", handler: text(metricsCurrent), opt: HTTPOptions{MaxBodyBytes: 100},
			wantErr: "over 100 bytes", isErr: ErrBodyTooLarge},
		{name: "timeout", handler: func(w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done() // hang until the client gives up
		}, opt: HTTPOptions{Timeout: 20 * time.Millisecond}, wantErr: "Client.Timeout exceeded"},
		{name: "health check ok", handler: route(map[string]string{"/health": "", "/metrics": metricsLegacy}),
			opt:  HTTPOptions{HealthCheck: true},
			want: Result{Snapshot: balancer.Snapshot{Running: 2, KVCacheUsage: 0.5}, Legacy: true}},
		{name: "health check fails", handler: route(map[string]string{"/metrics": metricsCurrent}),
			opt: HTTPOptions{HealthCheck: true}, wantErr: "/health: status 404"},
		{name: "models", handler: route(map[string]string{"/v1/models": `{"object":"list","data":[
			{"id":"qwen","object":"model","owned_by":"vllm"},{"id":"qwen-lora"},{"id":"qwen"},{"id":""}]}`}),
			models: []string{"qwen", "qwen-lora"}},
		{name: "models empty list", handler: route(map[string]string{"/v1/models": `{"object":"list","data":[]}`}),
			models: []string{}},
		{name: "models not json", handler: route(map[string]string{"/v1/models": `<html>`}),
			models: []string{}, wantErr: "scrape: parsing /v1/models"},
		{name: "models without data", handler: route(map[string]string{"/v1/models": `{"models":["a"]}`}),
			models: []string{}, wantErr: `no "data" list`},
		{name: "models non-200", handler: route(map[string]string{}),
			models: []string{}, wantErr: "status 404"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(tt.handler)
			defer srv.Close()
			f := NewHTTPFetcher(tt.opt)
			var got any
			var err error
			if tt.models != nil {
				got, err = f.FetchModels(context.Background(), srv.URL+"/")
			} else {
				got, err = f.Fetch(context.Background(), srv.URL)
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				if !strings.HasPrefix(err.Error(), "scrape: ") {
					t.Errorf("err %q lacks the package prefix", err)
				}
				if tt.isErr != nil && !errors.Is(err, tt.isErr) {
					t.Errorf("err = %v, want errors.Is %v", err, tt.isErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			var want any = tt.want
			if tt.models != nil {
				want = tt.models
			}
			// Which engine was recognized is TestParseEngines' subject.
			if d := cmp.Diff(want, got, cmpopts.IgnoreFields(Result{}, "Engine")); d != "" {
				t.Errorf("result mismatch (-want +got):\n%s", d)
			}
		})
	}
}

func TestFetchSendsAPIKey(t *testing.T) {
	var auth []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth = append(auth, r.Header.Get("Authorization"))
		_, _ = w.Write([]byte(metricsCurrent))
	}))
	defer srv.Close()
	f := NewHTTPFetcher(HTTPOptions{})
	if _, err := f.Fetch(WithAPIKey(context.Background(), "sk-123"), srv.URL); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Fetch(context.Background(), srv.URL); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"Bearer sk-123", ""}, auth); d != "" {
		t.Errorf("Authorization headers (-want +got):\n%s", d)
	}
}

// TestCheckLive: the scrape of a replica without metrics is GET /v1/models
// (after /health when configured) under Fetch's rules: its API key, no
// redirect, a body limit, and any status but 200 is a failure.
func TestCheckLive(t *testing.T) {
	models := `{"object":"list","data":[{"id":"llama3:8b","object":"model","owned_by":"library"}]}`
	tests := []struct {
		name    string
		handler http.HandlerFunc
		opt     HTTPOptions
		wantErr string // substring; "" = live
		isErr   error
	}{
		{name: "models answered, no /metrics", handler: route(map[string]string{"/v1/models": models})},
		{name: "a 200 is enough", handler: route(map[string]string{"/v1/models": "ok"})},
		{name: "404", handler: route(map[string]string{"/metrics": metricsCurrent}), wantErr: "/v1/models: status 404"},
		{name: "503", handler: func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "loading model", http.StatusServiceUnavailable)
		}, wantErr: "status 503"},
		{name: "health check ok", handler: route(map[string]string{"/health": "", "/v1/models": models}),
			opt: HTTPOptions{HealthCheck: true}},
		{name: "health check fails", handler: route(map[string]string{"/v1/models": models}),
			opt: HTTPOptions{HealthCheck: true}, wantErr: "/health: status 404"},
		{name: "redirect", handler: redirect("http://127.0.0.1:1/v1/models"), wantErr: "redirect not followed", isErr: ErrRedirect},
		{name: "body too large", handler: route(map[string]string{"/v1/models": models}), opt: HTTPOptions{MaxBodyBytes: 10},
			wantErr: "over 10 bytes", isErr: ErrBodyTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var auth string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/v1/models" {
					auth = r.Header.Get("Authorization")
				}
				tt.handler(w, r)
			}))
			defer srv.Close()
			err := NewHTTPFetcher(tt.opt).CheckLive(WithAPIKey(context.Background(), "sk-1"), srv.URL)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("CheckLive = %v, want live", err)
				}
				if auth != "Bearer sk-1" {
					t.Errorf("GET /v1/models sent Authorization %q, want the replica's key", auth)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.HasPrefix(err.Error(), "scrape: ") {
				t.Fatalf("CheckLive = %v, want a scrape: error containing %q", err, tt.wantErr)
			}
			if tt.isErr != nil && !errors.Is(err, tt.isErr) {
				t.Errorf("err = %v, want errors.Is %v", err, tt.isErr)
			}
		})
	}
}

func TestFetchRefused(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there any more
	_, err := NewHTTPFetcher(HTTPOptions{}).Fetch(context.Background(), url)
	if err == nil || !strings.HasPrefix(err.Error(), "scrape: ") {
		t.Fatalf("err = %v, want a scrape: error", err)
	}
}

// redirect answers every request with a 302 to location.
func redirect(location string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, location, http.StatusFound)
	}
}

func text(body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write([]byte(body))
	}
}

func route(paths map[string]string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, ok := paths[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(body))
	}
}

// BenchmarkParseMetrics parses a page shaped like a busy vLLM server's: the
// gauges we read amid 8 histograms of 30 buckets for 2 engines.
func BenchmarkParseMetrics(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(metricsEngines)
	for h := range 8 {
		fmt.Fprintf(&sb, "# TYPE vllm:hist_%d_seconds histogram\n", h)
		for e := range 2 {
			for k := range 30 {
				fmt.Fprintf(&sb, "vllm:hist_%d_seconds_bucket{engine=\"%d\",le=\"%d\",model_name=\"a\"} %d\n", h, e, k, k*7)
			}
			fmt.Fprintf(&sb, "vllm:hist_%d_seconds_bucket{engine=\"%d\",le=\"+Inf\",model_name=\"a\"} 300\n", h, e)
			fmt.Fprintf(&sb, "vllm:hist_%d_seconds_count{engine=\"%d\",model_name=\"a\"} 300\n", h, e)
			fmt.Fprintf(&sb, "vllm:hist_%d_seconds_sum{engine=\"%d\",model_name=\"a\"} 42.5\n", h, e)
		}
	}
	body := sb.String()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseMetrics(strings.NewReader(body)); err != nil {
			b.Fatal(err)
		}
	}
}
