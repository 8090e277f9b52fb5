package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/llmlb/llmlb/internal/admission"
	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/engine"
	"github.com/llmlb/llmlb/internal/policy"
	"github.com/llmlb/llmlb/internal/sharedstate"
	"github.com/llmlb/llmlb/internal/tokenize"
	"github.com/llmlb/llmlb/internal/workload"
)

// errReplicaDown is what a scrape of a flapping replica reports while down.
var errReplicaDown = errors.New("bench: connection refused (flap fault)")

// run is one policy's simulation: its own engines, balancer(s) and workload.
type run struct {
	runProgress
	opts   *Options
	policy string
	label  string // the policy, and with several balancers how they share state
	shared bool   // several balancers share state through bus
	flow   bool   // the policy runs behind flow control (Options.FlowControl, "+fc")

	// scrapeEvery is Options.ScrapeInterval, or the policy's own metrics
	// refresh where its original polls faster (llm-d: every 50 ms).
	scrapeEvery time.Duration
	// followUps: the run scrapes a replica again at scrapeEvery /
	// scrapeFollowUp when its balancer asks (Balancer.ScrapeSoon), as
	// serve's scraper does. Only llmlb's own policies behind flow control:
	// a baseline's state follows the replicas at its original's pace.
	followUps bool

	eng      []simEngine
	names    []string
	index    map[string]int
	down     []time.Duration      // flap period per replica, 0 = never down
	bal      *balancer.Balancer   // bals[0]
	bals     []*balancer.Balancer // Options.Balancers routing cores over the same engines
	pick     *rand.Rand           // which core takes each arrival
	bus      *sharedstate.Bus     // shared runs: the cores' shared state
	wl       workload.Workload
	h        *eventHeap
	emit     func(engine.Event)
	now      time.Duration // current virtual offset
	flights  map[uint64]*flight
	nextID   uint64
	arrivals bool  // the arrival source is still open
	fc       *flow // flow control's gates and held requests; nil without

	// Source indices in the heap; their order breaks ties at one instant.
	srcMark, srcScrape0, srcTick, srcArrival, srcBus, srcLoad, srcExpire int

	acc accumulator
	kv  *kvFeed // the engines' KV events, with Options.KVEvents (kvevents.go)
}

// simEngine is what the driver needs of an engine; *engine.Engine is the
// real one, tests may substitute a trivial model.
type simEngine interface {
	Add(r engine.Request, now time.Time) error
	Advance(now time.Time, emit func(engine.Event))
	NextEvent() (time.Time, bool)
	Stats() engine.Stats
}

// flight is one request inside an engine.
type flight struct {
	req        *workload.Request
	res        *balancer.Reservation
	replica    int
	core       int // the balancer that routed it
	arrived    time.Duration
	sent       time.Duration      // when the replica was chosen (a held request's dispatch)
	firstToken time.Duration      // -1 until the first token
	cached     int                // prompt tokens found cached, from the first token
	admitted   *admission.Request // flow control's: Done when it ends; nil without
}

