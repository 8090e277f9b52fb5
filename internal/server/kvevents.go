package server

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/kvevents"
)

// kvFeed subscribes to the KV cache events of every replica that has a
// kv_events endpoint, whichever way it joined (the config file, a reload,
// the admin API, discovery), unsubscribes when it leaves, and hands the
// policy the index they feed (docs/KV_EVENTS.md).
type kvFeed struct {
	feed     *kvevents.Feed
	bal      *balancer.Balancer
	log      *slog.Logger
	attached atomic.Bool // the policy reads the index
}

// kvSource is where a replica publishes its KV cache events; the zero
// value: it does not.
type kvSource struct{ endpoint, replay string }

func newKVFeed(bal *balancer.Balancer, log *slog.Logger, now func() time.Time) *kvFeed {
	// A replica whose health checks pass is still there: its quiet
	// publisher keeps its entries (Index.Expire).
	live := func() map[string]bool {
		out := make(map[string]bool)
		for _, r := range bal.Replicas(now()) {
			if r.State == "LIVE" {
				out[r.Name] = true
			}
		}
		return out
	}
	return &kvFeed{feed: kvevents.NewFeed(kvevents.NewIndex(0), 0, live, log), bal: bal, log: log}
}

// set subscribes to replica name's events at src, or unsubscribes when src
// is the zero value. The first replica that publishes hands the policy
// the index.
func (f *kvFeed) set(name string, src kvSource) {
	if src.endpoint == "" {
		f.remove(name)
		return
	}
	if !f.feed.Set(kvevents.Source{Replica: name, Endpoint: src.endpoint, Replay: src.replay}) {
		return
	}
	keys := "engine block hashes (only llmlb sim's match; configure tokenizers for a real vLLM)"
	if f.feed.Index().KeyByTokens() {
		keys = "token ids"
	}
	f.log.Info("server: subscribing to a replica's KV cache events", slog.String("replica", name), slog.String("kv_events", src.endpoint), slog.String("matched_by", keys))
	if f.attached.CompareAndSwap(false, true) && !f.bal.SetPreciseIndex(f.feed.Index()) {
		f.log.Warn("server: replicas publish KV events but the policy does not read them; use policy cost", slog.String("policy", f.bal.Policy()))
	}
}

// remove unsubscribes from replica name's events and forgets its entries.
func (f *kvFeed) remove(name string) {
	if f.feed.Remove(name) {
		f.log.Info("server: unsubscribed from a replica's KV cache events", slog.String("replica", name))
	}
}

// KVEventsIndex is the index the replicas' events feed (nil while none
// publishes).
func (s *Server) KVEventsIndex() *kvevents.Index {
	if !s.kv.attached.Load() {
		return nil
	}
	return s.kv.feed.Index()
}

// KVEventsSources returns the replicas subscribed to, with their endpoints.
func (s *Server) KVEventsSources() []kvevents.Source { return s.kv.feed.Sources() }

func (f *kvFeed) run(ctx context.Context) { f.feed.Run(ctx) }
