package balancer

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/llmlb/llmlb/internal/health"
	"github.com/llmlb/llmlb/internal/policy"
)

// SaturationConfig says when a replica is full and a pool of replicas is
// saturated: the signal flow control holds requests on (package
// flowcontrol). A replica is full when the requests it holds (running plus
// waiting in its own queue, as last scraped and kept current with this
// balancer's own sends and ends since) reach its running-slot limit plus a
// little headroom; a pool is saturated when every replica that could take
// the request is full.
type SaturationConfig struct {
	// MaxRunning is every replica's running-slot limit (vLLM's
	// --max-num-seqs) when the operator knows it: saturation.max_running,
	// 0 (the default) learns each replica's own from its scrapes: the
	// number running, unchanged over three scrapes in a row while requests
	// wait in its queue (a plateau), raised whenever more run with none
	// waiting (one request past the limit is sent after three scrapes
	// that show the limit running with none waiting, so a limit learned
	// too low grows back). It is a
	// high-water mark: a lower plateau is a full KV cache or a step's
	// prefill budget, which move with the prompt mix.
	MaxRunning int
	// Headroom is how many requests a replica may hold waiting in its own
	// queue, past its limit, before the balancer holds further requests
	// (saturation.headroom, 0). A request waiting in the engine starts the
	// moment a slot frees, without a round trip through the balancer (one
	// engine step at most, against requests that run for seconds); but the
	// engine's queue is first come, first served, so each request of
	// headroom is one that priorities and tenant shares no longer order:
	// on the benchmark's flood, a polite tenant's P90 is 6.7x its P90 alone
	// with none and 10.6x with one.
	Headroom int
	// KVFullUsage is the KV cache usage (0-1) from which requests waiting
	// in a replica's queue are taken as waiting for memory
	// (saturation.kv_full_usage; 0 means the default, 0.75). vLLM admits a
	// request only when its blocks fit, so an engine bound by its cache
	// queues with its usage high, how high depending on the prompts' size
	// against the cache; below it, requests wait for a step's token
	// budget and start as prefills progress, long before others end.
	KVFullUsage float64
	// ReserveShare is the share of each replica's running-slot limit kept
	// for the requests flow control favours (saturation.reserve_share,
	// default 0.05; a negative value keeps none): while one tenant has more
	// requests in flight than an equal share of the pool's, its held
	// requests fill a replica only up to its limit less the reserve
	// (rounded up), so that another tenant's request arriving at
	// saturation finds a slot at once instead of waiting for one to end
	// (trunk reservation; flowcontrol.Rank). With one tenant,
	// or tenants in step, every request is favoured and the whole limit
	// is used.
	ReserveShare float64
	// PrefillBacklog makes a replica full while its own queue is not
	// empty (its last scrape showed requests waiting) and the prefill this
	// balancer sent it and has not seen done would take longer than this
	// to work off (saturation.prefill_backlog; 0 means the default, 5s; a
	// negative value turns it off). An engine that prefills long prompts
	// one after another queues requests for a step's token budget with
	// slots and memory to spare, and a request sent there waits behind all
	// of that prefill: on the Mooncake synthetic trace at 2x on 8 replicas
	// 30-46 s, where no slot or memory signal saw a full replica. The
	// engine's queue guards the engines' work: a replica whose scrape shows
	// none waiting is never full by it, however much the balancer believes
	// it still owes. Only this balancer's own requests are counted, as the
	// policy prices them: policy cost (the default) says what each request
	// leaves to compute; under policies that do not, it never engages.
	PrefillBacklog time.Duration
	// KVCommit makes a replica full while the KV this balancer's requests
	// there hold or will hold reaches this share of the replica's KV
	// capacity (vLLM's vllm:cache_config_info, num_gpu_blocks x
	// block_size): the prompt tokens they computed or will compute there,
	// less their cache hits, plus half the mean output each
	// (saturation.kv_commit; 0 means the default, 1; a negative value
	// turns it off). vLLM admits a waiting request only when its blocks
	// fit, first come first served, so a request sent past that point
	// waits in the engine for memory that only running requests' ends
	// free, behind every request sent before it, whatever its priority,
	// while it could wait in the balancer's queue, in order, and go to
	// whichever replica frees memory first. The scraped signal (requests
	// waiting with the cache kv_full_usage used) sees that a scrape
	// late, and counts requests where long prompts need far more memory
	// than short ones free. This balancer's own requests are counted, as
	// the policy prices them, with shared state its peers' as they
	// publish them with their loads (ReplicaLoad.Held), and what a scrape
	// shows other clients' requests hold (othersKV). Under policies other
	// than cost, and for replicas that do not export their capacity, it
	// never engages.
	KVCommit float64
	// KVReserveShare is the share of the KV that KVCommit lets the
	// balancer's requests commit on each replica kept for a higher
	// priority (saturation.kv_reserve_share, default a third; a negative
	// value keeps none): the KV counterpart of ReserveShare. A request of
	// a lower priority while a higher one has requests outstanding
	// (Outranked) finds a replica full once the requests there commit the
	// rest; a tenant over its share keeps only the slots' reserve from the
	// others (tenants that differ in rate are over their share much of the
	// time, and a third of every cache would idle). An engine frees memory
	// only as running requests end, tens of seconds for long contexts, and
	// admits no request past its queue's head, so a higher-priority request
	// that arrives when lower classes have filled the cache waits for those
	// ends; with memory kept free it starts at once. On the conversation
	// trace at 2x with 20% of the requests in a higher class, that class's
	// P99 TTFT went from a median 14 s to 9.2 s on 4 replicas and to 7.5 s
	// on 8 with this reserve alone (docs/FLOW_CONTROL.md); the lower
	// classes pay with up to a tenth of the output tokens per second and
	// more refusals. With one priority all of KVCommit is used.
	KVReserveShare float64
	// LowerPrefillBacklog makes a replica full for a request of a lower
	// priority, while a higher one has requests outstanding (Outranked),
	// once the prefill this balancer sent it and has not seen done would
	// take longer than this to compute, whether or not its scrape shows a
	// queue (saturation.lower_prefill_backlog; 0 means the default, 2s; a
	// negative value turns it off): a reserve of prefill time, as
	// KVReserveShare is of memory. An engine computes prompts first come,
	// first served, so a higher-priority request sent there waits behind
	// all of it; held lower-priority requests released together when
	// memory frees put seconds of prefill ahead of the next higher one
	// before a scrape shows a queue (PrefillBacklog's condition). On the
	// Azure code trace at 2x with 20% in a higher class its P99 went from
	// 4.1-4.9 s to 1.6-2.6 s (and 2.2-5.7 s with neither reserve), at 5%
	// of the output tokens per second (docs/benchmarks/LAB-2026.md).
	LowerPrefillBacklog time.Duration
}

