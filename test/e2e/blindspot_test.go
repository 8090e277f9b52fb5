//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestWLCBlindSpot is guarantee 2 of docs/GUARANTEES.md (the WLC blind spot): a burst that
// arrives inside one scrape interval is spread by the balancer's own
// in-flight reservations, not by the (stale) scraped load. 8 simultaneous
// streams on 4 idle replicas land 2 per replica, and a second burst of 8
// while those still run lands 2 more per replica (4 each).
//
// Timers: scrape.interval 60s so that no scrape happens during the bursts
// (seed default 3s: the same holds for any burst shorter than one interval).
//
// Policy cost runs the same scenario: its own pending prefill and in-flight
// counts spread the burst the same way.
func TestWLCBlindSpot(t *testing.T) {
	for _, policy := range []string{"llmlb", "cost"} {
		t.Run(policy, func(t *testing.T) { testWLCBlindSpot(t, policy) })
	}
}

func testWLCBlindSpot(t *testing.T, policy string) {
	const n = 4
	sim := startSim(t, n)
	srv := startServe(t, sim.replicasYAML(n)+"scrape:\n  interval: 60s\n  timeout: 2s\nrouting:\n  policy: "+policy+"\n")
	srv.waitAllLive(t, n)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var (
		mu      sync.Mutex
		replies []reply
		wg      sync.WaitGroup
	)
	burst := func(round int) {
		var started sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			started.Add(1)
			go func() {
				defer wg.Done()
				once := sync.OnceFunc(started.Done)
				defer once()
				// Long enough to still run during the second burst (~40 s at the default profile's step).
				r := srv.chat(ctx, chatReq{Session: fmt.Sprintf("burst-%d-%d", round, i), MaxTokens: 300, Stream: true,
					OnFirstByte: once})
				mu.Lock()
				replies = append(replies, r)
				mu.Unlock()
			}()
		}
		started.Wait()
	}
	burst(1)
	rs := srv.replicas(t)
	for i := range n {
		if got := rs[simName(i)].InFlight; got != 2 {
			t.Errorf("after burst 1: %s in_flight = %d, want 2 (replicas: %+v)", simName(i), got, rs)
		}
	}
	burst(2)
	rs = srv.replicas(t)
	for i := range n {
		if got := rs[simName(i)].InFlight; got != 4 {
			t.Errorf("after burst 2: %s in_flight = %d, want 4", simName(i), got)
		}
	}
	cancel() // the streams have shown what they had to
	wg.Wait()
	per := tally(replies)
	for i := range n {
		if per[simName(i)] != 4 {
			t.Errorf("%s got %d of 16 requests, want 4 (by replica %v)", simName(i), per[simName(i)], per)
		}
	}
	t.Logf("GUARANTEE 2 blind spot (%s): 16 requests in two bursts of 8 inside one scrape interval -> by replica %v", policy, per)
}
