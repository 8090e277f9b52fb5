package discovery

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// fakeFleet records the Syncer's calls; in-flight counts are set by the test.
type fakeFleet struct {
	mu       sync.Mutex
	replicas map[string]Target
	keys     map[string]string
	draining map[string]bool
	inFlight map[string]int
	taken    map[string]bool // names owned by someone else (static replicas)
}

func newFakeFleet() *fakeFleet {
	return &fakeFleet{replicas: map[string]Target{}, keys: map[string]string{}, draining: map[string]bool{},
		inFlight: map[string]int{}, taken: map[string]bool{}}
}

func (f *fakeFleet) AddReplica(t Target, apiKey string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.replicas[t.Name]; ok || f.taken[t.Name] {
		return fmt.Errorf("replica %q already exists", t.Name)
	}
	f.replicas[t.Name] = t
	f.keys[t.Name] = apiKey
	return nil
}

func (f *fakeFleet) SetDraining(name string, d bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.replicas[name]
	if ok {
		f.draining[name] = d
	}
	return ok
}

func (f *fakeFleet) InFlight(name string) (int, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.replicas[name]
	return f.inFlight[name], ok
}

func (f *fakeFleet) RemoveReplica(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.replicas[name]
	delete(f.replicas, name)
	delete(f.draining, name)
	return ok
}

// state is "name" for serving replicas and "name(draining)" for draining ones.
func (f *fakeFleet) state() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for n := range f.replicas {
		if f.draining[n] {
			n += "(draining)"
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func tg(name string) Target { return Target{Name: name, URL: "http://" + name + ":8000"} }

func kinds(evs []Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Kind+" "+e.Replica)
	}
	return out
}

// TestSyncerSteps walks one Syncer through a table of source sets, in-flight
// counts and instants: add, drain on leave, wait for in-flight, remove;
// come back while draining; replace on URL change; drain timeout.
func TestSyncerSteps(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f := newFakeFleet()
	f.taken["static-a"] = true
	s := NewSyncer(f, "k", time.Minute, nil)
	type step struct {
		name     string
		at       time.Duration
		set      []Target // nil: Sweep only
		inFlight map[string]int
		events   []string
		fleet    []string
	}
	steps := []step{
		{name: "first set adds every target", at: 0, set: []Target{tg("a"), tg("b"), tg("c")},
			events: []string{"added a", "added b", "added c"}, fleet: []string{"a", "b", "c"}},
		{name: "same set changes nothing", at: time.Second, set: []Target{tg("c"), tg("b"), tg("a")},
			fleet: []string{"a", "b", "c"}},
		{name: "a replica that leaves drains", at: 2 * time.Second, set: []Target{tg("a"), tg("c")},
			inFlight: map[string]int{"b": 2},
			events:   []string{"draining b"}, fleet: []string{"a", "b(draining)", "c"}},
		{name: "it stays while requests are in flight", at: 3 * time.Second,
			inFlight: map[string]int{"b": 1}, fleet: []string{"a", "b(draining)", "c"}},
		{name: "removed once idle", at: 4 * time.Second,
			inFlight: map[string]int{"b": 0}, events: []string{"removed b"}, fleet: []string{"a", "c"}},
		{name: "leave, then come back before removal: resumes", at: 5 * time.Second, set: []Target{tg("a")},
			inFlight: map[string]int{"c": 1}, events: []string{"draining c"}, fleet: []string{"a", "c(draining)"}},
		{name: "back", at: 6 * time.Second, set: []Target{tg("a"), tg("c")},
			events: []string{"undrained c"}, fleet: []string{"a", "c"}},
		{name: "URL change replaces", at: 7 * time.Second, set: []Target{{Name: "a", URL: "http://a:9000"}, tg("c")},
			events: []string{"removed a", "added a"}, fleet: []string{"a", "c"}},
		{name: "a name owned by a static replica is not taken", at: 8 * time.Second,
			set:    []Target{{Name: "a", URL: "http://a:9000"}, tg("c"), tg("static-a")},
			events: []string{"failed static-a"}, fleet: []string{"a", "c"}},
		{name: "empty set drains everything", at: 9 * time.Second, set: []Target{},
			inFlight: map[string]int{"a": 3, "c": 3},
			events:   []string{"draining a", "draining c"}, fleet: []string{"a(draining)", "c(draining)"}},
		{name: "drain timeout removes despite in-flight", at: 9*time.Second + time.Minute,
			events: []string{"removed a", "removed c"}, fleet: nil},
	}
	for _, st := range steps {
		for n, v := range st.inFlight {
			f.inFlight[n] = v
		}
		now := t0.Add(st.at)
		var evs []Event
		if st.set != nil {
			evs = append(evs, s.Apply(st.set, now)...)
		}
		evs = append(evs, s.Sweep(now)...)
		if d := cmp.Diff(st.events, kinds(evs)); d != "" {
			t.Errorf("%s: events (-want +got):\n%s", st.name, d)
		}
		if d := cmp.Diff(st.fleet, f.state()); d != "" {
			t.Errorf("%s: fleet (-want +got):\n%s", st.name, d)
		}
	}
	if got := f.keys["c"]; got != "k" {
		t.Errorf("api key given to discovered replicas = %q, want %q", got, "k")
	}
	if len(s.Managed()) != 0 {
		t.Errorf("Managed() = %v after everything left", s.Managed())
	}
}

// TestSyncerRemovedElsewhere: a draining replica that the admin API
// already removed is forgotten without error.
func TestSyncerRemovedElsewhere(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f := newFakeFleet()
	s := NewSyncer(f, "", time.Hour, nil)
	s.Apply([]Target{tg("a")}, t0)
	f.inFlight["a"] = 5
	s.Apply(nil, t0)
	f.RemoveReplica("a")
	evs := s.Sweep(t0)
	if d := cmp.Diff([]Event{{Kind: "removed", Replica: "a", Detail: "already gone"}}, evs); d != "" {
		t.Error(d)
	}
}

// chanSource reports the sets sent on its channel.
type chanSource struct {
	sets chan []Target
	err  error
}

func (c *chanSource) Run(ctx context.Context, update func([]Target)) error {
	if c.err != nil {
		return c.err
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ts := <-c.sets:
			update(ts)
		}
	}
}

// TestSyncerRun: the shell applies a source's sets and returns nil on
// cancel, or the source's error when it cannot start.
func TestSyncerRun(t *testing.T) {
	f := newFakeFleet()
	s := NewSyncer(f, "", time.Minute, nil)
	src := &chanSource{sets: make(chan []Target)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, src, time.Millisecond, nil) }()
	src.sets <- []Target{tg("a"), tg("b")}
	src.sets <- []Target{tg("a")} // b has nothing in flight: drained and removed
	waitFleet(t, f, "a")
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil on cancel", err)
	}
	bad := &chanSource{err: errors.New("no cluster")}
	if err := s.Run(context.Background(), bad, time.Millisecond, nil); err == nil || err.Error() != "no cluster" {
		t.Fatalf("Run with a failing source = %v", err)
	}
}