// DefaultSaturationConfig returns the defaults: limits learned, no
// headroom (a request is sent when a slot is free, so the engines' own
// queues stay empty and every wait is ordered by flow control).
func DefaultSaturationConfig() SaturationConfig {
	return SaturationConfig{}
}

// Validate names the bad key relative to the routing section.
func (c SaturationConfig) Validate() error {
	var errs []error
	if c.MaxRunning < 0 {
		errs = append(errs, fmt.Errorf("saturation.max_running: must be >= 0 (0 learns it), got %d", c.MaxRunning))
	}
	if c.KVFullUsage < 0 || c.KVFullUsage > 1 {
		errs = append(errs, fmt.Errorf("saturation.kv_full_usage: must be 0-1 (a share of the KV cache; 0 = %g), got %g", defaultKVFullUsage, c.KVFullUsage))
	}
	if c.ReserveShare > maxReserveShare {
		errs = append(errs, fmt.Errorf("saturation.reserve_share: must be at most %g (a share of each replica's slots; 0 = %g, negative = none), got %g", maxReserveShare, defaultReserveShare, c.ReserveShare))
	}
	if c.PrefillBacklog > maxPrefillBacklog {
		errs = append(errs, fmt.Errorf("saturation.prefill_backlog: must be at most %v (0 = %v, negative = off), got %v", maxPrefillBacklog, defaultPrefillBacklog, c.PrefillBacklog))
	}
	if c.KVReserveShare > maxKVReserveShare {
		errs = append(errs, fmt.Errorf("saturation.kv_reserve_share: must be at most %g (a share of each replica's committed KV; 0 = %.2f, negative = none), got %g", maxKVReserveShare, defaultKVReserveShare, c.KVReserveShare))
	}
	if c.LowerPrefillBacklog > maxPrefillBacklog {
		errs = append(errs, fmt.Errorf("saturation.lower_prefill_backlog: must be at most %v (0 = %v, negative = off), got %v", maxPrefillBacklog, defaultLowerPrefillBacklog, c.LowerPrefillBacklog))
	}
	if c.KVCommit > maxKVCommit {
		errs = append(errs, fmt.Errorf("saturation.kv_commit: must be at most %g (a share of each replica's KV capacity; 0 = %g, negative = off), got %g", maxKVCommit, defaultKVCommit, c.KVCommit))
	}
	if c.Headroom < 0 || c.Headroom > maxHeadroom {
		errs = append(errs, fmt.Errorf("saturation.headroom: must be 0-%d (requests waiting in a replica's own queue), got %d", maxHeadroom, c.Headroom))
	}
	return errors.Join(errs...)
}

