// Package discovery keeps the fleet in step with a source of replicas
// (Kubernetes, DNS, GPUStack). A Source reports the whole desired set each
// time it changes; a Syncer compares it with the replicas it added before
// and applies the difference through the same add / drain / remove path as
// the admin API: a replica that leaves the set drains (no new traffic, its
// in-flight responses finish) and is removed once idle or after the drain
// timeout. Replicas the Syncer did not add (static ones, the admin API's)
// are never touched.
package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/llmlb/llmlb/internal/replicaurl"
)

// Target is one replica a source wants in the fleet.
type Target struct {
	Name   string   // replica name (replicaurl.CheckName's charset)
	URL    string   // server root, http(s)://host:port
	Models []string // served models; empty: learned from /v1/models
	// KVEvents and KVEventsReplay are the replica's KV cache event
	// publisher and replay socket, tcp://host:port ("" none), where the
	// source can tell them (discovery.kubernetes.kv_events_port).
	KVEvents, KVEventsReplay string
}

// Source produces the desired replica set continuously.
type Source interface {
	// Run calls update with the complete desired set whenever it may have
	// changed, until ctx is cancelled. A source that cannot read its
	// backend keeps the last set (it does not report an empty one) and
	// retries. Run returns ctx.Err() when cancelled, or an error when it
	// cannot start at all.
	Run(ctx context.Context, update func([]Target)) error
}

// Fleet is what the Syncer changes: the server's add / drain / remove path.
type Fleet interface {
	// AddReplica adds a replica with the api key sent to it ("" none).
	AddReplica(t Target, apiKey string) error
	// SetDraining stops (or resumes) new traffic to a replica.
	SetDraining(name string, draining bool) bool
	// InFlight is the replica's in-flight request count; ok is false when
	// it is no longer in the fleet.
	InFlight(name string) (n int, ok bool)
	// RemoveReplica removes a replica (scraping stops).
	RemoveReplica(name string) bool
}

// Event is one change the Syncer applied, for logs and tests.
type Event struct {
	Kind    string // added | draining | undrained | removed | failed
	Replica string
	Detail  string // why (e.g. "in-flight finished", "drain timeout", an error)
}

// entry is a replica the Syncer added.
type entry struct {
	target        Target
	drainingSince time.Time // zero: wanted
}

// Syncer applies desired sets to a Fleet. Apply and Sweep are the core
// (time is a parameter, nothing runs in the background); Run is the shell
// that feeds them from a Source and a ticker.
type Syncer struct {
	fleet        Fleet
	apiKey       string
	drainTimeout time.Duration
	log          *slog.Logger

	mu      sync.Mutex
	managed map[string]*entry
}

// NewSyncer returns a Syncer that adds replicas to fleet with apiKey and
// removes a draining replica after at most drainTimeout (0: at once, as
// soon as it leaves the set).
func NewSyncer(fleet Fleet, apiKey string, drainTimeout time.Duration, logger *slog.Logger) *Syncer {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Syncer{fleet: fleet, apiKey: apiKey, drainTimeout: drainTimeout, log: logger, managed: make(map[string]*entry)}
}

// Apply makes the fleet's discovered replicas the desired set: new targets
// are added, targets that came back while draining resume, and managed
// replicas missing from the set start draining. A target whose URL or
// models changed under the same name is replaced at once (the balancer
// lets its in-flight responses finish). It returns what it changed,
// sorted by replica name.
func (s *Syncer) Apply(desired []Target, now time.Time) []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	want := make(map[string]Target, len(desired))
	for _, t := range desired {
		want[t.Name] = t
	}
	var evs []Event
	for _, name := range slices.Sorted(maps.Keys(s.managed)) {
		e := s.managed[name]
		t, ok := want[name]
		switch {
		case !ok && e.drainingSince.IsZero():
			s.fleet.SetDraining(name, true)
			e.drainingSince = now
			evs = append(evs, Event{Kind: "draining", Replica: name, Detail: "left the discovered set"})
		case ok && !sameTarget(e.target, t):
			s.fleet.RemoveReplica(name)
			delete(s.managed, name)
			evs = append(evs, Event{Kind: "removed", Replica: name, Detail: "replaced: its URL, models or KV event endpoints changed"})
		case ok && !e.drainingSince.IsZero():
			s.fleet.SetDraining(name, false)
			e.drainingSince = time.Time{}
			evs = append(evs, Event{Kind: "undrained", Replica: name, Detail: "back in the discovered set"})
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if _, ok := s.managed[name]; ok {
			continue
		}
		t := want[name]
		if err := s.fleet.AddReplica(t, s.apiKey); err != nil {
			// A name taken by a static or admin replica, or a bad URL: tried
			// again with the next set.
			evs = append(evs, Event{Kind: "failed", Replica: name, Detail: err.Error()})
			continue
		}
		s.managed[name] = &entry{target: t}
		evs = append(evs, Event{Kind: "added", Replica: name, Detail: t.URL})
	}
	s.logEvents(evs)
	return evs
}

