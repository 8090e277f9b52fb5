// Package pins is the table of soft-sticky pins of step 4 of the selection (docs/ROUTING.md): session
// pins (idle TTL 60 min) and prefix pins (idle TTL 5 min), with their spill
// counters. It is pure: every call takes now, and housekeeping is bounded in
// cost (crystallization, docs/ROUTING.md "Pin life cycle": pins without a TTL cemented whole
// projects onto one replica).
//
// Each kind keeps its entries in lists ordered by last use. Because a kind's
// TTL is fixed, that order is also expiry order, so Sweep pops expired pins
// from the front in O(1) each and Lookup checks expiry lazily.
//
// The table is bounded by count (MaxPins) and by estimated bytes (MaxBytes),
// and protects pins that have been used more than once from floods of
// one-shot keys (segmented LRU, the admission idea of TinyLFU): a new pin
// enters a probation segment, a pin reused while pinned moves to a protected
// segment, and a new key at the bound evicts only probation pins. The
// protected segment holds at most 4/5 of either bound; a promotion past that
// evicts the least recently used protected pin, so reused pins compete only
// with each other (docs/SECURITY.md).
package pins

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
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
	MaxPins        int           // bound on the number of pins (1,000,000)
	// MaxBytes bounds the table's memory, estimated per pin as EntryBytes
	// plus its key (64 MiB). 0 means DefaultMaxBytes.
	MaxBytes int64
}

// DefaultMaxBytes is the default bound on the pin table's memory.
const DefaultMaxBytes = 64 << 20

// MinMaxBytes is the smallest accepted MaxBytes.
const MinMaxBytes = 64 << 10

// MaxKeyBytes bounds a stored key: a longer session or prefix key is stored
// (and looked up) as a hash of itself, so one client's 1 MB session id costs
// no more than anyone's.
const MaxKeyBytes = 128

// EntryBytes is the estimated memory of one pin besides its key bytes: the
// entry (64 B) and its share of the map (slot, control bytes, growth slack),
// measured by TestMemoryPerPin.
const EntryBytes = 160