// maxHeadroom bounds saturation.headroom: past a few thousand requests in
// each engine's queue flow control would never engage.
const maxHeadroom = 4096

// capacity is what the balancer learns of a replica's running-slot limit
// and how many requests it holds, guarded by the balancer's lock.
type capacity struct {
	learned  float64 // running-slot limit learned from scrapes (0: not yet)
	free     float64 // the most seen running with none waiting
	plateau  float64 // running on the last scrapes, all with requests waiting
	streak   int     // consecutive scrapes with requests waiting and running == plateau
	atScrape int     // own + peer in-flight requests at the last scrape
	queuedAt bool    // some scrape showed requests waiting for memory
	atLimit  int     // consecutive scrapes running the limit with none waiting
	probe    bool    // one request past the limit may be sent
	// tentative is the limit for requests flow control does not favour
	// while none is learned (tentativeLimit; 0: none); tentativeProbe
	// lets one more of them go until the next scrape; rising says the
	// last scrape showed more running than ever before, none waiting.
	tentative      float64
	tentativeProbe bool
	rising         bool
	followUps      int // follow-up scrapes asked for in a row (ScrapeSoon)
}

// defaultKVFullUsage is SaturationConfig.KVFullUsage's default, chosen on
// the benchmark's traces (only 0.75 and 0.9 were measured).
const defaultKVFullUsage = 0.75

// defaultReserveShare is SaturationConfig.ReserveShare's default: 3 slots
// of a 64-slot replica, 1 of anything up to 20.
const defaultReserveShare = 0.05

// maxReserveShare bounds SaturationConfig.ReserveShare: a reserve of half
// the slots would idle them whenever one tenant floods.
const maxReserveShare = 0.5

// reserve returns how many of a replica's limit slots a request flow
// control does not favour may not take: 0 when none is kept or no limit
// is known.
func (c SaturationConfig) reserve(limit float64) float64 {
	share := c.ReserveShare
	if share == 0 {
		share = defaultReserveShare
	}
	if share < 0 || limit <= 1 {
		return 0
	}
	return math.Ceil(share * limit)
}

// defaultPrefillBacklog is SaturationConfig.PrefillBacklog's default:
// flow control's own target for a standing queue (flowcontrol's
// StandingQueueTime), so that a request waits about as long in an
// engine's queue before the balancer holds the next ones as it may wait
// in the balancer's before it is refused. Measured on the overload runs of
// the bundled traces, 2 s held too soon (Mooncake 8 x 2 P99 42.7 s against
// 18.7 s at 5 s) and 10 s too late (Azure 4 x 3 14.8 s against 10.3 s).
const defaultPrefillBacklog = 5 * time.Second

// maxPrefillBacklog bounds SaturationConfig.PrefillBacklog: longer backlogs
// are waits no client keeps its connection open for.
const maxPrefillBacklog = 10 * time.Minute

// defaultKVCommit is SaturationConfig.KVCommit's default: the whole
// capacity. Measured against 0.9 for the requests flow control does not
// favour only (a reserve of memory, as of slots): no better for the
// favoured class on the overloaded conversation trace (docs/FLOW_CONTROL.md).
const defaultKVCommit = 1.0

// maxKVCommit bounds SaturationConfig.KVCommit: past a few times the
// capacity the engines' own queues hold minutes of work.
const maxKVCommit = 4.0

// kvCommit returns the configured SaturationConfig.KVCommit, 0 when it is
// off.
func (c SaturationConfig) kvCommit() float64 { return orDefault(c.KVCommit, defaultKVCommit) }

// defaultKVReserveShare is SaturationConfig.KVReserveShare's default.
// Measured on the conversation trace at 2x (4 and 8 replicas, two seeds,
// three rotation starts each; docs/benchmarks/LAB-2026.md): with a
// quarter the higher class's P99 was within 1.5x of the same build's P99
// at 1x on 7 of 12 runs, with a third on 10 (0.33: 9), with 0.4 on 9 and
// a half on 8 (a tenth, as of slots, helped none).
const defaultKVReserveShare = 1.0 / 3

