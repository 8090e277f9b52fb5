package simreplica

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/llmlb/llmlb/internal/kvevents"
)

// KVEventsOptions makes a replica publish its KV cache events as vLLM does
// with `--kv-events-config '{"publisher": "zmq", ...}'`: the same wire
// format on a PUB socket, and a replay ROUTER socket.
type KVEventsOptions struct {
	Endpoint string        // PUB socket, tcp://host:port (port 0: any)
	Replay   string        // replay socket; "" for none
	Lag      time.Duration // each batch is sent this late
	Loss     float64       // share of batches not sent (a replay still has them)
	Every    time.Duration // how often the engine's events are batched (default 10 ms)
	Seed     uint64        // draws of Loss
}

// KVEvents is a replica's running publisher.
type KVEvents struct {
	r    *Replica
	pub  *kvevents.Publisher
	opts KVEventsOptions
	rng  *rand.Rand
	q    []kvBatch
}

type kvBatch struct {
	at time.Time
	b  kvevents.Batch
}

// PublishKVEvents binds the replica's event sockets and turns on its
// engine's event log. It starts nothing: the owner runs Run.
func (r *Replica) PublishKVEvents(ctx context.Context, o KVEventsOptions) (*KVEvents, error) {
	if o.Loss < 0 || o.Loss >= 1 {
		return nil, fmt.Errorf("simreplica: kv events loss %g: must be in [0, 1)", o.Loss)
	}
	if o.Every <= 0 {
		o.Every = 10 * time.Millisecond
	}
	pub, err := kvevents.NewPublisher(ctx, o.Endpoint, o.Replay, "", 10_000)
	if err != nil {
		return nil, fmt.Errorf("simreplica: %w", err)
	}
	r.mu.Lock()
	r.eng.RecordKVEvents(true)
	r.mu.Unlock()
	return &KVEvents{r: r, pub: pub, opts: o, rng: rand.New(rand.NewPCG(o.Seed, 0x6b76))}, nil
}

// Endpoint is the PUB socket's tcp:// address.
func (k *KVEvents) Endpoint() string { return k.pub.Endpoint() }

// ReplayEndpoint is the replay socket's tcp:// address, "" without one.
func (k *KVEvents) ReplayEndpoint() string { return k.pub.ReplayEndpoint() }

// ResetPrefixCache empties the replica's prefix cache, which publishes
// AllBlocksCleared, and reports whether it did (not while requests run).
func (k *KVEvents) ResetPrefixCache() bool {
	k.r.mu.Lock()
	defer k.r.mu.Unlock()
	return k.r.eng.ResetPrefixCache()
}

// Run batches the engine's events every Every and sends each Lag later,
// until ctx is cancelled; then it closes the sockets.
func (k *KVEvents) Run(ctx context.Context) {
	defer k.pub.Close()
	go k.pub.ServeReplay(ctx)
	t := time.NewTicker(k.opts.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			k.step(now)
		}
	}
}

// step takes the events since the last one and sends the batches due.
func (k *KVEvents) step(now time.Time) {
	k.r.mu.Lock()
	evs := k.r.eng.DrainKVEvents(nil)
	k.r.mu.Unlock()
	if k.r.toks != nil {
		evs = k.r.toks.events(evs)
	}
	if len(evs) > 0 {
		k.q = append(k.q, kvBatch{at: now.Add(k.opts.Lag), b: kvevents.Batch{TS: float64(now.UnixNano()) / 1e9, Events: evs}})
	}
	n := 0
	for ; n < len(k.q) && !k.q[n].at.After(now); n++ {
		if k.opts.Loss > 0 && k.rng.Float64() < k.opts.Loss {
			k.pub.Skip(k.q[n].b)
			continue
		}
		if err := k.pub.Publish(k.q[n].b); err != nil {
			k.r.log.Warn("simreplica: publishing kv events", "err", err)
		}
	}
	k.q = k.q[:copy(k.q, k.q[n:])]
}
