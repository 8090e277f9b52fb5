package kvevents

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// DefaultMaxAge is how long a replica's entries outlive its last batch.
// vLLM publishes a batch every engine step that stores or evicts, so an
// engine that serves traffic and stays silent this long is not publishing.
const DefaultMaxAge = 60 * time.Second

// Run subscribes to every source, feeding idx, and every maxAge/4 forgets
// the replicas whose events stopped (maxAge < 1 means DefaultMaxAge). It
// returns when ctx is cancelled; a subscriber that fails is logged and
// retried after a second.
func Run(ctx context.Context, sources []Source, idx *Index, maxAge time.Duration, log *slog.Logger) {
	if log == nil {
		log = slog.Default()
	}
	if maxAge < 1 {
		maxAge = DefaultMaxAge
	}
	var wg sync.WaitGroup
	for _, src := range sources {
		wg.Go(func() {
			for ctx.Err() == nil {
				if err := NewSubscriber(src, idx, log).Run(ctx); err != nil {
					log.Warn("kvevents: subscriber stopped", "replica", src.Replica, "err", err)
				}
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
		})
	}
	t := time.NewTicker(maxAge / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case now := <-t.C:
			for _, rep := range idx.Expire(now, maxAge) {
				log.Info("kvevents: replica's events stopped; its entries expired", "replica", rep)
			}
		}
	}
}
