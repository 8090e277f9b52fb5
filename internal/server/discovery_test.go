package server

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/discovery"
)

// testSource reports its first set at once, then every set sent on sets.
type testSource struct {
	first []discovery.Target
	sets  chan []discovery.Target
}

func (s *testSource) Run(ctx context.Context, update func([]discovery.Target)) error {
	update(s.first)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ts := <-s.sets:
			update(ts)
		}
	}
}

func find(rs []balancer.ReplicaStatus, name string) (balancer.ReplicaStatus, bool) {
	for _, r := range rs {
		if r.Name == name {
			return r, true
		}
	}
	return balancer.ReplicaStatus{}, false
}

// TestDiscoveredReplicaLeavesWithoutLosingRequests: replicas come only
// from a discovery source; when one leaves the set while a stream runs on
// it, it drains (no new request goes there, the stream finishes whole)
// and is removed once idle; when it comes back it is added again.
func TestDiscoveredReplicaLeavesWithoutLosingRequests(t *testing.T) {
	src := &testSource{sets: make(chan []discovery.Target)}
	var all []discovery.Target
	e := start(t, 3, func(c *config.Config) {
		for _, r := range c.Replicas {
			all = append(all, discovery.Target{Name: "disc-" + r.Name, URL: r.URL})
		}
		src.first = all
		c.Replicas = nil // nothing static: every replica is discovered
	}, WithDiscovery(src))
	if got := e.srv.Syncer().Managed(); len(got) != 3 {
		t.Fatalf("discovered replicas %v, want 3", got)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leaving, finish := e.stream(ctx, 800, "long-session") // ~16 s of decoding: outlives the checks below
	var rest []discovery.Target
	for _, tg := range all {
		if tg.Name != leaving {
			rest = append(rest, tg)
		}
	}
	if len(rest) != 2 {
		t.Fatalf("stream served by %q, not a discovered replica", leaving)
	}
	src.sets <- rest
	e.waitReplicas(leaving+" draining with its stream in flight", func(rs []balancer.ReplicaStatus) bool {
		r, ok := find(rs, leaving)
		if !ok {
			t.Fatalf("%s removed while its stream was in flight", leaving)
		}
		return r.Draining && r.InFlight == 1
	})

	// New requests during the drain all succeed elsewhere.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	for i := range 8 {
		wg.Go(func() {
			code, rep, body := e.chat(chatBody("while draining", 4), map[string]string{"x-session-id": "long-session"})
			if code != http.StatusOK || rep == leaving {
				mu.Lock()
				failures = append(failures, fmt.Sprintf("request %d: %d from %q: %s", i, code, rep, body))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("requests during the drain failed or went to the leaving replica: %v", failures)
	}

	chunks, err := finish()
	if err != nil || chunks < 2 {
		t.Fatalf("the stream on the leaving replica broke: %d chunks, %v", chunks, err)
	}
	e.waitReplicas(leaving+" removed once idle", func(rs []balancer.ReplicaStatus) bool {
		_, ok := find(rs, leaving)
		return !ok && len(rs) == 2
	})

	src.sets <- all
	e.waitReplicas(leaving+" added back", func(rs []balancer.ReplicaStatus) bool {
		r, ok := find(rs, leaving)
		return ok && !r.Draining && len(rs) == 3
	})
}
