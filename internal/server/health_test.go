package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
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
