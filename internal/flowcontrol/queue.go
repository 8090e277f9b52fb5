package flowcontrol

import (
	"errors"
	"sync"
	"time"
)

// Item is one request as the queue sees it. The caller fills every field
// but Enqueued, which Admit sets.
type Item struct {
	ID       uint64 // unique among the requests the queue holds; chosen by the caller
	Priority int    // higher first; below zero is sheddable
	Tenant   string // fairness and limits are per tenant
	Tokens   int64  // estimated prompt plus output tokens: the fair-share cost
	Bytes    int64  // request body bytes, counted against MaxQueuedBytes
	Enqueued time.Time
	// PassesHeld lets Admit dispatch it while requests of its priority
	// are queued, when the room the pool has is room they may not take
	// (the replicas' reserve, which only favoured tenants' requests
	// take: Favoured).
	PassesHeld bool
	// Payload is the caller's own: typically what wakes the waiting
	// request (a channel the shell owns). The queue never looks at it.
	Payload any
}

// Outcome is what Admit decided.
type Outcome uint8

// Admit's outcomes.
const (
	Dispatch Outcome = iota // send it now: nothing is queued ahead and the pool has room
	Queued                  // held: Next returns it when a replica has room
	Refused                 // answer 429 with Retry-After; Reason says why
)

// String names the outcome for logs and metrics.
func (o Outcome) String() string {
	switch o {
	case Dispatch:
		return "dispatch"
	case Queued:
		return "queued"
	default:
		return "refused"
	}
}

// Reason says why a request was refused.
type Reason uint8

// Refusal reasons.
const (
	NoReason          Reason = iota
	QueueFull                // MaxQueued requests are queued
	QueueBytesFull           // the bodies would pass MaxQueuedBytes
	Shed                     // priority below zero while the pool is saturated
	TenantConcurrency        // the tenant has MaxConcurrent requests outstanding
	TenantRate               // the tenant spent its tokens per minute
	numReasons
)

// String names the reason for metric labels and logs.
func (r Reason) String() string {
	return [...]string{"", "queue_full", "queue_bytes_full", "shed", "tenant_concurrency", "tenant_rate"}[r]
}

// Code is the OpenAI-shaped error code the shell answers with: queue_full,
// shed or tenant_limit (queue_timeout is Expire's).
func (r Reason) Code() string {
	switch r {
	case QueueFull, QueueBytesFull:
		return "queue_full"
	case Shed:
		return "shed"
	case TenantConcurrency, TenantRate:
		return "tenant_limit"
	}
	return ""
}

// DefaultRetryAfter is the Retry-After of refusals whose end the queue cannot
// foresee (a full queue, a shed, a concurrency limit); shells may use it for
// expired requests too.
const DefaultRetryAfter = time.Second

// Decision is Admit's answer.
type Decision struct {
	Outcome    Outcome
	Reason     Reason        // set when Refused
	RetryAfter time.Duration // set when Refused: the rate limiter's wait, else DefaultRetryAfter
}

// Sentinel errors of Admit.
var (
	ErrDuplicateID = errors.New("flowcontrol: an item with this id is queued")
	ErrBadItem     = errors.New("flowcontrol: negative tokens or bytes")
)

// EntryBytes bounds the queue's own memory per queued request, besides the
// body counted in MaxQueuedBytes and the caller's tenant string: the entry
// (the Item, its tenant and its links, 144 B) and its slot in the
// id map; BenchmarkMemoryPerItem measures 168 B on amd64 with 100,000
// queued, so 100,000 queued requests cost about 17 MB plus their bodies.
const EntryBytes = 256

// keptBands is how many priorities keep their state (virtual time, idle
// flows) while they have nothing queued; beyond it, an emptied priority is
// forgotten, so clients inventing priorities cannot grow memory.
const keptBands = 16

// entry is a queued item, linked into its flow (FCFS) and into the queue's
// arrival order (expiry).
type entry struct {
	item         Item
	seq          uint64 // admission order, breaks ties between flows
	flow         *flow
	t            *tenant // whose counts it is in (the overflow tenant's, past MaxTenants)
	fprev, fnext *entry
	gprev, gnext *entry
}

