package balancer

import (
	"testing"
	"time"
)

// TestSaturationLearnsTheRunningLimit: a replica's running-slot limit is
// the number running, unchanged over three scrapes in a row while requests
// wait (an engine at its slot limit runs exactly that many; one waiting on
// its KV cache or prefill budget runs a number that moves, and a burst
// passes), it rises when more run with none waiting or a higher plateau
// shows, it is never lowered, and a configured limit wins.
func TestSaturationLearnsTheRunningLimit(t *testing.T) {
	b := newFleet(t, 1, nil)
	s := 0
	scrape := func(running, waiting float64) {
		s++
		b.ObserveScrape("a", Snapshot{Running: running, Waiting: waiting}, nil, t0.Add(time.Duration(s)*time.Second))
	}
	limit := func() float64 { return b.Replicas(t0)[0].MaxRunning }

	for _, step := range []struct {
		name             string
		running, waiting float64
		want             float64
	}{
		{"a request caught between two steps", 3, 1, 0},
		{"none waiting", 0, 0, 0},
		{"a moving count while requests wait (KV or prefill budget)", 4, 2, 0},
		{"still moving", 5, 2, 0},
		{"moving again", 4, 3, 0},
		{"4 twice in a row", 4, 1, 0},
		{"4 three times in a row: the plateau", 4, 5, 4},
		{"more ran with none waiting", 6, 0, 6},
		{"a lower plateau (full KV cache), 1", 3, 4, 6},
		{"a lower plateau, 2", 3, 4, 6},
		{"a lower plateau, 3: not below what ran free", 3, 4, 6},
		{"a higher plateau, 1", 9, 2, 6},
		{"a higher plateau, 2", 9, 2, 6},
		{"a higher plateau, 3", 9, 2, 9},
		{"a plateau of 7, 1", 7, 5, 9},
		{"a plateau of 7, 2", 7, 5, 9},
		{"a plateau of 7, 3: the high-water mark stays", 7, 5, 9},
	} {
		scrape(step.running, step.waiting)
		if got := limit(); got != step.want {
			t.Fatalf("%s (running %v, waiting %v): limit %v, want %v", step.name, step.running, step.waiting, got, step.want)
		}
	}

	cfg := b.Config()
	cfg.Saturation.MaxRunning = 16
	if err := b.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	if limit() != 16 {
		t.Fatalf("limit %v with saturation.max_running 16", limit())
	}
}

// TestSaturationCountsOwnSendsSinceTheScrape: a replica fills with what
// the balancer sends between two scrapes, and empties as those requests
// end; the pool is saturated only when every replica is full, and Dispatch
// offers the policy only the replicas with room.
func TestSaturationCountsOwnSendsSinceTheScrape(t *testing.T) {
	b := newFleet(t, 2, func(c *Config) { c.Saturation.MaxRunning = 2 }) // full at 2 + 1 headroom
	if b.Saturated("", t0) {
		t.Fatal("an idle pool is saturated")
	}
	var held []*Reservation
	for range 5 {
		res, err := b.Select(&Profile{}, t0)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, res)
	}
	if b.Saturated("", t0) {
		t.Fatal("saturated with 5 in flight on two replicas of 3 each")
	}
	res, err := b.Select(&Profile{}, t0)
	if err != nil {
		t.Fatal(err)
	}
	held = append(held, res)
	if !b.Saturated("", t0) {
		t.Fatal("not saturated with 3 in flight on each replica")
	}
	b.Release(held[0], OutcomeOK, t0)
	if b.Saturated("", t0) {
		t.Fatal("still saturated after a request ended")
	}
	freed := held[0].Replica
	for range 4 { // Select's policy may pick any; Dispatch only the one with room
		d, _, err := b.Dispatch(&Profile{}, t0)
		if err != nil {
			t.Fatal(err)
		}
		if d.Replica != freed {
			t.Fatalf("Dispatch chose full %s, want %s", d.Replica, freed)
		}
		b.Release(d, OutcomeOK, t0)
	}
}
