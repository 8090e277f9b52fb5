package server

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/testutil/hostile"
)

// TestLimitListener: at most n connections are open; Accept waits for a
// slot and gets it once a connection closes; Close ends a waiting Accept.
func TestLimitListener(t *testing.T) {
	inner := listen(t)
	l := LimitListener(inner, 2)
	defer l.Close()
	addr := inner.Addr().String()
	accepted := make(chan net.Conn, 3)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	hostile.IdleConns(t, addr, 3)
	first, second := <-accepted, <-accepted
	select {
	case <-accepted:
		t.Fatal("a third connection was accepted while 2 were open")
	case <-time.After(100 * time.Millisecond): // a negative check: a slow machine can only make it pass
	}
	first.Close()
	first.Close() // a second Close must not free a second slot
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting connection was not accepted after one closed")
	}
	second.Close()
	l.Close()
	for range accepted { // Accept returns once closed
	}
}

// TestProxySaturatedAdminReachable (docs/SECURITY.md, "File-descriptor exhaustion"): with the proxy
// listener at server.max_connections (idle clients holding every slot), the
// admin listener still answers, and the proxy serves again as soon as a
// slot frees.
func TestProxySaturatedAdminReachable(t *testing.T) {
	e := start(t, 1, func(c *config.Config) { c.Server.MaxConnections = 4 })
	proxyAddr := e.srv.ProxyAddr()
	idle := hostile.IdleConns(t, proxyAddr, 4)
	waitSaturated := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.proxy+"/v1/models", nil)
		res, err := (&http.Transport{}).RoundTrip(req)
		if err == nil {
			res.Body.Close()
			return false
		}
		return true
	}
	if !waitSaturated() {
		t.Fatal("the proxy served a 5th connection with max_connections 4")
	}
	for _, path := range []string{"/healthz", "/admin/replicas", "/metrics"} {
		res, err := e.http.Get(e.admin + path)
		if err != nil {
			t.Fatalf("admin %s while the proxy is saturated: %v", path, err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("admin %s: status %d", path, res.StatusCode)
		}
	}
	idle[0].Close()
	res, err := (&http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{}}).Get(e.proxy + "/v1/models")
	if err != nil {
		t.Fatalf("after a slot freed: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("after a slot freed: status %d", res.StatusCode)
	}
}