// Queue holds requests while a pool of replicas is saturated and picks the
// next to dispatch. Use one Queue per pool of replicas that can serve the
// same requests. It is safe for concurrent use: every method takes its lock.
type Queue struct {
	mu  sync.Mutex
	cfg Config

	ids   map[uint64]*entry
	bands map[int]*band
	bh    bandHeap     // non-empty bands, highest priority first
	arr   list[*entry] // every queued entry in admission order
	n     int
	bytes int64
	seq   uint64
	// busySince is when the queue last went from empty to holding a
	// request (valid while n > 0): how long its backlog has stood
	// (Config.StandingAfter).
	busySince time.Time

	tenants  map[string]*tenant
	overflow *tenant
	idleT    list[*tenant] // tenants with nothing outstanding, oldest idle first
	idleF    list[*flow]   // flows with nothing queued still owed fairness, oldest first

	inflight int // dispatched requests not yet Done, every tenant's
	// byPrio counts them by priority, and topPrio is the highest priority
	// among them (valid while inflight > 0): a request of a lower one may
	// not take the replicas' reserve (Favoured).
	byPrio  map[int]int
	topPrio int

	refused    [numReasons]uint64
	admitted   uint64
	dispatched uint64
	expired    uint64
	removed    uint64
}

// New returns an empty queue. cfg must be valid (Config.Validate).
func New(cfg Config) *Queue {
	return &Queue{
		cfg:     cfg,
		ids:     make(map[uint64]*entry),
		byPrio:  make(map[int]int),
		bands:   make(map[int]*band),
		tenants: make(map[string]*tenant),
	}
}

// Admit decides what to do with a new request at now. saturated is the
// pool's saturation signal: while it is false and nothing of the same or a
// higher priority waits, the request is dispatched at once, so an
// unsaturated pool routes exactly as without the queue. Limits apply either
// way. A Dispatch (like an item from Next) holds a tenant slot until Done.
func (q *Queue) Admit(it Item, saturated bool, now time.Time) (Decision, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.cfg.Enabled {
		return Decision{Outcome: Dispatch}, nil
	}
	if it.Tokens < 0 || it.Bytes < 0 {
		return Decision{}, ErrBadItem
	}
	if _, dup := q.ids[it.ID]; dup {
		return Decision{}, ErrDuplicateID
	}
	q.pruneTenants(now)

	now1 := !saturated && (it.PassesHeld || !q.queuedAtOrAbove(it.Priority))
	if !now1 {
		switch {
		case it.Priority < 0 && saturated:
			return q.refuse(Shed, DefaultRetryAfter), nil
		case q.n >= q.cfg.MaxQueued:
			return q.refuse(QueueFull, DefaultRetryAfter), nil
		case q.bytes+it.Bytes > q.cfg.MaxQueuedBytes:
			return q.refuse(QueueBytesFull, DefaultRetryAfter), nil
		}
	}
	t := q.tenant(it.Tenant)
	if t.maxConc > 0 && t.queued+t.inflight >= t.maxConc {
		return q.refuse(TenantConcurrency, DefaultRetryAfter), nil
	}
	if t.lim != nil && it.Tokens > 0 {
		n := int(min(it.Tokens, int64(t.lim.Burst())))
		r := t.lim.ReserveN(now, n)
		if d := r.DelayFrom(now); d > 0 {
			r.CancelAt(now)
			return q.refuse(TenantRate, d), nil
		}
	}
	q.admitted++
	if now1 {
		q.busy(t)
		t.inflight++
		q.started(it.Priority)
		q.dispatched++
		return Decision{Outcome: Dispatch}, nil
	}
	it.Enqueued = now
	if q.n == 0 {
		q.busySince = now
	}
	q.push(it, t)
	return Decision{Outcome: Queued}, nil
}

func (q *Queue) refuse(r Reason, after time.Duration) Decision {
	q.refused[r]++
	return Decision{Outcome: Refused, Reason: r, RetryAfter: after}
}

// queuedAtOrAbove reports whether a request of priority p would wait
// behind queued ones.
func (q *Queue) queuedAtOrAbove(p int) bool {
	return len(q.bh) > 0 && q.bh[0].prio >= p
}