// maxKVReserveShare bounds SaturationConfig.KVReserveShare: past it the
// lower priorities would keep less of the memory than they leave.
const maxKVReserveShare = 0.5

// kvCommitFor is kvCommit for a request of standing s: for one a higher
// priority outranks, the share less its reserve
// (SaturationConfig.KVReserveShare).
func (c SaturationConfig) kvCommitFor(s Standing) float64 {
	share := c.kvCommit()
	if s == Outranked {
		share *= 1 - orDefault(c.KVReserveShare, defaultKVReserveShare)
	}
	return share
}

// defaultLowerPrefillBacklog is SaturationConfig.LowerPrefillBacklog's
// default. Measured with the KV reserve on the Azure code trace, the
// Mooncake traces and the conversation trace at 2x with 20% in a higher
// class (three rotation starts): 1 s took the higher class's P99 lowest
// (Azure 1.4-1.5 s) at 6% of the output, 3 s barely moved it (3.0-3.4 s),
// 5 s not at all.
const defaultLowerPrefillBacklog = 2 * time.Second

// lowerPrefillBacklog returns the configured
// SaturationConfig.LowerPrefillBacklog, 0 when it is off.
func (c SaturationConfig) lowerPrefillBacklog() time.Duration {
	return orDefault(c.LowerPrefillBacklog, defaultLowerPrefillBacklog)
}

// prefillBacklog returns the configured SaturationConfig.PrefillBacklog,
// 0 when it is off.
func (c SaturationConfig) prefillBacklog() time.Duration {
	return orDefault(c.PrefillBacklog, defaultPrefillBacklog)
}

// orDefault is a setting where 0 means the default and a negative value
// off: v, def for 0, and 0 for a negative v.
func orDefault[T float64 | time.Duration](v, def T) T {
	switch {
	case v < 0:
		return 0
	case v == 0:
		return def
	}
	return v
}

// kvFullUsage returns the configured SaturationConfig.KVFullUsage.
func (c SaturationConfig) kvFullUsage() float64 {
	if c.KVFullUsage > 0 {
		return c.KVFullUsage
	}
	return defaultKVFullUsage
}

// plateauScrapes is how many scrapes in a row must show the same number
// running while requests wait before that number is taken as the slot
// limit. An engine at its slot limit runs exactly that many for as long as
// requests wait; one waiting on its KV cache or on a step's prefill budget
// runs a number that moves from scrape to scrape, and a burst caught
// between two engine steps passes within a scrape or two.
const plateauScrapes = 3

// observe learns from a successful scrape; sent is the replica's own plus
// peers' in-flight requests at that moment, kvFull the configured
// SaturationConfig.KVFullUsage.
//
// contested says that flow control has lately held requests it does not
// favour (Balancer.contestedAt): only then does a replica whose limit is
// not learned yet get a tentative one (tentativeLimit).
func (c *capacity) observe(snap Snapshot, sent int, kvFull float64, contested bool) {
	c.atScrape = sent
	c.queuedAt = c.queuedAt || (snap.Waiting >= 1 && snap.KVCacheUsage >= kvFull)
	c.probe, c.tentativeProbe = false, false
	if c.rising = false; !(snap.Waiting < 1 && snap.Running > c.free) {
		c.followUps = 0 // not filling: the next rise may ask again
	}
	if !contested || c.learned > 0 {
		c.tentative = 0
	}
	if snap.Waiting >= 1 {
		c.atLimit = 0
	}
	if snap.Waiting >= 1 && snap.Running >= 1 {
		// Requests wait although some run. The limit is the highest
		// plateau seen, and never below what the replica has run with
		// none waiting.
		if snap.Running == c.plateau {
			c.streak++
		} else {
			c.plateau, c.streak = snap.Running, 1
		}
		if c.streak >= plateauScrapes {
			c.learned = max(c.learned, snap.Running, c.free)
		}
		if contested && c.learned == 0 && snap.Running >= c.free {
			c.tentative = max(c.tentative, snap.Running)
		}
		return
	}
	if c.tentative > 0 && snap.Waiting < 1 && snap.Running == c.tentative {
		// Held at its tentative limit, the replica says neither yes nor
		// no: the plateau goes on, and one request more may go until the
		// next scrape. Where the limit is higher it runs, and the
		// tentative limit ends; at the limit it waits, and the plateau
		// has one more scrape.
		c.tentativeProbe = true
		return
	}
	c.plateau, c.streak = 0, 0
	if snap.Waiting >= 1 {
		return
	}
	if snap.Running > c.tentative {
		c.tentative = 0 // more ran with none waiting: it was not the limit
	}
	c.rising = snap.Running > c.free
	c.free = max(c.free, snap.Running)
	if c.learned > 0 && snap.Running > c.learned {
		c.learned = snap.Running // more ran with none waiting: the limit is higher
	}
	// It has run all it was given with none waiting, on three scrapes in
	// a row: until the next scrape, one more may be sent. Held at a limit
	// learned too low (a plateau that was a full KV cache), a replica
	// would never show more; at its true limit the probe waits in its
	// queue (in the way of whatever flow control sends next, so probes
	// are rare), and the next scrape, which shows it waiting, ends it.
	if c.learned > 0 && snap.Running >= c.learned {
		c.atLimit++
	} else {
		c.atLimit = 0
	}
	c.probe = c.atLimit >= plateauScrapes
}

