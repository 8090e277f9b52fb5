package server

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/config"
)

// A replica whose URL leads back to llmlb (here through a relay, as a
// Service or NAT in front of llmlb would) turned one request into about
// 9,900 self-hops and starved other clients. Through serve: the loop is
// refused at its first hop back, the replica is ejected, every client's
// request is served by the real replica; a replica URL that is llmlb's own
// listener is refused when added.
func TestSelfLoopThroughServe(t *testing.T) {
	e := start(t, 1, func(c *config.Config) {
		c.AdminToken = "s3cret"
		c.Scrape.Metrics = config.MetricsNone // llmlb answers /v1/models: the loop looks LIVE
	})
	target, _ := url.Parse(e.proxy)
	var hops atomic.Int64
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.ErrorLog = log.New(io.Discard, "", 0) // failed-over hops are cancelled
	relay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/models" && hops.Add(1) > 200 {
			http.Error(w, "runaway loop", http.StatusInternalServerError)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(relay.Close)

	post := func(body string) int {
		req, _ := http.NewRequest(http.MethodPost, e.admin+"/admin/replicas", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer s3cret")
		res, err := e.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	if got := post(fmt.Sprintf(`{"name":"self","url":%q}`, e.proxy)); got != http.StatusBadRequest {
		t.Errorf("adding llmlb's own listener: %d, want 400", got)
	}
	if got := post(fmt.Sprintf(`{"name":"loop","url":%q,"models":[%q]}`, relay.URL, model)); got != http.StatusCreated {
		t.Fatalf("adding the relay: %d, want 201", got)
	}
	e.waitReplicas("the looping replica LIVE", func(rs []balancer.ReplicaStatus) bool {
		r, ok := find(rs, "loop")
		return ok && r.State == "LIVE"
	})

	start := time.Now()
	const clients = 16
	var wg sync.WaitGroup
	codes := make([]int, clients)
	reps := make([]string, clients)
	for i := range clients {
		wg.Go(func() { codes[i], reps[i], _ = e.chat(chatBody(fmt.Sprintf("client %d", i), 4), nil) })
	}
	wg.Wait()
	took := time.Since(start)
	for i := range clients {
		if codes[i] != http.StatusOK || reps[i] != "sim-1" {
			t.Errorf("client %d: %d from %q, want 200 from sim-1", i, codes[i], reps[i])
		}
	}
	if h := hops.Load(); h > clients {
		t.Errorf("%d requests went through the loop for %d clients, want at most one each", h, clients)
	}
	r, _ := find(e.replicas(), "loop")
	if r.State != "EJECTED" {
		t.Errorf("looping replica is %s, want EJECTED", r.State)
	}
	t.Logf("GUARANTEE self-loop: %d clients served in %v, %d hops through the loop, replica %s", clients, took, hops.Load(), r.State)
}
