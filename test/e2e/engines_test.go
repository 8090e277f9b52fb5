//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// sglangMetrics is what an SGLang server started with --enable-metrics
// serves on /metrics (the scheduler's gauges and the tokenizer's counters,
// python/sglang/srt/observability/metrics_collector.py): 3 running, 1 queued.
const sglangMetrics = `# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="sg-model",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 3.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="sg-model",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 1.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="sg-model",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.42
# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool.
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{engine_type="unified",model_name="sg-model",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 500000.0
`

// engineReplica is an OpenAI-compatible server for one model in the test
// process, standing in for an engine llmlb does not simulate. It serves
// metrics on /metrics, or nothing there (404) when metrics is empty, and
// counts the chat completions it answered and the /v1/models requests that
// carried wantKey as their bearer token.
type engineReplica struct {
	srv        *httptest.Server
	chats      atomic.Int64
	keyedLists atomic.Int64
}

func newEngineReplica(t *testing.T, model, metrics, wantKey string) *engineReplica {
	t.Helper()
	e := &engineReplica{}
	mux := http.NewServeMux()
	if metrics != "" {
		mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			io.WriteString(w, metrics)
		})
	}
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		if wantKey != "" && r.Header.Get("Authorization") == "Bearer "+wantKey {
			e.keyedLists.Add(1)
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","owned_by":"e2e"}]}`, model)
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		e.chats.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-e2e","object":"chat.completion","created":1,"model":%q,`+
			`"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],`+
			`"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`, model)
	})
	e.srv = httptest.NewServer(mux)
	t.Cleanup(e.srv.Close)
	return e
}

// TestOtherEngines: llmlb in front of a fleet that is not vLLM. An SGLang
// replica is scraped with its own metric names (its running and queued
// requests reach GET /admin/replicas), and a replica without any Prometheus
// endpoint (/metrics is 404, like Ollama or LM Studio) configured with
// `metrics: none` is kept LIVE by its GET /v1/models, sent with its api_key.
// Both take requests for their model. Before llmlb knew these engines every
// scrape of both failed, both were EJECTED and every request was a 503.
func TestOtherEngines(t *testing.T) {
	const key = "sk-plain-e2e-4Tq8"
	sglang := newEngineReplica(t, "sg-model", sglangMetrics, "")
	plain := newEngineReplica(t, "plain-model", "", key)
	srv := startServe(t, fmt.Sprintf(`replicas:
  - name: sglang-1
    url: %s
  - name: plain-1
    url: %s
    api_key_env: LLMLB_E2E_PLAIN_KEY
    metrics: none
scrape:
  interval: 200ms
  timeout: 200ms
`, sglang.srv.URL, plain.srv.URL), "LLMLB_E2E_PLAIN_KEY="+key)

	waitFor(t, 20*time.Second, "both replicas LIVE with their scraped load", func() (bool, string) {
		rs := srv.replicas(t)
		sg, pl := rs["sglang-1"], rs["plain-1"]
		ok := sg.State == "LIVE" && sg.LastScrapeOK && sg.ScrapedRunning == 3 && sg.ScrapedWaiting == 1 &&
			pl.State == "LIVE" && pl.LastScrapeOK && pl.ScrapedRunning == 0 && pl.ScrapedWaiting == 0
		return ok, fmt.Sprintf("%+v", rs)
	})
	if plain.keyedLists.Load() == 0 {
		t.Errorf("the metrics: none replica's liveness checks did not carry its api_key")
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, c := range []struct{ model, replica string }{
		{"sg-model", "sglang-1"}, {"plain-model", "plain-1"}, {"sg-model", "sglang-1"}, {"plain-model", "plain-1"},
	} {
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`, c.model)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.proxy+"/v1/chat/completions", bytes.NewReader([]byte(body)))
		req.Header.Set("Content-Type", "application/json")
		res, err := httpClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", c.model, err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d %s, want 200", c.model, res.StatusCode, b)
		}
		if got := res.Header.Get("X-LLMLB-Replica"); got != c.replica {
			t.Errorf("%s served by %q, want %q", c.model, got, c.replica)
		}
	}
	if sglang.chats.Load() != 2 || plain.chats.Load() != 2 {
		t.Errorf("chat completions answered: sglang-1 %d, plain-1 %d; want 2 each", sglang.chats.Load(), plain.chats.Load())
	}
}