// contestWindow is how long after flow control last asked about a request
// it does not favour the balancer keeps tentative limits (tentativeLimit)
// and scrapes filling replicas soon (ScrapeSoon).
const contestWindow = 30 * time.Second

// contested reports whether flow control asked about a request it does not
// favour within contestWindow of now.
func (b *Balancer) contested(now time.Time) bool {
	return !b.contestedAt.IsZero() && now.Sub(b.contestedAt) < contestWindow
}

// ScrapeSoon reports whether the replica should be scraped again soon,
// at a fraction of the scrape interval (scrape.Options.FollowUp): requests
// of several priorities or tenants compete for the pool, its limit is not
// known, and its last scrape showed it running more than ever before with
// none waiting (a replica filling up). The scrape that first shows
// requests waiting then sets its tentative limit (tentativeLimit) within
// a fraction of an interval of the engine's first queued request, not up
// to a whole interval later.
func (b *Balancer) ScrapeSoon(name string, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.byName[name]
	if !ok || !r.lastScrapeOK || !b.contested(now) {
		return false
	}
	if b.limit(r) > 0 || !r.cap.rising || r.cap.followUps >= maxFollowUps {
		return false
	}
	r.cap.followUps++
	return true
}

// maxFollowUps bounds the follow-up scrapes of a replica in a row: two
// intervals' worth. A replica whose /metrics claim a running count that
// rises on every scrape is then scraped at its interval again.
const maxFollowUps = 12

// limit returns the replica's running-slot limit: configured, else
// learned, else 0 (not known: the replica is never full).
func (b *Balancer) limit(r *replica) float64 {
	if b.cfg.Saturation.MaxRunning > 0 {
		return float64(b.cfg.Saturation.MaxRunning)
	}
	return r.cap.learned
}

// occupancy is the requests the replica holds now, running or waiting in
// its own queue: the last scrape's, moved by what this balancer and its
// peers sent and saw end since, and never below their own in-flight.
func (r *replica) occupancy() float64 {
	sent := r.inFlight + r.peerInFlight
	scraped := r.snap.Running + r.snap.Waiting + float64(sent-r.cap.atScrape)
	return max(float64(sent), scraped)
}

// queued is how many requests wait in the replica's own queue now, when
// its last scrape showed some waiting for memory (KV cache usage at least
// kvFull, SaturationConfig.KVFullUsage): that number, moved by what this
// balancer and its peers sent (each waits behind them) and saw end (each
// frees the memory or the slot one waiting needs) since. ok is false
// otherwise: the replica had room then, or its queue was one of requests
// waiting for a step's token budget, which start as prefills progress; how
// much room is its limit's to say.
func (r *replica) queued(kvFull float64) (n float64, ok bool) {
	if r.snap.Waiting < 1 || r.snap.KVCacheUsage < kvFull {
		return 0, false
	}
	return r.snap.Waiting + float64(r.inFlight+r.peerInFlight-r.cap.atScrape), true
}

// full reports whether the replica holds as many requests as it can run
// plus the headroom of its own queue. Four signals say so: the occupancy
// against the slot limit (configured or learned), the engine's own queue
// of requests waiting for memory, which a replica bound by its KV cache
// fills well below its slot limit, that queue behind a prefill backlog
// (backlogged), which an engine computing long prompts one after another
// fills with slots and memory to spare, and the KV the balancer's own
// requests commit there (kvCommitted), which says a request sent now
// would wait for memory before a scrape shows it. For a request flow
// control does not favour (standing s) the limit is less its reserve
// (SaturationConfig.ReserveShare), and for one a higher priority outranks
// the committed KV and the prefill owed too (SaturationConfig.
// KVReserveShare, LowerPrefillBacklog).
func (b *Balancer) full(r *replica, s Standing, now time.Time) bool {
	return b.fullBy(r, s, now) != ""
}

