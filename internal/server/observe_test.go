package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/testutil/syncbuf"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/openai"
)

// steppingClock returns t0, t0+1s, t0+2s, ... on successive calls.
func steppingClock(t0 time.Time) func() time.Time {
	var mu sync.Mutex
	n := 0
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		n++
		return t0.Add(time.Duration(n-1) * time.Second)
	}
}

// TestObservingWriterStream: the first token is the first chunk with
// generated text, not the role-only chunk before it; lines split across
// writes are reassembled; the usage of the last chunk is read.
func TestObservingWriterStream(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rec := httptest.NewRecorder()
	rec.Header().Set("Content-Type", "text/event-stream")
	w := &observingWriter{ResponseWriter: rec, now: steppingClock(t0)}
	w.WriteHeader(http.StatusOK)
	writes := []string{
		`data: {"model":"m","choices":[{"delta":{"role":"assistant","content":""}}]}` + "\n\n", // clock t0: role only
		`data: {"model":"m","choices":[{"delta":{"con`,                                         // split mid-line
		`tent":"Hel"}}]}` + "\n\n",                                                             // clock t0+0s: first token
		`data: {"model":"m","choices":[{"delta":{"content":"lo"}}],"usage":null}` + "\n\n",
		`data: {"model":"m","choices":[],"usage":{"prompt_tokens":120,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":96}}}` + "\r\n\r\n",
		"data: [DONE]\n\n",
	}
	for _, s := range writes {
		if _, err := w.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	w.finish()
	if w.ttftAt != t0 {
		t.Errorf("first token at %v, want %v (the first clock reading: role-only chunks read no clock)", w.ttftAt, t0)
	}
	if w.read.Model != "m" {
		t.Errorf("model %q", w.read.Model)
	}
	if want := (openai.TokenCounts{PromptTokens: 120, CachedTokens: 96, CompletionTokens: 2, CachedReported: true}); w.read.Usage != want {
		t.Errorf("usage %+v, want %+v", w.read.Usage, want)
	}
	if got := rec.Body.String(); got != strings.Join(writes, "") {
		t.Errorf("the client did not get the stream unchanged:\n%s", got)
	}
}

// TestObservingWriterReasoningAndJSON: a reasoning or tool-call delta is a
// first token; a non-streamed JSON response has no TTFT but its usage is read.
func TestObservingWriterReasoningAndJSON(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, line := range []string{
		`data: {"choices":[{"delta":{"reasoning_content":"hmm"}}]}`,
		`data: {"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}`,
		`data: {"choices":[{"text":"x"}]}`,
	} {
		rec := httptest.NewRecorder()
		rec.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		w := &observingWriter{ResponseWriter: rec, now: steppingClock(t0)}
		w.Write([]byte(line + "\n"))
		if w.ttftAt.IsZero() {
			t.Errorf("%s: not seen as a first token", line)
		}
	}
	rec := httptest.NewRecorder()
	rec.Header().Set("Content-Type", "application/json")
	w := &observingWriter{ResponseWriter: rec, now: steppingClock(t0)}
	w.Write([]byte(`{"model":"m","choices":[{"message":{"content":"hi"}}],`))
	w.Write([]byte(`"usage":{"prompt_tokens":7,"completion_tokens":3}}`))
	w.finish()
	if !w.ttftAt.IsZero() || w.read.Usage != (openai.TokenCounts{PromptTokens: 7, CompletionTokens: 3}) || w.read.Model != "m" {
		t.Errorf("JSON: ttft %v usage %+v model %q", w.ttftAt, w.read.Usage, w.read.Model)
	}
}

func TestRequestIDAndTraceID(t *testing.T) {
	cases := []struct{ in, want string }{
		{"abc-123", "abc-123"},
		{"", ""},                       // generated
		{"has space", ""},              // generated
		{strings.Repeat("x", 200), ""}, // generated
	}
	for _, c := range cases {
		if got := saneID(c.in); got != (c.want != "") {
			t.Errorf("saneID(%q) = %v", c.in, got)
		}
	}
	if id := newRequestID(); len(id) != 32 || !saneID(id) || id == newRequestID() {
		t.Errorf("newRequestID %q", id)
	}
	for tp, want := range map[string]string{
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01": "4bf92f3577b34da6a3ce929d0e0e4736",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01": "",
		"garbage": "",
		"00-4bf92f3577b34da6a3ce929d0e0e473z-00f067aa0ba902b7-01": "",
	} {
		if got := traceID(tp); got != want {
			t.Errorf("traceID(%q) = %q, want %q", tp, got, want)
		}
	}
}

// syncBuffer is a goroutine-safe buffer (package syncbuf).
type syncBuffer = syncbuf.Buffer

// TestAccessLogRequestIDAndMetricsEndToEnd: through a running server to a
// replica that streams a role-only chunk, two content chunks and usage:
// the request id is passed upstream and returned, traceparent reaches the
// replica untouched, one access line names the request, and the TTFT,
// duration and token series count it under the model.
func TestAccessLogRequestIDAndMetricsEndToEnd(t *testing.T) {
	var mu sync.Mutex
	var upstreamHdr http.Header
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		upstreamHdr = r.Header.Clone()
		mu.Unlock()
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for _, s := range []string{
			`{"model":"sim-model","choices":[{"delta":{"role":"assistant"}}]}`,
			`{"model":"sim-model","choices":[{"delta":{"content":"Hel"}}]}`,
			`{"model":"sim-model","choices":[{"delta":{"content":"lo"}}]}`,
			`{"model":"sim-model","choices":[],"usage":{"prompt_tokens":50,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":32}}}`,
			`[DONE]`,
		} {
			io.WriteString(w, "data: "+s+"\n\n")
			w.(http.Flusher).Flush()
		}
	}))
	defer upstream.Close()

	logs := &syncBuffer{}
	e := startInFrontOf(t, upstream.URL, slog.New(slog.NewTextHandler(logs, nil)))

	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for i, id := range []string{"client-id-1", ""} {
		req, _ := http.NewRequest(http.MethodPost, e.proxy+"/v1/chat/completions",
			strings.NewReader(`{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Traceparent", tp)
		if id != "" {
			req.Header.Set(HeaderRequestID, id)
		}
		res, err := e.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		got := res.Header.Get(HeaderRequestID)
		mu.Lock()
		up := upstreamHdr
		mu.Unlock()
		switch {
		case res.StatusCode != http.StatusOK:
			t.Fatalf("request %d: status %d", i, res.StatusCode)
		case id != "" && got != id:
			t.Errorf("request %d: X-Request-Id %q returned, want the client's %q", i, got, id)
		case id == "" && len(got) != 32:
			t.Errorf("request %d: generated X-Request-Id %q", i, got)
		case up.Get(HeaderRequestID) != got:
			t.Errorf("request %d: the replica got X-Request-Id %q, the client %q", i, up.Get(HeaderRequestID), got)
		case up.Get("Traceparent") != tp:
			t.Errorf("request %d: the replica got traceparent %q", i, up.Get("Traceparent"))
		}
		if !strings.Contains(logs.String(), "request_id="+got) {
			t.Errorf("request %d: no access line with request_id=%s in:\n%s", i, got, logs.String())
		}
	}
	var access []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "msg=access") {
			access = append(access, l)
		}
	}
	if len(access) != 2 {
		t.Fatalf("%d access lines, want 2:\n%s", len(access), logs.String())
	}
	for _, want := range []string{"status=200", "model=sim-model", "replica=sim-1", "route=", "ttft=", "prompt_tokens=50",
		"cached_tokens=32", "completion_tokens=2", "trace_id=4bf92f3577b34da6a3ce929d0e0e4736", "path=/v1/chat/completions"} {
		if !strings.Contains(access[0], want) {
			t.Errorf("access line lacks %s: %s", want, access[0])
		}
	}
	res, err := e.http.Get(e.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{
		`llmlb_tokens_total{kind="prompt",model="sim-model"} 100`,
		`llmlb_tokens_total{kind="cached",model="sim-model"} 64`,
		`llmlb_tokens_total{kind="completion",model="sim-model"} 4`,
	} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	var ttftCount, durCount float64
	for _, l := range strings.Split(string(body), "\n") {
		var v float64
		if strings.HasPrefix(l, `llmlb_time_to_first_token_seconds_count{model="sim-model"`) {
			fmtSscan(l, &v)
			ttftCount += v
		}
		if strings.HasPrefix(l, `llmlb_request_duration_seconds_count{model="sim-model"`) {
			fmtSscan(l, &v)
			durCount += v
		}
	}
	if ttftCount != 2 || durCount != 2 {
		t.Errorf("TTFT observations %v and durations %v, want 2 each", ttftCount, durCount)
	}
}

// fmtSscan reads the value at the end of an exposition line.
func fmtSscan(line string, v *float64) {
	f := strings.Fields(line)
	_, _ = fmt.Sscan(f[len(f)-1], v)
}

// TestUsageAskedAndStripped: a streamed request that did not ask for usage
// reaches the replica with stream_options.include_usage, its tokens are
// counted, and the client's stream carries no usage chunk; a client that
// asked (even for no usage) gets exactly what the replica sent.
func TestUsageAskedAndStripped(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
		var req struct {
			StreamOptions *struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		if err := json.Unmarshal(b, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"model\":\"sim-model\",\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n")
		io.WriteString(w, "data: {\"model\":\"sim-model\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n")
		if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
			// split across two writes, as a replica may
			io.WriteString(w, `data: {"model":"sim-model","choices":[],"usage":{"prompt_tokens":7,`)
			w.(http.Flusher).Flush()
			io.WriteString(w, "\"completion_tokens\":1}}\n\n")
		}
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer upstream.Close()
	e := startInFrontOf(t, upstream.URL, testLogger())
	send := func(body string) string {
		res, err := e.http.Post(e.proxy+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("%d: %s", res.StatusCode, b)
		}
		return string(b)
	}

	got := send(`{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if strings.Contains(got, "usage") || !strings.Contains(got, `"content":"Hi"`) || !strings.HasSuffix(got, "data: [DONE]\n\n") {
		t.Errorf("client stream (no usage asked) = %q", got)
	}
	mu.Lock()
	if !strings.Contains(bodies[0], `"stream_options":{"include_usage":true}`) {
		t.Errorf("replica got %s, want include_usage added", bodies[0])
	}
	mu.Unlock()

	got = send(`{"model":"sim-model","stream":true,"stream_options":{"include_usage":true},"messages":[]}`)
	if !strings.Contains(got, `"usage":{"prompt_tokens":7,"completion_tokens":1}`) {
		t.Errorf("client that asked for usage got %q", got)
	}
	got = send(`{"model":"sim-model","stream":true,"stream_options":{"include_usage":false},"messages":[]}`)
	if strings.Contains(got, "usage") {
		t.Errorf("client that declined usage got %q", got)
	}
	mu.Lock()
	if strings.Contains(bodies[2], `"include_usage":true`) {
		t.Errorf("a client's stream_options was changed: %s", bodies[2])
	}
	mu.Unlock()

	res, err := e.http.Get(e.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{
		`llmlb_tokens_total{kind="prompt",model="sim-model"} 14`, // the first two requests
		`llmlb_tokens_total{kind="completion",model="sim-model"} 2`,
	} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// startInFrontOf runs a server in front of one upstream (an httptest server
// standing in for a replica, scraped as idle) until the test ends, and
// waits until it knows the upstream's model.
func startInFrontOf(t *testing.T, upstream string, logger *slog.Logger, tweaks ...func(*config.Config)) *env {
	t.Helper()
	fake, setIdle := idleFleet()
	cfg := testConfig(upstream)
	setIdle(&cfg)
	for _, tweak := range tweaks {
		tweak(&cfg)
	}
	srv, err := New(cfg, logger, WithFetcher(fake))
	if err != nil {
		t.Fatal(err)
	}
	srv.UseListeners(listen(t), listen(t))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	e := &env{t: t, srv: srv, proxy: "http://" + srv.ProxyAddr(), admin: "http://" + srv.AdminAddr(), http: &http.Client{}}
	e.waitReplicas("the replica serving the model", func(rs []balancer.ReplicaStatus) bool {
		return len(rs) == 1 && len(rs[0].Models) == 1
	})
	return e
}

// TestCachedTokensReachCost: the cached tokens a replica reports in a
// response's usage reach policy cost, which learns from them the share of
// an in-flight prefix's hit the replica computes again: a request sent
// while the one whose prefix it shares waits for its first token, and
// reported to have found nothing cached, moves the replica's share (the
// decision log's recomputed_share) from 0 to 1/32.
func TestCachedTokensReachCost(t *testing.T) {
	gotFirst, releaseFirst := make(chan struct{}), make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if bytes.Contains(body, []byte("first question")) {
			close(gotFirst)
			<-releaseFirst
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"model":"`+model+`","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],`+
			`"usage":{"prompt_tokens":600,"completion_tokens":1,"total_tokens":601,"prompt_tokens_details":{"cached_tokens":0}}}`)
	}))
	defer upstream.Close()
	logs := &syncBuffer{}
	logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e := startInFrontOf(t, upstream.URL, logger, func(c *config.Config) { c.Routing.Policy, c.Log.Access = "cost", true })

	shared := strings.Repeat("You are a careful assistant who reads the whole document. ", 40)
	first := make(chan int, 1)
	go func() {
		code, _, _ := e.chat(chatBody(shared+strings.Repeat(" first question", 20), 4), nil)
		first <- code
	}()
	<-gotFirst
	if code, _, out := e.chat(chatBody(shared+strings.Repeat(" second question", 20), 4), nil); code != http.StatusOK {
		t.Fatalf("second request: %d %s", code, out)
	}
	// The client may have the answer before the observer has read its
	// usage: its access line comes after.
	deadline := time.Now().Add(waitFor)
	for !strings.Contains(logs.String(), `"msg":"access"`) {
		if time.Now().After(deadline) {
			t.Fatalf("no access line for the second request:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code, _, out := e.chat(chatBody(shared+strings.Repeat(" third question", 20), 4), nil); code != http.StatusOK {
		t.Fatalf("third request: %d %s", code, out)
	}
	close(releaseFirst)
	if code := <-first; code != http.StatusOK {
		t.Fatalf("first request: %d", code)
	}
	var details []string
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var r struct {
			Msg    string `json:"msg"`
			Detail string `json:"candidates_detail"`
		}
		if json.Unmarshal([]byte(line), &r) == nil && r.Msg == "route" {
			details = append(details, r.Detail)
		}
	}
	if len(details) != 3 {
		t.Fatalf("%d route lines, want 3:\n%s", len(details), logs.String())
	}
	if !strings.Contains(details[1], "recomputed_share=0.000") {
		t.Errorf("second decision %q: want the first's prefix as an unscheduled hit", details[1])
	}
	if !strings.Contains(details[2], "recomputed_share=0.031") {
		t.Errorf("third decision %q: want the share learned from the second's report (1/32)", details[2])
	}
}
