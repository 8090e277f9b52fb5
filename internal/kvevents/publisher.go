package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"sync"

	"github.com/go-zeromq/zmq4"
)

// Publisher sends batches as vLLM's ZMQ publisher does: multipart messages
// (topic, 8-byte big-endian sequence number from 0, payload) on a PUB
// socket, and, when it has a replay socket, answers replay requests from
// the last bufSteps batches. The simulator publishes with it.
type Publisher struct {
	pub, replay zmq4.Socket
	topic       []byte

	mu   sync.Mutex
	seq  uint64
	buf  []Message // ring of the last batches, oldest at head
	head int
}

// NewPublisher listens on endpoint (tcp://host:port; port 0 picks one) and,
// if replayEndpoint is not "", on a replay ROUTER socket. It starts no
// goroutine: the owner runs ServeReplay when there is a replay socket.
func NewPublisher(ctx context.Context, endpoint, replayEndpoint, topic string, bufSteps int) (*Publisher, error) {
	p := &Publisher{pub: zmq4.NewPub(ctx), topic: []byte(topic), buf: make([]Message, 0, max(bufSteps, 1))}
	if err := p.pub.Listen(endpoint); err != nil {
		p.pub.Close()
		return nil, fmt.Errorf("kvevents: listen %s: %w", endpoint, err)
	}
	if replayEndpoint != "" {
		p.replay = zmq4.NewRouter(ctx)
		if err := p.replay.Listen(replayEndpoint); err != nil {
			p.Close()
			return nil, fmt.Errorf("kvevents: listen %s: %w", replayEndpoint, err)
		}
	}
	return p, nil
}

// Endpoint is the PUB socket's address as tcp://host:port.
func (p *Publisher) Endpoint() string { return tcpURL(p.pub.Addr()) }

// ReplayEndpoint is the replay socket's address, or "" without one.
func (p *Publisher) ReplayEndpoint() string {
	if p.replay == nil {
		return ""
	}
	return tcpURL(p.replay.Addr())
}

func tcpURL(a net.Addr) string {
	if a == nil {
		return ""
	}
	return "tcp://" + a.String()
}

// Publish encodes b and sends it with the next sequence number.
func (p *Publisher) Publish(b Batch) error {
	_, err := p.publish(b, true)
	return err
}

// Skip spends the next sequence number on b without sending it, but keeps
// it for replay: a message lost on the way, as a subscriber sees it.
func (p *Publisher) Skip(b Batch) { _, _ = p.publish(b, false) }

func (p *Publisher) publish(b Batch, send bool) (uint64, error) {
	payload := Encode(b)
	p.mu.Lock()
	defer p.mu.Unlock()
	seq := p.seq
	p.seq++
	m := Message{Seq: seq, Payload: payload}
	if len(p.buf) < cap(p.buf) {
		p.buf = append(p.buf, m)
	} else {
		p.buf[p.head] = m
		p.head = (p.head + 1) % len(p.buf)
	}
	if !send {
		return seq, nil
	}
	var sb [8]byte
	binary.BigEndian.PutUint64(sb[:], seq)
	if err := p.pub.SendMulti(zmq4.NewMsgFrom(p.topic, sb[:], payload)); err != nil {
		return seq, fmt.Errorf("kvevents: publish: %w", err)
	}
	return seq, nil
}

// ServeReplay answers replay requests until ctx is cancelled or the socket
// closes: for a request (identity, "", seq) it sends every buffered batch
// from seq on, then the end marker -1, as vLLM does.
func (p *Publisher) ServeReplay(ctx context.Context) {
	if p.replay == nil {
		return
	}
	for ctx.Err() == nil {
		req, err := p.replay.Recv()
		if err != nil {
			return
		}
		f := req.Frames
		if len(f) < 2 {
			continue
		}
		id, seqFrame := f[0], f[len(f)-1]
		if len(seqFrame) != 8 {
			continue
		}
		from := binary.BigEndian.Uint64(seqFrame)
		p.mu.Lock()
		var out []Message
		for i := range p.buf {
			m := p.buf[(p.head+i)%len(p.buf)]
			if m.Seq >= from {
				out = append(out, m)
			}
		}
		p.mu.Unlock()
		var sb [8]byte
		for _, m := range out {
			binary.BigEndian.PutUint64(sb[:], m.Seq)
			if err := p.replay.SendMulti(zmq4.NewMsgFrom(id, []byte{}, sb[:], m.Payload)); err != nil {
				break
			}
		}
		binary.BigEndian.PutUint64(sb[:], endSeq)
		_ = p.replay.SendMulti(zmq4.NewMsgFrom(id, []byte{}, sb[:], []byte{}))
	}
}

// Close closes the sockets.
func (p *Publisher) Close() error {
	err := p.pub.Close()
	if p.replay != nil {
		if e := p.replay.Close(); err == nil {
			err = e
		}
	}
	return err
}
