package balancer

import (
	"math"
	"slices"
	"time"

	"github.com/llmlb/llmlb/internal/policy"
)

// What the balancer learns of each replica's engine limits for cost-aware
// policies, and how well their time-to-first-token estimates hold: the
// running-slot limit comes from flow control's plateau (capacity.go); the
// estimates are checked against the first token each request gets.

// slotLimit is the replica's running-slot limit for policy cost: flow
// control's, configured (saturation.max_running) or learned from a plateau
// of scrapes; until that is known, the most the replica ran at a scrape
// that showed a queue; else the largest limit known of another replica
// (replicas of one pool are mostly alike); 0 while none is known.
//
// Flow control waits for three scrapes, since a limit learned too low
// would hold requests back; policy cost prices a batch by it
// (its utilisation and the wait for a slot), and pricing a 16-slot
// replica as a 256-slot one until its queue lasted three scrapes let the
// first bursts pile onto it (scripts/limits.sh: P99 2.2x that with the
// true size at 16 slots).
func (b *Balancer) slotLimit(r *replica) float64 {
	if l := b.limit(r); l > 0 {
		return l
	}
	if r.slots.queued > 0 {
		return max(r.slots.queued, r.cap.free)
	}
	return b.fleetSlots
}

// slotSeen is what one replica's scrapes showed of its slot limit.
type slotSeen struct {
	queued float64 // the most running on two scrapes in a row with requests waiting
	last   float64 // running at the last scrape, if requests waited then (else 0)
}

// observe learns from a successful scrape.
func (s *slotSeen) observe(snap Snapshot) {
	if snap.Waiting < 1 || snap.Running < 1 {
		s.last = 0
		return
	}
	if snap.Running == s.last {
		s.queued = max(s.queued, snap.Running)
	}
	s.last = snap.Running
}

// updateFleetSlots recomputes the largest slot limit known of any replica
// (flow control's, or seen at a queue), the prior of those not known yet.
func (b *Balancer) updateFleetSlots() {
	b.fleetSlots = 0
	for _, r := range b.replicas {
		l := b.limit(r)
		if l <= 0 && r.slots.queued > 0 {
			l = max(r.slots.queued, r.cap.free)
		}
		b.fleetSlots = max(b.fleetSlots, l)
	}
}

// ttftWindow is how many of a replica's latest first tokens its prediction
// error is measured over.
const ttftWindow = 256

// ttftTrack keeps a replica's latest estimates against the times to first
// token measured, as the ratio predicted / measured.
type ttftTrack struct {
	ratio [ttftWindow]float64
	n     int    // samples held (up to ttftWindow)
	next  int    // where the next sample goes
	total uint64 // samples ever taken
}

// add records one request's estimate and its measured time to first token,
// both in seconds; a sample without an estimate or a time is skipped.
func (t *ttftTrack) add(predicted, measured float64) {
	if !(predicted > 0) || !(measured > 0) || math.IsInf(predicted, 0) || math.IsInf(measured, 0) {
		return
	}
	t.ratio[t.next] = predicted / measured
	t.next = (t.next + 1) % ttftWindow
	t.n = min(t.n+1, ttftWindow)
	t.total++
}

// summary returns the median relative error |predicted - measured| /
// measured and the median ratio predicted / measured over the window
// (0, 0 without samples).
func (t *ttftTrack) summary() (errMedian, ratioMedian float64) {
	if t.n == 0 {
		return 0, 0
	}
	xs := slices.Clone(t.ratio[:t.n])
	slices.Sort(xs)
	ratioMedian = medianSorted(xs)
	for i, x := range xs {
		xs[i] = math.Abs(x - 1)
	}
	slices.Sort(xs)
	return medianSorted(xs), ratioMedian
}

// medianSorted is the median of sorted, non-empty xs.
func medianSorted(xs []float64) float64 {
	m := len(xs) / 2
	if len(xs)%2 == 1 {
		return xs[m]
	}
	return (xs[m-1] + xs[m]) / 2
}

// observeFirstToken checks res's estimate against its measured time to
// first token, from the decision to now, and hands both to the policy that
// chose, if it learns from them (policy.FirstTokenObserver: cost fits each
// replica's prefill model). Under the lock.
func (b *Balancer) observeFirstToken(res *Reservation, now time.Time) {
	if res.firstToken || res.at.IsZero() || now.Before(res.at) {
		return
	}
	measured := now.Sub(res.at).Seconds()
	res.rep.ttft.add(res.Explanation.Estimate, measured)
	if o, ok := res.policy.(policy.FirstTokenObserver); ok && any(res.policy) == any(b.policy) && !res.rep.removed {
		o.ObserveFirstToken(res.rep.name, res.shape, measured)
	}
}
