package flowcontrol

import (
	"time"

	"golang.org/x/time/rate"
)

// OverflowTenant is the name under which requests of tenants beyond
// MaxTenants are counted: they share one fair share and one set of limits
// (a tenant really named so shares the overflow's fair share too).
const OverflowTenant = "(overflow)"

// tenant is one tenant's limits and counts.
type tenant struct {
	name     string
	maxConc  int
	lim      *rate.Limiter // nil without a tokens-per-minute limit
	queued   int
	inflight int
	bytes    int64
	idle     bool // in Queue.idleT: nothing queued or running
	overflow bool
	iprev    *tenant
	inext    *tenant
}

// tenant returns the named tenant, remembering it if there is room, else
// the overflow tenant.
func (q *Queue) tenant(name string) *tenant {
	if t := q.tenants[name]; t != nil {
		return t
	}
	if len(q.tenants) >= q.cfg.MaxTenants {
		if q.overflow == nil {
			q.overflow = q.newTenant(OverflowTenant, q.cfg.Tenant)
			q.overflow.overflow = true
		}
		return q.overflow
	}
	t := q.newTenant(name, q.cfg.limitsFor(name))
	q.tenants[name] = t
	t.idle = true
	q.idleT.pushBack(t, tenantLinks)
	return t
}

func (q *Queue) newTenant(name string, l TenantLimits) *tenant {
	t := &tenant{name: name, maxConc: l.MaxConcurrent}
	if l.TokensPerMinute > 0 {
		t.lim = rate.NewLimiter(rate.Limit(float64(l.TokensPerMinute)/60), l.TokensPerMinute)
	}
	return t
}

// busy marks t as having something outstanding.
func (q *Queue) busy(t *tenant) {
	if t.idle {
		q.idleT.remove(t, tenantLinks)
		t.idle = false
	}
}

// maybeIdle files t among the idle tenants once nothing is outstanding.
func (q *Queue) maybeIdle(t *tenant) {
	if t.idle || t.overflow || t.queued+t.inflight > 0 {
		return
	}
	t.idle = true
	q.idleT.pushBack(t, tenantLinks)
}

// pruneTenants forgets idle tenants, oldest idle first, whose rate limiter
// has refilled (a fresh tenant would be the same), stopping at the first
// that still owes tokens: amortized O(1) per call.
func (q *Queue) pruneTenants(now time.Time) {
	for t := q.idleT.head; t != nil; t = q.idleT.head {
		if t.lim != nil && t.lim.TokensAt(now) < float64(t.lim.Burst()) {
			return
		}
		q.idleT.remove(t, tenantLinks)
		t.idle = false
		delete(q.tenants, t.name)
	}
}

// dropFlow forgets an idle flow: a flow that comes back starts at its
// band's virtual time, losing at most one request's worth of debt.
func (q *Queue) dropFlow(f *flow) {
	q.idleF.remove(f, flowLinks)
	f.idle = false
	delete(f.band.byKey, f.key)
}

// list is an intrusive doubly linked list; links returns pointers to an
// element's prev and next fields.
type list[T comparable] struct {
	head, tail T
	n          int
}

func (l *list[T]) pushBack(x T, links func(T) (*T, *T)) {
	var zero T
	p, n := links(x)
	*p, *n = l.tail, zero
	if l.tail != zero {
		_, tn := links(l.tail)
		*tn = x
	} else {
		l.head = x
	}
	l.tail = x
	l.n++
}

func (l *list[T]) remove(x T, links func(T) (*T, *T)) {
	var zero T
	p, n := links(x)
	if *p != zero {
		_, pn := links(*p)
		*pn = *n
	} else {
		l.head = *n
	}
	if *n != zero {
		np, _ := links(*n)
		*np = *p
	} else {
		l.tail = *p
	}
	*p, *n = zero, zero
	l.n--
}

func entryLinks(e *entry) (*(*entry), *(*entry))     { return &e.gprev, &e.gnext }
func flowLinks(f *flow) (*(*flow), *(*flow))         { return &f.iprev, &f.inext }
func tenantLinks(t *tenant) (*(*tenant), *(*tenant)) { return &t.iprev, &t.inext }
