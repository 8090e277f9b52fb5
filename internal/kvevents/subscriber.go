package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Source is where one replica publishes its events.
type Source struct {
	Replica  string // the replica's name in the index
	Endpoint string // its PUB socket, tcp://host:port
	Replay   string // its replay ROUTER socket, tcp://host:port; "" if none
	Topic    string // the topic to subscribe to; "" for all
}

// ValidateEndpoint checks that ep is a ZMQ TCP endpoint llmlb can dial.
func ValidateEndpoint(ep string) error {
	u, err := url.Parse(ep)
	if err != nil {
		return fmt.Errorf("kvevents: endpoint %q: %w", ep, err)
	}
	if u.Scheme != "tcp" || u.Hostname() == "" || u.Port() == "" || u.Path != "" {
		return fmt.Errorf("kvevents: endpoint %q: want tcp://host:port", ep)
	}
	return nil
}

// verdict is what a stream does with a message's sequence number.
type verdict int

const (
	apply   verdict = iota // the next one in order
	stale                  // already applied (a replay overlap): skip
	gap                    // some were missed: replay them, else resync
	restart                // the publisher started over: clear, then apply
)

// stream follows one publisher's sequence numbers.
type stream struct {
	seen bool
	last uint64
}

// check classifies seq; it does not advance the stream (see advance).
// A publisher that restarts counts from 0 again, so a seq of 0 after others
// is a restart, as is any seq far behind the last.
func (s *stream) check(seq uint64) verdict {
	switch {
	case !s.seen:
		// A subscriber that joins late has missed the blocks stored before:
		// the index under-reports them until they are stored again, which
		// routes no worse than not knowing.
		return apply
	case seq == s.last+1:
		return apply
	case seq == 0 || seq+restartBehind < s.last:
		return restart
	case seq <= s.last:
		return stale
	}
	return gap
}

// restartBehind is how far behind the last sequence number a message must
// be to mean the publisher restarted rather than a replay overlapping.
const restartBehind = 1 << 20

func (s *stream) advance(seq uint64) { s.seen, s.last = true, seq }

// Subscriber feeds one replica's events into an Index.
type Subscriber struct {
	src Source
	idx *Index
	log *slog.Logger
	now func() time.Time
	st  stream

	// Counters, written by Handle; read them after Run returns.
	Gaps, Replayed, Resyncs, Malformed uint64
}

// NewSubscriber returns a subscriber for src writing into idx. It starts
// nothing; the owner calls Run.
func NewSubscriber(src Source, idx *Index, log *slog.Logger) *Subscriber {
	if log == nil {
		log = slog.Default()
	}
	return &Subscriber{src: src, idx: idx, log: log.With("replica", src.Replica, "kv_events", src.Endpoint), now: time.Now}
}

// Handle applies one message (a sequence number and its payload); it is the
// subscriber's core, and Run feeds it what the socket receives. replay
// fetches the missed batches from a sequence number on (nil when the
// replica has no replay socket).
func (s *Subscriber) Handle(seq uint64, payload []byte, replay func(from uint64) ([]Message, error)) {
	s.handle(seq, s.now(), replay, func() (Batch, error) { return Decode(payload) })
}

// HandleBatch is Handle for a batch already decoded, received at now, with
// no replay socket: the benchmark feeds its in-process engines' events
// through it.
func (s *Subscriber) HandleBatch(seq uint64, b Batch, now time.Time) {
	s.handle(seq, now, nil, func() (Batch, error) { return b, nil })
}

func (s *Subscriber) handle(seq uint64, now time.Time, replay func(from uint64) ([]Message, error), batch func() (Batch, error)) {
	switch s.st.check(seq) {
	case stale:
		return
	case restart:
		s.log.Info("kvevents: publisher restarted; clearing the replica's entries", "seq", seq, "last", s.st.last)
		s.Resyncs++
		s.idx.Clear(s.src.Replica, now)
	case gap:
		s.Gaps++
		if !s.replay(seq, replay) {
			s.log.Warn("kvevents: missed events; clearing the replica's entries", "from", s.st.last+1, "to", seq)
			s.Resyncs++
			s.idx.Clear(s.src.Replica, now)
		}
	}
	b, err := batch()
	s.apply(seq, b, err, now)
}

