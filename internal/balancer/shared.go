package balancer

import (
	"slices"
	"time"

	"github.com/llmlb/llmlb/internal/pins"
	"github.com/llmlb/llmlb/internal/policy"
)

// Shared state between several balancers (docs/SHARED_STATE.md, issue 13):
// what decides affinity (pins, and the blocks policy cost's index says each
// replica was sent) leaves the core as Deltas through a Sharer, and other
// instances' Deltas come back in through Apply. Peers' in-flight loads come
// in through SetPeerLoad and are added to the effective load. The core does
// no I/O for any of it: a Sharer must not block, and what arrives is a hint
// applied under the lock like any other event, with the caller's now.

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

// Delta is one change of affinity state, published by the instance that
// made it. Replicas are named by Replica (their name) and URL: instances
// whose names differ but whose URLs agree still match.
type Delta struct {
	Kind    DeltaKind
	At      time.Time // when the publishing core made the change (its now)
	PinKind pins.Kind
	Key     string
	Replica string
	URL     string
	// Blocks are the prompt's block hashes (DeltaBlocks). The slice is the
	// request's own: a Sharer that keeps it past Publish must copy it.
	Blocks []uint64
}

// Sharer receives the core's Deltas. Publish is called under the
// balancer's lock on the routing path: it must not block or call back into
// the balancer (drop and count when full).
type Sharer interface {
	Publish(d Delta)
}

// maxSharedBlocks bounds a published prompt to what the cost policy indexes.
const maxSharedBlocks = policy.MaxIndexBlocks

// SetSharer makes the core publish its affinity changes to s (nil: none).
// Call it before traffic starts.
func (b *Balancer) SetSharer(s Sharer) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sharer = s
}

// pinState is a request's pin of one kind as Select found it, to publish
// what changed.
type pinState struct {
	kind    pins.Kind
	key     string
	replica string
	ok      bool
}

// pinsBefore records the request's pins before the policy runs.
func (b *Balancer) pinsBefore(p *Profile, now time.Time) [2]pinState {
	st := [2]pinState{{kind: pins.Session, key: p.SessionKey}, {kind: pins.Prefix, key: p.PrefixKey}}
	for i := range st {
		if st[i].key != "" {
			st[i].replica, _, st[i].ok = b.pins.Lookup(st[i].kind, st[i].key, now)
		}
	}
	return st
}

// publish tells the sharer what Select changed: a pin bound, moved, used
// (which refreshes its TTL and ends a run of spills) or deleted, and, for
// policies that index prompt blocks, the blocks the chosen replica was sent.
// A spill publishes nothing: spill counts are each instance's own, and a
// peer must not take a spilled pin for a used one.
func (b *Balancer) publish(p *Profile, before [2]pinState, r *replica, now time.Time) {
	for _, was := range before {
		if was.key == "" {
			continue
		}
		name, _, ok := b.pins.Lookup(was.kind, was.key, now)
		used := b.expl.PinKind == was.kind.String() && b.expl.PinDecision == "used"
		switch {
		case ok && (!was.ok || was.replica != name || used):
			d := Delta{Kind: DeltaPin, At: now, PinKind: was.kind, Key: was.key, Replica: name}
			if pr := b.byName[name]; pr != nil {
				d.URL = pr.url
			}
			b.sharer.Publish(d)
		case !ok && was.ok:
			b.sharer.Publish(Delta{Kind: DeltaUnpin, At: now, PinKind: was.kind, Key: was.key})
		}
	}
	if _, ok := b.policy.(policy.BlockRecorder); ok && len(p.PromptBlocks) > 0 {
		b.sharer.Publish(Delta{Kind: DeltaBlocks, At: now, Replica: r.name, URL: r.url,
			Blocks: p.PromptBlocks[:min(len(p.PromptBlocks), maxSharedBlocks)]})
	}
}

// resolve finds the local replica a peer named: by name, else by URL.
func (b *Balancer) resolve(name, url string) *replica {
	if r := b.byName[name]; r != nil {
		return r
	}
	if url == "" {
		return nil
	}
	for _, r := range b.replicas {
		if r.url == url {
			return r
		}
	}
	return nil
}

