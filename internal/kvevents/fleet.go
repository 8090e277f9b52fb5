package kvevents

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultMaxAge is how long a replica's entries outlive its last batch
// when nothing says the replica is still there (see Feed's alive).
const DefaultMaxAge = 60 * time.Second

// Feed keeps one subscriber per publishing replica, feeding one Index, as
// replicas come and go: Set subscribes to a replica (or moves it to new
// endpoints), Remove unsubscribes and forgets its entries. Run is the
// shell: it runs the subscribers until its context ends and expires the
// replicas whose events stopped. A Feed starts nothing before Run; sources
// set before it start with it.
type Feed struct {
	idx    *Index
	log    *slog.Logger
	maxAge time.Duration
	live   func() map[string]bool

	mu   sync.Mutex
	ctx  context.Context // Run's; nil before Run and after it returns
	wg   sync.WaitGroup
	subs map[string]*feedSub

	// sources is Sources' answer, replaced whenever subs changes, so that
	// reading it (the metrics, at every scrape) never waits on mu, which a
	// removal holds while a slow subscriber stops.
	sources atomic.Pointer[[]Source]
}

// feedSub is one replica's running subscriber.
type feedSub struct {
	src    Source
	cancel context.CancelFunc // nil while not started
	done   chan struct{}
}

// NewFeed returns a feed writing into idx. maxAge < 1 means DefaultMaxAge.
// live, when not nil, returns the replicas serving now (their health
// checks pass): a quiet publisher of a live replica keeps its entries
// (see Index.Expire).
func NewFeed(idx *Index, maxAge time.Duration, live func() map[string]bool, log *slog.Logger) *Feed {
	if log == nil {
		log = slog.Default()
	}
	if maxAge < 1 {
		maxAge = DefaultMaxAge
	}
	return &Feed{idx: idx, log: log, maxAge: maxAge, live: live, subs: make(map[string]*feedSub)}
}

// Index returns the index the feed writes.
func (f *Feed) Index() *Index { return f.idx }

// Set subscribes to src.Replica's events at src's endpoints; a replica
// already subscribed at other endpoints is resubscribed there and its
// entries cleared (they described another publisher). It reports whether
// anything changed.
func (f *Feed) Set(src Source) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if old, ok := f.subs[src.Replica]; ok {
		if old.src == src {
			return false
		}
		f.stopLocked(src.Replica, old)
	}
	s := &feedSub{src: src}
	f.subs[src.Replica] = s
	f.publishSourcesLocked()
	if f.ctx != nil {
		f.startLocked(s)
	}
	return true
}

// Remove unsubscribes from replica's events and forgets its entries. It
// reports whether the replica was subscribed.
func (f *Feed) Remove(replica string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.subs[replica]
	if ok {
		f.stopLocked(replica, s)
		f.publishSourcesLocked()
	}
	f.idx.Remove(replica)
	return ok
}

// Sources returns the subscribed sources, by replica name. It does not
// wait for a subscription being set or removed.
func (f *Feed) Sources() []Source {
	if p := f.sources.Load(); p != nil {
		return slices.Clone(*p)
	}
	return []Source{}
}

// publishSourcesLocked makes Sources answer what subs holds now; under mu.
func (f *Feed) publishSourcesLocked() {
	out := make([]Source, 0, len(f.subs))
	for _, name := range slices.Sorted(maps.Keys(f.subs)) {
		out = append(out, f.subs[name].src)
	}
	f.sources.Store(&out)
}

// stopLocked ends s's subscriber, waits for it to return (a batch it is
// applying must not bring the replica back into the index) and forgets the
// replica. A subscriber returns once its sockets see the cancellation; the
// wait is bounded all the same.
func (f *Feed) stopLocked(replica string, s *feedSub) {
	if s.cancel != nil {
		s.cancel()
		select {
		case <-s.done:
		case <-time.After(replayTimeout + time.Second):
			f.log.Warn("kvevents: subscriber slow to stop", "replica", replica)
		}
	}
	delete(f.subs, replica)
	f.idx.Remove(replica)
}

// startLocked runs s's subscriber under the feed's context; a subscriber
// that fails is logged and started again after a second.
func (f *Feed) startLocked(s *feedSub) {
	ctx, cancel := context.WithCancel(f.ctx)
	s.cancel, s.done = cancel, make(chan struct{})
	f.wg.Go(func() {
		defer close(s.done)
		for ctx.Err() == nil {
			if err := NewSubscriber(s.src, f.idx, f.log).Run(ctx); err != nil {
				f.log.Warn("kvevents: subscriber stopped", "replica", s.src.Replica, "err", err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	})
}

// Run starts the subscribers set so far, and any set later, and every
// maxAge/4 expires the replicas whose events stopped. It returns when ctx
// is cancelled, once every subscriber has returned.
func (f *Feed) Run(ctx context.Context) {
	f.mu.Lock()
	f.ctx = ctx
	for _, s := range f.subs {
		f.startLocked(s)
	}
	f.mu.Unlock()
	t := time.NewTicker(f.maxAge / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			f.mu.Lock()
			f.ctx = nil
			for _, s := range f.subs {
				s.cancel, s.done = nil, nil
			}
			f.mu.Unlock()
			f.wg.Wait()
			return
		case now := <-t.C:
			var live map[string]bool
			if f.live != nil {
				live = f.live()
			}
			for _, rep := range f.idx.Expire(now, f.maxAge, live) {
				f.log.Info("kvevents: replica's events stopped; its entries expired", "replica", rep)
			}
		}
	}
}
