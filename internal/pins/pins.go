// Package pins is the table of soft-sticky pins of SPEC s3 step 4: session
// pins (idle TTL 60 min) and prefix pins (idle TTL 5 min), with their spill
// counters. It is pure: every call takes now, and housekeeping is bounded in
// cost (incident 1, "crystallization": pins without a TTL cemented whole
// projects onto one replica).
//
// Each kind keeps its entries in a list ordered by last use. Because a kind's
// TTL is fixed, that order is also expiry order, so Sweep pops expired pins
// from the front in O(1) each and Lookup checks expiry lazily.
package pins

import (
	"errors"
	"fmt"
	"time"
)

// Kind is a pin's kind.
type Kind uint8

// The two kinds of pin, consulted in this order (session first).
const (
	Session Kind = iota
	Prefix
	numKinds
)

// String returns "session" or "prefix".
func (k Kind) String() string {
	if k == Session {
		return "session"
	}
	return "prefix"
}

// Config sets the pin life cycle.
type Config struct {
	SessionTTL     time.Duration // idle TTL of a session pin (60 min)
	PrefixTTL      time.Duration // idle TTL of a prefix pin (5 min)
	SpillsToRebind int           // consecutive spills that move a session pin (3)
	PrefixSpills   int           // consecutive spills that delete a prefix pin (2: "a repeated spill")
	MaxPins        int           // bound on the table; the pin closest to expiry is evicted first
}

// DefaultConfig returns the seed 002 values.
func DefaultConfig() Config {
	return Config{SessionTTL: 60 * time.Minute, PrefixTTL: 5 * time.Minute,
		SpillsToRebind: 3, PrefixSpills: 2, MaxPins: 1_000_000}
}

// Validate reports bad values (keys are those of the balancer's affinity section).
func (c Config) Validate() error {
	var errs []error
	if c.SessionTTL <= 0 {
		errs = append(errs, fmt.Errorf("affinity.session_ttl: must be > 0, got %s", c.SessionTTL))
	}
	if c.PrefixTTL <= 0 {
		errs = append(errs, fmt.Errorf("affinity.prefix_ttl: must be > 0, got %s", c.PrefixTTL))
	}
	if c.SpillsToRebind < 1 {
		errs = append(errs, fmt.Errorf("affinity.spills_to_rebind: must be >= 1, got %d", c.SpillsToRebind))
	}
	if c.PrefixSpills < 1 {
		errs = append(errs, fmt.Errorf("affinity.prefix_spills_to_drop: must be >= 1, got %d", c.PrefixSpills))
	}
	if c.MaxPins < 1 {
		errs = append(errs, fmt.Errorf("affinity.max_pins: must be >= 1, got %d", c.MaxPins))
	}
	return errors.Join(errs...)
}

// Pin is a copy of one pin, for listings.
type Pin struct {
	Kind      Kind
	Key       string
	Replica   string
	LastUsed  time.Time
	ExpiresAt time.Time
	Spills    int
}

// SpillResult is what a spill did to the pin.
type SpillResult int

// Results of Spill.
const (
	Spilled SpillResult = iota // counted; the pin stays
	Rebound                    // the spill limit moved the pin to the chosen replica
	Dropped                    // a prefix pin's repeated spill deleted it
)

type key struct {
	kind Kind
	key  string
}

type entry struct {
	key
	replica    string
	lastUsed   time.Time
	spills     int
	prev, next *entry
}

// list is an intrusive doubly linked list ordered by lastUsed (front oldest).
type list struct{ front, back *entry }

func (l *list) pushBack(e *entry) {
	e.prev, e.next = l.back, nil
	if l.back != nil {
		l.back.next = e
	} else {
		l.front = e
	}
	l.back = e
}

func (l *list) remove(e *entry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		l.front = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		l.back = e.prev
	}
	e.prev, e.next = nil, nil
}

// Table holds the pins. It is not safe for concurrent use; the balancer
// calls it under its lock.
type Table struct {
	cfg     Config
	entries [numKinds]map[string]*entry
	n       int // pins of both kinds
	byAge   [numKinds]list
	free    *entry // recycled entries, linked through next
	last    *entry // the entry of the latest lookup: step 4 touches a pin right after finding it
}

// New returns an empty table. cfg must have passed Validate.
func New(cfg Config) *Table {
	return &Table{cfg: cfg, entries: [numKinds]map[string]*entry{make(map[string]*entry), make(map[string]*entry)}}
}

// Len returns the number of pins, expired ones not yet swept included.
func (t *Table) Len() int { return t.n }

// Count returns the number of pins of one kind, expired ones not yet swept
// included.
func (t *Table) Count(kind Kind) int { return len(t.entries[kind]) }

func (t *Table) ttl(k Kind) time.Duration {
	if k == Session {
		return t.cfg.SessionTTL
	}
	return t.cfg.PrefixTTL
}

func (t *Table) expired(e *entry, now time.Time) bool {
	return now.Sub(e.lastUsed) >= t.ttl(e.kind)
}

