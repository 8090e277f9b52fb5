package balancer

import (
	"math"
	"slices"
	"time"
)

// What the balancer learns of each replica's engine limits for cost-aware
// policies, and how well their time-to-first-token estimates hold: the
// running-slot limit comes from flow control's plateau (capacity.go); the
// estimates are checked against the first token each request gets.

// slotLimit is the replica's running-slot limit for policy cost:
// flow control's, configured (saturation.max_running) or learned from a
// plateau of scrapes; 0 while not known.
func (b *Balancer) slotLimit(r *replica) float64 {
	return b.limit(r)
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
// first token: from the decision to now. Under the lock.
func (b *Balancer) observeFirstToken(res *Reservation, now time.Time) {
	if res.firstToken || res.at.IsZero() || now.Before(res.at) {
		return
	}
	res.rep.ttft.add(res.Explanation.Estimate, now.Sub(res.at).Seconds())
}
