package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/openai"
)

// TestAgentAPIsAreRoutedByModel: the Anthropic Messages API and the
// Responses API are profiled like chat, so a fleet serving two models sends
// each request to a replica serving its model, and a model no replica
// serves is the balancer's 404.
func TestAgentAPIsAreRoutedByModel(t *testing.T) {
	p, _ := costProxy(t,
		balancer.ReplicaSpec{Name: "x1", URL: okUpstream(t).URL, Models: []string{"x"}},
		balancer.ReplicaSpec{Name: "y1", URL: okUpstream(t).URL, Models: []string{"y"}},
		balancer.ReplicaSpec{Name: "x2", URL: okUpstream(t).URL, Models: []string{"x"}})
	send := func(path, body string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		p.ServeHTTP(w, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
		return w
	}
	for i := range 6 {
		for _, c := range []struct{ path, body string }{
			{"/v1/messages", `{"model":"y","max_tokens":10,"system":"s","messages":[{"role":"user","content":"hi"}]}`},
			{"/v1/responses", `{"model":"y","instructions":"s","input":"hi"}`},
		} {
			w := send(c.path, c.body)
			if w.Code != http.StatusOK || w.Header().Get(HeaderReplica) != "y1" {
				t.Fatalf("%s request %d: %d from %q, want 200 from y1 (the only replica serving y)", c.path, i, w.Code, w.Header().Get(HeaderReplica))
			}
		}
	}
	if w := send("/v1/messages", `{"model":"z","max_tokens":10,"messages":[]}`); w.Code != http.StatusNotFound || errorCode(t, w.Body.Bytes()) != openai.CodeModelNotFound {
		t.Errorf("unknown model on /v1/messages: %d %s, want 404 %s", w.Code, w.Body, openai.CodeModelNotFound)
	}
	if w := send("/v1/responses", `{"model":"y","input":`); w.Code != http.StatusBadRequest {
		t.Errorf("truncated Responses body: %d, want 400", w.Code)
	}
}

// TestResponsesStreamOpeningIsNoFirstToken: a Responses API stream opens
// with response.created before the replica has computed the prompt, so its
// first chunk must not retire the prompt's pending prefill; a Messages API
// stream's first chunk comes with the first token and does.
func TestResponsesStreamOpeningIsNoFirstToken(t *testing.T) {
	for _, c := range []struct {
		path, body, first string
		pending           bool
	}{
		{"/v1/responses", `{"model":"m","stream":true,"input":"` + strings.Repeat("long context ", 40000) + `"}`,
			"event: response.created\ndata: {\"type\":\"response.created\"}\n\n", true},
		{"/v1/messages", `{"model":"m","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"` + strings.Repeat("long context ", 40000) + `"}]}`,
			"event: message_start\ndata: {\"type\":\"message_start\"}\n\n", false},
	} {
		t.Run(c.path, func(t *testing.T) {
			sent, release := make(chan struct{}), make(chan struct{})
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, c.first)
				w.(http.Flusher).Flush()
				close(sent)
				<-release
			}))
			defer up.Close()
			p, bal := costProxy(t, balancer.ReplicaSpec{Name: "a", URL: up.URL, Models: []string{"m"}})
			done := make(chan struct{})
			go func() {
				defer close(done)
				w := httptest.NewRecorder()
				p.ServeHTTP(w, httptest.NewRequest(http.MethodPost, c.path, strings.NewReader(c.body)))
			}()
			<-sent
			// The proxy relays the first chunk right after the replica
			// flushed it; wait for that relay before looking.
			deadline := time.Now().Add(5 * time.Second)
			// (About 130K tokens: at the default 10K tokens/s the balancer's
			// own bound on what the replica computed drains them in 13 s.)
			var pending float64
			for {
				pending = bal.Replicas(time.Now())[0].PendingPrefill
				if !c.pending && pending == 0 || c.pending || time.Now().After(deadline) {
					break
				}
				time.Sleep(time.Millisecond)
			}
			if c.pending {
				time.Sleep(50 * time.Millisecond) // time for a wrong retirement to happen
				pending = bal.Replicas(time.Now())[0].PendingPrefill
			}
			close(release)
			<-done
			if got := pending > 0; got != c.pending {
				t.Errorf("after the stream's first chunk: %.0f prompt tokens pending prefill, want pending %v", pending, c.pending)
			}
		})
	}
}

// costProxy is a proxy over a balancer with policy cost and these replicas,
// profiling prompts into blocks as serve does for cost.
func costProxy(t *testing.T, reps ...balancer.ReplicaSpec) (*Proxy, *balancer.Balancer) {
	t.Helper()
	cfg := balancer.DefaultConfig()
	cfg.Policy = "cost"
	bal, err := balancer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range reps {
		if err := bal.AddReplica(r, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	rc := testRequestConfig
	rc.PromptBlocks = true
	p, err := New(Options{Balancer: bal, Request: rc, Proxy: defaultProxyConfig(), Metrics: &recorder{}})
	if err != nil {
		t.Fatal(err)
	}
	return p, bal
}