// Why a replica is full (ReplicaStatus.FullBy): the signal that says so,
// the first that does in full's order.
const (
	fullByMemory   = "memory"          // its own queue waits for memory (scraped)
	fullByBacklog  = "prefill_backlog" // its own queue waits behind llmlb's prefill
	fullByKVCommit = "kv_commit"       // llmlb's requests commit its KV capacity
	fullBySlots    = "slots"           // its running-slot limit (less the reserve)
)

// fullBy is full with the signal that makes the replica full, "" when none
// does.
func (b *Balancer) fullBy(r *replica, s Standing, now time.Time) string {
	barred := s != Favoured
	headroom := float64(b.cfg.Saturation.Headroom)
	if n, ok := r.queued(b.cfg.Saturation.kvFullUsage()); ok && n >= headroom {
		return fullByMemory
	}
	if b.backlogged(r, now) || (s == Outranked && b.backloggedBelow(r, now)) {
		return fullByBacklog
	}
	if b.kvCommitted(r, s, now) {
		return fullByKVCommit
	}
	limit := b.provisionalLimit(r)
	if t := b.tentativeLimit(r); barred && t > 0 && (limit <= 0 || t < limit) {
		limit = t
	} else if limit > 0 && r.cap.probe {
		limit++
	}
	if limit <= 0 {
		return ""
	}
	if barred {
		limit -= b.cfg.Saturation.reserve(limit)
	}
	if r.occupancy() >= limit+headroom {
		return fullBySlots
	}
	return ""
}

// backlogged reports whether requests wait in the replica's own queue (as
// of its last scrape) behind more prefill than saturation.prefill_backlog
// takes it to compute: what this balancer sent it and has not seen done,
// at its measured rate (SaturationConfig.PrefillBacklog).
func (b *Balancer) backlogged(r *replica, now time.Time) bool {
	limit := b.cfg.Saturation.prefillBacklog()
	if limit <= 0 || r.snap.Waiting < 1 || r.pendingPrefill <= 0 {
		return false
	}
	return b.pending(r, now)/b.prefillRate(r) > limit.Seconds()
}

// backloggedBelow reports whether the prefill this balancer sent the
// replica and has not seen done takes it longer than
// saturation.lower_prefill_backlog to compute, at its measured rate
// (SaturationConfig.LowerPrefillBacklog): full for a request a higher
// priority outranks.
func (b *Balancer) backloggedBelow(r *replica, now time.Time) bool {
	limit := b.cfg.Saturation.lowerPrefillBacklog()
	if limit <= 0 || r.pendingPrefill <= 0 {
		return false
	}
	return b.pending(r, now)/b.prefillRate(r) > limit.Seconds()
}

// kvCommitted reports whether the KV this balancer's requests on the
// replica hold or will hold, with its peers' (kvHeld), reaches
// saturation.kv_commit of its capacity (SaturationConfig.KVCommit): their
// prompt tokens computed or to compute there, less cache hits (as the
// policy counts them: policy cost's HeldPrefill), plus half the fleet's
// mean output for each. For a request a higher priority outranks (s) that
// share less its reserve (SaturationConfig.KVReserveShare).
func (b *Balancer) kvCommitted(r *replica, s Standing, now time.Time) bool {
	share := b.cfg.Saturation.kvCommitFor(s)
	if share <= 0 || r.snap.KVCacheTokens <= 0 {
		return false
	}
	held := b.kvHeld(r, now)
	return held > 0 && held >= share*r.snap.KVCacheTokens
}

// kvHeld is the KV this balancer's requests on the replica hold or will
// hold, with shared state its peers' as they last published it and what
// they are taken to have sent since (peersUnseen), and what the last
// scrape showed other clients' requests hold (othersKV), as kvCommitted
// counts it (ReplicaStatus.KVCommitted).
func (b *Balancer) kvHeld(r *replica, now time.Time) float64 {
	own := b.kvAccounted(r)
	if own <= 0 {
		return 0
	}
	return own + r.othersKV + b.peersUnseen(r, now)
}

