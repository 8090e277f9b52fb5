// Package flowcontrol is the pure core of llmlb's flow control: when every
// replica of a pool is saturated, requests wait in the balancer and are
// dispatched late, to the first replica that frees up, highest priority
// first and fairly between tenants. It does no I/O, starts no goroutines and
// no timers; every call that depends on time takes now, so the server and
// the benchmark's virtual clock drive the same code. A Queue carries its own
// mutex and is safe for concurrent use.
//
// The shell's part, per request: Admit it with the pool's saturation
// signal. Dispatch means route it now, as without flow control; Refused
// means answer 429 with Retry-After (Reason.Code gives the error code);
// Queued means wait on something the shell owns (a channel in
// Item.Payload). Whenever a replica gets room (a request ends, a scrape
// shows room), call Next and route the item it returns. A client that goes
// away is taken out with Remove; false means it was dispatched meanwhile.
// A periodic Expire hands back requests that waited MaxQueueTime, or
// StandingQueueTime once the backlog has stood StandingAfter (429
// queue_timeout); NextExpiry says when the next one is due. Done releases a dispatched request's tenant slot when it
// ends. Drain empties the queue at shutdown.
//
// Why one shared queue: once every replica is busy, committing a request to
// one replica at arrival puts it behind whatever that replica holds, on an
// estimate, while another replica may free first; c queues served by one
// server each always wait longer than one queue served by c servers. Held
// here, a request takes the first slot anywhere. The queue engages only at
// saturation: unsaturated, with nothing of the same or a higher priority
// waiting, Admit says Dispatch and routing is exactly what it was.
//
// Order: priorities are strict (a higher class always goes first) and
// classes below zero are sheddable: refused at once at saturation rather
// than queued. Within a priority each tenant is a flow, served first come
// first served, and flows share dispatches by start-time fair queueing
// (Goyal, Vin and Cheng, 1996) with each request costing its estimated
// tokens: a flow's head request gets the start tag max(v, the flow's last
// finish tag), its finish tag is start plus cost, the smallest start tag is
// dispatched next, and the class's virtual time v becomes that tag. A flow
// that empties keeps its finish tag, so going idle for a moment earns
// nothing. Chosen over deficit round robin because request costs here span
// three orders of magnitude (50 to 100,000 tokens): DRR is O(1) only with a
// quantum at least the largest cost, and its lag behind the fair share
// grows with that quantum, while SFQ's lag is one request's cost per tenant
// whatever the mix, needs no quantum to tune, and needs no notion of rounds
// or service rate, so its virtual time comes from dispatches alone and
// behaves the same on the wall clock and in virtual time. Measured by the
// tests: four tenants with equal token backlogs and requests of 100 to
// 8,000 tokens receive tokens with Jain's index 1.000 (first come first
// served: 0.65); a polite tenant beside one sending 10 times its rate, on a
// saturated pool, is served in the step each request arrives while the
// flood absorbs the wait.
//
// Reserve: fair order decides who takes a slot that frees, not whether one
// is free when a request arrives. Rank tells the shell which requests may
// take the slots each replica keeps in reserve
// (balancer.SaturationConfig.ReserveShare): not those of a tenant with more
// than an equal share of the requests in flight, nor those below a priority
// with requests outstanding (trunk reservation); and which a higher
// priority outranks, from whom the replicas' memory and prefill time are
// kept too (KVReserveShare, LowerPrefillBacklog). Such requests find the pool
// saturated earlier; a favoured one arriving while they wait passes them
// (Item.PassesHeld), since the room left is room they may not take. Pump
// stops at a head that may not take the reserve, even if a favoured
// request waits behind it in the same priority; fair order puts the
// favoured tenants' requests first, so this is rare, and the next pump
// (any request's end) sends it.
//
// Tenant limits: MaxConcurrent counts a tenant's requests admitted and not
// yet finished, queued or running, so a limited tenant never blocks the
// head of its flow; TokensPerMinute is a golang.org/x/time/rate bucket with
// a minute's burst, charged at admission (a request larger than the burst
// costs the whole burst) and not refunded if the request later leaves the
// queue. Refusals carry Retry-After: the bucket's wait, else
// DefaultRetryAfter.
//
// Bounds: at most MaxQueued requests and MaxQueuedBytes of bodies, plus
// EntryBytes of bookkeeping per request. Tenants are forgotten once nothing
// of theirs is queued or running and their token bucket has refilled (a
// fresh tenant would be the same); at most MaxTenants are remembered, and
// requests of further tenants are counted as one OverflowTenant, sharing
// one fair share and one set of limits, so a client inventing tenant names
// gets one tenant's share and cannot grow memory. Idle flows (fairness
// memory) are capped at MaxTenants, oldest dropped first, losing at most one
// request's worth of fairness each; priorities with nothing queued keep
// their state only up to keptBands.
//
// Cost: Admit and Next are O(log F + log P) for F tenants with requests
// queued in a class and P classes with requests queued, independent of the
// number of requests; Remove is O(1) plus a heap fix when the request was
// its tenant's oldest; Expire is O(1) per expired request; Stats is
// O(tenants + priorities).
//
// Several balancers each hold their own queue: priorities hold per
// instance, fair shares and tenant limits are per instance (a tenant spread
// over N balancers gets up to N shares; divide limits by N).
package flowcontrol