// Sweep removes draining replicas whose in-flight requests have finished,
// or whose drain timeout has passed.
func (s *Syncer) Sweep(now time.Time) []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	var evs []Event
	for _, name := range slices.Sorted(maps.Keys(s.managed)) {
		e := s.managed[name]
		if e.drainingSince.IsZero() {
			continue
		}
		n, ok := s.fleet.InFlight(name)
		var why string
		switch {
		case !ok:
			why = "already gone"
		case n == 0:
			why = "in-flight finished"
		case now.Sub(e.drainingSince) >= s.drainTimeout:
			why = fmt.Sprintf("drain timeout with %d in flight", n)
		default:
			continue
		}
		s.fleet.RemoveReplica(name)
		delete(s.managed, name)
		evs = append(evs, Event{Kind: "removed", Replica: name, Detail: why})
	}
	s.logEvents(evs)
	return evs
}

// Managed returns the names of the replicas the Syncer added and has not
// removed yet (draining ones included), sorted.
func (s *Syncer) Managed() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.managed))
}

// Run feeds the source's sets to Apply and calls Sweep every interval
// until ctx is cancelled; it returns nil then, or the source's error when
// the source could not start.
func (s *Syncer) Run(ctx context.Context, src Source, interval time.Duration, now func() time.Time) error {
	if now == nil {
		now = time.Now
	}
	if interval <= 0 {
		interval = time.Second
	}
	updates := make(chan []Target, 1)
	srcErr := make(chan error, 1)
	go func() {
		srcErr <- src.Run(ctx, func(ts []Target) {
			// Only the newest set matters: replace one not yet applied.
			select {
			case <-updates:
			default:
			}
			updates <- slices.Clone(ts)
		})
	}()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			<-srcErr
			return nil
		case err := <-srcErr:
			if err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
			<-ctx.Done()
			return nil
		case ts := <-updates:
			s.Apply(ts, now())
			s.Sweep(now())
		case <-t.C:
			s.Sweep(now())
		}
	}
}

func (s *Syncer) logEvents(evs []Event) {
	for _, e := range evs {
		level := slog.LevelInfo
		if e.Kind == "failed" {
			level = slog.LevelWarn
		}
		s.log.LogAttrs(context.Background(), level, "discovery: replica "+e.Kind,
			slog.String("replica", e.Replica), slog.String("detail", e.Detail))
	}
}

func sameTarget(a, b Target) bool {
	return a.URL == b.URL && slices.Equal(a.Models, b.Models) && a.KVEvents == b.KVEvents && a.KVEventsReplay == b.KVEventsReplay
}

// New builds the source configured in d (nil for static).
func New(d Config, logger *slog.Logger) (Source, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	switch d.Type {
	case "", "static":
		return nil, nil
	case "kubernetes":
		return NewKubernetes(d.Kubernetes, logger)
	case "dns":
		return NewDNS(d.DNS, net.DefaultResolver, logger), nil
	case "gpustack":
		return NewGPUStack(d.Gpustack, nil, logger), nil
	}
	return nil, fmt.Errorf("discovery: discovery.type: unknown source %q", d.Type)
}

// targetName is the replica name of host:port, or preferred when it is a
// valid name and unique enough (a pod or instance name reads better in
// metrics than an address).
func targetName(preferred, host string, port int) string {
	if preferred != "" && replicaurl.CheckName(preferred) == nil {
		return preferred
	}
	return net.JoinHostPort(host, strconv.Itoa(port))
}

// targetURL is scheme://host:port.
func targetURL(scheme, host string, port int) string {
	return scheme + "://" + net.JoinHostPort(host, strconv.Itoa(port))
}

// kvEndpoint is tcp://host:port, or "" when port is 0 (none).
func kvEndpoint(host string, port int) string {
	if port == 0 {
		return ""
	}
	return targetURL("tcp", host, port)
}

// pollEvery is the loop of the polling sources (DNS, GPUStack): fetch at
// once and then every interval until ctx ends; a set fetched goes to
// update, a failure to failed and the last set stays.
func pollEvery(ctx context.Context, interval time.Duration, fetch func(context.Context) ([]Target, error),
	update func([]Target), failed func(error)) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		ts, err := fetch(ctx)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			failed(err)
		default:
			update(ts)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
