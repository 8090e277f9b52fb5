package simreplica

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	dto "github.com/prometheus/client_model/go"

	"github.com/llmlb/llmlb/internal/engine"
)

// testProfile is the fast profile: small prompts finish in well under a second.
const testProfile = "h100"

// waitTimeout bounds every polling wait; it is generous on purpose (the
// tests assert states, never durations).
const waitTimeout = 10 * time.Second

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// startReplica runs a replica for the test's lifetime.
func startReplica(t *testing.T, opts Options) *Replica {
	t.Helper()
	if opts.Profile == "" {
		opts.Profile = testProfile
	}
	if opts.Logger == nil {
		opts.Logger = quietLogger()
	}
	if opts.Seed == 0 {
		opts.Seed = 1
	}
	r, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return r
}

// testClient has its own transport, so closing idle connections or a
// refused replica in one test never affects another.
func testClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{}}
}

func openaiClient(r *Replica) openai.Client {
	return openai.NewClient(
		option.WithBaseURL(r.URL()+"/v1"),
		option.WithAPIKey("sim"),
		option.WithMaxRetries(0),
		option.WithHTTPClient(testClient(waitTimeout)),
	)
}

// waitFor polls cond until it holds or waitTimeout passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestChatNonStreamingAndCache(t *testing.T) {
	r := startReplica(t, Options{})
	client := openaiClient(r)
	ctx := context.Background()
	system := strings.Repeat("You are a careful assistant who answers in short sentences. ", 20)
	params := openai.ChatCompletionNewParams{
		Model: "sim-model",
		Messages: []openai.ChatCompletionMessageParamUnion{
			openai.SystemMessage(system),
			openai.UserMessage("Tell me about load balancing."),
		},
		MaxTokens: openai.Int(8),
	}
	first, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	if first.Object != "chat.completion" || len(first.Choices) != 1 {
		t.Fatalf("response = %+v", first)
	}
	c := first.Choices[0]
	if c.Message.Content != outputText(8) || c.FinishReason != "length" || c.Message.Role != "assistant" {
		t.Errorf("choice = %q finish %q role %q, want %q length assistant", c.Message.Content, c.FinishReason, c.Message.Role, outputText(8))
	}
	if first.Usage.CompletionTokens != 8 || first.Usage.PromptTokens < 100 ||
		first.Usage.TotalTokens != first.Usage.PromptTokens+8 {
		t.Errorf("usage = %+v", first.Usage)
	}
	if first.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("first call cached_tokens = %d, want 0", first.Usage.PromptTokensDetails.CachedTokens)
	}
	second, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("second chat: %v", err)
	}
	if got := second.Usage.PromptTokensDetails.CachedTokens; got <= 0 || got > second.Usage.PromptTokens {
		t.Errorf("repeated prompt cached_tokens = %d of %d, want > 0", got, second.Usage.PromptTokens)
	}
}

