package bench

import (
	"io"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/llmlb/llmlb/internal/kvevents"
)

// kvFeed carries the engines' KV events to the routing cores' shared
// event-fed index, as `serve` subscribes to each replica's publisher: one
// batch per engine advance, delivered lag later, lost with probability
// loss. Delivery is lazy: the index is read only when a request is routed,
// so the batches due by then are applied just before.
type kvFeed struct {
	idx  *kvevents.Index
	subs []*kvevents.Subscriber
	seq  []uint64
	lag  time.Duration
	loss float64
	rng  *rand.Rand
	q    []kvPending // in delivery order (the lag is constant)
	evs  []kvevents.Event
}

type kvPending struct {
	at  time.Duration
	rep int
	seq uint64
	b   kvevents.Batch
}

// engineKVEvents is what a simulated engine that logs its KV events offers;
// engine.Engine does.
type engineKVEvents interface {
	RecordKVEvents(on bool)
	DrainKVEvents(dst []kvevents.Event) []kvevents.Event
}

// setupKVEvents hands the run's cores the event-fed index (Options.KVEvents)
// when the policy reads one, and turns on the engines' event logs.
func (r *run) setupKVEvents() {
	o := r.opts
	if !o.KVEvents {
		return
	}
	f := &kvFeed{idx: kvevents.NewIndex(0), lag: o.KVEventsLag, loss: o.KVEventsLoss,
		rng: rand.New(rand.NewPCG(uint64(o.Seed), 0x6b76)), seq: make([]uint64, len(r.eng))}
	used := false
	for _, b := range r.bals {
		if b.SetPreciseIndex(f.idx) {
			used = true
		}
	}
	if !used {
		return
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for i, e := range r.eng {
		ke, ok := e.(engineKVEvents)
		if !ok {
			continue
		}
		ke.RecordKVEvents(true)
		f.subs = append(f.subs, kvevents.NewSubscriber(kvevents.Source{Replica: r.names[i]}, f.idx, quiet))
	}
	if len(f.subs) == len(r.eng) {
		r.kv = f
	}
}

// kvDrain takes engine i's events since its last advance as one batch.
func (r *run) kvDrain(i int) {
	f := r.kv
	if f == nil {
		return
	}
	f.evs = r.eng[i].(engineKVEvents).DrainKVEvents(f.evs[:0])
	if len(f.evs) == 0 {
		return
	}
	seq := f.seq[i]
	f.seq[i]++
	if f.loss > 0 && f.rng.Float64() < f.loss {
		return // lost on the way: the subscriber sees a gap
	}
	b := kvevents.Batch{TS: r.now.Seconds(), Events: append([]kvevents.Event(nil), f.evs...)}
	f.q = append(f.q, kvPending{at: r.now + f.lag, rep: i, seq: seq, b: b})
}

// kvDeliver applies the batches due by now.
func (r *run) kvDeliver() {
	f := r.kv
	if f == nil {
		return
	}
	n := 0
	for n < len(f.q) && f.q[n].at <= r.now {
		p := &f.q[n]
		f.subs[p.rep].HandleBatch(p.seq, p.b, Epoch.Add(p.at))
		n++
	}
	f.q = f.q[:copy(f.q, f.q[n:])]
}

// indexHit counts one first token's cached tokens against what the
// policy's index expected for it (expected 0: the policy keeps no index,
// or expected none).
func (a *accumulator) indexHit(expected, found int) {
	if expected <= 0 {
		return
	}
	a.indexExpected += uint64(expected)
	a.indexFound += uint64(min(max(found, 0), expected))
}