// replay fetches and applies the batches between the stream's last and seq;
// it reports whether the gap was closed.
func (s *Subscriber) replay(seq uint64, replay func(from uint64) ([]Message, error)) bool {
	if replay == nil {
		return false
	}
	msgs, err := replay(s.st.last + 1)
	if err != nil {
		s.log.Warn("kvevents: replay failed", "err", err)
		return false
	}
	now := s.now()
	for _, m := range msgs {
		if m.Seq >= seq {
			break
		}
		if m.Seq != s.st.last+1 {
			if m.Seq <= s.st.last {
				continue
			}
			return false // the publisher's buffer no longer holds them
		}
		b, err := Decode(m.Payload)
		s.apply(m.Seq, b, err, now)
		s.Replayed++
	}
	return s.st.last+1 == seq
}

func (s *Subscriber) apply(seq uint64, b Batch, err error, now time.Time) {
	s.st.advance(seq)
	if err != nil {
		// A batch we cannot read is a batch missed: what it stored or
		// removed is unknown, so start over rather than drift.
		s.Malformed++
		s.Resyncs++
		s.log.Warn("kvevents: unreadable batch; clearing the replica's entries", "seq", seq, "err", err)
		s.idx.Clear(s.src.Replica, now)
		return
	}
	if n := s.idx.Apply(s.src.Replica, b, now); n > 0 {
		s.log.Warn("kvevents: replica exceeds its block budget; stores refused", "refused", n)
	}
}

// Message is one published batch: its sequence number and payload.
type Message struct {
	Seq     uint64
	Payload []byte
}

// endSeq ends a replay: vLLM sends -1 as a signed 8-byte big-endian number.
const endSeq = ^uint64(0)

// Run subscribes to the replica's PUB socket and feeds the index until ctx
// is cancelled. The socket redials by itself when the publisher goes away.
func (s *Subscriber) Run(ctx context.Context) error {
	sub := zmq4.NewSub(ctx, zmq4.WithDialerRetry(time.Second), zmq4.WithAutomaticReconnect(true))
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, s.src.Topic); err != nil {
		return fmt.Errorf("kvevents: subscribe: %w", err)
	}
	if err := sub.Dial(s.src.Endpoint); err != nil {
		return fmt.Errorf("kvevents: dial %s: %w", s.src.Endpoint, err)
	}
	var replay func(uint64) ([]Message, error)
	if s.src.Replay != "" {
		replay = func(from uint64) ([]Message, error) { return s.fetchReplay(ctx, from) }
	}
	for {
		msg, err := sub.Recv()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return fmt.Errorf("kvevents: receive from %s: %w", s.src.Endpoint, err)
		}
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
			s.Malformed++
			s.log.Warn("kvevents: message without topic, sequence and payload frames", "frames", len(msg.Frames))
			continue
		}
		s.Handle(binary.BigEndian.Uint64(msg.Frames[1]), msg.Frames[2], replay)
	}
}

// maxReplay bounds the batches one replay may return (vLLM keeps 10,000).
const maxReplay = 100_000

// maxReplayBytes bounds the payload bytes one replay may return.
const maxReplayBytes = 64 << 20

// replayTimeout bounds one replay exchange.
const replayTimeout = 5 * time.Second

// fetchReplay asks the replay ROUTER for the batches from seq from on. A
// DEALER sends an empty delimiter and the number; the ROUTER answers with
// (delimiter, seq, payload) per batch and a final seq of -1.
func (s *Subscriber) fetchReplay(ctx context.Context, from uint64) ([]Message, error) {
	ctx, cancel := context.WithTimeout(ctx, replayTimeout)
	defer cancel()
	d := zmq4.NewDealer(ctx, zmq4.WithTimeout(replayTimeout))
	defer d.Close()
	if err := d.Dial(s.src.Replay); err != nil {
		return nil, fmt.Errorf("kvevents: dial replay %s: %w", s.src.Replay, err)
	}
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], from)
	if err := d.SendMulti(zmq4.NewMsgFrom([]byte{}, seq[:])); err != nil {
		return nil, fmt.Errorf("kvevents: replay request: %w", err)
	}
	var out []Message
	size := 0
	for len(out) <= maxReplay && size <= maxReplayBytes {
		m, err := d.Recv()
		if err != nil {
			return nil, fmt.Errorf("kvevents: replay: %w", err)
		}
		f := m.Frames
		if len(f) == 3 && len(f[0]) == 0 {
			f = f[1:]
		}
		if len(f) != 2 || len(f[0]) != 8 {
			return nil, errors.New("kvevents: replay: malformed reply")
		}
		n := binary.BigEndian.Uint64(f[0])
		if n == endSeq {
			return out, nil
		}
		out = append(out, Message{Seq: n, Payload: f[1]})
		size += len(f[1])
	}
	return nil, fmt.Errorf("kvevents: replay: more than %d batches or %d bytes", maxReplay, maxReplayBytes)
}
