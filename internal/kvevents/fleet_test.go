package kvevents

import (
	"context"
	"testing"
)

// TestFeedSubscribesAndUnsubscribes sets, moves and removes a replica's
// source on a running Feed: its events arrive once set, stop counting once
// removed (the replica leaves the index and stays out), and a source set
// again at another publisher follows that one.
func TestFeedSubscribesAndUnsubscribes(t *testing.T) {
	if testing.Short() {
		t.Skip("opens ZMQ sockets")
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	newPub := func() *Publisher {
		p, err := NewPublisher(ctx, "tcp://127.0.0.1:0", "", "", 100)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	pubA, pubB := newPub(), newPub()
	idx := NewIndex(0)
	f := NewFeed(idx, 0, nil, nil)
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()

	// publishUntil publishes block h at p until replica r holds it.
	publishUntil := func(p *Publisher, r string, h uint64) {
		t.Helper()
		waitFor(t, func() bool {
			if err := p.Publish(Batch{Events: []Event{stored("GPU", h)}}); err != nil {
				t.Fatal(err)
			}
			_, n := idx.Match(r, []uint64{h}, t0)
			return n == 1
		})
	}
	if !f.Set(Source{Replica: "r", Endpoint: pubA.Endpoint()}) {
		t.Fatal("Set of a new source reported no change")
	}
	if f.Set(Source{Replica: "r", Endpoint: pubA.Endpoint()}) {
		t.Fatal("Set of the same source again reported a change")
	}
	publishUntil(pubA, "r", 1)

	if !f.Remove("r") || idx.Publishes("r") || len(f.Sources()) != 0 {
		t.Fatalf("after Remove: publishes %v, sources %v", idx.Publishes("r"), f.Sources())
	}
	for range 20 {
		if err := pubA.Publish(Batch{Events: []Event{stored("GPU", 2)}}); err != nil {
			t.Fatal(err)
		}
	}
	if idx.Publishes("r") {
		t.Fatal("a removed replica's events still reach the index")
	}

	// Set again, at B: B's events count, and A's no longer do.
	f.Set(Source{Replica: "r", Endpoint: pubA.Endpoint()})
	publishUntil(pubA, "r", 3)
	if !f.Set(Source{Replica: "r", Endpoint: pubB.Endpoint()}) {
		t.Fatal("moving a source reported no change")
	}
	if _, n := idx.Match("r", []uint64{3}, t0); n != 0 {
		t.Fatal("moving a source kept the old publisher's entries")
	}
	publishUntil(pubB, "r", 4)
	for range 20 {
		if err := pubA.Publish(Batch{Events: []Event{stored("GPU", 5)}}); err != nil {
			t.Fatal(err)
		}
	}
	publishUntil(pubB, "r", 6)
	if _, n := idx.Match("r", []uint64{5}, t0); n != 0 {
		t.Fatal("the old publisher's events reach the index after the move")
	}
	cancel()
	<-done
}