// DefaultConfig returns the defaults of docs/ROUTING.md, "Pin life cycle".
func DefaultConfig() Config {
	return Config{SessionTTL: 60 * time.Minute, PrefixTTL: 5 * time.Minute,
		SpillsToRebind: 3, PrefixSpills: 2, MaxPins: 1_000_000, MaxBytes: DefaultMaxBytes}
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
	if c.MaxBytes != 0 && c.MaxBytes < MinMaxBytes {
		errs = append(errs, fmt.Errorf("affinity.max_pin_bytes: must be >= %d (64KiB), got %d", MinMaxBytes, c.MaxBytes))
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
	// Reused is true once the pin has routed a second request: it is then
	// protected from eviction by new keys.
	Reused bool
}

// SpillResult is what a spill did to the pin.
type SpillResult int

// Results of Spill.
const (
	Spilled SpillResult = iota // counted; the pin stays
	Rebound                    // the spill limit moved the pin to the chosen replica
	Dropped                    // a prefix pin's repeated spill deleted it
)

// segment is a pin's place in the segmented LRU.
type segment uint8

const (
	probation segment = iota // bound once, evicted first
	protected                // reused; evicted only by other reused pins
	numSegs
)

// entry is one pin: 64 bytes on 64-bit machines.
type entry struct {
	key        string
	replica    string
	lastUsed   int64 // nanoseconds since the table's epoch
	prev, next *entry
	spills     int32
	kind       Kind
	seg        segment
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
	bytes   int64
	segN    [numSegs]int
	segB    [numSegs]int64
	byAge   [numKinds][numSegs]list
	free    *entry // recycled entries, linked through next
	last    *entry // the entry of the latest lookup: step 4 touches a pin right after finding it

	epoch    time.Time // lastUsed is stored relative to it (8 bytes instead of 24)
	hasEpoch bool

	evictions [numSegs]uint64
}

// New returns an empty table. cfg must have passed Validate.
func New(cfg Config) *Table {
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	return &Table{cfg: cfg, entries: [numKinds]map[string]*entry{make(map[string]*entry), make(map[string]*entry)}}
}

// Len returns the number of pins, expired ones not yet swept included.
func (t *Table) Len() int { return t.n }

// Bytes returns the estimated memory of the pins (EntryBytes + key each);
// it never exceeds Config.MaxBytes.
func (t *Table) Bytes() int64 { return t.bytes }

// Count returns the number of pins of one kind, expired ones not yet swept
// included.
func (t *Table) Count(kind Kind) int { return len(t.entries[kind]) }

// Evictions returns how many pins the bounds evicted: new pins that were
// never reused, and reused pins (which only other reused pins displace).
func (t *Table) Evictions() (oneShot, reused uint64) {
	return t.evictions[probation], t.evictions[protected]
}

// NormKey returns the key under which k is stored: k itself, or for a key
// longer than MaxKeyBytes "sha256:" and the hex of its first 16 bytes.
func NormKey(k string) string {
	if len(k) <= MaxKeyBytes {
		return k
	}
	sum := sha256.Sum256([]byte(k))
	return "sha256:" + hex.EncodeToString(sum[:16])
}

func (t *Table) ttl(k Kind) time.Duration {
	if k == Session {
		return t.cfg.SessionTTL
	}
	return t.cfg.PrefixTTL
}

// clock converts now to the table's int64 clock.
func (t *Table) clock(now time.Time) int64 {
	if !t.hasEpoch {
		t.epoch, t.hasEpoch = now, true
	}
	return int64(now.Sub(t.epoch))
}

func (t *Table) timeOf(c int64) time.Time { return t.epoch.Add(time.Duration(c)) }

func (t *Table) expired(e *entry, now int64) bool {
	return now-e.lastUsed >= int64(t.ttl(e.kind))
}

func cost(key string) int64 { return EntryBytes + int64(len(key)) }

// get returns the live entry for k (already normalized), deleting it
// lazily if it expired.
func (t *Table) get(kind Kind, k string, now int64) *entry {
	e := t.last
	if e == nil || e.kind != kind || e.key != k {
		e = t.entries[kind][k]
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
	e := t.get(kind, NormKey(k), t.clock(now))
	if e == nil {
		return "", 0, false
	}
	return e.replica, int(e.spills), true
}

// touch marks e used at now, moving it to the back of its age list; a pin
// used again while in probation is promoted (it has proven to be reused).
func (t *Table) touch(e *entry, now int64) {
	e.lastUsed = now
	if e.seg == probation {
		t.promote(e)
		return
	}
	l := &t.byAge[e.kind][e.seg]
	if l.back != e {
		l.remove(e)
		l.pushBack(e)
	}
}

// promote moves a probation entry to the protected segment, evicting the
// least recently used protected pins to keep that segment within 4/5 of the
// bounds. With bounds too small for a protected segment it stays put.
func (t *Table) promote(e *entry) {
	maxN, maxB := t.cfg.MaxPins*4/5, t.cfg.MaxBytes*4/5
	c := cost(e.key)
	if maxN < 1 || c > maxB {
		l := &t.byAge[e.kind][probation]
		if l.back != e {
			l.remove(e)
			l.pushBack(e)
		}
		return
	}
	for t.segN[protected]+1 > maxN || t.segB[protected]+c > maxB {
		if !t.evictFrom(protected) {
			break
		}
	}
	t.byAge[e.kind][probation].remove(e)
	t.segN[probation]--
	t.segB[probation] -= c
	e.seg = protected
	t.segN[protected]++
	t.segB[protected] += c
	t.byAge[e.kind][protected].pushBack(e)
}

// Use records that the pin routed a request: a used pin resets its spills.
func (t *Table) Use(kind Kind, k string, now time.Time) {
	c := t.clock(now)
	if e := t.get(kind, NormKey(k), c); e != nil {
		e.spills = 0
		t.touch(e, c)
	}
}

// Bind pins a key to replica (a new pin or a rebind) with no spills. A new
// pin at the bounds evicts the probation pin closest to expiry: never a
// reused one (see the package comment).
func (t *Table) Bind(kind Kind, k string, replica string, now time.Time) {
	c := t.clock(now)
	k = NormKey(k)
	e := t.get(kind, k, c)
	if e != nil {
		e.replica, e.spills = replica, 0
		t.touch(e, c)
		return
	}
	sz := cost(k)
	for t.n >= t.cfg.MaxPins || t.bytes+sz > t.cfg.MaxBytes {
		if !t.evictFrom(probation) && !t.evictFrom(protected) {
			break
		}
	}
	e = t.alloc()
	// Clone: a key sliced from a request body must not keep the body alive.
	e.key, e.kind, e.seg, e.replica, e.spills, e.lastUsed = strings.Clone(k), kind, probation, replica, 0, c
	t.entries[kind][e.key] = e
	t.n++
	t.bytes += sz
	t.segN[probation]++
	t.segB[probation] += sz
	t.byAge[kind][probation].pushBack(e)
}

// Spill records that a request with this key was routed elsewhere (to
// chosen). A session pin moves to chosen after SpillsToRebind consecutive
// spills when rebindOK (the chosen replica is LIVE); a prefix pin is deleted
// after PrefixSpills. The request still counts as use of the key for its TTL.
func (t *Table) Spill(kind Kind, k string, chosen string, rebindOK bool, now time.Time) SpillResult {
	c := t.clock(now)
	e := t.get(kind, NormKey(k), c)
	if e == nil {
		return Spilled
	}
	if e.spills < 1<<30 {
		e.spills++
	}
	t.touch(e, c)
	switch {
	case kind == Prefix && int(e.spills) >= t.cfg.PrefixSpills:
		t.delete(e)
		return Dropped
	case kind == Session && int(e.spills) >= t.cfg.SpillsToRebind && rebindOK:
		e.replica, e.spills = chosen, 0
		return Rebound
	}
	return Spilled
}

// Delete removes a pin; it reports whether one existed.
func (t *Table) Delete(kind Kind, k string) bool {
	e := t.entries[kind][NormKey(k)]
	if e == nil {
		return false
	}
	t.delete(e)
	return true
}

// Sweep deletes at most budget expired pins (oldest first) and returns how
// many it deleted: bounded housekeeping, O(1) per pin.
func (t *Table) Sweep(now time.Time, budget int) int {
	c := t.clock(now)
	n := 0
	for k := range t.byAge {
		for s := range t.byAge[k] {
			l := &t.byAge[k][s]
			for n < budget && l.front != nil && t.expired(l.front, c) {
				t.delete(l.front)
				n++
			}
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

// List returns copies of the live pins, oldest first per kind and segment,
// at most limit (0 = all). It visits the whole table: use Page where the
// table may be large.
func (t *Table) List(now time.Time, limit int) []Pin {
	var out []Pin
	cur := Cursor{}
	for {
		page, next, done := t.Page(now, cur, 1<<30, 1<<30)
		out = append(out, page...)
		if limit > 0 && len(out) >= limit {
			return out[:limit]
		}
		if done {
			return out
		}
		cur = next
	}
}

// Cursor is a position in the listing of Page: the list being walked (kind
// and segment) and the last pin visited in it. The zero Cursor is the start.
type Cursor struct {
	Kind    Kind
	Reused  bool   // the protected segment of Kind
	Key     string // the last pin visited ("" = the list's front)
	LastUse int64  // its last use on the table's clock, to resume if it moved
}

func (c Cursor) list() int { return int(c.Kind)*int(numSegs) + b2i(c.Reused) }

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Page copies at most limit live pins that follow after, visiting at most
// budget entries (expired ones included), so that a caller holding a lock
// holds it for a bounded time whatever the table's size. It returns the
// cursor to continue from and done once every list has been walked.
//
// Pins are walked per kind and segment, oldest use first. A pin used during
// a walk moves to the back and may be listed again; if the cursor's own pin
// was used or deleted, the walk resumes after the pins used no later than it
// (scanning from the front within the same budget).
func (t *Table) Page(now time.Time, after Cursor, limit, budget int) (out []Pin, next Cursor, done bool) {
	limit, budget = max(limit, 1), max(budget, 1) // every call makes progress
	c := t.clock(now)
	li := after.list()
	if li >= int(numKinds)*int(numSegs) {
		return nil, after, true
	}
	kind, seg := Kind(li/int(numSegs)), segment(li%int(numSegs))
	e := t.byAge[kind][seg].front
	visits := 0
	next = Cursor{Kind: kind, Reused: seg == protected}
	if after.Key != "" {
		next.Key, next.LastUse = after.Key, after.LastUse
		if at := t.entries[kind][after.Key]; at != nil && at.seg == seg && at.lastUsed == after.LastUse {
			e = at.next
		} else {
			for e != nil && e.lastUsed <= after.LastUse {
				if visits >= budget {
					return out, next, false
				}
				visits++
				next.Key, next.LastUse = e.key, e.lastUsed
				e = e.next
			}
		}
	}
	for {
		for ; e != nil; e = e.next {
			if len(out) >= limit || visits >= budget {
				return out, next, false
			}
			visits++
			next.Key, next.LastUse = e.key, e.lastUsed
			if t.expired(e, c) {
				continue
			}
			out = append(out, Pin{Kind: e.kind, Key: e.key, Replica: e.replica, LastUsed: t.timeOf(e.lastUsed),
				ExpiresAt: t.timeOf(e.lastUsed).Add(t.ttl(e.kind)), Spills: int(e.spills), Reused: e.seg == protected})
		}
		li++
		if li >= int(numKinds)*int(numSegs) {
			return out, Cursor{Kind: numKinds}, true
		}
		kind, seg = Kind(li/int(numSegs)), segment(li%int(numSegs))
		e = t.byAge[kind][seg].front
		next = Cursor{Kind: kind, Reused: seg == protected}
	}
}

// evictFrom deletes the pin of segment s closest to its expiry (the oldest
// front of the two kinds); false when the segment is empty.
func (t *Table) evictFrom(s segment) bool {
	var victim *entry
	for k := range t.byAge {
		e := t.byAge[k][s].front
		if e == nil {
			continue
		}
		if victim == nil || e.lastUsed+int64(t.ttl(e.kind)) < victim.lastUsed+int64(t.ttl(victim.kind)) {
			victim = e
		}
	}
	if victim == nil {
		return false
	}
	t.evictions[s]++
	t.delete(victim)
	return true
}

func (t *Table) delete(e *entry) {
	if t.last == e {
		t.last = nil
	}
	c := cost(e.key)
	delete(t.entries[e.kind], e.key)
	t.n--
	t.bytes -= c
	t.segN[e.seg]--
	t.segB[e.seg] -= c
	t.byAge[e.kind][e.seg].remove(e)
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

// SetConfig replaces the table's rules (a configuration reload): new TTLs
// apply to every pin at its next lookup or sweep, and lower bounds evict
// as the next pins are bound. cfg must have passed Validate.
func (t *Table) SetConfig(cfg Config) {
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	t.cfg = cfg
}
