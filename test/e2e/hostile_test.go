//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/llmlb/llmlb/internal/testutil/hostile"
)

// vmRSS is a process's resident set size in bytes (/proc/PID/status).
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// TestHostileProxyPort runs the proxy-port attacks of docs/SECURITY.md against the `llmlb serve`
// binary in front of a hostile upstream (internal/testutil/hostile), with
// the default proxy settings (32 MiB bodies, 1 min read_body_timeout):
// each row is one attack and what the balancer must keep.
func TestHostileProxyPort(t *testing.T) {
	up := hostile.NewUpstream(t, map[string]hostile.Behavior{
		"/metrics":             hostile.Metrics(),
		"/v1/models":           hostile.JSON(200, `{"object":"list","data":[{"id":"sim-model","object":"model"}]}`),
		"/v1/chat/completions": hostile.SSE(3, true),
		"/v1/realtime":         hostile.WebSocketEcho(),
		"/secret":              hostile.JSON(200, `{"secret":true}`),
	})
	s := startServe(t, fmt.Sprintf("replicas:\n  - name: sim-1\n    url: %s\n    models: [sim-model]\nscrape:\n  interval: 500ms\n  timeout: 400ms\n", up.URL))
	s.waitAllLive(t, 1)

	t.Run("100 clients announce 32 MiB and send one byte: RSS stays under 300 MB", func(t *testing.T) {
		pid := s.p.cmd.Process.Pid
		base := vmRSS(t, pid)
		for range 100 {
			hostile.SlowBody(t, s.proxyAddr, "/v1/chat/completions", 32<<20, "{")
		}
		// The handlers start reading within milliseconds; the old code
		// grew each buffer to 32 MiB at once. Sample for a while, keep the max.
		var peak int64
		for range 20 {
			peak = max(peak, vmRSS(t, pid))
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("GUARANTEE RSS idle %d MiB, with 100 slow 32 MiB bodies %d MiB", base>>20, peak>>20)
		if peak > 300<<20 {
			t.Fatalf("RSS %d MiB with 100 slow clients, want < 300 MiB", peak>>20)
		}
	})

	t.Run("path traversal is refused before any replica sees it", func(t *testing.T) {
		for _, target := range []string{"/v1/../secret", "/v1/%2e%2e/secret", "/v1/..%2fsecret"} {
			code, body := hostile.Raw(t, s.proxyAddr, "POST", target, `{"model":"sim-model","messages":[]}`)
			if code != 400 || !strings.Contains(body, "invalid_path") {
				t.Errorf("%s: %d %s, want 400 invalid_path", target, code, body)
			}
		}
		if n := up.Hits("/secret"); n != 0 {
			t.Fatalf("%d requests reached /secret", n)
		}
	})

	t.Run("a WebSocket round trip passes and is no replica failure", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for i := range 4 {
			c, _, err := websocket.Dial(ctx, "ws://"+s.proxyAddr+"/v1/realtime", nil)
			if err != nil {
				t.Fatalf("upgrade %d: %v", i, err)
			}
			if err := c.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
				t.Fatal(err)
			}
			if _, msg, err := c.Read(ctx); err != nil || string(msg) != "ping" {
				t.Fatalf("echo %q %v", msg, err)
			}
			c.Close(websocket.StatusNormalClosure, "")
		}
		if r := s.replicas(t)["sim-1"]; r.State != "LIVE" || r.Ejections != 0 {
			t.Fatalf("after 4 upgrades the replica is %s with %d ejections", r.State, r.Ejections)
		}
	})

	t.Run("the only replica hangs (SIGSTOP-like): ejected by its scrapes, then 503 at once", func(t *testing.T) {
		up.Set("/metrics", hostile.Hang())
		up.Set("/v1/chat/completions", hostile.Hang())
		s.waitState(t, "sim-1", "EJECTED", 20*time.Second)
		before := up.Hits("/v1/chat/completions")
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		start := time.Now()
		r := s.chat(ctx, chatReq{User: "anyone?", MaxTokens: 2})
		took := time.Since(start)
		t.Logf("GUARANTEE all replicas dead: status %d in %s", r.Status, took.Round(time.Millisecond))
		if r.Status != 503 || !strings.Contains(r.Body, "no_healthy_instances") {
			t.Fatalf("status %d %s %v, want 503 no_healthy_instances", r.Status, r.Body, r.Err)
		}
		if n := up.Hits("/v1/chat/completions") - before; n != 0 {
			t.Fatalf("%d requests sent to the hung replica", n)
		}
	})
}
