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
// of scrapes; until that is known, the most the replica ran on two scrapes
// in a row that showed a queue; until then, while it preempts, its
// KV-bound batch; else the largest limit known of another replica
// (replicas of one pool are mostly alike); 0 while none is known. Each is
// never below the most the replica ran with none waiting.
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
	if r.slots.kvBound > 0 {
		return max(r.slots.kvBound, r.cap.free)
	}
	return b.fleetSlots
}

// kvBoundScrapes is how many scrapes in a row without a preemption end a
// replica's KV-bound batch (slotSeen.kvBound): how many requests fit its
// KV cache moves with their contexts, and a replica priced by one
// preemption for good was measured worse (the mixed workload with default
// engine sizes, seed 4: P99 0.69 s to 2.30 s; 1.03 s with the bound held
// for 10 scrapes).
const kvBoundScrapes = 10

// slotSeen is what one replica's scrapes showed of its slot limit.
type slotSeen struct {
	queued float64 // the most running on two scrapes in a row with requests waiting
	last   float64 // running at the last scrape, if requests waited then (else 0)

	// kvBound is the most running at a scrape whose preemption counter
	// (vllm:num_preemptions_total) grew since the one before, while the
	// replica preempts (0 after kvBoundScrapes without): the batch its KV
	// cache holds. An engine whose KV fills before its slots do preempts
	// with fewer running than its slot limit and never holds a queue at
	// one running count, so no plateau shows its limit, and priced as a
	// 256-slot replica it drew more requests while it thrashed (agentic,
	// 64 slots, parallel prefill, seed 4: 2,102 preemptions, P99 16.7 s
	// against 0.68 s with the true size; scripts/limits.sh).
	kvBound     float64
	quiet       int     // scrapes since the last that showed a preemption
	preemptions float64 // the counter at the last scrape
	scraped     bool    // preemptions holds a scrape's counter
}

// observe learns from a successful scrape.
func (s *slotSeen) observe(snap Snapshot) {
	preempted := s.scraped && snap.Preemptions > s.preemptions && snap.Running >= 1
	s.preemptions, s.scraped = snap.Preemptions, true
	switch {
	case preempted:
		s.kvBound, s.quiet = max(s.kvBound, snap.Running), 0
	case s.kvBound > 0:
		if s.quiet++; s.quiet >= kvBoundScrapes {
			s.kvBound, s.quiet = 0, 0
		}
	}
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
// A KV-bound batch is not: it is the replica's prompt mix of the moment,
// and lent to the others it made the 64-slot parallel fleet worse
// (scripts/limits.sh: P99 1.84x the true size's against 1.00x).
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
