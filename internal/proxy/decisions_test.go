package proxy

import (
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/request"
)

// TestDecisionsHookSeesEveryAttempt checks Options.Decisions: one call per
// routing decision, failovers with their attempt number, with the request's
// session key and the core's explanation.
func TestDecisionsHookSeesEveryAttempt(t *testing.T) {
	up := okUpstream(t)
	f := newFixture(t, defaultProxyConfig(), replica{name: "dead"}, replica{name: "ok", url: up.URL})
	type seen struct {
		replica, session string
		attempt          int
		expl             balancer.Explanation
	}
	var mu sync.Mutex
	var got []seen
	f.p.decisions = func(_ time.Time, res *balancer.Reservation, prof *request.Profile, attempt int) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, seen{res.Replica, prof.SessionKey, attempt, res.Explanation})
	}
	for range 4 {
		if w := post(t, f.p, chatBody, map[string]string{"X-Session-Id": "s-1"}); w.Code != 200 {
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	firsts, retries := 0, 0
	for _, s := range got {
		if s.session != "s-1" || s.expl.Policy == "" {
			t.Errorf("decision %+v lacks the session key or the explanation", s)
		}
		switch s.attempt {
		case 1:
			firsts++
		case 2:
			retries++
			if s.replica != "ok" {
				t.Errorf("retry went to %s, want ok", s.replica)
			}
		default:
			t.Errorf("attempt %d, want 1 or 2", s.attempt)
		}
	}
	if firsts != 4 || retries != len(f.rec.failovers) {
		t.Errorf("%d first attempts and %d retries, want 4 and %d (the failovers)", firsts, retries, len(f.rec.failovers))
	}
}
