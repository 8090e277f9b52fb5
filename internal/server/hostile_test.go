package server

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/testutil/hostile"
)

// TestEjectionFailsOverWaitingRequest (docs/SECURITY.md, "Hung replica", through the
// server's wiring): a replica hangs (SIGSTOP-like: its API, then its
// /metrics); the scraper ejects it, and the request that was waiting for
// its answer fails over to the other replica at once instead of waiting
// for proxy.first_byte_timeout.
func TestEjectionFailsOverWaitingRequest(t *testing.T) {
	hung := hostile.NewUpstream(t, map[string]hostile.Behavior{
		"/metrics": hostile.Metrics(), "/v1/models": hostile.JSON(200, `{"data":[{"id":"m"}]}`),
		"/v1/chat/completions": hostile.Hang(),
	})
	ok := hostile.NewUpstream(t, map[string]hostile.Behavior{
		"/metrics": hostile.Metrics(), "/v1/models": hostile.JSON(200, `{"data":[{"id":"m"}]}`),
		"/v1/chat/completions": hostile.JSON(200, `{"ok":true}`),
	})
	cfg := testConfig(hung.URL, ok.URL)
	cfg.Proxy.FirstByteTimeout = time.Hour
	cfg.Scrape.Interval, cfg.Scrape.Timeout = 100*time.Millisecond, 100*time.Millisecond
	srv, err := New(cfg, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	srv.UseListeners(listen(t), listen(t))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	bal := srv.Balancer()
	live := func() bool {
		n := 0
		for _, r := range bal.Replicas(time.Now()) {
			if r.State == "LIVE" {
				n++
			}
		}
		return n == 2
	}
	deadline := time.Now().Add(20 * time.Second)
	for !live() {
		if time.Now().After(deadline) {
			t.Fatalf("replicas never LIVE: %+v", bal.Replicas(time.Now()))
		}
		time.Sleep(10 * time.Millisecond)
	}
	bal.SetDraining("sim-2", true) // the first attempt goes to the hung replica
	type result struct {
		code int
		body string
		err  error
	}
	res := make(chan result, 1)
	go func() {
		rctx, rcancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer rcancel()
		req, _ := http.NewRequestWithContext(rctx, http.MethodPost, "http://"+srv.ProxyAddr()+"/v1/chat/completions",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
		r, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			res <- result{err: err}
			return
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		res <- result{code: r.StatusCode, body: string(b)}
	}()
	for hung.Hits("/v1/chat/completions") == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	bal.SetDraining("sim-2", false)
	hung.Set("/metrics", hostile.Hang()) // now its scrapes time out too: ejected
	r := <-res
	if r.err != nil || r.code != http.StatusOK || !strings.Contains(r.body, `"ok":true`) {
		t.Fatalf("got %d %q %v, want 200 from the other replica", r.code, r.body, r.err)
	}
	var st balancer.ReplicaStatus
	for _, x := range bal.Replicas(time.Now()) {
		if x.Name == "sim-1" {
			st = x
		}
	}
	if st.State != "EJECTED" {
		t.Fatalf("the hung replica is %s", st.State)
	}
}
