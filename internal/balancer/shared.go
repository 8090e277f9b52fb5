package balancer

import (
	"slices"
	"time"

	"github.com/llmlb/llmlb/internal/health"
	"github.com/llmlb/llmlb/internal/policy"
)

// Shared state between several balancers (docs/SHARED_STATE.md): what
// decides affinity (a policy's pins, or the blocks policy cost's index says
// each replica was sent) leaves the policy as Deltas through a Sharer, and other
// instances' Deltas come back in through Apply. Peers' in-flight loads come
// in through SetPeerLoad and are added to the effective load. The core does
// no I/O for any of it: a Sharer must not block, and what arrives is a hint
// applied under the lock like any other event, with the caller's now.

// Delta, DeltaKind and Sharer are package policy's: a policy publishes its
// own affinity changes. The names stay here for the shell's convenience.
type (
	Delta     = policy.Delta
	DeltaKind = policy.DeltaKind
	Sharer    = policy.Sharer
)

// The kinds of Delta (see package policy).
const (
	DeltaPin    = policy.DeltaPin
	DeltaUnpin  = policy.DeltaUnpin
	DeltaBlocks = policy.DeltaBlocks
)

// SetSharer makes the core publish its policy's affinity changes to s (nil:
// none). Call it before traffic starts.
func (b *Balancer) SetSharer(s Sharer) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sharer = s
}

// fleetView is the core as its policy sees it (policy.Fleet), under the lock.
type fleetView struct{ b *Balancer }

// Alive reports whether the replica is known, not draining and not EJECTED.
func (f fleetView) Alive(name string) bool {
	r := f.b.byName[name]
	return r != nil && !r.draining && r.health.State() != health.Ejected
}

// Sharer returns where the policy publishes, nil when state is not shared.
func (f fleetView) Sharer() policy.Sharer {
	if f.b.sharer == nil {
		return nil
	}
	return urlSharer{f.b}
}

// urlSharer fills in the URL of the replica a Delta names, so that peers
// whose names for it differ still match it, then passes the Delta on.
type urlSharer struct{ b *Balancer }

// Publish passes d on with its replica's URL.
func (s urlSharer) Publish(d Delta) {
	if d.URL == "" && d.Replica != "" {
		if r := s.b.byName[d.Replica]; r != nil {
			d.URL = r.url
		}
	}
	s.b.sharer.Publish(d)
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

// Apply applies a peer's Delta at now. It is a hint: a change naming a
// replica this instance does not know is ignored; the policy applies the
// rest as if this instance had made it (a pin bound or refreshed as the peer
// left it, blocks entered into its index). It reports whether the Delta
// changed anything.
func (b *Balancer) Apply(d Delta, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	capacity := 0
	if d.Kind != DeltaUnpin {
		r := b.resolve(d.Replica, d.URL)
		if r == nil {
			return false
		}
		d.Replica, capacity = r.name, int(r.snap.KVCacheTokens)
	}
	return b.policy.Apply(d, capacity, now)
}

// ReplicaLoad is one replica's in-flight requests at one instance, as
// published to its peers.
type ReplicaLoad struct {
	Replica  string  `json:"r"`
	URL      string  `json:"u,omitempty"`
	InFlight int     `json:"n"`
	Weight   float64 `json:"w"` // in-flight weight (docs/ROUTING.md "Effective load" units)
	// Held is the prompt tokens those requests computed or will compute
	// there, less their cache hits: the KV they hold or will hold (policy
	// cost prices it; 0 under other policies). Peers add it to what
	// they count as committed on the replica (SaturationConfig.KVCommit).
	Held float64 `json:"h,omitempty"`
}

// Load returns this instance's own in-flight requests per replica (those
// with none included, so a peer learns they ended), for its peers.
func (b *Balancer) Load() []ReplicaLoad {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]ReplicaLoad, 0, len(b.replicas))
	for _, r := range b.replicas {
		out = append(out, ReplicaLoad{Replica: r.name, URL: r.url, InFlight: r.inFlight,
			Weight: float64(r.inFlightWeight) / microUnit, Held: r.heldPrefill})
	}
	return out
}

// peerLoad is one peer's latest published load, valid until expires.
type peerLoad struct {
	loads   []ReplicaLoad
	expires time.Time
	at      time.Time // when it arrived
}

// SetPeerLoad records peer's in-flight loads, valid until expires (the
// publisher's TTL: a peer that stops publishing stops counting). Each
// replica's effective load then includes every live peer's in-flight
// requests (docs/ROUTING.md's wlc_in_flight over all instances). Loads of
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
	b.peers[peer] = peerLoad{loads: slices.Clone(loads[:min(len(loads), maxPeerLoads)]), expires: expires, at: now}
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
		r.peerInFlight, r.peerWeight, r.peerHeld = 0, 0, 0
	}
	b.peersExpire = time.Time{}
	b.peersLive, b.peersAgeSum, b.peersSummed = 0, 0, now
	for id, pl := range b.peers {
		if !now.Before(pl.expires) {
			delete(b.peers, id)
			continue
		}
		b.peersLive++
		b.peersAgeSum += now.Sub(pl.at).Seconds()
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
			if l.Held > 0 { // not NaN
				r.peerHeld += min(l.Held, maxPeerHeld)
			}
		}
	}
}

// peersUnseen is the KV the live peers are taken to have sent to the
// replica since their loads arrived: each as much as this instance sends
// there, at its recent rate (sendRate), for as long as that peer's load
// is old. Instances that see the same memory free all send into it in
// the moments before they see each other's sends; counting the others'
// as about one's own keeps them from filling it several times over.
// The live peers' loads' ages are kept as a count and a sum (sumPeers),
// so that this costs the same with many peers as with one.
func (b *Balancer) peersUnseen(r *replica, now time.Time) float64 {
	rate := r.sendRate(now)
	if rate <= 0 || b.peersLive == 0 {
		return 0
	}
	ages := b.peersAgeSum + float64(b.peersLive)*now.Sub(b.peersSummed).Seconds()
	return rate * max(0, ages)
}

// maxPeerInFlight bounds one peer's claim on one replica, so that a
// corrupt message cannot overflow the sums.
const maxPeerInFlight = 1 << 20

// maxPeerHeld bounds one peer's claim of KV held on one replica, in
// tokens: far above any engine's cache, far below overflowing a sum.
const maxPeerHeld = 1 << 40

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