func TestChatStreaming(t *testing.T) {
	r := startReplica(t, Options{})
	client := openaiClient(r)
	stream := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model:         "sim-model",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Stream me something.")},
		MaxTokens:     openai.Int(12),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	var content strings.Builder
	var role, finish string
	var chunks, contentChunks int
	var usage openai.CompletionUsage
	for stream.Next() {
		ch := stream.Current()
		chunks++
		if ch.Object != "chat.completion.chunk" {
			t.Errorf("chunk object = %q", ch.Object)
		}
		if len(ch.Choices) == 0 {
			usage = ch.Usage
			continue
		}
		d := ch.Choices[0].Delta
		if d.Role != "" {
			role = d.Role
		}
		if d.Content != "" {
			contentChunks++
			content.WriteString(d.Content)
		}
		if ch.Choices[0].FinishReason != "" {
			finish = ch.Choices[0].FinishReason
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if role != "assistant" || finish != "length" {
		t.Errorf("role %q finish %q, want assistant length", role, finish)
	}
	if content.String() != outputText(12) || contentChunks != 12 {
		t.Errorf("content %q in %d chunks, want %q in 12", content.String(), contentChunks, outputText(12))
	}
	if usage.CompletionTokens != 12 || usage.PromptTokens == 0 {
		t.Errorf("usage chunk = %+v", usage)
	}
	if got := r.Stats().Running; got != 0 {
		t.Errorf("running after the stream = %d, want 0", got)
	}
}

func TestCompletions(t *testing.T) {
	r := startReplica(t, Options{})
	client := openaiClient(r)
	ctx := context.Background()
	prompt := strings.Repeat("0123456789abcdef", 40) // 160 tokens: 10 full blocks
	params := openai.CompletionNewParams{
		Model:     "sim-model",
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
		MaxTokens: openai.Int(5),
	}
	full, err := client.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("completion: %v", err)
	}
	if full.Object != "text_completion" || len(full.Choices) != 1 || full.Choices[0].Text != outputText(5) ||
		full.Choices[0].FinishReason != "length" || full.Usage.CompletionTokens != 5 {
		t.Errorf("completion = %+v", full)
	}

	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := client.Completions.NewStreaming(ctx, params)
	var text strings.Builder
	var usage openai.CompletionUsage
	for stream.Next() {
		ch := stream.Current()
		if ch.Object != "text_completion" {
			t.Errorf("chunk object = %q", ch.Object)
		}
		for _, c := range ch.Choices {
			text.WriteString(c.Text)
		}
		if ch.Usage.TotalTokens > 0 {
			usage = ch.Usage
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if text.String() != outputText(5) {
		t.Errorf("streamed text %q, want %q", text.String(), outputText(5))
	}
	if usage.CompletionTokens != 5 || usage.PromptTokensDetails.CachedTokens <= 0 {
		t.Errorf("usage = %+v, want 5 completion tokens and a cache hit on the repeated prompt", usage)
	}
}

func TestDefaultMaxTokensFinishesWithStop(t *testing.T) {
	r := startReplica(t, Options{DefaultMaxTokens: 3})
	client := openaiClient(r)
	resp, err := client.Completions.New(context.Background(), openai.CompletionNewParams{
		Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}},
		Model:  "sim-model",
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Choices[0].FinishReason != "stop" || resp.Usage.CompletionTokens != 3 || resp.Usage.PromptTokens != 17 {
		t.Errorf("finish %q usage %+v, want stop, 3 completion and 17 prompt tokens", resp.Choices[0].FinishReason, resp.Usage)
	}
}

// parseMetrics scrapes /metrics as the balancer does.
func parseMetrics(t *testing.T, r *Replica) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := testClient(waitTimeout).Get(r.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics status %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

func metricValue(t *testing.T, fams map[string]*dto.MetricFamily, name string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok || len(f.GetMetric()) == 0 {
		t.Fatalf("metric %s missing", name)
	}
	m := f.GetMetric()[0]
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	if labels["model_name"] != "sim-model" || labels["engine"] != "0" {
		t.Errorf("%s labels = %v, want model_name=sim-model engine=0", name, labels)
	}
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Histogram != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	t.Fatalf("metric %s has no value", name)
	return 0
}

func TestMetrics(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		name := "current"
		kv, queries, hits := "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
		itl, otherITL := "vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"
		if legacy {
			name = "legacy"
			kv, queries, hits = "vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total"
			itl, otherITL = otherITL, itl
		}
		t.Run(name, func(t *testing.T) {
			r := startReplica(t, Options{LegacyMetrics: legacy})
			client := openaiClient(r)
			prompt := strings.Repeat("shared prefix text ", 30)
			for range 2 {
				_, err := client.Completions.New(context.Background(), openai.CompletionNewParams{
					Model: "sim-model", MaxTokens: openai.Int(4),
					Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			fams := parseMetrics(t, r)
			for _, other := range []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"} {
				if _, ok := fams[other]; ok && other != kv {
					t.Errorf("%s exposed in %s mode", other, name)
				}
			}
			if _, ok := fams[otherITL]; ok {
				t.Errorf("%s exposed in %s mode", otherITL, name)
			}
			checks := []struct {
				metric string
				ok     func(float64) bool
			}{
				{"vllm:num_requests_running", func(v float64) bool { return v == 0 }},
				{"vllm:num_requests_waiting", func(v float64) bool { return v == 0 }},
				{kv, func(v float64) bool { return v >= 0 && v <= 1 }},
				{queries, func(v float64) bool { return v > 0 }},
				{hits, func(v float64) bool { return v > 0 }},
				{"vllm:prompt_tokens_total", func(v float64) bool { return v > 0 }},
				{"vllm:generation_tokens_total", func(v float64) bool { return v == 8 }},
				{"vllm:num_preemptions_total", func(v float64) bool { return v == 0 }},
				{"vllm:time_to_first_token_seconds", func(v float64) bool { return v == 2 }},
				{"vllm:e2e_request_latency_seconds", func(v float64) bool { return v == 2 }},
				{"vllm:request_queue_time_seconds", func(v float64) bool { return v == 2 }},
				{"vllm:request_prefill_time_seconds", func(v float64) bool { return v == 2 }},
				{itl, func(v float64) bool { return v == 6 }}, // 3 gaps per 4-token request
			}
			for _, c := range checks {
				if v := metricValue(t, fams, c.metric); !c.ok(v) {
					t.Errorf("%s = %v", c.metric, v)
				}
			}
			var success float64
			for _, m := range fams["vllm:request_success_total"].GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "finished_reason" && l.GetValue() == "length" {
						success = m.GetCounter().GetValue()
					}
				}
			}
			if success != 2 {
				t.Errorf("vllm:request_success_total{finished_reason=length} = %v, want 2", success)
			}
			for _, h := range []struct {
				name    string
				buckets []float64
			}{
				{"vllm:time_to_first_token_seconds", engine.TTFTBuckets},
				{"vllm:request_queue_time_seconds", engine.RequestLatencyBuckets},
				{"vllm:request_prefill_time_seconds", engine.RequestLatencyBuckets},
				{itl, engine.InterTokenBuckets},
			} {
				f := fams[h.name]
				if f.GetType() != dto.MetricType_HISTOGRAM {
					t.Errorf("%s is %v, want a histogram", h.name, f.GetType())
					continue
				}
				var got []float64
				for _, b := range f.GetMetric()[0].GetHistogram().GetBucket() {
					if !math.IsInf(b.GetUpperBound(), 1) {
						got = append(got, b.GetUpperBound())
					}
				}
				if !slices.Equal(got, h.buckets) {
					t.Errorf("%s buckets %v, want vLLM's %v", h.name, got, h.buckets)
				}
			}
			checkCacheConfigInfo(t, fams)
		})
	}
}

func TestInfoEndpoints(t *testing.T) {
	r := startReplica(t, Options{Model: "m1"})
	client := testClient(waitTimeout)
	get := func(path string) (int, string) {
		resp, err := client.Get(r.URL() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/health"); code != 200 || body != "" {
		t.Errorf("/health = %d %q, want 200 and an empty body", code, body)
	}
	if code, body := get("/version"); code != 200 || !strings.Contains(body, `"version":"0.`) {
		t.Errorf("/version = %d %q", code, body)
	}
	code, body := get("/v1/models")
	var list modelList
	if err := json.Unmarshal([]byte(body), &list); err != nil || code != 200 {
		t.Fatalf("/v1/models = %d %q (%v)", code, body, err)
	}
	if list.Object != "list" || len(list.Data) != 1 || list.Data[0].ID != "m1" || list.Data[0].OwnedBy != "vllm" || list.Data[0].MaxModelLen <= 0 {
		t.Errorf("/v1/models = %+v", list)
	}
}

func TestErrors(t *testing.T) {
	r := startReplica(t, Options{MaxBodyBytes: 4096})
	long := strings.Repeat("x", 4*r.profile.MaxModelLen+64)
	r2 := startReplica(t, Options{})
	tests := []struct {
		name, path, body string
		replica          *Replica
		status           int
		typ              string
	}{
		{"bad json", "/v1/chat/completions", `{"model":`, r, 400, "BadRequestError"},
		{"empty body", "/v1/chat/completions", ``, r, 400, "BadRequestError"},
		{"missing messages", "/v1/chat/completions", `{"model":"sim-model"}`, r, 400, "BadRequestError"},
		{"message without role", "/v1/chat/completions", `{"messages":[{"content":"hi"}]}`, r, 400, "BadRequestError"},
		{"bad content", "/v1/chat/completions", `{"messages":[{"role":"user","content":7}]}`, r, 400, "BadRequestError"},
		{"zero max_tokens", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":0}`, r, 400, "BadRequestError"},
		{"n=2", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"n":2}`, r, 400, "BadRequestError"},
		{"unknown model", "/v1/chat/completions", `{"model":"gpt-9","messages":[{"role":"user","content":"hi"}]}`, r, 404, "NotFoundError"},
		{"missing prompt", "/v1/completions", `{"model":"sim-model"}`, r, 400, "BadRequestError"},
		{"empty prompt", "/v1/completions", `{"prompt":""}`, r, 400, "BadRequestError"},
		{"two prompts", "/v1/completions", `{"prompt":["a","b"]}`, r, 400, "BadRequestError"},
		{"unknown model completions", "/v1/completions", `{"model":"x","prompt":"hi"}`, r, 404, "NotFoundError"},
		{"body too large", "/v1/completions", `{"prompt":"` + strings.Repeat("y", 5000) + `"}`, r, 413, "RequestEntityTooLarge"},
		{"prompt longer than context", "/v1/completions", `{"prompt":"` + long + `"}`, r2, 400, "BadRequestError"},
	}
	client := testClient(waitTimeout)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := client.Post(tt.replica.URL()+tt.path, "application/json", strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
					Code    int     `json:"code"`
				} `json:"error"`
			}
			raw, _ := io.ReadAll(resp.Body)
			if err := json.Unmarshal(raw, &body); err != nil {
				t.Fatalf("error body %q: %v", raw, err)
			}
			if resp.StatusCode != tt.status || body.Error.Type != tt.typ || body.Error.Code != tt.status || body.Error.Message == "" {
				t.Errorf("got %d %s, want %d %s", resp.StatusCode, raw, tt.status, tt.typ)
			}
			if !strings.Contains(string(raw), `"param":null`) {
				t.Errorf("error body %s lacks param", raw)
			}
		})
	}
}

// openStream starts a raw streaming chat request and returns its body reader.
func openStream(t *testing.T, ctx context.Context, r *Replica, maxTokens int) (*http.Response, *bufio.Reader) {
	t.Helper()
	body := `{"model":"sim-model","stream":true,"max_tokens":` + itoa(maxTokens) + `,"messages":[{"role":"user","content":"go on"}]}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.URL()+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := testClient(0).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream status %d", resp.StatusCode)
	}
	return resp, bufio.NewReader(resp.Body)
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// readEvent returns the next SSE data payload.
func readEvent(br *bufio.Reader) (string, error) {
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return "", err
		}
		if data, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), "data: "); ok {
			return data, nil
		}
	}
}

func TestClientCancelFreesSlot(t *testing.T) {
	r := startReplica(t, Options{Profile: "2x3090-tp2"})
	ctx, cancel := context.WithCancel(context.Background())
	resp, br := openStream(t, ctx, r, 100000)
	defer resp.Body.Close()
	for range 3 { // role chunk and two tokens
		if _, err := readEvent(br); err != nil {
			t.Fatal(err)
		}
	}
	if got := r.Stats().Running; got != 1 {
		t.Fatalf("running mid-stream = %d, want 1", got)
	}
	cancel()
	waitFor(t, "running back to 0 after the client left", func() bool { return r.Stats().Running == 0 })
	r.mu.Lock()
	pending := len(r.pending)
	r.mu.Unlock()
	if pending != 0 {
		t.Errorf("pending requests after cancel = %d, want 0", pending)
	}
}

func TestFaultRefuseAndRecover(t *testing.T) {
	r := startReplica(t, Options{})
	client := testClient(waitTimeout)
	// A keep-alive connection opened before the fault must die with it.
	if resp, err := client.Get(r.URL() + "/health"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("health before fault: %v", err)
	} else {
		resp.Body.Close()
	}
	if err := r.SetFault(Fault{Mode: Refuse}); err != nil {
		t.Fatal(err)
	}
	if !r.Refusing() {
		t.Fatal("Refusing() = false after SetFault(refuse)")
	}
	_, err := client.Get(r.URL() + "/health")
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("GET while refusing: %v, want connection refused", err)
	}
	if err := r.SetFault(Fault{Mode: Recover}); err != nil {
		t.Fatal(err)
	}
	resp, err := client.Get(r.URL() + "/health")
	if err != nil {
		t.Fatalf("GET after recover: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || r.Fault().Mode != None {
		t.Errorf("after recover: status %d fault %v", resp.StatusCode, r.Fault())
	}
}

func TestFaultRefuseKillsStreams(t *testing.T) {
	r := startReplica(t, Options{Profile: "2x3090-tp2"})
	resp, br := openStream(t, context.Background(), r, 100000)
	defer resp.Body.Close()
	if _, err := readEvent(br); err != nil {
		t.Fatal(err)
	}
	if err := r.SetFault(Fault{Mode: Refuse}); err != nil {
		t.Fatal(err)
	}
	for {
		data, err := readEvent(br)
		if err != nil {
			break
		}
		if data == "[DONE]" {
			t.Fatal("stream finished although the replica went down")
		}
	}
	waitFor(t, "the killed stream to leave the engine", func() bool { return r.Stats().Running == 0 })
}

func TestFaultHang(t *testing.T) {
	r := startReplica(t, Options{Fault: Fault{Mode: Hang}})
	client := testClient(300 * time.Millisecond)
	for _, path := range []string{"/health", "/metrics", "/v1/models"} {
		_, err := client.Get(r.URL() + path)
		var ne interface{ Timeout() bool }
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("GET %s while hanging: %v, want a client timeout", path, err)
		}
	}
	// The control endpoint still answers, and recovering serves again.
	resp, err := testClient(waitTimeout).Post(r.URL()+"/sim/fault", "application/json", strings.NewReader(`{"mode":"recover"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("POST /sim/fault recover: %d", resp.StatusCode)
	}
	resp, err = testClient(waitTimeout).Get(r.URL() + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("health after recover: %v", err)
	}
	resp.Body.Close()
}

func TestFaultErrorRate(t *testing.T) {
	r := startReplica(t, Options{Fault: Fault{Mode: Error, Rate: 1, Status: 500}})
	client := testClient(waitTimeout)
	reqs := []struct{ method, path, body string }{
		{"GET", "/health", ""},
		{"GET", "/metrics", ""},
		{"GET", "/v1/models", ""},
		{"POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`},
		{"POST", "/v1/completions", `{"prompt":"hi","max_tokens":1}`},
	}
	for _, rq := range reqs {
		for range 5 {
			req, _ := http.NewRequest(rq.method, r.URL()+rq.path, strings.NewReader(rq.body))
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 500 {
				t.Errorf("%s %s = %d, want 500", rq.method, rq.path, resp.StatusCode)
			}
		}
	}
	// At rate 0.5 some requests pass and /health still says 503-class failure.
	if err := r.SetFault(Fault{Mode: Error, Rate: 0.5}); err != nil {
		t.Fatal(err)
	}
	var ok, failed int
	for range 40 {
		resp, err := client.Get(r.URL() + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		switch resp.StatusCode {
		case 200:
			ok++
		case 503:
			failed++
		default:
			t.Errorf("status %d", resp.StatusCode)
		}
	}
	if ok == 0 || failed == 0 {
		t.Errorf("rate 0.5: %d ok, %d failed; want both", ok, failed)
	}
	for range 5 {
		resp, err := client.Get(r.URL() + "/health")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 503 {
			t.Errorf("/health in error mode = %d, want 503", resp.StatusCode)
		}
	}
}

func TestFaultSlow(t *testing.T) {
	r := startReplica(t, Options{})
	if err := r.SetFault(Fault{Mode: Slow, Factor: 3}); err != nil {
		t.Fatal(err)
	}
	if got := r.Slowdown(); got != 3 {
		t.Errorf("slowdown = %v, want 3", got)
	}
	// Requests still complete under the slowdown.
	client := openaiClient(r)
	if _, err := client.Completions.New(context.Background(), openai.CompletionNewParams{
		Model: "sim-model", MaxTokens: openai.Int(2),
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("slow")},
	}); err != nil {
		t.Fatal(err)
	}
	if err := r.SetFault(Fault{Mode: Recover}); err != nil {
		t.Fatal(err)
	}
	if got := r.Slowdown(); got != 1 {
		t.Errorf("slowdown after recover = %v, want 1", got)
	}
}

func TestFaultBreak(t *testing.T) {
	r := startReplica(t, Options{Fault: Fault{Mode: Break, AfterTokens: 3}})
	resp, br := openStream(t, context.Background(), r, 20)
	defer resp.Body.Close()
	var tokens int
	var sawDone bool
	for {
		data, err := readEvent(br)
		if err != nil {
			if errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Logf("stream ended with plain EOF")
			}
			break
		}
		if data == "[DONE]" {
			sawDone = true
			continue
		}
		var c chunk
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatal(err)
		}
		if len(c.Choices) == 1 && c.Choices[0].Delta != nil && c.Choices[0].Delta.Content != nil && *c.Choices[0].Delta.Content != "" {
			tokens++
		}
	}
	if sawDone || tokens != 3 {
		t.Errorf("broken stream: %d tokens, [DONE]=%v; want 3 tokens and no [DONE]", tokens, sawDone)
	}
	waitFor(t, "the broken stream to leave the engine", func() bool { return r.Stats().Running == 0 })
	// Non-streaming requests get the connection closed instead of an answer.
	_, err := testClient(waitTimeout).Post(r.URL()+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x","max_tokens":2}`))
	if err == nil {
		t.Error("non-streaming request in break mode succeeded")
	}
}

