package policy

import (
	"time"

	"github.com/llmlb/llmlb/internal/pins"
)

// PinTable is implemented by policies that keep pins (llmlb, llmlb-warm):
// what the admin API, the metrics and the benchmark read of them. Its
// methods are called under the routing core's lock (balancer.Inspect) and
// return copies.
type PinTable interface {
	// PinList copies at most limit pins (0: all).
	PinList(now time.Time, limit int) []PinStatus
	// PinPage copies at most limit pins following after (the zero cursor is
	// the start), visiting at most limit+slack entries whatever the table's
	// size, so it may return fewer than limit and not done.
	PinPage(now time.Time, after pins.Cursor, limit, slack int) (page []PinStatus, next pins.Cursor, done bool)
	// PinMemory returns the table's estimated bytes and the pins its bounds
	// evicted (never-reused and reused ones).
	PinMemory() (bytes int64, evictedOneShot, evictedReused uint64)
	// PinCounts returns the number of session and prefix pins (expired ones
	// not yet swept included) without copying the table.
	PinCounts() (session, prefix int)
	// PinCounters returns the pin decisions' monotonic totals.
	PinCounters() PinCounters
}

// PinStatus is a copy of one pin for /admin/pins.
type PinStatus struct {
	Kind      string    `json:"kind"` // session | prefix
	Key       string    `json:"key"`
	Replica   string    `json:"replica"`
	LastUsed  time.Time `json:"last_used"`
	ExpiresAt time.Time `json:"expires_at"`
	Spills    int       `json:"spills"`
	Reused    bool      `json:"reused"` // protected from eviction by new keys
}

// PinCounters are monotonic totals of pin decisions, for metrics: spills,
// rebinds after spills or of pins on dead replicas, pins moved at once by
// the force-rebind gap, prefix pins dropped after a repeated spill.
type PinCounters struct {
	Spills, Rebinds, ForceRebinds, PrefixDrops uint64
}

func pinStatus(p pins.Pin) PinStatus {
	return PinStatus{Kind: p.Kind.String(), Key: p.Key, Replica: p.Replica,
		LastUsed: p.LastUsed, ExpiresAt: p.ExpiresAt, Spills: p.Spills, Reused: p.Reused}
}

// PinList copies at most limit pins (0: all).
func (l *LLMLB) PinList(now time.Time, limit int) []PinStatus {
	list := l.table.List(now, limit)
	out := make([]PinStatus, len(list))
	for i, p := range list {
		out[i] = pinStatus(p)
	}
	return out
}

// PinPage copies a bounded page of pins (see PinTable).
func (l *LLMLB) PinPage(now time.Time, after pins.Cursor, limit, slack int) ([]PinStatus, pins.Cursor, bool) {
	list, next, done := l.table.Page(now, after, limit, limit+slack)
	out := make([]PinStatus, len(list))
	for i, p := range list {
		out[i] = pinStatus(p)
	}
	return out, next, done
}

// PinMemory returns the table's estimated bytes and its evictions.
func (l *LLMLB) PinMemory() (bytes int64, evictedOneShot, evictedReused uint64) {
	oneShot, reused := l.table.Evictions()
	return l.table.Bytes(), oneShot, reused
}

// PinCounts returns the number of session and prefix pins.
func (l *LLMLB) PinCounts() (session, prefix int) {
	return l.table.Count(pins.Session), l.table.Count(pins.Prefix)
}

// PinCounters returns the pin decisions' totals.
func (l *LLMLB) PinCounters() PinCounters { return l.counters }

// pinState is a request's pin of one kind as Choose found it, to publish
// what changed.
type pinState struct {
	kind    pins.Kind
	key     string
	replica string
	ok      bool
}

// pinsBefore records the request's pins before the choice.
func (l *LLMLB) pinsBefore(p *Request, now time.Time) [2]pinState {
	st := [2]pinState{{kind: pins.Session, key: p.SessionKey}, {kind: pins.Prefix, key: p.PrefixKey}}
	for i := range st {
		if st[i].key != "" {
			st[i].replica, _, st[i].ok = l.table.Lookup(st[i].kind, st[i].key, now)
		}
	}
	return st
}

// Routed publishes what the choice changed (shared state): a pin bound,
// moved, used (which refreshes its TTL and ends a run of spills) or deleted.
// A spill publishes nothing: spill counts are each instance's own, and a
// peer must not take a spilled pin for a used one.
func (l *LLMLB) Routed(_ string, p *Request, c Choice, now time.Time) {
	var s Sharer
	if l.fleet != nil {
		s = l.fleet.Sharer()
	}
	if s == nil {
		return
	}
	for _, was := range l.before {
		if was.key == "" {
			continue
		}
		name, _, ok := l.table.Lookup(was.kind, was.key, now)
		used := c.PinKind == was.kind.String() && c.PinDecision == "used"
		switch {
		case ok && (!was.ok || was.replica != name || used):
			s.Publish(Delta{Kind: DeltaPin, At: now, PinKind: was.kind, Key: was.key, Replica: name})
		case !ok && was.ok:
			s.Publish(Delta{Kind: DeltaUnpin, At: now, PinKind: was.kind, Key: was.key})
		}
	}
	l.before = [2]pinState{}
}

// Apply applies a peer's pin change: a pin is (re)bound or refreshed as the
// peer left it, or deleted.
func (l *LLMLB) Apply(d Delta, _ int, now time.Time) bool {
	switch d.Kind {
	case DeltaPin:
		if d.Key == "" || d.PinKind > pins.Prefix {
			return false
		}
		if cur, _, ok := l.table.Lookup(d.PinKind, d.Key, now); ok && cur == d.Replica {
			l.table.Use(d.PinKind, d.Key, now)
		} else {
			l.table.Bind(d.PinKind, d.Key, d.Replica, now)
		}
		return true
	case DeltaUnpin:
		if d.PinKind > pins.Prefix {
			return false
		}
		return l.table.Delete(d.PinKind, d.Key)
	}
	return false
}
