package sharedstate

import (
	"fmt"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
)

// Bus is shared state in memory, for the benchmark: the same Deltas and
// loads as Redis carries, between cores in one process, delivered Delay
// after they were made on the caller's clock (virtual time), so a run is
// deterministic and needs no Redis. It is not safe for concurrent use: one
// benchmark run drives it from its event loop.
type Bus struct {
	Delay   time.Duration // propagation delay of every change and load
	LoadTTL time.Duration // how long a published load counts (Config.LoadTTL)

	cores   []Core
	pending []busMsg // FIFO; with one Delay it is ordered by due time
	head    int
}

type busMsg struct {
	due   time.Time
	from  int
	delta balancer.Delta
	loads []balancer.ReplicaLoad // a load message when non-nil
	ttl   time.Time
}

// NewBus returns a bus between cores; Member(i) is core i's Sharer.
func NewBus(delay, loadTTL time.Duration, cores ...Core) *Bus {
	return &Bus{Delay: delay, LoadTTL: loadTTL, cores: cores}
}

// Member returns the Sharer of core i.
func (b *Bus) Member(i int) balancer.Sharer { return member{b, i} }

type member struct {
	b *Bus
	i int
}

// Publish queues d for every other core, due Delay after d.At.
func (m member) Publish(d balancer.Delta) {
	if len(d.Blocks) > 0 {
		d.Blocks = append([]uint64(nil), d.Blocks...)
	}
	m.b.pending = append(m.b.pending, busMsg{due: d.At.Add(m.b.Delay), from: m.i, delta: d})
}

// PublishLoad queues core i's current load for the others, as the Redis
// writer does every load_interval.
func (b *Bus) PublishLoad(i int, now time.Time) {
	loads := b.cores[i].Load()
	if loads == nil {
		loads = []balancer.ReplicaLoad{}
	}
	b.pending = append(b.pending, busMsg{due: now.Add(b.Delay), from: i, loads: loads, ttl: now.Add(b.LoadTTL)})
}

// Next returns when the next message is due (false: none pending).
func (b *Bus) Next() (time.Time, bool) {
	if b.head >= len(b.pending) {
		return time.Time{}, false
	}
	return b.pending[b.head].due, true
}

// Deliver applies every message due at or before now to every core but
// its sender, in publication order, and returns how many it delivered.
func (b *Bus) Deliver(now time.Time) int {
	n := 0
	for b.head < len(b.pending) && !b.pending[b.head].due.After(now) {
		m := b.pending[b.head]
		b.pending[b.head] = busMsg{}
		b.head++
		for j, c := range b.cores {
			if j == m.from {
				continue
			}
			if m.loads != nil {
				c.SetPeerLoad(peerName(m.from), m.loads, m.ttl, now)
			} else {
				c.Apply(m.delta, now)
			}
		}
		n++
	}
	if b.head == len(b.pending) { // reuse the backing array
		b.pending, b.head = b.pending[:0], 0
	}
	return n
}

func peerName(i int) string { return fmt.Sprintf("balancer-%d", i+1) }