func (r *run) setup() error {
	o := r.opts
	cfg, err := o.routingFor(r.policy)
	if err != nil {
		return err
	}
	_, fc := cutFlowControl(r.policy)
	r.flow = fc || o.FlowControl
	if cfg.Seed == 0 {
		cfg.Seed = uint64(o.Seed)
	}
	r.scrapeEvery = o.ScrapeInterval
	if f, ok := policy.Lookup(cfg.Policy); ok && f.PollEvery != nil {
		r.scrapeEvery = f.PollEvery(cfg.Settings)
	}
	r.followUps = r.flow && slices.Contains(ownPolicies, cfg.Policy)
	// Several balancers: the same code N times, each its own seed; an
	// arrival goes to one at random (the same draws in both modes).
	r.bals = make([]*balancer.Balancer, max(o.Balancers, 1))
	cores := make([]sharedstate.Core, len(r.bals))
	for i := range r.bals {
		c := cfg
		c.Seed += uint64(i)
		if r.bals[i], err = balancer.New(c); err != nil {
			return err
		}
		cores[i] = r.bals[i]
	}
	r.bal = r.bals[0]
	r.pick = rand.New(rand.NewPCG(uint64(o.Seed), 0xba1a))
	if r.shared {
		r.bus = sharedstate.NewBus(o.ShareDelay, o.LoadTTL, cores...)
		for i, b := range r.bals {
			b.SetSharer(r.bus.Member(i))
		}
	}
	wl, err := o.NewWorkload()
	if err != nil {
		return err
	}
	r.wl = wl
	n := o.Replicas
	r.eng = make([]simEngine, n)
	r.names = make([]string, n)
	r.index = make(map[string]int, n)
	r.down = make([]time.Duration, n)
	for i := range n {
		if o.newEngine != nil {
			r.eng[i] = o.newEngine()
		} else {
			r.eng[i] = engine.New(o.Profile)
		}
		r.names[i] = replicaName(i)
		r.index[r.names[i]] = i
		for _, bal := range r.bals {
			if err := bal.AddReplica(balancer.ReplicaSpec{Name: r.names[i], URL: "sim://" + r.names[i]}, Epoch); err != nil {
				return err
			}
		}
	}
	for _, f := range o.Flaps {
		i, _ := replicaIndex(f.Replica, n)
		r.down[i] = f.Period
	}
	for _, s := range o.Slow {
		i, _ := replicaIndex(s.Replica, n)
		// engine.Engine has it; tests' stand-in engines do not.
		if e, ok := r.eng[i].(interface{ SetSlowdown(float64) }); ok {
			e.SetSlowdown(s.Factor)
		}
	}
	// Sources: engines 0..n-1, mark, scrapes, tick, arrival, shared-state
	// deliveries, load publication and flow control's queue timeouts.
	r.srcMark = n
	r.srcScrape0 = n + 1
	r.srcTick = 2*n + 1
	r.srcArrival = 2*n + 2
	r.srcBus = 2*n + 3
	r.srcLoad = 2*n + 4
	r.srcExpire = 2*n + 5
	r.h = newEventHeap(2*n + 6)
	if r.flow {
		r.fc = newFlow(o.queueConfig(), r.bals, o.Profile, o.Duration)
	}
	r.h.set(r.srcBus, never)
	r.h.set(r.srcLoad, never)
	if r.shared && !o.NoShareLoad {
		r.h.set(r.srcLoad, int64(o.LoadInterval))
	}
	r.h.set(r.srcMark, int64(o.Duration))
	for i := range n {
		// Staggered phases: replica i is first scraped at i/n of an interval,
		// so the fleet's snapshots are of different ages at any instant.
		r.h.set(r.srcScrape0+i, int64(r.scrapeEvery)*int64(i)/int64(n))
	}
	r.h.set(r.srcTick, int64(o.TickInterval))
	r.arrivals = true
	r.rekeyArrival()
	r.flights = make(map[uint64]*flight)
	r.emit = r.onEvent
	r.acc.init(n, o)
	r.setupKVEvents()
	return nil
}

// execute runs the simulation to its end and returns the policy's result.
func (r *run) execute(ctx context.Context) (Result, error) {
	wall := time.Now()
	if err := r.setup(); err != nil {
		return Result{}, err
	}
	end := r.opts.Duration + r.opts.Drain
	for steps := 0; ; steps++ {
		if steps&4095 == 0 {
			if err := ctx.Err(); err != nil {
				return Result{}, err
			}
			r.progress.Store(int64(r.now))
		}
		src, key := r.h.min()
		if key == never || time.Duration(key) > end {
			break
		}
		if key < int64(r.now) {
			return Result{}, fmt.Errorf("bench: event source %d went back in time (%v < %v)", src, time.Duration(key), r.now)
		}
		r.now = time.Duration(key)
		switch {
		case src < r.srcMark:
			if err := r.engineEvent(src); err != nil {
				return Result{}, err
			}
		case src == r.srcMark:
			r.mark()
		case src < r.srcTick:
			r.scrape(src - r.srcScrape0)
		case src == r.srcTick:
			for _, b := range r.bals {
				b.Tick(r.at())
			}
			r.h.set(r.srcTick, r.nextAfterDuration(key+int64(r.opts.TickInterval)))
		case src == r.srcArrival:
			if err := r.arrival(); err != nil {
				return Result{}, err
			}
		case src == r.srcBus:
			r.bus.Deliver(r.at())
		case src == r.srcLoad:
			for i := range r.bals {
				r.bus.PublishLoad(i, r.at())
			}
			r.h.set(r.srcLoad, r.nextAfterDuration(key+int64(r.opts.LoadInterval)))
		case src == r.srcExpire:
			r.expire()
		}
		if r.fc != nil && r.fc.holding() {
			// Anything may have made room: an end, a scrape, a tick.
			r.pump()
		}
		if r.bus != nil {
			r.rekeyBus()
		}
	}
	r.progress.Store(int64(min(r.now, r.opts.Duration)))
	// Every reservation the core holds must be a request still in an
	// engine: a leak here would distort every load-aware policy.
	held := 0
	for _, b := range r.bals {
		for _, st := range b.Replicas(r.at()) {
			held += st.InFlight
		}
	}
	if held != len(r.flights) {
		return Result{}, fmt.Errorf("bench: the core holds %d reservations but %d requests are in flight", held, len(r.flights))
	}
	r.finished.Store(true)
	return r.result(end, time.Since(wall)), nil
}

