package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/llmlb/llmlb/internal/simreplica"
)

// simKVEvents is sim's --kv-events-* flags: each replica publishes its KV
// cache events over ZMQ as vLLM does.
type simKVEvents struct {
	offset int
	lag    time.Duration
	loss   float64
}

func (k *simKVEvents) flags(fs *flag.FlagSet) {
	fs.IntVar(&k.offset, "kv-events-offset", 0, "each replica publishes its KV cache events (vLLM's ZMQ format) on tcp://HOST:PORT+this, with a replay socket at +this+1000; 0 disables")
	fs.DurationVar(&k.lag, "kv-events-lag", 0, "--kv-events-offset: send each batch of events this late")
	fs.Float64Var(&k.loss, "kv-events-loss", 0, "--kv-events-offset: share of batches not sent (the replay socket still has them)")
}

// start binds every replica's event sockets and runs the publishers until
// ctx is cancelled; it prints each replica's endpoints.
func (k *simKVEvents) start(ctx context.Context, fleet *simreplica.Fleet, stdout io.Writer) error {
	if k.offset == 0 {
		if k.lag != 0 || k.loss != 0 {
			return fmt.Errorf("--kv-events-lag and --kv-events-loss need --kv-events-offset")
		}
		return nil
	}
	for i, r := range fleet.Replicas {
		host, port, err := net.SplitHostPort(r.Addr())
		if err != nil {
			return err
		}
		p, _ := strconv.Atoi(port)
		ev, err := r.PublishKVEvents(ctx, simreplica.KVEventsOptions{
			Endpoint: "tcp://" + net.JoinHostPort(host, strconv.Itoa(p+k.offset)),
			Replay:   "tcp://" + net.JoinHostPort(host, strconv.Itoa(p+k.offset+1000)),
			Lag:      k.lag, Loss: k.loss, Seed: uint64(i + 1),
		})
		if err != nil {
			return err
		}
		go ev.Run(ctx)
		fmt.Fprintf(stdout, "  %s  kv_events %s  kv_events_replay %s\n", r.Name(), ev.Endpoint(), ev.ReplayEndpoint())
	}
	return nil
}
