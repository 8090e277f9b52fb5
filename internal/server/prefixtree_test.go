package server

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/scrape"
)

// roundTripFunc answers upstream requests in memory.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestPrefixTreeGetsPromptBlocks: with routing.policy prefix-tree, llm-d or cost,
// serve hashes prompts into blocks by itself (request.prompt_blocks left
// false), so a repeated long prompt follows its longest match (reason
// affinity) instead of every request looking like a cache miss.
func TestPrefixTreeGetsPromptBlocks(t *testing.T) {
	for _, policy := range []string{"prefix-tree", "llm-d", "cost"} {
		t.Run(policy, func(t *testing.T) { testPromptBlocks(t, policy) })
	}
}

func testPromptBlocks(t *testing.T, policy string) {
	cfg := testConfig("http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000")
	cfg.Routing.Policy = policy
	cfg.Request.PromptBlocks = false
	upstream := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		_, _ = io.Copy(io.Discard, r.Body)
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(strings.NewReader(`{}`)), Request: r}, nil
	})
	srv, err := New(cfg, nil, WithFetcher(scrape.NewFake()), WithTransport(upstream))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range srv.Balancer().Replicas(srv.now()) { // ready: a first good scrape each
		srv.Balancer().ObserveScrape(r.Name, balancer.Snapshot{}, nil, srv.now())
	}
	body := `{"model":"m","messages":[{"role":"system","content":"` + strings.Repeat("shared instructions ", 200) + `"},{"role":"user","content":"hi"}]}`
	var replicas, routes []string
	for range 2 {
		rec := httptest.NewRecorder()
		srv.ProxyHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body)))
		if rec.Code != http.StatusOK {
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
		replicas = append(replicas, rec.Header().Get("X-LLMLB-Replica"))
		routes = append(routes, rec.Header().Get("X-LLMLB-Route"))
	}
	if replicas[0] != replicas[1] || routes[1] != "affinity" {
		t.Fatalf("replicas %v, routes %v: want the repeat to follow its prefix (affinity)", replicas, routes)
	}
}