// rekeyBus keys the next shared-state delivery (shared runs).
func (r *run) rekeyBus() {
	if t, ok := r.bus.Next(); ok {
		r.h.set(r.srcBus, int64(max(t.Sub(Epoch), r.now)))
	} else {
		r.h.set(r.srcBus, never)
	}
}

// at is the current virtual instant.
func (r *run) at() time.Time { return Epoch.Add(r.now) }

// nextAfterDuration keeps periodic sources (scrapes, tick) alive only while
// requests may still arrive: in the drain nothing is routed any more, but
// for the requests flow control still holds (none arrive any more, so once
// it holds none it never will again).
func (r *run) nextAfterDuration(key int64) int64 {
	if time.Duration(key) >= r.opts.Duration && (r.fc == nil || !r.fc.holding()) {
		return never
	}
	return key
}

// engineEvent advances engine i to its next event and re-keys it.
func (r *run) engineEvent(i int) error {
	e := r.eng[i]
	e.Advance(r.at(), r.emit)
	r.kvDrain(i)
	r.rekeyEngine(i)
	if r.h.key[i] <= int64(r.now) {
		return fmt.Errorf("bench: engine %s made no progress at %v", r.names[i], r.now)
	}
	r.rekeyArrival()
	return nil
}

func (r *run) rekeyEngine(i int) {
	t, ok := r.eng[i].NextEvent()
	if !ok {
		r.h.set(i, never)
		return
	}
	r.h.set(i, int64(t.Sub(Epoch)))
}

// rekeyArrival re-reads the workload's next arrival (a completion may have
// scheduled a closed-loop follow-up).
func (r *run) rekeyArrival() {
	if !r.arrivals {
		return
	}
	at, ok := r.wl.Peek()
	switch {
	case !ok && r.wl.Done():
		r.arrivals = false
		r.h.set(r.srcArrival, never)
	case !ok:
		r.h.set(r.srcArrival, never) // waits for a Complete
	case at >= r.opts.Duration:
		r.arrivals = false
		r.h.set(r.srcArrival, never)
	default:
		r.h.set(r.srcArrival, int64(max(at, r.now)))
	}
}

// isDown reports whether replica i refuses connections now (flap fault).
func (r *run) isDown(i int) bool {
	p := r.down[i]
	return p > 0 && Flap{Period: p}.down(r.now)
}

// scrape is one scrape of replica i: the engine is brought to now and its
// vLLM gauges go to the balancer, exactly what the serve shell's scraper does.
func (r *run) scrape(i int) {
	now := r.at()
	// Every balancer scrapes the replica (at the same instant here).
	if r.isDown(i) {
		for _, b := range r.bals {
			b.ObserveScrape(r.names[i], balancer.Snapshot{}, errReplicaDown, now)
		}
	} else {
		e := r.eng[i]
		e.Advance(now, r.emit)
		r.rekeyEngine(i)
		snap := snapshotOf(e.Stats(), r.opts.Profile)
		for _, b := range r.bals {
			b.ObserveScrape(r.names[i], snap, nil, now)
		}
		if r.fc != nil {
			r.fc.sample(r.names[i], snap, r.now)
		}
		r.rekeyArrival()
	}
	next := r.scrapeEvery
	for _, b := range r.bals {
		if r.followUps && b.ScrapeSoon(r.names[i], now) {
			next = r.scrapeEvery / scrapeFollowUp
			break
		}
	}
	r.h.set(r.srcScrape0+i, r.nextAfterDuration(int64(r.now+next)))
}

// scrapeFollowUp divides the scrape interval into the wait before a
// follow-up scrape (scrape.Options.FollowUp's default).
const scrapeFollowUp = 6

// ownPolicies are llmlb's policies, whose runs behind flow control scrape
// as serve does, follow-ups included (run.followUps).
var ownPolicies = []string{policy.NameCost, policy.NameLLMLB, policy.NameLLMLBWarm}

// mark fires once at Duration: the throughput window closes here.
func (r *run) mark() {
	now := r.at()
	for i, e := range r.eng {
		e.Advance(now, r.emit)
		r.rekeyEngine(i)
		r.acc.generatedAtEnd += e.Stats().GenerationTokens
	}
	r.rekeyArrival()
	r.h.set(r.srcMark, never)
}

// arrival routes the workload's next request: Select with its reservation,
// then Add to the chosen engine. A refusing replica (flap) is reported as a
// transport error and the request retried elsewhere, as the proxy does.
// Behind flow control the gate admits it first: it may wait (a later pump
// routes it) or be refused.
func (r *run) arrival() error {
	req := r.wl.Pop()
	r.acc.arrive(req)
	if req.Turn >= 2 {
		r.acc.turn2Arrived++
	}
	// The request's balancer (with one, always the same draw is skipped:
	// results with one balancer stay what they were).
	core := 0
	if len(r.bals) > 1 {
		core = r.pick.IntN(len(r.bals))
	}
	var admitted *admission.Request
	if r.fc != nil {
		var err error
		if admitted, err = r.admit(req, core); err != nil || admitted == nil {
			r.rekeyArrival()
			return err
		}
	}
	r.route(req, core, nil, r.now, admitted)
	return nil
}

