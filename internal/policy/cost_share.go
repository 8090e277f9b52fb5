package policy

import "github.com/llmlb/llmlb/internal/tokenize"

// fleetEvents is what an event-fed index may say beyond PreciseIndex
// (kvevents.Index does): how many blocks the replicas have computed,
// whoever routed their prompts, and each replica's marginal reuse as its
// own evictions show it.
type fleetEvents interface {
	// Computed counts the blocks replicas stored in their GPU caches
	// that they did not hold there before; it only grows.
	Computed() uint64
	// SetMargin sets MarginalReuse's margin, a share of each replica's
	// capacity.
	SetMargin(share float64)
	// MarginalReuse is the recent share of the blocks the replica's GPU
	// cache evicted that were computed again, by any replica, while a
	// cache larger by the margin would still have held them; ok is false
	// until it has evicted enough.
	MarginalReuse(replica string) (reuse float64, ok bool)
}

// trafficShare is this balancer's share of the blocks the fleet computes:
// the blocks it routed to publishing replicas to be computed, over those
// their events report computed, both counted since the last halving.
type trafficShare struct {
	last uint64  // the events' count at the last decision
	own  float64 // blocks this balancer routed to be computed
	all  float64 // blocks the events reported computed
}

const (
	// shareHalfLife is the computed blocks after which both counts halve.
	shareHalfLife = 1 << 16
	// shareSample is the computed blocks below which the share is not
	// known (taken as 1). At start the engines report blocks computed for
	// prompts routed before their first events made them publishing
	// replicas: one balancer measured shares of 0.03-0.7 until the fleet
	// had computed about 5,000 blocks, long before any cache was full.
	shareSample = 1 << 13
	// fleetShare is the share below which cost takes the fleet's view:
	// one balancer in front of a fleet measures 0.97-1.02 (its routed
	// blocks and the events' do not match one for one), each of two or
	// more well under it.
	fleetShare = 0.75
	// shareMin bounds the share that scales what this balancer knows.
	shareMin = 1.0 / 16
)

// noteComputed reads the events' count of computed blocks.
func (p *Cost) noteComputed() {
	f, ok := p.precise.(fleetEvents)
	if !ok {
		return
	}
	n := f.Computed()
	if n < p.share.last { // another index
		p.share.last = n
	}
	p.share.all += float64(n - p.share.last)
	p.share.last = n
	if p.share.all >= shareHalfLife {
		p.share.all /= 2
		p.share.own /= 2
	}
}

// noteRouted counts the blocks the chosen candidate must compute, when
// its events report them.
func (p *Cost) noteRouted(d *costDecision, best int) {
	if _, ok := p.precise.(fleetEvents); !ok || !p.usePrecise(d) || !p.precise.Publishes(p.names[p.candID[best]]) {
		return
	}
	p.share.own += float64(max(0, d.tokens/tokenize.BlockSize-int(p.depth[p.candID[best]])))
}

// fleetView reports whether this balancer routes well under the blocks the
// fleet computes (other balancers, or clients sent straight to the
// engines, route the rest), and its share of them. Its own index then
// sees only its share of the traffic: each replica's evictions in it are
// those its own prompts cause, and it sees only its share of the evicted
// blocks asked for again, so the replicas' marginal reuse it measures is
// a small, noisy sample (0.02-0.14 where one balancer measures 0.3-0.95
// on chat), and each of several balancers measures a different one.
//
// With shared state the peers' prompts reach this index too (Apply) and
// their in-flight requests its loads: it sees the fleet's traffic, and
// keeps its own view.
func (p *Cost) fleetView() (share float64, ok bool) {
	if p.share.all < shareSample || (p.fleet != nil && p.fleet.Sharer() != nil) {
		return 1, false
	}
	share = min(1, max(shareMin, p.share.own/p.share.all))
	return share, share < fleetShare
}

// marginalReuse is replica id's marginal reuse (kvindex.MarginalReuse):
// from the replica's own events when this balancer takes the fleet's view
// and the replica publishes them, so that every balancer reading them
// measures the same thing on all of the traffic; from its own index
// otherwise.
func (p *Cost) marginalReuse(id int32) (float64, bool) {
	if _, fleet := p.fleetView(); fleet {
		if f, ok := p.precise.(fleetEvents); ok && p.precise.Publishes(p.names[id]) {
			return f.MarginalReuse(p.names[id])
		}
	}
	return p.index.MarginalReuse(id)
}

// heldKV scales the KV this balancer's own requests hold on a replica to
// the fleet's when it takes the fleet's view: the others' requests there
// hold about as much for each of its blocks.
func (p *Cost) heldKV(held float64) float64 {
	if share, fleet := p.fleetView(); fleet {
		return held / share
	}
	return held
}

// setFleetMargin gives an event-fed index the margin of marginal reuse.
func (p *Cost) setFleetMargin() {
	if f, ok := p.precise.(fleetEvents); ok {
		f.SetMargin(p.cfg.MarginWindow)
	}
}
