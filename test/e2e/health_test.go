//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestHealthWithoutUserTraffic is guarantee 3 of docs/GUARANTEES.md: with no
// user traffic at all, a killed replica (refuse fault) is EJECTED by the
// active scrape within scrape.interval (+10% jitter) + scrape.timeout; while
// it is EJECTED no user request reaches it, even once it is back up (its own
// vllm:request_success_total does not move and no response names it in
// X-LLMLB-Replica); it returns only through EJECTED -> PROBING (2 good
// scrapes after the cooldown) -> LIVE (a clean probing window).
//
// Timers: scrape 500ms/250ms, base_cooldown 3s, probing_window 1s. With the
// defaults (3s/1s, 30s, 15s): ejected within 4.3 s, back in PROBING no
// sooner than 30 s + 2 scrapes (~36 s), LIVE 15 s later.
func TestHealthWithoutUserTraffic(t *testing.T) {
	const (
		n        = 3
		interval = 500 * time.Millisecond
		timeout  = 250 * time.Millisecond
		cooldown = 3 * time.Second
		window   = time.Second
		victim   = 1 // sim-2
	)
	sim := startSim(t, n)
	srv := startServe(t, sim.replicasYAML(n)+yamlTimers(interval, timeout, cooldown, 10*cooldown, window))
	srv.waitAllLive(t, n)
	name := simName(victim)

	sim.fault(t, victim, `{"mode":"refuse"}`)
	detect := srv.waitState(t, name, "EJECTED", 20*time.Second)
	ejectedAt := time.Now()
	bound := time.Duration(float64(interval)*1.1) + timeout
	t.Logf("GUARANTEE 3 detection: %s EJECTED %v after the refuse fault (bound interval*1.1+timeout = %v)", name, detect.Round(time.Millisecond), bound)
	if detect > bound+time.Second { // +1 s for polling and a busy 2-core machine
		t.Errorf("ejection took %v, want within %v (+1 s slack)", detect, bound)
	}

	// Back up at once, but still in its cooldown: user traffic must avoid it.
	sim.fault(t, victim, `{"mode":"none"}`)
	var before float64
	waitFor(t, 10*time.Second, name+" answering /metrics again", func() (bool, string) {
		before = sim.requestsDone(victim)
		return before >= 0, "no answer"
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var (
		mu      sync.Mutex
		replies []reply
		wg      sync.WaitGroup
	)
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 4 {
				r := srv.chat(ctx, chatReq{Session: fmt.Sprintf("ej-%d-%d", w, i), MaxTokens: 4})
				mu.Lock()
				replies = append(replies, r)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if st := srv.replicas(t)[name].State; st != "EJECTED" {
		t.Fatalf("%s left EJECTED (%s) before the user traffic ended (%v after ejection); the cooldown is too short for this machine", name, st, time.Since(ejectedAt))
	}
	after := sim.requestsDone(victim)
	for _, r := range replies {
		if !r.ok() {
			t.Errorf("request failed while %s was EJECTED: %+v", name, r)
		}
		if r.Replica == name {
			t.Errorf("a request reached %s while it was EJECTED", name)
		}
	}
	if after != before {
		t.Errorf("%s served %v requests while EJECTED, want 0", name, after-before)
	}
	t.Logf("GUARANTEE 3 isolation: %d user requests while %s EJECTED (and up): by replica %v, its own counter moved by %v",
		len(replies), name, tally(replies), after-before)

	// The way back: EJECTED -> PROBING -> LIVE, observed on /admin/replicas.
	seq := []string{"EJECTED"}
	var probingAt, liveAt time.Time
	waitFor(t, 30*time.Second, name+" LIVE again", func() (bool, string) {
		st := srv.replicas(t)[name].State
		if st != seq[len(seq)-1] {
			seq = append(seq, st)
			switch st {
			case "PROBING":
				probingAt = time.Now()
			case "LIVE":
				liveAt = time.Now()
			}
		}
		return st == "LIVE", fmt.Sprintf("sequence so far %v", seq)
	})
	if !slices.Equal(seq, []string{"EJECTED", "PROBING", "LIVE"}) {
		t.Errorf("state sequence %v, want [EJECTED PROBING LIVE]", seq)
	}
	if !probingAt.IsZero() && probingAt.Sub(ejectedAt) < cooldown {
		t.Errorf("PROBING %v after ejection, before the %v cooldown ended", probingAt.Sub(ejectedAt), cooldown)
	}
	if !probingAt.IsZero() && liveAt.Sub(probingAt) < window-100*time.Millisecond {
		t.Errorf("LIVE %v after PROBING, before the %v clean window", liveAt.Sub(probingAt), window)
	}
	mfs := srv.metrics(t)
	for _, tr := range [][2]string{{"LIVE", "EJECTED"}, {"EJECTED", "PROBING"}, {"PROBING", "LIVE"}} {
		if got := sumMetric(mfs, "llmlb_health_transitions_total", map[string]string{"replica": name, "from": tr[0], "to": tr[1]}); got != 1 {
			t.Errorf("llmlb_health_transitions_total{%s %s->%s} = %v, want 1", name, tr[0], tr[1], got)
		}
	}
	if !probingAt.IsZero() && !liveAt.IsZero() {
		t.Logf("GUARANTEE 3 return: %v -> PROBING %v after ejection (cooldown %v) -> LIVE %v later (window %v)",
			seq, probingAt.Sub(ejectedAt).Round(time.Millisecond), cooldown, liveAt.Sub(probingAt).Round(time.Millisecond), window)
	}
}