func TestFaultFlap(t *testing.T) {
	r := startReplica(t, Options{})
	if err := r.SetFault(Fault{Mode: Flap, Period: 200 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	// Flap goes down at once, then the engine loop alternates the listener.
	var transitions int
	last := r.Refusing()
	if !last {
		t.Fatal("flap did not start down")
	}
	waitFor(t, "four flap transitions", func() bool {
		if now := r.Refusing(); now != last {
			transitions++
			last = now
		}
		return transitions >= 4
	})
	if err := r.SetFault(Fault{Mode: Recover}); err != nil {
		t.Fatal(err)
	}
	if r.Refusing() {
		t.Error("still refusing after recover")
	}
}

func TestControlListenerWhileRefusing(t *testing.T) {
	r := startReplica(t, Options{ControlListen: "127.0.0.1:0", Fault: Fault{Mode: Refuse}})
	client := testClient(waitTimeout)
	if _, err := client.Get(r.URL() + "/health"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("main listener while refusing: %v", err)
	}
	resp, err := client.Get(r.ControlURL() + "/sim/fault")
	if err != nil {
		t.Fatal(err)
	}
	var f Fault
	err = json.NewDecoder(resp.Body).Decode(&f)
	resp.Body.Close()
	if err != nil || f.Mode != Refuse {
		t.Fatalf("GET /sim/fault = %+v, %v", f, err)
	}
	resp, err = client.Post(r.ControlURL()+"/sim/fault", "application/json", strings.NewReader(`{"mode":"bogus"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Errorf("bad fault: status %d, want 400", resp.StatusCode)
	}
	resp, err = client.Post(r.ControlURL()+"/sim/fault", "application/json", strings.NewReader(`{"mode":"recover"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	resp, err = client.Get(r.URL() + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("health after recover via control port: %v", err)
	}
	resp.Body.Close()
}

func TestStartFleet(t *testing.T) {
	ctx := context.Background()
	f, err := StartFleet(ctx, FleetOptions{Replicas: 3, Profile: testProfile, Model: "fleet-model", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	urls := f.URLs()
	seen := map[string]bool{}
	for i, r := range f.Replicas {
		if r.Name() != "sim-"+itoa(i+1) || seen[urls[i]] {
			t.Errorf("replica %d: name %q url %q", i, r.Name(), urls[i])
		}
		seen[urls[i]] = true
		resp, err := testClient(waitTimeout).Get(urls[i] + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		var list modelList
		json.NewDecoder(resp.Body).Decode(&list)
		resp.Body.Close()
		if len(list.Data) != 1 || list.Data[0].ID != "fleet-model" {
			t.Errorf("%s models = %+v", r.Name(), list)
		}
	}
	if err := f.Replica("sim-2").SetFault(Fault{Mode: Refuse}); err != nil {
		t.Fatal(err)
	}
	if !f.Replicas[1].Refusing() || f.Replicas[0].Refusing() {
		t.Error("fault hit the wrong replica")
	}
	if err := f.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

func TestStartFleetBadOptions(t *testing.T) {
	tests := []FleetOptions{
		{Listen: "nonsense"},
		{Listen: "127.0.0.1:65535", Replicas: 2},
		{Profile: "no-such-gpu"},
		{Fault: Fault{Mode: "explode"}},
	}
	for _, o := range tests {
		o.Logger = quietLogger()
		if f, err := StartFleet(context.Background(), o); err == nil {
			f.Close()
			t.Errorf("StartFleet(%+v) succeeded", o)
		}
	}
}

func TestSlowConsumerDoesNotBlockOthers(t *testing.T) {
	r := startReplica(t, Options{})
	// A streaming client that never reads: its tokens pile up, coalesced.
	resp, _ := openStream(t, context.Background(), r, 5000)
	defer resp.Body.Close()
	client := openaiClient(r)
	for range 3 {
		got, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
			Model:     "sim-model",
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("am I served?")},
			MaxTokens: openai.Int(4),
		})
		if err != nil || got.Usage.CompletionTokens != 4 {
			t.Fatalf("request beside a stalled stream: %v %+v", err, got)
		}
	}
}

// checkCacheConfigInfo: vllm:cache_config_info is a gauge of 1 whose labels
// are vLLM's CacheConfig fields; a router reads block_size and num_gpu_blocks.
func checkCacheConfigInfo(t *testing.T, fams map[string]*dto.MetricFamily) {
	t.Helper()
	f, ok := fams["vllm:cache_config_info"]
	if !ok || f.GetType() != dto.MetricType_GAUGE || len(f.GetMetric()) != 1 {
		t.Fatalf("vllm:cache_config_info missing or not one gauge: %v", f)
	}
	m := f.GetMetric()[0]
	if m.GetGauge().GetValue() != 1 {
		t.Errorf("vllm:cache_config_info = %v, want 1", m.GetGauge().GetValue())
	}
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	p, _ := engine.Lookup(testProfile)
	want := map[string]string{
		"block_size":            "16",
		"num_gpu_blocks":        strconv.Itoa(p.Blocks()),
		"enable_prefix_caching": "True",
		"cache_dtype":           "auto",
		"engine":                "0",
	}
	for k, v := range want {
		if labels[k] != v {
			t.Errorf("vllm:cache_config_info{%s=%q}, want %q (labels %v)", k, labels[k], v, labels)
		}
	}
	if _, ok := labels["model_name"]; ok {
		t.Errorf("vllm:cache_config_info has model_name; vLLM's has only CacheConfig fields and engine")
	}
}

// TestPriorityField: like vLLM, a non-zero priority is refused (400)
// unless the replica schedules by priority; 0 is always accepted.
func TestPriorityField(t *testing.T) {
	for _, sched := range []bool{false, true} {
		r := startReplica(t, Options{PriorityScheduling: sched})
		for _, prio := range []int{0, -3} {
			body := fmt.Sprintf(`{"model":%q,"max_tokens":2,"priority":%d,"messages":[{"role":"user","content":"hi"}]}`, r.Model(), prio)
			res, err := testClient(waitTimeout).Post(r.URL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			want := http.StatusOK
			if prio != 0 && !sched {
				want = http.StatusBadRequest
			}
			if res.StatusCode != want {
				t.Errorf("priority scheduling %v, priority %d: %d %s, want %d", sched, prio, res.StatusCode, b, want)
			}
		}
	}
}
