package server

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/admin"
	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/health"
	"github.com/llmlb/llmlb/internal/scrape"
)

// TestStartedBeforeItsReplicas (docs/SECURITY.md and docs/ROUTING.md, "Start-up order"): serve
// starts 10 s before its replicas (normal under Kubernetes or compose). The
// replicas are not ready meanwhile (no traffic, shown EJECTED with no
// cooldown and no ejection), and once they are up the first good scrape of
// each makes it LIVE: all of them take traffic within 2 scrapes (here 1)
// plus the probing window, with no ejection and no flap cooldown. A replica
// added by API that does not exist never shows LIVE. Time is the server's
// clock, walked by hand: no sleeps.
func TestStartedBeforeItsReplicas(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	now := t0
	cfg := testConfig("http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000")
	cfg.Scrape.Interval = 3 * time.Second
	cfg.Routing.Health = health.Default() // 30 s cooldown, 15 s window: what a start-up must not run into
	upstream := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		_, _ = io.Copy(io.Discard, r.Body)
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(strings.NewReader(`{}`)), Request: r}, nil
	})
	srv, err := New(cfg, nil, WithFetcher(scrape.NewFake()), WithTransport(upstream), WithClock(func() time.Time { return now }))
	if err != nil {
		t.Fatal(err)
	}
	bal := srv.Balancer()
	post := func() (int, string) {
		rec := httptest.NewRecorder()
		srv.ProxyHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)))
		return rec.Code, rec.Header().Get("X-LLMLB-Replica")
	}
	check := func(when string, wantState string) {
		t.Helper()
		for _, r := range bal.Replicas(now) {
			if r.State != wantState || r.Ejections != 0 || r.CooldownSeconds != 0 {
				t.Fatalf("%s: %s is %s with %d ejections, cooldown %gs; want %s, 0, 0",
					when, r.Name, r.State, r.Ejections, r.CooldownSeconds, wantState)
			}
		}
	}
	check("at start", "EJECTED")
	if code, _ := post(); code != http.StatusServiceUnavailable {
		t.Fatalf("before any scrape: status %d, want 503 (no replica is ready)", code)
	}
	// The replicas are still down for 10 s: every scrape is refused.
	for ; now.Before(t0.Add(10 * time.Second)); now = now.Add(cfg.Scrape.Interval) {
		for _, r := range bal.Replicas(now) {
			if ts := bal.ObserveScrape(r.Name, balancer.Snapshot{}, errors.New("connection refused"), now); len(ts) != 0 {
				t.Fatalf("a refused scrape of a starting replica changed its state: %+v", ts)
			}
		}
		bal.Tick(now)
		check("while the replicas start", "EJECTED")
	}
	// They are up: the next scrape of each succeeds.
	for _, r := range bal.Replicas(now) {
		bal.ObserveScrape(r.Name, balancer.Snapshot{}, nil, now)
	}
	bal.Tick(now)
	check("after the first good scrape", "LIVE")
	seen := map[string]bool{}
	for range 6 {
		code, rep := post()
		if code != http.StatusOK {
			t.Fatalf("status %d after the replicas came up", code)
		}
		seen[rep] = true
	}
	if len(seen) != 3 {
		t.Fatalf("requests reached %v, want all 3 replicas", seen)
	}

	// A replica added by API that does not exist never shows LIVE.
	if err := (fleet{srv}).AddReplica(balancer.ReplicaSpec{Name: "ghost", URL: "http://10.0.0.99:8000"}, admin.KVEvents{}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		now = now.Add(cfg.Scrape.Interval)
		bal.ObserveScrape("ghost", balancer.Snapshot{}, errors.New("connection refused"), now)
		for _, r := range bal.Replicas(now) {
			if r.Name == "ghost" && (r.State == "LIVE" || r.Ejections != 0) {
				t.Fatalf("scrape %d: the ghost replica is %s with %d ejections", i, r.State, r.Ejections)
			}
		}
	}
}