// othersKV is, at a scrape, the KV in use on the replica that neither this
// balancer nor its peers account for: the cache's used share times its
// capacity, less what they count as held there (kvAccounted), when the
// scrape shows more requests running and waiting than they have in
// flight, so some are another instance's or a direct client's. Other
// llmlb instances without shared state are the usual case: each accounts
// for about 1/N of the prompts and would count the replica full late. It
// stands until the next scrape; while neither this balancer nor its
// peers count anything held there it is not counted (kvHeld): the signal
// then never engages, as under policies that do not price prefill. A lower bound: what this balancer counts includes prompts
// still waiting in the engine's queue, which hold no KV yet.
func (b *Balancer) othersKV(r *replica) float64 {
	if r.snap.KVCacheTokens <= 0 || r.snap.Running+r.snap.Waiting-float64(r.inFlight+r.peerInFlight) < 1 {
		return 0
	}
	// A usage over 1 is a replica's lie: at most the whole cache.
	return max(0, min(1, r.snap.KVCacheUsage)*r.snap.KVCacheTokens-b.kvAccounted(r))
}

// kvAccounted is the KV this balancer's requests on the replica and its
// peers' hold or will hold, as they count it.
func (b *Balancer) kvAccounted(r *replica) float64 {
	held := r.heldPrefill + r.peerHeld
	if held <= 0 {
		return 0
	}
	return held + float64(r.inFlight+r.peerInFlight)*b.fleetPrefill.meanOutput()/2
}

// tentativeLimit is, for a replica whose limit is neither configured nor
// learned yet, the running-slot limit that requests flow control does not
// favour are held at while requests of several priorities or tenants
// compete: the number running at the latest scrape that showed requests
// waiting in its own queue, when that was at least the most it has run
// with none waiting (a lower plateau is more likely a long prefill holding
// a step's token budget, or a full KV cache). It stands until a scrape
// shows more running with none waiting. 0: none.
//
// Learning the limit takes a plateau over three scrapes: until then every
// request sent waits in the engine's own queue, first come first served,
// and a request of a higher priority (or of a polite tenant) arriving then
// waits behind every one sent before it. Holding only the requests flow
// control does not favour at a limit that may be too low costs them a few
// seconds of throughput at worst, and leaves policy cost's pricing, which
// reads the learned limit, as it was.
func (b *Balancer) tentativeLimit(r *replica) float64 {
	if r.cap.tentative <= 0 || b.limit(r) > 0 {
		return 0
	}
	if r.cap.tentativeProbe {
		return r.cap.tentative + 1
	}
	return r.cap.tentative
}

// provisionalLimit is limit, or for a replica that has queued for memory
// and has no limit learned yet, twice the most it has run with none
// waiting, so that a pool held at saturation fills it by doublings, scrape
// by scrape, rather than all at once. 0: not known.
func (b *Balancer) provisionalLimit(r *replica) float64 {
	limit := b.limit(r)
	if limit <= 0 && r.cap.queuedAt {
		limit = 2 * r.cap.free
	}
	return limit
}

// updateFleetLimit keeps fleetLimit, the largest running-slot limit any
// replica has (configured or learned), after a scrape or a removal.
func (b *Balancer) updateFleetLimit() {
	b.fleetLimit = 0
	for _, r := range b.replicas {
		b.fleetLimit = max(b.fleetLimit, b.limit(r))
	}
}

// hasRoom reports whether a held request may be sent to r now (late
// binding, Dispatch). Not being full is not enough for a replica whose
// limit is not known: it is never full by its limit, and when its last
// scrape showed requests waiting in its own queue it has no free slot,
// whatever keeps them waiting. Sending held requests there because it is
// the only replica not known to be full would empty the balancer's queue
// into that one engine's; Dispatch chooses among every replica instead,
// one request at a time.
//
// For the same reason a replica of unknown limit that joins a pool where
// requests are held (autoscaling, or one back from an ejection) takes held
// requests only up to the largest limit another replica has, or twice the
// most it has run with none waiting when that is more; then one at a time
// as above, until its scrapes tell its room.
func (b *Balancer) hasRoom(r *replica, s Standing, now time.Time) bool {
	if b.full(r, s, now) {
		return false
	}
	if b.provisionalLimit(r) > 0 || (s != Favoured && b.tentativeLimit(r) > 0) {
		return true
	}
	if r.snap.Waiting >= 1 {
		return false
	}
	return b.fleetLimit <= 0 || r.occupancy() < max(b.fleetLimit, 2*r.cap.free)
}

