package flowcontrol

import (
	"sort"
	"time"
)

// Stats is a snapshot of the queue for metrics and the dashboard.
type Stats struct {
	Queued     int           // requests queued
	Bytes      int64         // their body bytes
	OldestWait time.Duration // how long the oldest has waited
	Tenants    int           // tenants remembered (the overflow tenant aside)
	// Classes has one row per priority with requests queued, highest first.
	Classes []ClassStats
	// ByTenant has one row per tenant with requests queued or running,
	// by name; tenants beyond MaxTenants appear as OverflowTenant.
	ByTenant []TenantStats
	// Counters since New.
	Admitted   uint64            // dispatched at once or queued
	Dispatched uint64            // by Admit or Next
	Expired    uint64            // handed back by Expire
	Removed    uint64            // taken out by Remove or Drain
	Refused    map[Reason]uint64 // by reason, nonzero only
}

// ClassStats describes the queued requests of one priority.
type ClassStats struct {
	Priority   int
	Queued     int
	Bytes      int64
	OldestWait time.Duration
}

// TenantStats describes one tenant's requests.
type TenantStats struct {
	Tenant     string
	Queued     int
	Bytes      int64
	InFlight   int           // dispatched and not yet Done
	OldestWait time.Duration // of its queued requests
}

// Stats returns a snapshot at now. It costs O(tenants + priorities), not
// O(queued requests).
func (q *Queue) Stats(now time.Time) Stats {
	q.mu.Lock()
	defer q.mu.Unlock()
	s := Stats{Queued: q.n, Bytes: q.bytes, Tenants: len(q.tenants),
		Admitted: q.admitted, Dispatched: q.dispatched, Expired: q.expired, Removed: q.removed}
	if q.arr.head != nil {
		s.OldestWait = now.Sub(q.arr.head.item.Enqueued)
	}
	for r, n := range q.refused {
		if n > 0 {
			if s.Refused == nil {
				s.Refused = make(map[Reason]uint64)
			}
			s.Refused[Reason(r)] = n
		}
	}
	oldest := make(map[*tenant]time.Time)
	for _, b := range q.bh {
		c := ClassStats{Priority: b.prio, Queued: b.n, Bytes: b.bytes}
		for _, f := range b.fh {
			w := now.Sub(f.head.item.Enqueued)
			c.OldestWait = max(c.OldestWait, w)
			if o, ok := oldest[f.head.t]; !ok || f.head.item.Enqueued.Before(o) {
				oldest[f.head.t] = f.head.item.Enqueued
			}
		}
		s.Classes = append(s.Classes, c)
	}
	sort.Slice(s.Classes, func(i, j int) bool { return s.Classes[i].Priority > s.Classes[j].Priority })
	add := func(t *tenant) {
		if t == nil || t.queued+t.inflight == 0 {
			return
		}
		ts := TenantStats{Tenant: t.name, Queued: t.queued, Bytes: t.bytes, InFlight: t.inflight}
		if o, ok := oldest[t]; ok {
			ts.OldestWait = now.Sub(o)
		}
		s.ByTenant = append(s.ByTenant, ts)
	}
	for _, t := range q.tenants {
		add(t)
	}
	add(q.overflow)
	sort.Slice(s.ByTenant, func(i, j int) bool { return s.ByTenant[i].Tenant < s.ByTenant[j].Tenant })
	return s
}