// Apply applies a peer's Delta at now. It is a hint: a pin to a replica
// this instance does not know is ignored, a pin is (re)bound or refreshed
// as the peer left it, and blocks enter the policy's index as if this
// instance had sent them. It reports whether the Delta changed anything.
func (b *Balancer) Apply(d Delta, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch d.Kind {
	case DeltaPin:
		if d.Key == "" || d.PinKind > pins.Prefix {
			return false
		}
		r := b.resolve(d.Replica, d.URL)
		if r == nil {
			return false
		}
		if cur, _, ok := b.pins.Lookup(d.PinKind, d.Key, now); ok && cur == r.name {
			b.pins.Use(d.PinKind, d.Key, now)
		} else {
			b.pins.Bind(d.PinKind, d.Key, r.name, now)
		}
		return true
	case DeltaUnpin:
		if d.PinKind > pins.Prefix {
			return false
		}
		return b.pins.Delete(d.PinKind, d.Key)
	case DeltaBlocks:
		rec, ok := b.policy.(policy.BlockRecorder)
		r := b.resolve(d.Replica, d.URL)
		if !ok || r == nil || len(d.Blocks) == 0 {
			return false
		}
		rec.Record(r.name, d.Blocks[:min(len(d.Blocks), maxSharedBlocks)], int(r.snap.KVCacheTokens))
		return true
	}
	return false
}

// ReplicaLoad is one replica's in-flight requests at one instance, as
// published to its peers.
type ReplicaLoad struct {
	Replica  string  `json:"r"`
	URL      string  `json:"u,omitempty"`
	InFlight int     `json:"n"`
	Weight   float64 `json:"w"` // in-flight weight (SPEC s2.2 units)
}

// Load returns this instance's own in-flight requests per replica (those
// with none included, so a peer learns they ended), for its peers.
func (b *Balancer) Load() []ReplicaLoad {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]ReplicaLoad, 0, len(b.replicas))
	for _, r := range b.replicas {
		out = append(out, ReplicaLoad{Replica: r.name, URL: r.url, InFlight: r.inFlight,
			Weight: float64(r.inFlightWeight) / microUnit})
	}
	return out
}

// peerLoad is one peer's latest published load, valid until expires.
type peerLoad struct {
	loads   []ReplicaLoad
	expires time.Time
}

// SetPeerLoad records peer's in-flight loads, valid until expires (the
// publisher's TTL: a peer that stops publishing stops counting). Each
// replica's effective load then includes every live peer's in-flight
// requests (SPEC s2.2's wlc_in_flight over all instances). Loads of
// replicas this instance does not know are ignored.
func (b *Balancer) SetPeerLoad(peer string, loads []ReplicaLoad, expires, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.peers == nil {
		b.peers = make(map[string]peerLoad)
	}
	if _, known := b.peers[peer]; !known && len(b.peers) >= maxPeers {
		b.sumPeers(now) // drops the expired ones
		if len(b.peers) >= maxPeers {
			return
		}
	}
	// A load claims at most maxPeerLoadTTL: whatever the message says, a
	// peer that stops publishing stops counting soon.
	expires = minTime(expires, now.Add(maxPeerLoadTTL))
	b.peers[peer] = peerLoad{loads: slices.Clone(loads[:min(len(loads), maxPeerLoads)]), expires: expires}
	b.sumPeers(now)
}

// refreshPeers drops expired peer loads; cheap when nothing expired.
func (b *Balancer) refreshPeers(now time.Time) {
	if len(b.peers) > 0 && !now.Before(b.peersExpire) {
		b.sumPeers(now)
	}
}

// sumPeers recomputes every replica's peer load from the live peers.
func (b *Balancer) sumPeers(now time.Time) {
	for _, r := range b.replicas {
		r.peerInFlight, r.peerWeight = 0, 0
	}
	b.peersExpire = time.Time{}
	for id, pl := range b.peers {
		if !now.Before(pl.expires) {
			delete(b.peers, id)
			continue
		}
		if b.peersExpire.IsZero() || pl.expires.Before(b.peersExpire) {
			b.peersExpire = pl.expires
		}
		for _, l := range pl.loads {
			r := b.resolve(l.Replica, l.URL)
			if r == nil || l.InFlight <= 0 {
				continue
			}
			r.peerInFlight += min(l.InFlight, maxPeerInFlight)
			r.peerWeight += int64(min(max(l.Weight, 0), maxWeight) * microUnit)
		}
	}
}

// maxPeerInFlight bounds one peer's claim on one replica, so that a
// corrupt message cannot overflow the sums.
const maxPeerInFlight = 1 << 20

// Bounds on what peers' load messages can make this instance hold and
// recompute under its lock (a misbehaving or hostile writer to the shared
// store): peers at once, replicas per message, and how long a load counts.
const (
	maxPeers       = 1024
	maxPeerLoads   = 16384
	maxPeerLoadTTL = time.Minute
)

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
