// Package admission joins flow control's queue (package flowcontrol) to the
// routing core (package balancer): it asks the core whether a request's pool
// is saturated, holds the request in that pool's queue if so, and, when the
// shell reports that a replica may have room (a request ended, a scrape came
// in, a tick), dispatches held requests late: the core reserves a replica
// with room for each, highest priority first and fairly between tenants.
//
// Like the core it is pure: no goroutines, no timers, every call takes now,
// so `llmlb serve`, `llmlb epp` and the benchmark's virtual clock run the
// same code. The shell owns the waiting: the server parks the client's
// goroutine on a channel in Request.Payload, the benchmark keeps the request
// in its event queue.
//
// One queue per model: a pool is the replicas serving one model, and a
// request waits for a replica of its own pool. Fair shares and tenant limits
// therefore hold per model (a tenant calling two models gets a share and its
// limits in each).
package admission

import (
	"slices"
	"sync"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/flowcontrol"
)

// Request is one request as the gate holds it. The shell fills every field.
type Request struct {
	ID       uint64 // unique among the requests the gate holds
	Profile  *balancer.Profile
	Priority int    // higher first; below zero is sheddable
	Tenant   string // fair shares and limits are per tenant
	Bytes    int64  // body bytes held while it waits
	// Exclude names replicas the request must not be dispatched to (as
	// Balancer.Select's exclude; `llmlb epp`'s gateway subset). Saturation
	// stays the model's: a request whose allowed replicas are all full may
	// be dispatched to one of them while another has room.
	Exclude []string
	// Payload is the shell's own (what wakes the waiting request).
	Payload any

	enqueued time.Time
}

// Enqueued is when the request joined the queue (zero if it never did).
func (r *Request) Enqueued() time.Time { return r.enqueued }

// Ticket is a held request the gate dispatched: the replica the core
// reserved for it (Res) or why none could be (Err), and how long it waited.
type Ticket struct {
	Request *Request
	Res     *balancer.Reservation
	Err     error
	Waited  time.Duration
}

// Gate holds requests while their pool is saturated. It is safe for
// concurrent use.
type Gate struct {
	bal *balancer.Balancer

	mu     sync.Mutex
	cfg    flowcontrol.Config
	queues map[string]*flowcontrol.Queue // by model
	models []string                      // queues' keys in creation order, for a fair pump
	start  int                           // where the next pump starts in models
}

// New returns a gate in front of bal. cfg must be valid
// (flowcontrol.Config.Validate).
func New(bal *balancer.Balancer, cfg flowcontrol.Config) *Gate {
	return &Gate{bal: bal, cfg: cfg, queues: make(map[string]*flowcontrol.Queue)}
}

// Config returns the gate's configuration.
func (g *Gate) Config() flowcontrol.Config {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cfg
}

// maxQueues bounds the queues a gate creates: a replica whose models are
// not known yet serves every model name, and a client must not grow memory
// by inventing names. Requests of further models are dispatched unqueued.
const maxQueues = 1024