// route sends req, which arrived at arrived, to a replica: res is the
// reservation flow control made for it (a held request's dispatch), or nil
// to Select one now. admitted is flow control's record of it, nil without.
func (r *run) route(req *workload.Request, core int, res *balancer.Reservation, arrived time.Duration, admitted *admission.Request) {
	now := r.at()
	bal := r.bals[core]
	r.kvDeliver()
	var exclude []string
	for range r.opts.MaxAttempts {
		if res == nil {
			var err error
			if res, err = bal.Select(&req.Profile, now, exclude...); err != nil {
				break
			}
		}
		i, ok := r.index[res.Replica]
		if !ok {
			bal.Release(res, balancer.OutcomeCanceled, now)
			break
		}
		if r.isDown(i) {
			bal.Release(res, balancer.OutcomeTransportError, now)
			r.acc.refused++
			exclude = append(exclude, res.Replica)
			res = nil
			continue
		}
		e := r.eng[i]
		e.Advance(now, r.emit)
		r.nextID++
		id := r.nextID
		ereq := engine.Request{ID: id, Prompt: req.Prompt, MaxTokens: req.Output}
		if r.fc != nil && r.fc.cfg.EnginePriority {
			ereq.Priority = -req.Priority // as the proxy writes it: vLLM serves lower values first
		}
		if err := e.Add(ereq, now); err != nil {
			// The replica answers 400 (prompt too long): not its fault,
			// and it computed nothing.
			bal.Release(res, balancer.OutcomeRejected, now)
			r.acc.rejected++
			r.ended(core, admitted)
			r.wl.Complete(req, r.now)
			r.rekeyEngine(i)
			r.rekeyArrival()
			return
		}
		r.flights[id] = &flight{req: req, res: res, replica: i, core: core, arrived: arrived, firstToken: -1, admitted: admitted, sent: r.now}
		r.acc.routed(i, r.now, req, res)
		r.rekeyEngine(i)
		r.rekeyArrival()
		return
	}
	r.acc.failed++
	r.ended(core, admitted)
	r.wl.Complete(req, r.now)
	r.rekeyArrival()
}

// ended tells flow control that a request it admitted ended (no-op
// without flow control).
func (r *run) ended(core int, admitted *admission.Request) {
	if admitted != nil {
		r.fc.gates[core].Done(admitted, r.at())
	}
}

// onEvent handles an engine event: first token, finish (release and tell the
// workload, which may schedule the session's next turn).
func (r *run) onEvent(ev engine.Event) {
	f, ok := r.flights[ev.ID]
	if !ok {
		return
	}
	at := ev.At.Sub(Epoch)
	switch ev.Kind {
	case engine.FirstToken:
		if f.firstToken < 0 {
			f.firstToken = at - f.arrived
			f.cached = ev.CachedTokens
			r.acc.indexHit(f.res.Explanation.CachedTokens, ev.CachedTokens)
			r.acc.pred.add(f.res.Explanation, (at - f.sent).Seconds())
			r.bals[f.core].Cached(f.res, ev.CachedTokens)
		}
		r.bals[f.core].FirstToken(f.res, ev.At)
	case engine.Finished, engine.Aborted:
		if f.firstToken < 0 {
			f.firstToken = at - f.arrived
		}
		delete(r.flights, ev.ID)
		r.bals[f.core].Release(f.res, balancer.OutcomeOK, ev.At)
		if f.admitted != nil {
			r.fc.gates[f.core].Done(f.admitted, ev.At)
		}
		r.acc.done(f, at, ev, r.opts.Duration)
		r.wl.Complete(f.req, at)
	}
}

// snapshotOf is what the serve shell's scraper reads from a replica's
// /metrics, taken from the engine's counters.
func snapshotOf(st engine.Stats, p engine.Profile) balancer.Snapshot {
	return balancer.Snapshot{
		Running:        float64(st.Running),
		Waiting:        float64(st.Waiting),
		KVCacheUsage:   st.KVCacheUsage,
		PromptTokens:   float64(st.PromptTokens),
		PrefixHits:     float64(st.PrefixHitTokens),
		PrefillSeconds: st.PrefillTime.Sum,
		PrefillCount:   float64(st.PrefillTime.Count),
		DecodeSeconds:  st.InterTokenLatency.Sum,
		DecodeCount:    float64(st.InterTokenLatency.Count),
		Preemptions:    float64(st.Preemptions),
		KVCacheTokens:  float64(p.Blocks() * tokenize.BlockSize),
	}
}
