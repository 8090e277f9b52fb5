package main

import (
	"errors"
	"flag"
	"fmt"
	"time"
)

// benchKVEvents is bench's --kv-events flags: cost fed by the simulated
// engines' own KV events.
type benchKVEvents struct {
	on   bool
	lag  time.Duration
	loss float64
}

func (k *benchKVEvents) flags(fs *flag.FlagSet) {
	fs.BoolVar(&k.on, "kv-events", false, "cost reads what each replica holds from the engines' own KV cache events (docs/KV_EVENTS.md) instead of its own guess")
	fs.DurationVar(&k.lag, "kv-events-lag", 0, "--kv-events: how late each batch of events reaches the balancer")
	fs.Float64Var(&k.loss, "kv-events-loss", 0, "--kv-events: share of event batches lost on the way (a loss clears that replica's entries until its next events)")
}

func (k *benchKVEvents) validate() error {
	switch {
	case k.lag < 0:
		return fmt.Errorf("--kv-events-lag %s: must be >= 0", k.lag)
	case k.loss < 0 || k.loss >= 1:
		return fmt.Errorf("--kv-events-loss %g: must be in [0, 1)", k.loss)
	case !k.on && (k.lag != 0 || k.loss != 0):
		return errors.New("--kv-events-lag and --kv-events-loss need --kv-events")
	}
	return nil
}
