package server

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/simreplica"
	"github.com/llmlb/llmlb/internal/testutil/pinview"
	"github.com/llmlb/llmlb/internal/testutil/redisserver"
)

// sharedPair runs two llmlb instances, A and B, in front of one simulated
// fleet of n replicas, sharing state through the Redis at url.
func sharedPair(t *testing.T, n int, url string) (a, b *env) {
	t.Helper()
	fleet, err := simreplica.StartFleet(context.Background(), simreplica.FleetOptions{Replicas: n, Model: model, Seed: 1, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fleet.Close() })
	prefix := "test:" + strings.ReplaceAll(t.Name(), "/", "_") + ":"
	with := func(id string) func(*config.Config) {
		return func(c *config.Config) {
			// Pins are what these tests share: policy llmlb keeps
			// them (cost shares its block index instead, tested in
			// internal/balancer).
			c.Routing.Policy = "llmlb"
			c.State.RedisURL, c.State.InstanceID, c.State.KeyPrefix = url, id, prefix
			c.State.OpTimeout = time.Second // a loaded CI machine with -race
		}
	}
	return startOn(t, fleet, with("A")), startOn(t, fleet, with("B"))
}

// waitPin polls e's core until the session is pinned to want ("" = any).
func (e *env) waitPin(session, want string) string {
	e.t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		for _, p := range pinview.List(e.srv.Balancer(), time.Now(), 0) {
			if p.Kind == "session" && p.Key == session && (want == "" || p.Replica == want) {
				return p.Replica
			}
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("session %s not pinned to %q within %v at %s", session, want, waitFor, e.proxy)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Shared state (docs/SHARED_STATE.md): with two instances and Redis, a session whose turns alternate
// between them stays on one replica.
func TestSharedStateSessionAlternatesInstances(t *testing.T) {
	srv := redisserver.Start(t)
	a, b := sharedPair(t, 4, srv.URL())
	insts := []*env{a, b}
	first := ""
	for turn := range 8 {
		e := insts[turn%2]
		if first != "" {
			e.waitPin("s-1", first) // visible at the other instance (a fraction of a second)
		}
		code, rep, body := e.chat(chatBody(fmt.Sprintf("turn %d", turn), 4), map[string]string{"x-session-id": "s-1"})
		if code != http.StatusOK {
			t.Fatalf("turn %d: %d %s", turn, code, body)
		}
		if first == "" {
			first = rep
		}
		if rep != first {
			t.Fatalf("turn %d (instance %d) went to %s, the session is on %s", turn, turn%2, rep, first)
		}
	}
}

// Shared state: killing Redis mid-run fails no request; restarting it brings
// sharing back by itself.
func TestSharedStateRedisKilledMidRun(t *testing.T) {
	srv := redisserver.Start(t)
	a, b := sharedPair(t, 4, srv.URL())
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	sent := 0
	for w, e := range []*env{a, b, a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				code, _, body := e.chat(chatBody("hello", 2), map[string]string{"x-session-id": fmt.Sprintf("w%d-%d", w, i%5)})
				mu.Lock()
				sent++
				if code != http.StatusOK {
					failures = append(failures, fmt.Sprintf("%d %s", code, body))
				}
				mu.Unlock()
			}
		}()
	}
	waitSent := func(n int) {
		deadline := time.Now().Add(waitFor)
		for {
			mu.Lock()
			s := sent
			mu.Unlock()
			if s >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("only %d requests done", s)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitSent(20)
	srv.Stop()
	eventually(t, "both instances see Redis down", func() bool { return !a.srv.shared.Up() && !b.srv.shared.Up() })
	mu.Lock()
	atDown := sent
	mu.Unlock()
	waitSent(atDown + 40) // traffic goes on without Redis
	srv.Start()
	eventually(t, "both instances see Redis up", func() bool { return a.srv.shared.Up() && b.srv.shared.Up() })
	cancel()
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d of %d requests failed around the Redis outage, first: %s", len(failures), sent, failures[0])
	}
	// Sharing resumed: a new session pinned at A is seen at B.
	code, rep, body := a.chat(chatBody("after", 2), map[string]string{"x-session-id": "after"})
	if code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	b.waitPin("after", rep)
	metrics := a.get(t, "/metrics")
	for _, m := range []string{"llmlb_shared_state_up 1", `llmlb_shared_state_errors_total{op="publish"}`, "llmlb_shared_state_published_total"} {
		if !strings.Contains(metrics, m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
}

// Shared state: an instance adds the other's in-flight requests to its
// effective load.
func TestSharedStatePeerInFlightRaisesLoad(t *testing.T) {
	srv := redisserver.Start(t)
	a, b := sharedPair(t, 2, srv.URL())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rep, finish := a.stream(ctx, 100000, "long")
	peer := func(rs []balancer.ReplicaStatus) (balancer.ReplicaStatus, bool) {
		for _, r := range rs {
			if r.Name == rep {
				return r, true
			}
		}
		return balancer.ReplicaStatus{}, false
	}
	b.waitReplicas("B counts A's stream on "+rep, func(rs []balancer.ReplicaStatus) bool {
		r, ok := peer(rs)
		return ok && r.PeerInFlight == 1 && r.InFlight == 0 && r.EffectiveRunning >= 1
	})
	cancel()
	_, _ = finish()
	b.waitReplicas("B sees A's stream end", func(rs []balancer.ReplicaStatus) bool {
		r, ok := peer(rs)
		return ok && r.PeerInFlight == 0
	})
}

// eventually polls cond until it holds or waitFor passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", waitFor, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// get reads an admin path as text.
func (e *env) get(t *testing.T, path string) string {
	t.Helper()
	res, err := e.http.Get(e.admin + path)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var sb strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := res.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return sb.String()
}
