package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/discovery"
	"github.com/llmlb/llmlb/internal/replicaurl"
)

// WithDiscovery replaces the discovery source built from the config's
// discovery: section (tests inject a fake source).
func WithDiscovery(src discovery.Source) Option { return func(o *options) { o.discovery = src } }

// runDiscovery keeps the discovered replicas in step with the source until
// ctx is cancelled (a no-op without a source).
func (s *Server) runDiscovery(ctx context.Context) {
	if s.discovery == nil {
		return
	}
	err := s.syncer.Run(ctx, s.discovery, TickInterval, s.now)
	if err != nil && !errors.Is(err, context.Canceled) {
		s.log.Error("server: discovery stopped", slog.String("error", err.Error()))
	}
}

// Syncer returns the discovery syncer (nil without discovery).
func (s *Server) Syncer() *discovery.Syncer { return s.syncer }

// discoveryFleet implements discovery.Fleet with the admin API's path.
type discoveryFleet struct{ s *Server }

// AddReplica checks the discovered name and URL as the admin API does and
// adds the replica with the discovery api key, scraped as scrape.metrics
// says.
func (f discoveryFleet) AddReplica(t discovery.Target, apiKey string) error {
	if err := replicaurl.CheckName(t.Name); err != nil {
		return fmt.Errorf("server: discovered replica: %w", err)
	}
	if probs := replicaurl.Check(t.URL); len(probs) > 0 {
		return fmt.Errorf("server: discovered replica %s: %s", t.Name, probs[0])
	}
	f.s.reloadMu.Lock()
	defer f.s.reloadMu.Unlock()
	if err := f.s.checkNotSelf(t.URL); err != nil {
		return fmt.Errorf("server: discovered replica %s: %w", t.Name, err)
	}
	return f.s.addReplica(balancer.ReplicaSpec{Name: t.Name, URL: t.URL, Models: t.Models}, apiKey, "", kvSource{endpoint: t.KVEvents, replay: t.KVEventsReplay})
}

// SetDraining stops or resumes new traffic to a replica.
func (f discoveryFleet) SetDraining(name string, draining bool) bool {
	ok := f.s.bal.SetDraining(name, draining)
	f.s.proxy.Pump()
	return ok
}

// InFlight is the replica's in-flight request count.
func (f discoveryFleet) InFlight(name string) (int, bool) {
	for _, r := range f.s.bal.Replicas(f.s.now()) {
		if r.Name == name {
			return r.InFlight, true
		}
	}
	return 0, false
}

// RemoveReplica stops scraping the replica and removes it from the core.
func (f discoveryFleet) RemoveReplica(name string) bool {
	f.s.reloadMu.Lock()
	defer f.s.reloadMu.Unlock()
	return f.s.removeReplica(name)
}
