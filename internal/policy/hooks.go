package policy

import (
	"time"

	"github.com/llmlb/llmlb/internal/pins"
)

// Hooks is a routed request's life cycle as the routing core tells it to the
// policy that chose its replica, plus the fleet's changes a policy with
// per-replica state must follow. The core calls every hook under its lock
// and never checks which a policy implements: Base's do nothing.
type Hooks interface {
	// Attach gives the policy the core's view of the fleet, once, before
	// the first Choose.
	Attach(f Fleet)
	// Routed: the request was sent to the chosen replica (its slot is
	// reserved). A policy that shares state publishes what it changed here.
	Routed(replica string, r *Request, c Choice, now time.Time)
	// Refused: the replica turned the request away before running it (a
	// 4xx or 5xx answer, a refused or broken connection, all before its
	// first token). blocks are its prompt's (not to be kept), recorded is
	// the Choice's Recorded (called only when it is not 0).
	Refused(replica string, blocks []uint64, recorded uint64)
	// Started: the request is known to run on the replica (its first token;
	// waiting requests hold no blocks), with its prompt blocks (not to be
	// kept). The token it returns comes back in Ended; 0 needs no Ended.
	Started(replica string, blocks []uint64) uint64
	// Finished: the request completed successfully. vLLM frees a request's
	// blocks when it finishes, so their place in the replica's eviction
	// order is set then. blocks are its prompt's (not to be kept).
	Finished(replica string, blocks []uint64, now time.Time)
	// Ended returns the token of Started when the request ends, whatever
	// the outcome.
	Ended(token uint64)
	// RemoveReplica: the replica left the fleet; forget its state.
	RemoveReplica(name string)
	// ForgetCache: the replica restarted (its /metrics counters went back)
	// with an empty cache.
	ForgetCache(name string)
	// Apply applies a peer balancer's Delta (shared state) as if this one
	// had made the change; d.Replica is already the local replica's name,
	// capacityTokens its KV capacity (0: not known). It reports whether
	// anything changed.
	Apply(d Delta, capacityTokens int, now time.Time) bool
	// Tick is the core's housekeeping tick (expire what has a TTL, within
	// a bounded budget so that routing never stalls).
	Tick(now time.Time)
	// SetExplain asks for every candidate to be described in
	// Choice.Detail (an allocation per decision: on only when decisions are
	// logged at debug level or recorded).
	SetExplain(on bool)
	// SetSettings applies new parameters to the running policy, keeping its
	// state (a configuration reload).
	SetSettings(s Settings) error
}

// Fleet is what a policy may ask the routing core about replicas that are
// not among a decision's candidates. It is called under the core's lock.
type Fleet interface {
	// Alive reports whether the named replica may still get traffic at all:
	// known, not draining and not EJECTED. A PROBING replica at its
	// in-flight limit, one serving another model or one already tried for
	// the request is alive but not a candidate.
	Alive(name string) bool
	// Sharer is where the policy publishes its affinity changes for other
	// balancers, or nil when state is not shared.
	Sharer() Sharer
}

// Base implements every hook as doing nothing; policies embed it.
type Base struct{}

// Attach does nothing.
func (Base) Attach(Fleet) {}

// Routed does nothing.
func (Base) Routed(string, *Request, Choice, time.Time) {}

// Refused does nothing.
func (Base) Refused(string, []uint64, uint64) {}

// Started does nothing and needs no Ended.
func (Base) Started(string, []uint64) uint64 { return 0 }

// Finished does nothing.
func (Base) Finished(string, []uint64, time.Time) {}

// Ended does nothing.
func (Base) Ended(uint64) {}

// RemoveReplica does nothing.
func (Base) RemoveReplica(string) {}

// ForgetCache does nothing.
func (Base) ForgetCache(string) {}

// Apply changes nothing.
func (Base) Apply(Delta, int, time.Time) bool { return false }

// Tick does nothing.
func (Base) Tick(time.Time) {}

// SetExplain does nothing.
func (Base) SetExplain(bool) {}

// SetSettings accepts any settings: the policy has none.
func (Base) SetSettings(Settings) error { return nil }

// DeltaKind is what a Delta says.
type DeltaKind uint8

// The kinds of Delta.
const (
	// DeltaPin: Key (of PinKind) is pinned to Replica (a bind, a rebind or
	// a use, which refreshes its idle TTL).
	DeltaPin DeltaKind = iota + 1
	// DeltaUnpin: the pin of Key (of PinKind) was deleted (a dropped
	// prefix pin, a pin on a dead replica).
	DeltaUnpin
	// DeltaBlocks: Replica was sent a prompt with these chained block
	// hashes, or finished one (policy cost re-records a prompt then).
	DeltaBlocks
)

// Delta is one change of affinity state, published by the balancer that
// made it (docs/SHARED_STATE.md). Replicas are named by Replica (their name)
// and URL: instances whose names differ but whose URLs agree still match.
type Delta struct {
	Kind    DeltaKind
	At      time.Time // when the publishing core made the change (its now)
	PinKind pins.Kind
	Key     string
	Replica string
	URL     string // filled in by the core when the policy leaves it empty
	// Blocks are the prompt's block hashes (DeltaBlocks). The slice is the
	// request's own: a Sharer that keeps it past Publish must copy it.
	Blocks []uint64
}

// Sharer receives a balancer's Deltas. Publish is called under the core's
// lock on the routing path: it must not block or call back into the core
// (drop and count when full).
type Sharer interface {
	Publish(d Delta)
}

// CacheHolder is a policy that can say, without changing anything, which
// replica holds the most of a prompt's leading blocks and how many tokens
// that is (cost: its block index). Flow control prefers, among the held
// requests it may dispatch next, one whose holder has room
// (admission.Gate.Pump).
type CacheHolder interface {
	Holder(blocks []uint64) (replica string, tokens int)
}
