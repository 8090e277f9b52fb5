package balancer

import (
	"fmt"
	"time"

	"github.com/llmlb/llmlb/internal/health"
)

// buckets is the resolution of a traffic window: alerts.window is counted in
// this many buckets, so a window add or sum is O(1).
const buckets = 6

// window counts events in a sliding window of fixed buckets.
type window struct {
	counts [buckets]uint64
	epochs [buckets]int64 // the bucket number each slot currently holds
}

func bucketOf(now time.Time, span time.Duration) int64 {
	return now.UnixNano() / int64(max(span/buckets, 1))
}

func (w *window) add(now time.Time, span time.Duration) {
	idx := bucketOf(now, span)
	slot := ((idx % buckets) + buckets) % buckets
	if w.epochs[slot] != idx {
		w.epochs[slot], w.counts[slot] = idx, 0
	}
	w.counts[slot]++
}

// sum returns the events of the last span (the current bucket included).
func (w *window) sum(now time.Time, span time.Duration) uint64 {
	idx := bucketOf(now, span)
	var n uint64
	for s := range buckets {
		if w.epochs[s] > idx-buckets && w.epochs[s] <= idx {
			n += w.counts[s]
		}
	}
	return n
}

// alertState is what the alerts of docs/ROUTING.md "Alerts" remember between evaluations.
type alertState struct {
	lastGoodScrape  time.Time // of any replica (probe_broken)
	imbalanceSince  time.Time // zero while the index is <= alerts.imbalance_index
	oneReplicaSince time.Time // zero unless all traffic goes to one replica
	oneReplica      string
	index           float64
}

// evalAlerts re-evaluates the windowed conditions at now. Tick and Alerts
// call it; a condition "for 5 minutes" must hold at every evaluation.
func (b *Balancer) evalAlerts(now time.Time) {
	a, span := &b.alerts, b.cfg.Alerts.Window
	a.index = b.imbalanceIndex(now)
	if a.index > b.cfg.Alerts.ImbalanceIndex {
		if a.imbalanceSince.IsZero() {
			a.imbalanceSince = now
		}
	} else {
		a.imbalanceSince = time.Time{}
	}

	// All traffic on one replica, with more than one replica in service.
	inService, busy, last := 0, 0, ""
	for _, r := range b.replicas {
		if !r.draining {
			inService++
		}
		if r.traffic.sum(now, span) > 0 {
			busy++
			last = r.name
		}
	}
	if inService > 1 && busy == 1 {
		if a.oneReplicaSince.IsZero() || a.oneReplica != last {
			a.oneReplicaSince, a.oneReplica = now, last
		}
	} else {
		a.oneReplicaSince, a.oneReplica = time.Time{}, ""
	}
}

// imbalanceIndex is max share / mean share of the requests routed in the
// last alerts.window among the LIVE, non-draining replicas: 1 is perfectly
// even, N means all traffic on one of N. It is 0 when undefined (fewer than
// two such replicas, or no traffic).
func (b *Balancer) imbalanceIndex(now time.Time) float64 {
	n, total, top := 0, uint64(0), uint64(0)
	for _, r := range b.replicas {
		if r.draining || r.health.State() != health.Live {
			continue
		}
		c := r.traffic.sum(now, b.cfg.Alerts.Window)
		n++
		total += c
		top = max(top, c)
	}
	if n < 2 || total == 0 {
		return 0
	}
	return float64(top) * float64(n) / float64(total)
}

// ImbalanceIndex returns the imbalance index at now (see imbalanceIndex and
// docs/ROUTING.md), for metrics and the dashboard.
func (b *Balancer) ImbalanceIndex(now time.Time) float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.imbalanceIndex(now)
}

// Alerts returns the alerts firing at now.
func (b *Balancer) Alerts(now time.Time) []Alert {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.evalAlerts(now)
	a, cfg := &b.alerts, b.cfg.Alerts
	var out []Alert
	if !a.imbalanceSince.IsZero() && now.Sub(a.imbalanceSince) >= cfg.ImbalanceFor {
		out = append(out, Alert{Name: "imbalance", Since: a.imbalanceSince,
			Message: fmt.Sprintf("imbalance index %.2f > %g for %s: load starts to crystallize", a.index, cfg.ImbalanceIndex, now.Sub(a.imbalanceSince).Round(time.Second))})
	}
	if !a.oneReplicaSince.IsZero() && now.Sub(a.oneReplicaSince) >= cfg.OneReplicaFor {
		out = append(out, Alert{Name: "one_replica", Replica: a.oneReplica, Since: a.oneReplicaSince,
			Message: fmt.Sprintf("all traffic on %s for %s", a.oneReplica, now.Sub(a.oneReplicaSince).Round(time.Second))})
	}
	ejected := 0
	for _, r := range b.replicas {
		if r.health.State() == health.Ejected {
			ejected++
		}
	}
	if ejected > 0 && now.Sub(a.lastGoodScrape) >= cfg.ProbeBrokenFor {
		out = append(out, Alert{Name: "probe_broken", Since: a.lastGoodScrape.Add(cfg.ProbeBrokenFor),
			Message: fmt.Sprintf("%d replica(s) EJECTED and no successful scrape since %s: the probe is broken", ejected, a.lastGoodScrape.Format(time.RFC3339))})
	}
	for _, r := range b.replicas {
		if at := r.health.CappedAt(); !at.IsZero() {
			out = append(out, Alert{Name: "flapping", Replica: r.name, Since: at,
				Message: fmt.Sprintf("%s reached the ejection cooldown cap (%s): it flaps", r.name, b.cfg.Health.MaxCooldown)})
		}
	}
	return out
}