// push queues it for tenant t.
func (q *Queue) push(it Item, t *tenant) {
	b := q.bands[it.Priority]
	if b == nil {
		b = &band{prio: it.Priority, byKey: make(map[string]*flow), hidx: -1}
		q.bands[it.Priority] = b
	}
	if b.hidx < 0 {
		q.bh.push(b)
	}
	f := b.byKey[t.name]
	if f == nil {
		f = &flow{key: t.name, band: b, hidx: -1}
		b.byKey[t.name] = f
	}
	q.seq++
	e := &entry{item: it, seq: q.seq, flow: f, t: t}
	q.ids[it.ID] = e
	q.arr.pushBack(e, entryLinks)
	if f.head == nil {
		// The flow becomes backlogged: start-time fair queueing's start
		// tag, max(virtual time, the flow's last finish tag).
		if f.idle {
			q.idleF.remove(f, flowLinks)
			f.idle = false
			f.start = max(b.v, f.finish)
		} else {
			f.start = b.v
		}
		f.head, f.tail = e, e
		b.fh.push(f)
	} else {
		e.fprev = f.tail
		f.tail.fnext = e
		f.tail = e
	}
	f.n++
	b.n++
	b.bytes += it.Bytes
	q.n++
	q.bytes += it.Bytes
	q.busy(t)
	t.queued++
	t.bytes += it.Bytes
}

// Head returns the request Next would return at now, leaving it queued.
func (q *Queue) Head(now time.Time) (Item, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.bh) == 0 {
		return Item{}, false
	}
	return q.head(now).item, true
}

// head is the entry Next takes at now from a queue that is not empty.
func (q *Queue) head(now time.Time) *entry {
	e := q.bh[0].fh[0].head
	if q.cfg.LIFOAfter > 0 && (now.Sub(e.item.Enqueued) >= q.cfg.LIFOAfter || q.standing(now)) {
		e = e.flow.tail // the flow is behind: newest first (Config.LIFOAfter)
	}
	return e
}

// standing reports whether the backlog has stood long enough at now for
// Config.StandingQueueTime to apply (the queue is not empty). Then every
// flow goes newest first: the oldest are refused at StandingQueueTime, so
// that waiting for one of them to reach LIFOAfter would serve the queue
// first come, first served, each request after about StandingQueueTime.
func (q *Queue) standing(now time.Time) bool {
	c := q.cfg
	return c.StandingQueueTime > 0 && c.StandingQueueTime < c.MaxQueueTime && now.Sub(q.busySince) >= c.StandingAfter
}

// Next returns the next request to dispatch when a replica has room: the
// highest priority first; within a priority the tenant with the smallest
// start tag; within a tenant the oldest, or the newest once the oldest has
// waited Config.LIFOAfter. The tenant keeps a slot until Done.
func (q *Queue) Next(now time.Time) (Item, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.pruneTenants(now)
	if len(q.bh) == 0 {
		return Item{}, false
	}
	e := q.head(now)
	q.take(e)
	return e.item, true
}

// Peek appends to out the requests Next may return at now, up to n: the
// one Next would return, then those queued behind it in its flow (the same
// priority and tenant), in the order Next would reach them. Take dispatches
// one of them instead of the first, so that flow control may pass over a
// request for another of the same flow (admission.Gate.Pump prefers one
// whose cached prefix is on a replica with room). Fairness between
// priorities and tenants is unchanged: only the order within a flow moves.
func (q *Queue) Peek(now time.Time, n int, out []Item) []Item {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.bh) == 0 || n <= 0 {
		return out
	}
	e := q.head(now)
	lifo := e != e.flow.head
	for ; e != nil && n > 0; n-- {
		out = append(out, e.item)
		if lifo {
			e = e.fprev
		} else {
			e = e.fnext
		}
	}
	return out
}

// Take dispatches the queued request id as Next would (its tenant keeps a
// slot until Done) if it is in the flow Next serves at now; false
// otherwise (it left the queue, or another flow's turn came meanwhile).
func (q *Queue) Take(now time.Time, id uint64) (Item, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.pruneTenants(now)
	e := q.ids[id]
	if e == nil || len(q.bh) == 0 || q.head(now).flow != e.flow {
		return Item{}, false
	}
	q.take(e)
	return e.item, true
}

