package balancer

import (
	"testing"
	"time"
)

// TestSaturationLearnsTheRunningLimit: a replica's running-slot limit is
// the number running while requests wait on two scrapes in a row (one
// scrape may catch a request between arrival and the next engine step), it
// rises when more run with none waiting, and a configured limit wins.
func TestSaturationLearnsTheRunningLimit(t *testing.T) {
	b := newFleet(t, 1, nil)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	limit := func() float64 { return b.Replicas(t0)[0].MaxRunning }

	b.ObserveScrape("a", Snapshot{Running: 3, Waiting: 1}, nil, at(1))
	if limit() != 0 {
		t.Fatalf("one scrape with a request waiting set the limit to %v", limit())
	}
	b.ObserveScrape("a", Snapshot{Running: 0}, nil, at(2))
	b.ObserveScrape("a", Snapshot{Running: 4, Waiting: 2}, nil, at(3))
	b.ObserveScrape("a", Snapshot{Running: 4, Waiting: 5}, nil, at(4))
	if limit() != 4 {
		t.Fatalf("limit %v after two scrapes running 4 with requests waiting, want 4", limit())
	}
	b.ObserveScrape("a", Snapshot{Running: 6}, nil, at(5))
	if limit() != 6 {
		t.Fatalf("limit %v after 6 ran with none waiting, want 6", limit())
	}
	// A lower plateau (a full KV cache) does not lower it below what ran
	// with none waiting.
	b.ObserveScrape("a", Snapshot{Running: 3, Waiting: 4}, nil, at(6))
	b.ObserveScrape("a", Snapshot{Running: 3, Waiting: 4}, nil, at(7))
	if limit() != 6 {
		t.Fatalf("limit %v after a plateau of 3 below a free 6, want 6", limit())
	}
	// The limit is a high-water mark: a higher plateau raises it, a lower
	// one later (long prompts filling the KV cache) does not lower it.
	b.ObserveScrape("a", Snapshot{Running: 9, Waiting: 2}, nil, at(8))
	b.ObserveScrape("a", Snapshot{Running: 9, Waiting: 2}, nil, at(9))
	b.ObserveScrape("a", Snapshot{Running: 7, Waiting: 5}, nil, at(10))
	b.ObserveScrape("a", Snapshot{Running: 7, Waiting: 5}, nil, at(11))
	if limit() != 9 {
		t.Fatalf("limit %v after plateaus of 9 then 7, want the high-water 9", limit())
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