// get returns the live entry for k, deleting it lazily if it expired.
func (t *Table) get(k key, now time.Time) *entry {
	e := t.last
	if e == nil || e.key != k {
		e = t.entries[k.kind][k.key]
	}
	if e == nil {
		return nil
	}
	if t.expired(e, now) {
		t.delete(e)
		return nil
	}
	t.last = e
	return e
}

// Lookup returns the replica a key is pinned to; an expired pin is deleted.
func (t *Table) Lookup(kind Kind, k string, now time.Time) (replica string, spills int, ok bool) {
	e := t.get(key{kind, k}, now)
	if e == nil {
		return "", 0, false
	}
	return e.replica, e.spills, true
}

// touch marks e used at now, moving it to the back of its age list.
func (t *Table) touch(e *entry, now time.Time) {
	e.lastUsed = now
	l := &t.byAge[e.kind]
	if l.back != e {
		l.remove(e)
		l.pushBack(e)
	}
}

// Use records that the pin routed a request: a used pin resets its spills.
func (t *Table) Use(kind Kind, k string, now time.Time) {
	if e := t.get(key{kind, k}, now); e != nil {
		e.spills = 0
		t.touch(e, now)
	}
}

// Bind pins a key to replica (a new pin or a rebind) with no spills.
func (t *Table) Bind(kind Kind, k string, replica string, now time.Time) {
	e := t.get(key{kind, k}, now)
	if e == nil {
		if t.n >= t.cfg.MaxPins {
			t.evictOldest()
		}
		e = t.alloc()
		e.key = key{kind, k}
		t.entries[kind][k] = e
		t.n++
		e.lastUsed = now
		t.byAge[kind].pushBack(e)
	}
	e.replica, e.spills = replica, 0
	t.touch(e, now)
}

// Spill records that a request with this key was routed elsewhere (to
// chosen). A session pin moves to chosen after SpillsToRebind consecutive
// spills when rebindOK (the chosen replica is LIVE); a prefix pin is deleted
// after PrefixSpills. The request still counts as use of the key for its TTL.
func (t *Table) Spill(kind Kind, k string, chosen string, rebindOK bool, now time.Time) SpillResult {
	e := t.get(key{kind, k}, now)
	if e == nil {
		return Spilled
	}
	e.spills++
	t.touch(e, now)
	switch {
	case kind == Prefix && e.spills >= t.cfg.PrefixSpills:
		t.delete(e)
		return Dropped
	case kind == Session && e.spills >= t.cfg.SpillsToRebind && rebindOK:
		e.replica, e.spills = chosen, 0
		return Rebound
	}
	return Spilled
}

// Delete removes a pin; it reports whether one existed.
func (t *Table) Delete(kind Kind, k string) bool {
	e := t.entries[kind][k]
	if e == nil {
		return false
	}
	t.delete(e)
	return true
}

// Sweep deletes at most budget expired pins (oldest first) and returns how
// many it deleted: bounded housekeeping, O(1) per pin.
func (t *Table) Sweep(now time.Time, budget int) int {
	n := 0
	for k := range t.byAge {
		l := &t.byAge[k]
		for n < budget && l.front != nil && t.expired(l.front, now) {
			t.delete(l.front)
			n++
		}
	}
	return n
}

// RemoveReplica deletes every pin on replica (O(pins); an admin action).
func (t *Table) RemoveReplica(replica string) int {
	n := 0
	for k := range t.entries {
		for _, e := range t.entries[k] {
			if e.replica == replica {
				t.delete(e)
				n++
			}
		}
	}
	return n
}

// List returns copies of the live pins, oldest first per kind, at most limit
// (0 = all).
func (t *Table) List(now time.Time, limit int) []Pin {
	var out []Pin
	for k := range t.byAge {
		for e := t.byAge[k].front; e != nil; e = e.next {
			if limit > 0 && len(out) >= limit {
				return out
			}
			if t.expired(e, now) {
				continue
			}
			out = append(out, Pin{Kind: e.kind, Key: e.key.key, Replica: e.replica, LastUsed: e.lastUsed,
				ExpiresAt: e.lastUsed.Add(t.ttl(e.kind)), Spills: e.spills})
		}
	}
	return out
}

// evictOldest deletes the pin closest to its expiry (MaxPins bound).
func (t *Table) evictOldest() {
	var victim *entry
	for k := range t.byAge {
		e := t.byAge[k].front
		if e == nil {
			continue
		}
		if victim == nil || e.lastUsed.Add(t.ttl(e.kind)).Before(victim.lastUsed.Add(t.ttl(victim.kind))) {
			victim = e
		}
	}
	if victim != nil {
		t.delete(victim)
	}
}

func (t *Table) delete(e *entry) {
	if t.last == e {
		t.last = nil
	}
	delete(t.entries[e.kind], e.key.key)
	t.n--
	t.byAge[e.kind].remove(e)
	*e = entry{next: t.free}
	t.free = e
}

func (t *Table) alloc() *entry {
	if e := t.free; e != nil {
		t.free = e.next
		e.next = nil
		return e
	}
	return &entry{}
}
