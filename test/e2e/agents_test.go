//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestAgentAPIsThroughTheBalancer: the APIs agents speak (Anthropic
// Messages, OpenAI Responses, embeddings, and chat with a required tool)
// work through llmlb on `llmlb sim`'s fleet, streamed and not, in the wire
// shapes the official SDKs send (headers included) and read.
func TestAgentAPIsThroughTheBalancer(t *testing.T) {
	const n = 2
	sim := startSim(t, n)
	srv := startServe(t, sim.replicasYAML(n)+"scrape:\n  interval: 200ms\n  timeout: 150ms\n")
	srv.waitAllLive(t, n)
	if code := status(srv.proxy + "/health"); code != http.StatusOK {
		t.Fatalf("GET /health on the proxy port: %d", code)
	}

	anthropic := map[string]string{"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01"}
	openai := map[string]string{"Authorization": "Bearer sk-test"}
	tests := []struct {
		name    string
		path    string
		headers map[string]string
		body    string
		stream  bool
		check   func(t *testing.T, full map[string]any, events []string)
	}{
		{"messages", "/v1/messages", anthropic,
			`{"model":"sim-model","max_tokens":8,"system":"You are terse.","messages":[{"role":"user","content":[{"type":"text","text":"hello"}]}]}`, false,
			func(t *testing.T, full map[string]any, _ []string) {
				if full["type"] != "message" || full["stop_reason"] != "max_tokens" || block(full["content"], "type") != "text" {
					t.Fatalf("message %v", full)
				}
			}},
		{"messages streamed", "/v1/messages", anthropic,
			`{"model":"sim-model","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hello"}]}`, true,
			func(t *testing.T, _ map[string]any, events []string) {
				wantOrder(t, events, "message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop")
			}},
		{"messages with a required tool", "/v1/messages", anthropic,
			`{"model":"sim-model","max_tokens":8,"tools":[{"name":"get_weather","input_schema":{"type":"object"}}],"tool_choice":{"type":"any"},"messages":[{"role":"user","content":"weather?"}]}`, false,
			func(t *testing.T, full map[string]any, _ []string) {
				if full["stop_reason"] != "tool_use" || block(full["content"], "type") != "tool_use" || block(full["content"], "name") != "get_weather" {
					t.Fatalf("message %v", full)
				}
			}},
		{"responses", "/v1/responses", openai,
			`{"model":"sim-model","input":"hello","instructions":"be brief","max_output_tokens":8}`, false,
			func(t *testing.T, full map[string]any, _ []string) {
				if full["object"] != "response" || block(full["output"], "type") != "message" {
					t.Fatalf("response %v", full)
				}
			}},
		{"responses streamed", "/v1/responses", openai,
			`{"model":"sim-model","input":[{"role":"user","content":[{"type":"input_text","text":"hello"}]}],"max_output_tokens":8,"stream":true}`, true,
			func(t *testing.T, _ map[string]any, events []string) {
				wantOrder(t, events, "response.created", "response.output_item.added", "response.output_text.delta", "response.output_item.done", "response.incomplete")
			}},
		{"responses with a named function", "/v1/responses", openai,
			`{"model":"sim-model","input":"weather?","tools":[{"type":"function","name":"get_weather","parameters":{}}],"tool_choice":{"type":"function","name":"get_weather"}}`, false,
			func(t *testing.T, full map[string]any, _ []string) {
				if block(full["output"], "type") != "function_call" || block(full["output"], "name") != "get_weather" {
					t.Fatalf("response %v", full)
				}
			}},
		{"chat with tool_choice required", "/v1/chat/completions", openai,
			`{"model":"sim-model","max_tokens":8,"tools":[{"type":"function","function":{"name":"get_weather","parameters":{}}}],"tool_choice":"required","messages":[{"role":"user","content":"weather?"}]}`, false,
			func(t *testing.T, full map[string]any, _ []string) {
				c := full["choices"].([]any)[0].(map[string]any)
				calls, _ := c["message"].(map[string]any)["tool_calls"].([]any)
				if c["finish_reason"] != "tool_calls" || len(calls) != 1 {
					t.Fatalf("chat %v", full)
				}
			}},
		{"chat streamed with a named tool", "/v1/chat/completions", openai,
			`{"model":"sim-model","max_tokens":8,"stream":true,"tools":[{"type":"function","function":{"name":"get_weather","parameters":{}}}],"tool_choice":{"type":"function","function":{"name":"get_weather"}},"messages":[{"role":"user","content":"weather?"}]}`, true,
			func(t *testing.T, _ map[string]any, events []string) {
				joined := strings.Join(events, "\n")
				if !strings.Contains(joined, `"tool_calls":[{"index":0`) || !strings.Contains(joined, `"finish_reason":"tool_calls"`) {
					t.Fatalf("stream lacks the tool call:\n%s", joined)
				}
			}},
		{"embeddings", "/v1/embeddings", openai,
			`{"model":"sim-model","input":["hello","world"],"encoding_format":"float"}`, false,
			func(t *testing.T, full map[string]any, _ []string) {
				data, _ := full["data"].([]any)
				if full["object"] != "list" || len(data) != 2 || len(data[0].(map[string]any)["embedding"].([]any)) == 0 {
					t.Fatalf("embeddings %v", full)
				}
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.proxy+tc.path, bytes.NewReader([]byte(tc.body)))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			if res.StatusCode != http.StatusOK || res.Header.Get("X-LLMLB-Replica") == "" {
				b, _ := io.ReadAll(res.Body)
				t.Fatalf("%d (replica %q): %s", res.StatusCode, res.Header.Get("X-LLMLB-Replica"), b)
			}
			if !tc.stream {
				var full map[string]any
				if err := json.NewDecoder(res.Body).Decode(&full); err != nil {
					t.Fatal(err)
				}
				tc.check(t, full, nil)
				return
			}
			if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
				t.Fatalf("Content-Type %q", ct)
			}
			var events []string
			sc := bufio.NewScanner(res.Body)
			for sc.Scan() {
				line := sc.Text()
				if name, ok := strings.CutPrefix(line, "event: "); ok {
					events = append(events, name)
				} else if data, ok := strings.CutPrefix(line, "data: "); ok && !strings.HasPrefix(tc.path, "/v1/messages") && !strings.HasPrefix(tc.path, "/v1/responses") {
					events = append(events, data)
				}
			}
			tc.check(t, nil, events)
		})
	}
}

// block returns field of the first element of a JSON array of objects.
func block(v any, field string) any {
	arr, _ := v.([]any)
	if len(arr) == 0 {
		return nil
	}
	m, _ := arr[0].(map[string]any)
	return m[field]
}

// wantOrder checks that want's events appear in events in this order.
func wantOrder(t *testing.T, events []string, want ...string) {
	t.Helper()
	i := 0
	for _, e := range events {
		if i < len(want) && e == want[i] {
			i++
		}
	}
	if i != len(want) {
		t.Fatalf("events %v, want in order %v", events, want)
	}
}
