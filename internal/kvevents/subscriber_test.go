package kvevents

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"
)

func storedBatch(hs ...uint64) []byte {
	return Encode(Batch{Events: []Event{stored("GPU", hs...)}})
}

func TestSubscriberHandleSequence(t *testing.T) {
	// Each message stores one block numbered by its seq (block 100+seq).
	type replayResult struct {
		msgs []Message
		err  error
	}
	replayOf := func(seqs ...uint64) replayResult {
		var r replayResult
		for _, s := range seqs {
			r.msgs = append(r.msgs, Message{Seq: s, Payload: storedBatch(100 + s)})
		}
		return r
	}
	cases := []struct {
		name     string
		seqs     []uint64
		replay   *replayResult // nil: no replay socket
		want     []uint64      // blocks held at the end
		gaps     uint64
		resyncs  uint64
		replayed uint64
	}{
		{name: "in order", seqs: []uint64{0, 1, 2}, want: []uint64{100, 101, 102}},
		{name: "joins late", seqs: []uint64{7, 8}, want: []uint64{107, 108}},
		{name: "duplicate skipped", seqs: []uint64{0, 1, 1, 2}, want: []uint64{100, 101, 102}},
		{name: "gap without replay clears", seqs: []uint64{0, 1, 4, 5}, want: []uint64{104, 105}, gaps: 1, resyncs: 1},
		{name: "gap replayed", seqs: []uint64{0, 1, 4, 5}, replay: ptr(replayOf(2, 3, 4, 5)),
			want: []uint64{100, 101, 102, 103, 104, 105}, gaps: 1, replayed: 2},
		{name: "replay overlapping what was applied", seqs: []uint64{0, 1, 4}, replay: ptr(replayOf(1, 2, 3)),
			want: []uint64{100, 101, 102, 103, 104}, gaps: 1, replayed: 2},
		{name: "replay buffer lost some", seqs: []uint64{0, 1, 4}, replay: ptr(replayOf(3, 4)),
			want: []uint64{104}, gaps: 1, resyncs: 1},
		{name: "replay fails", seqs: []uint64{0, 1, 4}, replay: &replayResult{err: errors.New("timeout")},
			want: []uint64{104}, gaps: 1, resyncs: 1},
		{name: "publisher restart clears", seqs: []uint64{5, 6, 0, 1}, want: []uint64{100, 101}, resyncs: 1},
	}
	all := []uint64{100, 101, 102, 103, 104, 105, 106, 107, 108}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			idx := NewIndex(0)
			s := NewSubscriber(Source{Replica: "r"}, idx, slog.New(slog.NewTextHandler(io.Discard, nil)))
			s.now = func() time.Time { return t0 }
			var replay func(uint64) ([]Message, error)
			if c.replay != nil {
				replay = func(uint64) ([]Message, error) { return c.replay.msgs, c.replay.err }
			}
			for _, seq := range c.seqs {
				s.Handle(seq, storedBatch(100+seq), replay)
			}
			var held []uint64
			for _, h := range all {
				if _, n := idx.Match("r", []uint64{h}, t0); n == 1 {
					held = append(held, h)
				}
			}
			if !equalU64(held, c.want) {
				t.Errorf("held %v, want %v", held, c.want)
			}
			if s.Gaps != c.gaps || s.Resyncs != c.resyncs || s.Replayed != c.replayed {
				t.Errorf("gaps %d resyncs %d replayed %d, want %d %d %d", s.Gaps, s.Resyncs, s.Replayed, c.gaps, c.resyncs, c.replayed)
			}
		})
	}
}

func TestSubscriberMalformedBatchClears(t *testing.T) {
	idx := NewIndex(0)
	s := NewSubscriber(Source{Replica: "r"}, idx, slog.New(slog.NewTextHandler(io.Discard, nil)))
	s.Handle(0, storedBatch(1), nil)
	s.Handle(1, []byte{0xc1}, nil)
	s.Handle(2, storedBatch(2), nil)
	if _, n := idx.Match("r", []uint64{1}, t0); n != 0 {
		t.Error("block stored before an unreadable batch still held")
	}
	if _, n := idx.Match("r", []uint64{2}, t0); n != 1 {
		t.Error("block stored after an unreadable batch not held")
	}
	if s.Malformed != 1 {
		t.Errorf("malformed %d, want 1", s.Malformed)
	}
}

func TestValidateEndpoint(t *testing.T) {
	for ep, ok := range map[string]bool{
		"tcp://10.0.0.1:5557": true, "tcp://vllm-0:5557": true,
		"tcp://*:5557": true, // a wildcard host is not dialable, but url accepts it
		"http://h:1":   false, "tcp://h": false, "h:5557": false, "tcp://h:1/x": false, "": false,
	} {
		if err := ValidateEndpoint(ep); (err == nil) != ok {
			t.Errorf("ValidateEndpoint(%q) = %v, want ok=%v", ep, err, ok)
		}
	}
}

// TestSubscriberOverZMQ runs a publisher and a subscriber over loopback TCP:
// the batches published reach the index, and a batch lost on the way is
// fetched from the replay socket.
func TestSubscriberOverZMQ(t *testing.T) {
	if testing.Short() {
		t.Skip("opens TCP sockets")
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pub, err := NewPublisher(ctx, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", "kv", 100)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	go pub.ServeReplay(ctx)
	idx := NewIndex(0)
	s := NewSubscriber(Source{Replica: "r", Endpoint: pub.Endpoint(), Replay: pub.ReplayEndpoint(), Topic: "kv"}, idx, nil)
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()

	// PUB drops what it sends before the subscription arrives (ZMQ's slow
	// joiner): publish a probe until one lands.
	waitFor(t, func() bool {
		if err := pub.Publish(Batch{Events: []Event{stored("GPU", 1)}}); err != nil {
			t.Fatal(err)
		}
		_, n := idx.Match("r", []uint64{1}, t0)
		return n == 1
	})
	pub.Skip(Batch{Events: []Event{stored("GPU", 2)}}) // lost: replay must bring it
	if err := pub.Publish(Batch{Events: []Event{stored("GPU", 3)}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		_, n2 := idx.Match("r", []uint64{2}, t0)
		_, n3 := idx.Match("r", []uint64{3}, t0)
		return n2 == 1 && n3 == 1
	})
	if err := pub.Publish(Batch{Events: []Event{{Kind: AllBlocksCleared}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		st, _ := idx.Stats("r")
		return st.Blocks == 0
	})
	cancel()
	pub.Close()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if s.Gaps != 1 || s.Replayed != 1 || s.Resyncs != 0 {
		t.Errorf("gaps %d replayed %d resyncs %d, want 1 1 0", s.Gaps, s.Replayed, s.Resyncs)
	}
}

// waitFor polls cond until it holds, failing after a generous deadline; it
// asserts an outcome, not a duration.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func ptr[T any](v T) *T { return &v }

func equalU64(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
