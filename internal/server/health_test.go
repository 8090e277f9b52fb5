package server

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/scrape"
)

// TestProxyPortHealth: GET /health on the proxy port is 200 while some
// replica is LIVE, 503 when none is and while the server drains, with a
// small JSON body; it is not proxied and not counted as a request.
func TestProxyPortHealth(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cfg := testConfig("http://a:8000", "http://b:8000")
	srv, err := New(cfg, nil, WithFetcher(scrape.NewFake()), WithClock(func() time.Time { return now }))
	if err != nil {
		t.Fatal(err)
	}
	get := func(method string) (int, healthBody, *httptest.ResponseRecorder) {
		rec := httptest.NewRecorder()
		srv.ProxyHandler().ServeHTTP(rec, httptest.NewRequest(method, "/health", nil))
		var b healthBody
		if method == http.MethodGet {
			if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil {
				t.Fatalf("body %q: %v", rec.Body.String(), err)
			}
		}
		return rec.Code, b, rec
	}
	steps := []struct {
		name     string
		do       func()
		method   string
		wantCode int
		want     healthBody
	}{
		{"no replica scraped yet", func() {}, http.MethodGet, 503, healthBody{Status: "no live replica", Replicas: 2}},
		{"one replica LIVE", func() {
			// Good scrapes past the cooldown and the probing window: LIVE.
			for range 10 {
				now = now.Add(100 * time.Millisecond)
				srv.Balancer().ObserveScrape("sim-1", balancer.Snapshot{}, nil, now)
			}
			if st := srv.Balancer().Replicas(now)[0]; st.State != "LIVE" {
				t.Fatalf("sim-1 is %s after good scrapes", st.State)
			}
		}, http.MethodGet, 200, healthBody{Status: "ok", LiveReplicas: 1, Replicas: 2}},
		{"HEAD has no body", func() {}, http.MethodHead, 200, healthBody{}},
		{"the LIVE one drains", func() { srv.Balancer().SetDraining("sim-1", true) }, http.MethodGet, 503, healthBody{Status: "no live replica", Replicas: 2}},
		{"the server drains", func() {
			srv.Balancer().SetDraining("sim-1", false)
			srv.draining.Store(true)
		}, http.MethodGet, 503, healthBody{Status: "draining", LiveReplicas: 1, Replicas: 2}},
	}
	for _, st := range steps {
		st.do()
		code, body, rec := get(st.method)
		if code != st.wantCode || body != st.want {
			t.Fatalf("%s: %d %+v, want %d %+v", st.name, code, body, st.wantCode, st.want)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("%s: Content-Type %q", st.name, ct)
		}
		if st.method == http.MethodHead && rec.Body.Len() != 0 {
			t.Fatalf("HEAD wrote %q", rec.Body.String())
		}
	}
	// Another method is the proxy's to answer (it knows no POST /health).
	rec := httptest.NewRecorder()
	srv.ProxyHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/health", nil))
	var b healthBody
	if json.Unmarshal(rec.Body.Bytes(), &b) == nil && b.Status != "" {
		t.Fatalf("POST /health answered %d %q by the health check", rec.Code, rec.Body.String())
	}
}

// TestReplicaAPIKeyReplacesClientCredentials: through the whole server, a
// replica configured with an api_key sees that key and none of the client's
// (Authorization, x-api-key, api-key).
func TestReplicaAPIKeyReplacesClientCredentials(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cfg := testConfig("http://a:8000")
	cfg.Replicas[0].APIKey = "sk-replica"
	var got http.Header
	upstream := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		got = r.Header.Clone()
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(strings.NewReader(`{}`)), Request: r}, nil
	})
	srv, err := New(cfg, nil, WithFetcher(scrape.NewFake()), WithTransport(upstream), WithClock(func() time.Time { return now }))
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		now = now.Add(100 * time.Millisecond)
		srv.Balancer().ObserveScrape("sim-1", balancer.Snapshot{}, nil, now)
	}
	for _, path := range []string{"/v1/messages", "/v1/chat/completions"} {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer sk-client")
		req.Header.Set("x-api-key", "sk-ant-client")
		req.Header.Set("api-key", "azure-client")
		rec := httptest.NewRecorder()
		srv.ProxyHandler().ServeHTTP(rec, req)
		if rec.Code != 200 {
			t.Fatalf("%s: %d %s", path, rec.Code, rec.Body.String())
		}
		for name, want := range map[string]string{"Authorization": "Bearer sk-replica", "X-Api-Key": "sk-replica", "Api-Key": "sk-replica"} {
			if v := got.Values(name); len(v) != 1 || v[0] != want {
				t.Errorf("%s: replica got %s %q, want %q", path, name, v, want)
			}
		}
	}
}