// take dispatches e, queued in the flow whose turn it is.
func (q *Queue) take(e *entry) {
	f := e.flow
	f.band.v = f.start
	f.start += max(e.item.Tokens, 1)
	e.t.inflight++ // before unlink, so the tenant never looks idle
	q.started(e.item.Priority)
	q.unlink(e)
	if f.hidx >= 0 {
		f.band.fh.fix(f.hidx) // its start tag moved (unlink fixes it only for a head)
	}
	q.dispatched++
}

// unlink takes e out of every structure and its tenant's queued count,
// leaving the tenant's in-flight count to the caller.
func (q *Queue) unlink(e *entry) {
	f, b, it := e.flow, e.flow.band, e.item
	delete(q.ids, it.ID)
	q.arr.remove(e, entryLinks)
	wasHead := f.head == e
	if e.fprev != nil {
		e.fprev.fnext = e.fnext
	} else {
		f.head = e.fnext
	}
	if e.fnext != nil {
		e.fnext.fprev = e.fprev
	} else {
		f.tail = e.fprev
	}
	e.fprev, e.fnext, e.flow = nil, nil, nil
	f.n--
	t := e.t
	switch {
	case f.head == nil:
		b.fh.remove(f.hidx)
		f.finish = f.start
		f.idle = true
		q.idleF.pushBack(f, flowLinks)
		for q.idleF.n > q.cfg.MaxTenants {
			q.dropFlow(q.idleF.head)
		}
	case wasHead:
		b.fh.fix(f.hidx)
	}
	b.n--
	b.bytes -= it.Bytes
	if b.n == 0 {
		q.bh.remove(b.hidx)
		b.hidx = -1
		if len(q.bands) > keptBands {
			for _, f := range b.byKey {
				q.dropFlow(f)
			}
			delete(q.bands, b.prio)
		}
	}
	q.n--
	q.bytes -= it.Bytes
	t.queued--
	t.bytes -= it.Bytes
	q.maybeIdle(t)
}

// Remove takes a queued request out (its client went away) and releases
// its tenant slot. It reports false if the id is not queued: the request
// was already dispatched (the shell then owes a Done) or handed back.
func (q *Queue) Remove(id uint64) (Item, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	e := q.ids[id]
	if e == nil {
		return Item{}, false
	}
	q.unlink(e)
	q.removed++
	return e.item, true
}

// Expire takes out the requests that have waited MaxQueueTime or longer at
// now, oldest first, and releases their tenant slots; the shell answers
// each with 429 queue_timeout. Requests are checked in admission order, so
// one admitted with an earlier now than its predecessor (callers racing for
// the lock) expires with that predecessor.
func (q *Queue) Expire(now time.Time) []Item {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []Item
	for e := q.arr.head; e != nil && !now.Before(q.deadline(e)); e = q.arr.head {
		q.unlink(e)
		q.expired++
		out = append(out, e.item)
	}
	return out
}

// NextExpiry returns when Expire will next take a request out, if the
// queue stays as it is: the oldest request's deadline. ok is false when
// nothing is queued.
func (q *Queue) NextExpiry() (at time.Time, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.arr.head == nil {
		return time.Time{}, false
	}
	return q.deadline(q.arr.head), true
}

// deadline is when queued e times out: MaxQueueTime after it was queued,
// or, once the queue has held requests without a break for
// StandingAfter, StandingQueueTime after it was queued (Config).
func (q *Queue) deadline(e *entry) time.Time {
	at := e.item.Enqueued.Add(q.cfg.MaxQueueTime)
	if q.cfg.StandingQueueTime > 0 && q.cfg.StandingQueueTime < q.cfg.MaxQueueTime {
		standing := q.busySince.Add(q.cfg.StandingAfter)
		short := e.item.Enqueued.Add(q.cfg.StandingQueueTime)
		if standing.After(short) {
			short = standing
		}
		if short.Before(at) {
			at = short
		}
	}
	return at
}