// queue returns the model's queue, creating it if the fleet serves the
// model; nil when it does not or maxQueues are in use.
func (g *Gate) queue(model string) *flowcontrol.Queue {
	if q := g.existing(model); q != nil {
		return q
	}
	if !g.bal.Serves(model) {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	q, ok := g.queues[model]
	if !ok {
		if len(g.queues) >= maxQueues {
			return nil
		}
		q = flowcontrol.New(g.cfg)
		g.queues[model] = q
		g.models = append(g.models, model)
	}
	return q
}

// existing returns the model's queue or nil.
func (g *Gate) existing(model string) *flowcontrol.Queue {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.queues[model]
}

// Admit decides at now what to do with a new request: Dispatch (route it
// now with Balancer.Select, exactly as without flow control), Queued (wait:
// a later Pump returns it with a reservation) or Refused (answer 429 with
// Retry-After; the Decision says why). A dispatched request holds its
// tenant's slot until Done.
func (g *Gate) Admit(r *Request, now time.Time) (flowcontrol.Decision, error) {
	model := r.Profile.Model
	q := g.queue(model)
	if q == nil { // a model no replica serves: Select answers it
		return flowcontrol.Decision{Outcome: flowcontrol.Dispatch}, nil
	}
	// A tenant sending more than its share of the pool's requests finds
	// the pool saturated earlier: at each replica's limit less its
	// reserve, which others' requests may still take.
	rank := q.Rank(r.Tenant, r.Priority)
	saturated := g.cfg.Enabled && g.bal.SaturatedFor(model, standing(rank), now)
	// Room left only in the reserve is room the requests held are not
	// favoured for: this one need not wait behind them.
	passes := rank.Contested && rank.Favoured && !saturated && g.bal.SaturatedFor(model, balancer.OverShare, now)
	tokens := int64(max(0, r.Profile.PromptTokens)) + int64(max(0, r.Profile.OutputTokens))
	// Set before the queue holds r: Pump, Expire and Drain, on other
	// goroutines, read it once they take r out under the queue's lock.
	r.enqueued = now
	d, err := q.Admit(flowcontrol.Item{ID: r.ID, Priority: r.Priority, Tenant: r.Tenant,
		Tokens: tokens, Bytes: r.Bytes, PassesHeld: passes, Payload: r}, saturated, now)
	if err != nil || d.Outcome != flowcontrol.Queued {
		r.enqueued = time.Time{} // never queued: no other goroutine has r
	}
	return d, err
}

// Pump dispatches held requests at now while their pool has room: for
// each, the core reserves a replica with room (Balancer.Dispatch). The
// shell calls it whenever a replica may have got room: a request ended, a
// scrape came in, the health of a replica changed, a tick. The shell must
// deliver every ticket: a reservation not used must be released.
func (g *Gate) Pump(now time.Time) []Ticket {
	g.mu.Lock()
	models := slices.Clone(g.models)
	start := g.start
	g.start++
	g.mu.Unlock()
	var out []Ticket
	for i := range models {
		model := models[(start+i)%len(models)]
		q := g.existing(model)
		for room := true; room && q.Len() > 0; {
			// The request Next would give, and whether the pool has room
			// for it: a tenant over its share may not take the reserve.
			head, ok := q.Head(now)
			if !ok {
				break
			}
			st := standing(q.Rank(head.Tenant, head.Priority))
			if g.bal.SaturatedFor(model, st, now) {
				break
			}
			it, ok := g.next(q, head, st, now)
			if !ok {
				break
			}
			r := it.Payload.(*Request)
			var t Ticket
			t.Res, room, t.Err = g.bal.Dispatch(r.Profile, now, st, r.Exclude...)
			t.Request, t.Waited = r, now.Sub(r.enqueued)
			out = append(out, t)
		}
	}
	return out
}

// next takes from q the held request to dispatch now, head being the one
// Next would return: head, unless the replica holding the most of its
// prompt has no room for it (Balancer.Local) and it has waited less than
// flow_control.locality_wait; then the first of the next requests of its
// flow (locality_scan in all, head included) that loses no cached prefix
// by going now, if any. Delay scheduling (Zaharia et al., EuroSys 2010):
// a request waits a bounded time for the replica that holds its context
// while slots elsewhere go to requests with nothing to lose there, instead
// of computing its whole context again on whichever replica frees first.
func (g *Gate) next(q *flowcontrol.Queue, head flowcontrol.Item, st balancer.Standing, now time.Time) (flowcontrol.Item, bool) {
	if g.cfg.LocalityScan <= 1 || now.Sub(head.Enqueued) >= g.cfg.LocalityWait {
		return q.Next(now)
	}
	local := func(it flowcontrol.Item) bool {
		r := it.Payload.(*Request)
		return g.bal.Local(r.Profile, st, now, r.Exclude...)
	}
	if local(head) {
		return q.Next(now)
	}
	var buf [16]flowcontrol.Item
	for _, it := range q.Peek(now, g.cfg.LocalityScan, buf[:0])[1:] {
		if local(it) {
			if t, ok := q.Take(now, it.ID); ok {
				return t, true
			}
			break
		}
	}
	return q.Next(now)
}

// standing is the balancer's view of a rank: which reserves the request
// may take. Outranked also bars a tenant's share: a request both over its
// tenant's share and below a higher priority may take neither reserve.
func standing(r flowcontrol.Rank) balancer.Standing {
	switch {
	case r.Favoured:
		return balancer.Favoured
	case r.Outranked:
		return balancer.Outranked
	}
	return balancer.OverShare
}

// Remove takes a waiting request out (its client went away). False means
// it is not waiting: a Pump has dispatched it (its ticket is on its way to
// the shell) or it was never queued.
func (g *Gate) Remove(r *Request) bool {
	q := g.existing(r.Profile.Model)
	if q == nil {
		return false
	}
	_, ok := q.Remove(r.ID)
	return ok
}

// Expire takes out the requests that have waited max_queue_time at now;
// the shell answers each 429 queue_timeout.
func (g *Gate) Expire(now time.Time) []*Request {
	var out []*Request
	for _, q := range g.allQueues() {
		for _, it := range q.Expire(now) {
			out = append(out, it.Payload.(*Request))
		}
	}
	return out
}

// NextExpiry returns when Expire will next take a request out, if nothing
// changes before: the earliest of the queues' (flowcontrol.Queue.
// NextExpiry). ok is false when nothing waits.
func (g *Gate) NextExpiry() (at time.Time, ok bool) {
	for _, q := range g.allQueues() {
		if t, qok := q.NextExpiry(); qok && (!ok || t.Before(at)) {
			at, ok = t, true
		}
	}
	return at, ok
}

// Done releases the tenant slot a dispatched request held (it ended, in any
// way). Call it once per request Admit dispatched or Pump returned.
func (g *Gate) Done(r *Request, now time.Time) {
	if q := g.existing(r.Profile.Model); q != nil {
		q.Done(r.Tenant, r.Priority, now)
	}
}

// Drain takes every waiting request out (shutdown); the shell dispatches
// or answers each.
func (g *Gate) Drain() []*Request {
	var out []*Request
	for _, q := range g.allQueues() {
		for _, it := range q.Drain() {
			out = append(out, it.Payload.(*Request))
		}
	}
	return out
}

// Len returns the number of waiting requests.
func (g *Gate) Len() int {
	n := 0
	for _, q := range g.allQueues() {
		n += q.Len()
	}
	return n
}

// Stats returns each model's queue statistics at now.
func (g *Gate) Stats(now time.Time) map[string]flowcontrol.Stats {
	g.mu.Lock()
	queues := make(map[string]*flowcontrol.Queue, len(g.queues))
	for m, q := range g.queues {
		queues[m] = q
	}
	g.mu.Unlock()
	out := make(map[string]flowcontrol.Stats, len(queues))
	for m, q := range queues {
		out[m] = q.Stats(now)
	}
	return out
}

func (g *Gate) allQueues() []*flowcontrol.Queue {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]*flowcontrol.Queue, 0, len(g.models))
	for _, m := range g.models {
		out = append(out, g.queues[m])
	}
	return out
}