// routable reports whether step 1 of Select would offer the replica for
// model (exclusions aside).
func (b *Balancer) routable(r *replica, model string) bool {
	if !r.serves(model) || r.draining || !r.fallbackOK() {
		return false
	}
	st := r.health.State()
	return st == health.Live || (st == health.Probing && r.inFlight < b.cfg.Probing.MaxInFlight)
}

// Saturated reports whether every replica that could take a request for
// model is full (SaturationConfig). A pool with no routable replica is not
// saturated: such a request fails (or falls back) at once instead of
// waiting for a fleet that may not come back.
func (b *Balancer) Saturated(model string, now time.Time) bool {
	return b.SaturatedFor(model, Favoured, now)
}

// Standing is where flow control ranks a request among those outstanding
// in its pool (flowcontrol.Queue.Rank): which of the replicas' reserves it
// may take.
type Standing uint8

const (
	// Favoured: no request of a higher priority is outstanding, and its
	// tenant has no more in flight than an equal share (or is alone): it
	// may take every reserve.
	Favoured Standing = iota
	// OverShare: its tenant has more requests in flight than an equal
	// share of the pool's while others have some: not the reserved slots
	// (SaturationConfig.ReserveShare).
	OverShare
	// Outranked: a request of a higher priority is outstanding: neither
	// the reserved slots nor the reserved KV nor prefill past
	// SaturationConfig.LowerPrefillBacklog.
	Outranked
)

// SaturatedFor is Saturated for a request of standing s: one flow control
// does not favour finds a replica full at its limit less the reserve
// (SaturationConfig.ReserveShare), one a higher priority outranks also at
// its committed KV less the KV's reserve (SaturationConfig.KVReserveShare).
func (b *Balancer) SaturatedFor(model string, s Standing, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s != Favoured {
		b.contestedAt = now
	}
	b.refreshPeers(now)
	return b.saturated(model, s, now)
}

// saturated is Saturated under the lock. The cheap test goes first: at
// saturation every replica is full, and only one needs to be routable.
func (b *Balancer) saturated(model string, s Standing, now time.Time) bool {
	some := false
	for _, r := range b.replicas {
		if b.full(r, s, now) {
			some = some || b.routable(r, model)
			continue
		}
		if b.routable(r, model) {
			return false
		}
	}
	return some
}

// Dispatch is Select for a request flow control held: the policy chooses
// among the replicas that have room only (late binding: the first replica
// that frees up takes the request). With none, it chooses as Select does.
// roomLeft reports whether some replica still has room after this
// reservation (false after a choice among full ones). s says which of the
// replicas' reserves the request may take (SaturatedFor); roomLeft is for
// a request like it. exclude is Select's: replicas the request must not
// go to (the gateway's subset, in `llmlb epp`).
func (b *Balancer) Dispatch(p *Profile, now time.Time, s Standing, exclude ...string) (res *Reservation, roomLeft bool, err error) {
	return b.choose(p, now, exclude, true, s)
}

// Serves reports whether some replica serves model (one whose models are
// not known yet serves every model).
func (b *Balancer) Serves(model string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range b.replicas {
		if r.serves(model) {
			return true
		}
	}
	return false
}

// Local reports whether a held request loses none of its cached prefix by
// being dispatched now: its policy keeps no block index
// (policy.CacheHolder), no replica holds the start of its prompt, or the
// replica that holds the most of it can take it (has room, for a request
// flow control favours or not; or cannot take it at all: not routable,
// excluded). Flow control asks it of the requests it may dispatch next and
// prefers one for which it is true (admission.Gate.Pump): late binding
// sends a held request to whichever replica frees a slot first, and a
// conversation's next turn sent to a replica without its context computes
// the whole context again.
func (b *Balancer) Local(p *Profile, s Standing, now time.Time, exclude ...string) bool {
	ch, ok := b.policy.(policy.CacheHolder)
	if !ok || p == nil || len(p.PromptBlocks) == 0 {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	name, tokens := ch.Holder(p.PromptBlocks)
	if tokens < localMinTokens {
		return true
	}
	r, ok := b.byName[name]
	if !ok || !b.routable(r, p.Model) || slices.Contains(exclude, name) {
		return true
	}
	return b.hasRoom(r, s, now)
}

// localMinTokens is the cached prefix below which a held request counts as
// having nothing to lose wherever it goes (Local): a quarter of one step's
// token budget on the smallest engines.
const localMinTokens = 512