// started counts a dispatched request of priority p.
func (q *Queue) started(p int) {
	if q.inflight == 0 || p > q.topPrio {
		q.topPrio = p
	}
	q.inflight++
	q.byPrio[p]++
}

// ended uncounts a dispatched request of priority p, if one is counted.
func (q *Queue) ended(p int) {
	n, ok := q.byPrio[p]
	if !ok {
		return
	}
	q.inflight--
	if n > 1 {
		q.byPrio[p] = n - 1
		return
	}
	delete(q.byPrio, p)
	if p == q.topPrio { // at most one scan per priority that empties
		first := true
		for k := range q.byPrio {
			if first || k > q.topPrio {
				q.topPrio, first = k, false
			}
		}
	}
}

// Done releases a tenant slot of a dispatched request of priority at now
// (it finished, failed or was cancelled). A tenant admitted over
// MaxTenants releases the overflow tenant's slot. It reports whether a
// slot was held.
func (q *Queue) Done(tenant string, priority int, now time.Time) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	t := q.tenants[tenant]
	if t == nil || t.inflight == 0 {
		t = q.overflow
	}
	if t == nil || t.inflight == 0 {
		return false
	}
	t.inflight--
	q.ended(priority)
	q.maybeIdle(t)
	q.pruneTenants(now)
	return true
}

// Drain takes out every queued request, highest priority first, tenants
// in their fair order, each tenant's oldest first, releasing their tenant
// slots (shutdown: the shell dispatches or answers each).
func (q *Queue) Drain() []Item {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make([]Item, 0, q.n)
	for len(q.bh) > 0 {
		f := q.bh[0].fh[0]
		e := f.head
		f.band.v = f.start
		f.start += max(e.item.Tokens, 1)
		q.unlink(e)
		q.removed++
		out = append(out, e.item)
	}
	return out
}

// Rank is where a request of a tenant and priority stands among those
// outstanding in its pool: which of the replicas' reserves it may take.
type Rank struct {
	// Favoured: it may take the slots each replica keeps in reserve
	// (balancer.SaturationConfig.ReserveShare): no request of a higher
	// priority is outstanding (queued or in flight), and its tenant has no
	// more requests in flight than an equal share of all the pool's among
	// the tenants with requests outstanding, or is the only such tenant.
	// Lower classes and a tenant sending far more than the others fill the
	// pool only up to the reserve, so that a request of a higher class or
	// of another tenant arriving at saturation finds a free slot at once
	// instead of waiting for the next to end (trunk reservation).
	Favoured bool
	// Outranked: a request of a higher priority is outstanding. The
	// replicas' reserves of KV and of prefill time are kept from it
	// (balancer.SaturationConfig.KVReserveShare, LowerPrefillBacklog), not
	// from a tenant over its share.
	Outranked bool
	// Contested: the answer matters: requests of another priority or of
	// more than one tenant are outstanding.
	Contested bool
}

// Rank ranks a request of tenant and priority against those outstanding.
func (q *Queue) Rank(tenant string, priority int) Rank {
	q.mu.Lock()
	defer q.mu.Unlock()
	higher := (q.inflight > 0 && q.topPrio > priority) || (len(q.bh) > 0 && q.bh[0].prio > priority)
	others := higher || q.inflight > q.byPrio[priority] || len(q.bh) > 1 || (len(q.bh) == 1 && q.bh[0].prio != priority)
	tf, tc := q.tenantFavoured(tenant)
	return Rank{Favoured: tf && !higher, Outranked: higher, Contested: tc || others}
}

// tenantFavoured is Rank's tenant part.
func (q *Queue) tenantFavoured(tenant string) (favoured, contested bool) {
	t := q.tenants[tenant]
	if t == nil && len(q.tenants) >= q.cfg.MaxTenants {
		t = q.overflow
	}
	active := len(q.tenants) - q.idleT.n
	if q.overflow != nil && q.overflow.queued+q.overflow.inflight > 0 {
		active++
	}
	if t == nil || t.queued+t.inflight == 0 {
		active++ // the request makes its tenant active
	}
	if t == nil || active <= 1 { // a new tenant has nothing in flight
		return true, active > 1
	}
	return t.inflight*active <= q.inflight, true
}

// Len returns the number of queued requests.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}
