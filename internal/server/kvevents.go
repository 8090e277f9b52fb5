package server

import (
	"context"
	"log/slog"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/kvevents"
)

// kvFeed subscribes to the KV cache events of the replicas configured with
// kv_events and hands the policy the index they feed (docs/KV_EVENTS.md).
type kvFeed struct {
	idx     *kvevents.Index
	sources []kvevents.Source
	log     *slog.Logger
}

// newKVFeed returns the feed for cfg's publishing replicas, or nil if none
// publishes. Replicas added later (admin API, discovery, reload) are not
// subscribed to.
func newKVFeed(cfg config.Config, bal *balancer.Balancer, log *slog.Logger) *kvFeed {
	f := &kvFeed{idx: kvevents.NewIndex(0), log: log}
	for _, r := range cfg.Replicas {
		if r.KVEvents == "" {
			continue
		}
		name := r.Name
		if name == "" {
			name = defaultName(r.URL)
		}
		f.sources = append(f.sources, kvevents.Source{Replica: name, Endpoint: r.KVEvents, Replay: r.KVEventsReplay})
	}
	if len(f.sources) == 0 {
		return nil
	}
	if !bal.SetPreciseIndex(f.idx) {
		log.Warn("server: replicas publish KV events but the policy does not read them; use policy cost", slog.String("policy", bal.Policy()))
	}
	return f
}

// KVEventsIndex is the index the replicas' events feed (nil when none publishes).
func (s *Server) KVEventsIndex() *kvevents.Index {
	if s.kv == nil {
		return nil
	}
	return s.kv.idx
}

func (f *kvFeed) run(ctx context.Context) {
	f.log.Info("server: subscribing to replicas' KV cache events", slog.Int("replicas", len(f.sources)))
	kvevents.Run(ctx, f.sources, f.idx, 0, f.log)
}
