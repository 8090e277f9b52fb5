//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestFlap is guarantee 4 of docs/GUARANTEES.md (flapping): a replica that flaps
// (refuses half of each period, serves the other half) is ejected again and
// again with cooldowns doubling up to the cap, 30, 60, 120, 240, 300 s with
// the defaults, receives no pin while it flaps, raises the flapping
// alert at the cap, and user traffic sees no error.
//
// Timers are the defaults divided by 60: base_cooldown 500ms, max_cooldown 5s
// (cooldowns 0.5, 1, 2, 4, 5 s), probing_window 250ms, flap_window and
// streak_reset 10s, scrape 100ms/80ms, flap period 400ms (at the defaults' scale: 10-20 s).
func TestFlap(t *testing.T) {
	const (
		n      = 3
		victim = 1 // sim-2
	)
	sim := startSim(t, n)
	srv := startServe(t, sim.replicasYAML(n)+`scrape:
  interval: 100ms
  timeout: 80ms
routing:
  health:
    base_cooldown: 500ms
    max_cooldown: 5s
    probing_window: 250ms
    flap_window: 10s
    streak_reset: 10s
`)
	srv.waitAllLive(t, n)
	name := simName(victim)
	sim.fault(t, victim, `{"mode":"flap","period":"400ms"}`)
	srv.waitState(t, name, "EJECTED", 10*time.Second)

	// Light session traffic while it flaps: every request a new session.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		stop    atomic.Bool
		mu      sync.Mutex
		replies []reply
		wg      sync.WaitGroup
	)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				r := srv.chat(ctx, chatReq{Session: fmt.Sprintf("flap-%d-%d", w, i), MaxTokens: 2})
				mu.Lock()
				replies = append(replies, r)
				mu.Unlock()
			}
		}()
	}

	want := []float64{0.5, 1, 2, 4, 5, 5}
	var cooldowns []float64
	seen, pinsOnFlapper, polls := 0, 0, 0
	waitFor(t, 60*time.Second, "6 ejections", func() (bool, string) {
		r := srv.replicas(t)[name]
		if r.Ejections > seen && r.State == "EJECTED" {
			if r.Ejections > seen+1 {
				t.Logf("missed an ejection between polls (%d -> %d)", seen, r.Ejections)
			}
			seen = r.Ejections
			cooldowns = append(cooldowns, r.CooldownSeconds)
		}
		polls++
		for _, p := range srv.pins(t) {
			if p.Replica == name {
				pinsOnFlapper++
				t.Errorf("pin on the flapping replica: %+v (state %s)", p, r.State)
			}
		}
		return seen >= len(want), fmt.Sprintf("ejections %d, cooldowns %v", seen, cooldowns)
	})
	stop.Store(true)
	wg.Wait()

	if !slices.Equal(cooldowns, want[:len(cooldowns)]) || len(cooldowns) < len(want) {
		t.Errorf("cooldowns at each ejection %v, want %v", cooldowns, want)
	}
	flapping := false
	for _, a := range srv.alerts(t) {
		if a.Name == "flapping" && a.Replica == name {
			flapping = true
		}
	}
	if !flapping {
		t.Errorf("no flapping alert for %s at the cooldown cap: %+v", name, srv.alerts(t))
	}
	failed, onFlapper := 0, 0
	for _, r := range replies {
		if !r.ok() {
			failed++
			t.Errorf("request failed while %s flapped: %+v", name, r)
		}
		if r.Replica == name {
			onFlapper++
		}
	}
	probes := sumMetric(srv.metrics(t), "llmlb_health_transitions_total", map[string]string{"replica": name, "from": "EJECTED", "to": "PROBING"})
	t.Logf("GUARANTEE 4 flap: cooldowns %v s (seed scale x60: 30 60 120 240 300 300), flapping alert %v, %d pins on it in %d polls; %v times PROBING; %d requests while flapping, %d failed, %d served by it (PROBING)",
		cooldowns, flapping, pinsOnFlapper, polls, probes, len(replies), failed, onFlapper)
}
