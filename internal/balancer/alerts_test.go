package balancer

import (
	"errors"
	"testing"
	"time"
)

// traffic drives b for the given span: every 10 s it routes perStep
// requests (released at once) and, every minute, one request to each
// replica in side (by excluding all the others). It ticks every 10 s.
func traffic(t *testing.T, b *Balancer, from, span time.Duration, perStep int, side ...string) {
	t.Helper()
	names := []string{}
	for _, st := range b.Replicas(t0) {
		names = append(names, st.Name)
	}
	for at := from; at < from+span; at += 10 * time.Second {
		now := t0.Add(at)
		for range perStep {
			r, err := b.Select(&Profile{}, now)
			if err != nil {
				t.Fatal(err)
			}
			b.Release(r, OutcomeOK, now)
		}
		if at%time.Minute == 0 {
			for _, s := range side {
				var ex []string
				for _, n := range names {
					if n != s {
						ex = append(ex, n)
					}
				}
				r, err := b.Select(&Profile{}, now, ex...)
				if err != nil {
					t.Fatal(err)
				}
				b.Release(r, OutcomeOK, now)
			}
		}
		b.Tick(now)
	}
}

func firing(b *Balancer, now time.Time, name string) bool {
	for _, a := range b.Alerts(now) {
		if a.Name == name {
			return true
		}
	}
	return false
}

// TestAlerts has one case per alert of docs/ROUTING.md, "Alerts", each checked just before
// and at its threshold.
func TestAlerts(t *testing.T) {
	m := time.Minute
	tests := []struct {
		name   string
		alert  string
		drive  func(t *testing.T, b *Balancer, from, to time.Duration) // drives the fleet from t0+from to t0+to
		quiet  time.Duration                                           // the alert must not fire at t0+quiet
		firing time.Duration                                           // and must fire at t0+firing
	}{
		{"imbalance index > 3 for 5 minutes", "imbalance", func(t *testing.T, b *Balancer, from, to time.Duration) {
			for _, n := range []string{"b", "c", "d"} { // queued: no-wait sends all to a
				b.ObserveScrape(n, Snapshot{Running: 1, Waiting: 1}, nil, t0)
			}
			traffic(t, b, from, to-from, 3, "b") // a 18, b 1 a minute: index 72/19 = 3.8
		}, 5 * m, 5*m + 10*time.Second},
		{"all traffic on one replica (N > 1) for 5 minutes", "one_replica", func(t *testing.T, b *Balancer, from, to time.Duration) {
			for _, n := range []string{"b", "c", "d"} {
				b.ObserveScrape(n, Snapshot{Running: 1, Waiting: 1}, nil, t0)
			}
			traffic(t, b, from, to-from, 2)
		}, 5*m - 10*time.Second, 5 * m},
		{"EJECTED > 0 and zero successful scrapes in a minute", "probe_broken", func(t *testing.T, b *Balancer, from, _ time.Duration) {
			if from > 0 {
				return
			}
			b.ObserveScrape("a", Snapshot{}, errors.New("refused"), t0.Add(time.Second))
		}, 59 * time.Second, 60 * time.Second},
		{"a replica's cooldown reached the 300 s cap", "flapping", func(t *testing.T, b *Balancer, from, _ time.Duration) {
			if from == 0 {
				return // quiet until the flapping starts
			}
			now := t0.Add(from)
			for range 5 { // cooldowns 30, 60, 120, 240, 300
				b.ObserveScrape("a", Snapshot{}, errors.New("refused"), now)
				now = now.Add(b.cfg.Health.MaxCooldown + time.Second)
				b.ObserveScrape("a", Snapshot{}, nil, now)
				b.ObserveScrape("a", Snapshot{}, nil, now.Add(3*time.Second))
				now = now.Add(20 * time.Second)
				b.Tick(now)
			}
		}, m, 30 * m},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newFleet(t, 4, nil)
			tc.drive(t, b, 0, tc.quiet)
			if tc.quiet > 0 && firing(b, t0.Add(tc.quiet), tc.alert) {
				t.Fatalf("%s fires at +%s, too early", tc.alert, tc.quiet)
			}
			tc.drive(t, b, tc.quiet, tc.firing)
			if !firing(b, t0.Add(tc.firing), tc.alert) {
				t.Fatalf("%s does not fire at +%s: %+v (index %.2f)", tc.alert, tc.firing, b.Alerts(t0.Add(tc.firing)), b.ImbalanceIndex(t0.Add(tc.firing)))
			}
		})
	}
}

func TestNoAlertsOnEvenTraffic(t *testing.T) {
	b := newFleet(t, 4, nil)
	traffic(t, b, 0, 10*time.Minute, 4)
	now := t0.Add(10 * time.Minute)
	for _, n := range []string{"a", "b", "c", "d"} {
		b.ObserveScrape(n, Snapshot{}, nil, now)
	}
	if a := b.Alerts(now); len(a) != 0 {
		t.Fatalf("alerts on even traffic: %+v", a)
	}
	if idx := b.ImbalanceIndex(now); idx != 1 {
		t.Fatalf("imbalance index %.2f, want 1", idx)
	}
}
