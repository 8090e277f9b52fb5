// Package engine simulates one vLLM replica's scheduler and KV cache on a clock
// it is given: continuous batching, chunked prefill, automatic prefix caching in
// 16-token blocks, a waiting queue and preemption. It has no HTTP and no
// goroutines: the benchmark drives it on a virtual clock, the simulated replica
// (package simreplica) on the wall clock.
//
// The scheduler follows vLLM v1 (vllm/v1/core/sched/scheduler.py, FCFS):
// every step first gives each running request its next tokens (a prefill
// chunk or one decode token) within the step's token budget, preempting the
// most recently admitted request when KV blocks run out (recompute: its blocks
// are freed and it goes back to the front of the waiting queue); then, if
// nothing was preempted, it admits waiting requests in arrival order while
// slots, budget and blocks allow, each starting after its cached prefix.
//
// Time: the engine's clock is the end of the last completed step. A step's
// composition is fixed when it starts; a request added while a step runs
// joins at the next step boundary. A step's duration grows with its batched
// tokens, with the attention work of its prefill chunks (quadratic in the
// context) and with the context its decoding requests read (see Profile).
// Runs of pure-decode steps over the same requests are fast-forwarded in one
// go: their durations grow by a constant each step (every request's context
// grows by one token), so the run's timing has a closed form and the events
// are exactly those of the step-by-step simulation.
package engine

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/llmlb/llmlb/internal/tokenize"
)

// ErrPromptTooLong is returned by Add for a prompt that can never fit the KV
// cache (or the profile's maximum model length).
var ErrPromptTooLong = errors.New("engine: prompt longer than the model's context")

// ErrBadRequest is returned by Add for a request the engine cannot take: an
// empty prompt or an id that is already in the engine.
var ErrBadRequest = errors.New("engine: bad request")

// Request is one generation request as the engine sees it.
type Request struct {
	ID        uint64
	Prompt    tokenize.Prompt
	MaxTokens int // output tokens to generate (the simulator always generates exactly this many, min 1)
	// StreamTokens asks for a Token event for every generated token (streaming
	// HTTP responses); without it only FirstToken and Finished are emitted.
	StreamTokens bool
	// Priority is vLLM's request priority: lower is served earlier. It
	// orders the waiting queue only on an engine with
	// Profile.PriorityScheduling.
	Priority int
}

// EventKind says what happened to a request.
type EventKind int

const (
	// FirstToken: prefill is complete and the first output token exists.
	FirstToken EventKind = iota
	// Token: one more output token (only for StreamTokens requests).
	Token
	// Finished: all MaxTokens generated; the request has left the engine.
	Finished
	// Aborted: the request was removed by Abort. The engine never emits it
	// (Abort's caller already knows); it is kept for consumers' switches.
	Aborted
)

// String returns the kind's name.
func (k EventKind) String() string {
	switch k {
	case FirstToken:
		return "FirstToken"
	case Token:
		return "Token"
	case Finished:
		return "Finished"
	case Aborted:
		return "Aborted"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event is emitted by Advance.
//
// Every output token produces exactly one FirstToken or Token event (Token
// only for StreamTokens requests); Finished follows the last token's event
// at the same instant with OutputTokens == MaxTokens. A request with
// MaxTokens 1 thus gets FirstToken and Finished at one instant.
type Event struct {
	Kind         EventKind
	ID           uint64
	At           time.Time
	CachedTokens int // prompt tokens served from the prefix cache (set on FirstToken and Finished)
	OutputTokens int // output tokens generated so far
}

// Histogram is a cumulative histogram with vLLM's bucket bounds (seconds).
type Histogram struct {
	Bounds []float64 // upper bounds, ascending, +Inf implied
	Counts []uint64  // cumulative count per bound (len == len(Bounds))
	Count  uint64
	Sum    float64
}

// Stats is everything vLLM counts, read at the engine's current time.
type Stats struct {
	Running      int
	Waiting      int
	KVCacheUsage float64 // 0..1, fraction of KV blocks in use by running requests

	PrefixQueryTokens uint64 // prompt tokens looked up in the prefix cache
	PrefixHitTokens   uint64 // of those, tokens found cached
	PromptTokens      uint64
	GenerationTokens  uint64
	PrefillComputed   uint64 // prompt tokens actually computed (incl. recompute after preemption)
	Preemptions       uint64
	Finished          uint64

	TTFT Histogram // arrival -> first token
	E2E  Histogram // arrival -> finish

	// The phase histograms below are observed when a request finishes, as
	// vLLM does (aborted requests are not counted).

	// QueueTime is vllm:request_queue_time_seconds: arrival -> first
	// scheduling (admission into the running batch).
	QueueTime Histogram
	// PrefillTime is vllm:request_prefill_time_seconds: first scheduling ->
	// first token. Prefill rates can be learned from it.
	PrefillTime Histogram
	// InterTokenLatency is vllm:inter_token_latency_seconds: one observation
	// per output token after the first, the gap since the previous token
	// (decode step times, as the batch and its context grow).
	InterTokenLatency Histogram
}

// seqState is where a request is in the engine.
type seqState uint8

const (
	stWaiting seqState = iota
	stRunning
	stGone // finished or aborted
)

// seq is one request inside the engine (vLLM's Request).
type seq struct {
	req          Request
	arrival      time.Time
	blocks       []int32   // KV blocks, in token order
	computed     int       // tokens whose KV is computed or scheduled
	outputs      int       // output tokens sampled
	hashed       int       // leading prompt blocks registered in (or hit from) the cache
	promptBlocks int       // full prompt blocks that have a hash
	cached       int       // prompt tokens hit at first admission; -1 before
	scheduled    time.Time // first admission into the running batch; zero before
	firstTok     int64     // first output token (Unix ns)
	lastTok      int64     // latest output token (Unix ns: decode runs compare it per request per step)
	state        seqState
	preempted    bool // preempted at least once (prefix stats count first admissions only)
	done         bool // finished in the step being applied
}

// tokens is the request's current length: prompt plus sampled output.
func (s *seq) tokens() int { return s.req.Prompt.Tokens + s.outputs }

// entry is one request's share of a step.
type entry struct {
	s *seq
	n int
}

// plan is the step (or run of identical decode steps) in flight.
type plan struct {
	active bool
	start  time.Time
	dur    time.Duration // of the first step
	delta  time.Duration // each later step of a run lasts delta more than the one before
	// steps is the number of steps in the plan; more than one only for a
	// run of pure-decode steps over all running requests.
	steps     int
	applied   int // steps already applied by Advance
	scheduled int // steps whose tokens are already scheduled (blocks allocated)
	run       bool
	streamers bool // a running request streams: every run step emits events
	entries   []entry
}

// Engine is one simulated replica. It is not safe for concurrent use; the
// owner serialises calls.
type Engine struct {
	profile  Profile
	coef     Profile // profile with its step times scaled by the slowdown
	err      error   // the profile's validation error, returned by Add
	kv       *kvCache
	slowdown float64

	clock   time.Time // end of the last completed step
	lastNow time.Time // latest instant any call told us about
	seqs    map[uint64]*seq
	running []*seq
	waiting []*seq // FCFS; preempted requests are put back at the front
	whead   int
	plan    plan

	// blocked memoises a failed admission of the waiting queue's head so
	// that a busy engine does not redo its prefix lookup every step.
	blocked struct {
		s      *seq
		free   int
		gen    uint64
		budget int
	}

	hitBuf []int32
	spare  []*seq // finished requests, recycled with their block slices
	noRuns bool   // tests: plan every step singly (the reference simulation)
	plans  uint64 // plans made (steps or decode runs): the benchmark's work unit
	steps  uint64 // scheduler steps simulated

	st      Stats // counters only; the histograms live below
	ttft    hist
	e2e     hist
	queue   hist
	prefill hist
	itl     hist
}

// New returns an idle engine with an empty cache. An invalid profile makes
// every Add fail with the validation error.
func New(p Profile) *Engine {
	e := &Engine{
		profile:  p,
		coef:     p,
		slowdown: 1,
		seqs:     make(map[uint64]*seq),
		ttft:     newHist(TTFTBuckets),
		e2e:      newHist(E2EBuckets),
		queue:    newHist(RequestLatencyBuckets),
		prefill:  newHist(RequestLatencyBuckets),
		itl:      newHist(InterTokenBuckets),
	}
	if e.err = p.Validate(); e.err == nil {
		e.kv = newKVCache(p.Blocks())
	}
	return e
}

// Profile returns the engine's profile.
func (e *Engine) Profile() Profile { return e.profile }

// Add queues a request that arrived at now. If the engine is idle the next step
// starts at now; otherwise the request joins at the next step boundary.
func (e *Engine) Add(r Request, now time.Time) error {
	if e.err != nil {
		return e.err
	}
	p := r.Prompt
	switch {
	case p.Tokens < 1:
		return fmt.Errorf("%w: empty prompt (request %d)", ErrBadRequest, r.ID)
	case e.seqs[r.ID] != nil:
		return fmt.Errorf("%w: duplicate request id %d", ErrBadRequest, r.ID)
	}
	r.MaxTokens = max(r.MaxTokens, 1)
	total := p.Tokens + r.MaxTokens
	if p.Tokens > e.profile.MaxModelLen || r.MaxTokens > e.profile.MaxModelLen || total > e.profile.MaxModelLen {
		return fmt.Errorf("%w: %d prompt + %d output tokens > max model length %d",
			ErrPromptTooLong, p.Tokens, r.MaxTokens, e.profile.MaxModelLen)
	}
	if need := blocksFor(total); need > len(e.kv.blocks) {
		return fmt.Errorf("%w: %d tokens need %d KV blocks, the cache has %d",
			ErrPromptTooLong, total, need, len(e.kv.blocks))
	}
	e.see(now)

	s := e.newSeq()
	s.req = r
	s.arrival = now
	s.promptBlocks = min(len(p.Blocks), p.Tokens/tokenize.BlockSize)
	if c := blocksFor(total); cap(s.blocks) < c {
		s.blocks = make([]int32, 0, c)
	}
	e.seqs[r.ID] = s
	e.enqueue(s)

	if !e.plan.active {
		e.schedule(later(now, e.clock))
	} else {
		e.truncate(now)
	}
	return nil
}

// enqueue adds s, which has just arrived, to the waiting queue: at its end,
// or with priority scheduling after every waiting request of its priority
// or a lower (earlier served) one. It arrived last, so once the plan is cut
// at its arrival every request it passes has arrived too, and the queue's
// arrivals need no order.
func (e *Engine) enqueue(s *seq) {
	i := len(e.waiting)
	if e.profile.PriorityScheduling {
		for i > e.whead && e.waiting[i-1].req.Priority > s.req.Priority {
			i--
		}
	}
	e.waiting = slices.Insert(e.waiting, i, s)
}

// Abort removes a request (client went away) and frees its blocks. It emits
// no event; it reports whether the request was in the engine.
func (e *Engine) Abort(id uint64, now time.Time) bool {
	s, ok := e.seqs[id]
	if !ok {
		return false
	}
	e.see(now)
	// The step in flight completes as planned (the GPU is computing it);
	// later steps are planned without the request.
	e.truncate(now)
	switch s.state {
	case stRunning:
		for i, r := range e.running {
			if r == s {
				e.running = append(e.running[:i], e.running[i+1:]...)
				break
			}
		}
		e.freeBlocks(s)
	case stWaiting:
		for i := e.whead; i < len(e.waiting); i++ {
			if e.waiting[i] == s {
				e.waiting = append(e.waiting[:i], e.waiting[i+1:]...)
				break
			}
		}
	}
	s.state = stGone
	delete(e.seqs, id)
	if e.blocked.s == s {
		e.blocked.s = nil
	}
	// Not recycled: the plan in flight may still point at it.
	return true
}

// Advance runs every scheduler step that ends at or before now and calls emit
// for each event in time order.
func (e *Engine) Advance(now time.Time, emit func(Event)) {
	e.see(now)
	for e.plan.active {
		pl := &e.plan
		if pl.run {
			if done := pl.stepsDone(now); done > pl.applied {
				e.applyRun(done-pl.applied, emit)
			}
			if pl.applied < pl.steps {
				return
			}
		} else {
			end := pl.start.Add(pl.dur)
			if end.After(now) {
				return
			}
			e.applyStep(end, emit)
		}
		end := pl.start.Add(pl.offset(pl.steps))
		e.steps += uint64(pl.steps)
		pl.active = false
		e.clock = end
		e.reap()
		e.schedule(end)
	}
}

// NextEvent returns the earliest time at which Advance would emit an event;
// ok is false when the engine is idle.
//
// The answer is never later than the next event but may be earlier: the end
// of a step whose outcome (a prefill chunk, a coming preemption) the engine
// cannot know before it has run, because a request added meanwhile would
// change the next step. Advancing to such a time emits nothing; ask again.
func (e *Engine) NextEvent() (t time.Time, ok bool) {
	pl := &e.plan
	if !pl.active {
		return time.Time{}, false
	}
	if pl.run && !pl.streamers {
		return pl.start.Add(pl.offset(pl.steps)), true
	}
	return pl.start.Add(pl.offset(pl.applied + 1)), true
}

// SetSlowdown multiplies every step's duration by factor (>= 1; fault injection).
// Values below 1 (or NaN) mean 1. It applies from the next step boundary.
func (e *Engine) SetSlowdown(factor float64) {
	if !(factor >= 1) {
		factor = 1
	}
	e.truncate(e.lastNow)
	e.slowdown = factor
	e.coef = e.profile.scaled(factor)
}

// Stats returns the counters as of the last Advance.
func (e *Engine) Stats() Stats {
	s := e.st
	s.Running = len(e.running)
	s.Waiting = len(e.waiting) - e.whead
	if e.kv != nil {
		s.KVCacheUsage = float64(e.kv.used()) / float64(len(e.kv.blocks))
	}
	s.TTFT = e.ttft.snapshot()
	s.E2E = e.e2e.snapshot()
	s.QueueTime = e.queue.snapshot()
	s.PrefillTime = e.prefill.snapshot()
	s.InterTokenLatency = e.itl.snapshot()
	return s
}

// see records the latest instant a caller told us about.
func (e *Engine) see(now time.Time) {
	if now.After(e.lastNow) {
		e.lastNow = now
	}
}

// truncate ends a run of decode steps at the first step boundary at or
// after t, so that whatever happened at t (an arrival, an abort, a new
// slowdown) shapes the steps after it, as in a step-by-step simulation.
func (e *Engine) truncate(t time.Time) {
	pl := &e.plan
	if !pl.active || !pl.run {
		return
	}
	m := pl.applied + 1
	if d := t.Sub(pl.start); d > 0 {
		m = max(m, pl.stepsUntil(d, pl.steps))
	}
	if m < pl.steps {
		pl.steps = m
	}
}

// schedule plans the step that starts at boundary b (vLLM's schedule()).
func (e *Engine) schedule(b time.Time) {
	pl := &e.plan
	for attempt := 0; attempt < 2; attempt++ {
		if len(e.running) == 0 {
			if e.whead == len(e.waiting) {
				return // idle
			}
			// Idle until the first request arrives.
			b = later(b, e.waiting[e.whead].arrival)
		}
		if e.planStep(b) {
			return
		}
	}
	// Unreachable with a valid profile: a lone request always fits (Add
	// checks it). Leave the engine idle rather than spin.
	pl.active = false
}

// planStep builds the step starting at b; false if nothing could run.
func (e *Engine) planStep(b time.Time) bool {
	pl := &e.plan
	budget := e.profile.MaxNumBatchedTokens
	ents := pl.entries[:0]
	tokens := 0
	var w work
	preempted := false
	decodeOnly := true

	// With parallel prefill, the budget the decodes leave is shared evenly
	// by the requests in prefill (sharers counts those still to be served).
	sharers, shared := e.prefillSharers(b)

	// 1. Running requests, in admission order.
	for i := 0; i < len(e.running) && budget > 0; i++ {
		s := e.running[i]
		n := min(s.tokens()-s.computed, budget)
		if sharers > 0 && n > 1 {
			n = min(n, max(1, shared/sharers))
			sharers--
			shared -= n
		}
		for !e.allocate(s, n) {
			// Out of blocks: preempt the most recently admitted request.
			v := e.running[len(e.running)-1]
			e.running = e.running[:len(e.running)-1]
			e.preempt(v)
			preempted = true
			if v == s {
				s = nil
				break
			}
		}
		if s == nil {
			break
		}
		if n != 1 || s.outputs == 0 || s.computed != s.tokens()-1 {
			decodeOnly = false
		}
		e.commit(s, n)
		w.add(s, n)
		ents = append(ents, entry{s, n})
		budget -= n
		tokens += n
	}
	allRunning := len(ents) == len(e.running)

	// 2. Waiting requests, if nothing was preempted.
	admitted, blocked := false, false
	if !preempted {
		for e.whead < len(e.waiting) {
			s := e.waiting[e.whead]
			if s.arrival.After(b) {
				break // arrives during this step: joins at the next boundary
			}
			if len(e.running) >= e.profile.MaxNumSeqs || budget <= 0 {
				blocked = true
				break
			}
			chunk := budget
			if sharers > 0 {
				chunk = min(budget, max(1, shared/sharers))
			}
			n, ok := e.admit(s, chunk, b)
			if !ok {
				blocked = true
				break
			}
			if sharers > 0 {
				sharers--
				shared -= n
			}
			e.waiting[e.whead] = nil
			e.whead++
			s.state = stRunning
			e.running = append(e.running, s)
			w.add(s, n)
			ents = append(ents, entry{s, n})
			budget -= n
			tokens += n
			admitted = true
		}
		e.compactWaiting()
	}
	pl.entries = ents
	if len(ents) == 0 {
		return false
	}
	e.plans++
	pl.active = true
	pl.start = b
	pl.dur = e.stepTime(len(ents), tokens, w)
	pl.delta = 0
	pl.steps, pl.applied, pl.scheduled = 1, 0, 1
	pl.run = false
	if decodeOnly && allRunning && !preempted && !admitted && !e.noRuns {
		// Every later step of the run reads one more token of context per
		// request: its duration is exactly delta more (integer arithmetic).
		pl.delta = time.Duration(len(ents)) * e.coef.StepPerContextToken
		if k := e.runLength(b, blocked); k > 1 {
			pl.steps = k
			pl.run = true
			pl.streamers = false
			for _, s := range e.running {
				pl.streamers = pl.streamers || s.req.StreamTokens
			}
		}
	}
	return true
}

// prefillSharers returns, for a parallel-prefill profile, how many
// requests share the step starting at b for their prefill (those running
// with more than one token to compute, then waiting ones that have arrived
// and would find a free slot, up to MaxPartialPrefills) and the budget they
// share: what the running decodes leave. Serial profiles get 0, 0.
func (e *Engine) prefillSharers(b time.Time) (sharers, shared int) {
	limit := e.profile.MaxPartialPrefills
	if limit <= 1 {
		return 0, 0
	}
	decodes := 0
	for _, s := range e.running {
		if s.tokens()-s.computed > 1 {
			if sharers < limit {
				sharers++
			}
		} else {
			decodes++
		}
	}
	free := e.profile.MaxNumSeqs - len(e.running)
	for i := e.whead; i < len(e.waiting) && sharers < limit && free > 0; i++ {
		if e.waiting[i].arrival.After(b) {
			break
		}
		sharers++
		free--
	}
	return sharers, max(0, e.profile.MaxNumBatchedTokens-decodes)
}

// runLength is how many identical pure-decode steps can follow from b: up to
// the first step in which a request finishes, while the KV blocks they need
// are free (after that a step would preempt), and up to the boundary at which
// a known pending arrival joins. blocked says the waiting head was refused at
// b; it stays refused during the run (free blocks only shrink, slots and
// budget stay the same), so it does not limit the run.
func (e *Engine) runLength(b time.Time, blocked bool) int {
	k := e.profile.MaxModelLen
	for _, s := range e.running {
		k = min(k, s.req.MaxTokens-s.outputs)
	}
	if !blocked {
		for i := e.whead; i < len(e.waiting); i++ {
			if a := e.waiting[i].arrival; a.After(b) {
				k = min(k, e.plan.stepsUntil(a.Sub(b), k))
				break
			}
		}
	}
	if k <= 1 || e.runBlocks(k) <= e.kv.numFree {
		return k
	}
	// Largest j < k whose extra blocks fit (runBlocks is monotone).
	lo, hi := 1, k // runBlocks(lo) fits, runBlocks(hi) does not
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if e.runBlocks(mid) <= e.kv.numFree {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// runBlocks is the number of new blocks steps 2..k of a decode run need.
func (e *Engine) runBlocks(k int) int {
	need := 0
	for _, s := range e.running {
		need += blocksFor(s.computed+k-1) - len(s.blocks)
	}
	return need
}

// admit tries to start waiting request s with at most budget tokens: a
// prefix-cache lookup (capped so that at least one token is computed, as
// vLLM recomputes the last block of a full hit), then blocks for the hit
// and for the first chunk, in the step starting at b. It returns the chunk
// size.
func (e *Engine) admit(s *seq, budget int, b time.Time) (int, bool) {
	bl := &e.blocked
	if bl.s == s && e.kv.numFree <= bl.free && e.kv.gen == bl.gen && budget >= bl.budget {
		return 0, false // nothing that could help has changed
	}
	maxHit := min(s.promptBlocks, (s.tokens()-1)/tokenize.BlockSize)
	hits := e.kv.matchPrefix(s.req.Prompt.Blocks[:max(maxHit, 0)], e.hitBuf[:0])
	e.hitBuf = hits
	evictable := 0
	for _, i := range hits {
		if e.kv.blocks[i].ref == 0 {
			evictable++
		}
	}
	hitTokens := len(hits) * tokenize.BlockSize
	n := min(s.tokens()-hitTokens, budget)
	if blocksFor(hitTokens+n)-len(hits)+evictable > e.kv.numFree {
		bl.s, bl.free, bl.gen, bl.budget = s, e.kv.numFree, e.kv.gen, budget
		return 0, false
	}
	bl.s = nil
	if s.scheduled.IsZero() {
		s.scheduled = b // vLLM keeps the first scheduling across preemptions
	}
	for _, i := range hits {
		e.kv.touch(i)
	}
	s.blocks = append(s.blocks[:0], hits...)
	s.computed = hitTokens
	s.hashed = len(hits)
	if !s.preempted {
		e.st.PrefixQueryTokens += uint64(s.req.Prompt.Tokens)
		e.st.PrefixHitTokens += uint64(hitTokens)
		s.cached = hitTokens
	}
	e.allocate(s, n) // fits: checked above
	e.commit(s, n)
	return n, true
}

// allocate gives s the blocks for n more tokens; false if they are not free.
func (e *Engine) allocate(s *seq, n int) bool {
	need := blocksFor(s.computed+n) - len(s.blocks)
	if need > e.kv.numFree {
		return false
	}
	if need > 1 {
		e.kv.prefetchFree(need)
	}
	for range need {
		s.blocks = append(s.blocks, e.kv.alloc())
	}
	return true
}

// commit schedules n tokens of s: they count as computed from now on (vLLM
// advances num_computed_tokens at schedule time), and prompt blocks that
// become full are cached under their hash.
func (e *Engine) commit(s *seq, n int) {
	if s.outputs == 0 || s.computed < s.tokens()-1 {
		e.st.PrefillComputed += uint64(n)
	}
	s.computed += n
	upto := min(s.computed/tokenize.BlockSize, s.promptBlocks)
	if upto > s.hashed {
		e.kv.prefetch(s.req.Prompt.Blocks[s.hashed:upto])
	}
	for ; s.hashed < upto; s.hashed++ {
		e.kv.cache(s.blocks[s.hashed], s.req.Prompt.Blocks[s.hashed])
	}
}

// preempt frees v's blocks and puts it back at the front of the waiting
// queue; it will recompute everything not found in the cache.
func (e *Engine) preempt(v *seq) {
	e.freeBlocks(v)
	v.computed = 0
	v.hashed = 0
	v.preempted = true
	v.state = stWaiting
	if e.whead > 0 {
		e.whead--
		e.waiting[e.whead] = v
	} else {
		e.waiting = append(e.waiting, nil)
		copy(e.waiting[1:], e.waiting)
		e.waiting[0] = v
	}
	e.st.Preemptions++
}

// freeBlocks releases s's blocks in reverse order, so that the tail of a
// prompt is evicted before its (more shared) head, as vLLM does.
func (e *Engine) freeBlocks(s *seq) {
	e.kv.prefetchBlocks(s.blocks)
	for i := len(s.blocks) - 1; i >= 0; i-- {
		e.kv.release(s.blocks[i])
	}
	s.blocks = s.blocks[:0]
}

// applyStep completes a single step at end: requests whose tokens are all
// computed sample one token.
func (e *Engine) applyStep(end time.Time, emit func(Event)) {
	for _, en := range e.plan.entries {
		s := en.s
		if s.state != stRunning || s.computed < s.tokens() {
			continue // aborted, or a prefill chunk that samples nothing
		}
		e.sample(s, end, emit)
	}
	e.plan.applied = 1
}

// applyRun applies j more steps of a decode run.
func (e *Engine) applyRun(j int, emit func(Event)) {
	pl := &e.plan
	target := pl.applied + j
	last := target == pl.steps
	bulk := j
	if last {
		bulk-- // the last step may finish requests: sampled one by one below
	}
	if bulk > 0 {
		// Inter-token gaps: a request's first step in this call may follow
		// an older token (a request skipped by an earlier step's budget);
		// every later step is one step duration for every request.
		start := pl.start.UnixNano()
		at1 := start + int64(pl.offset(pl.applied+1))
		atN := start + int64(pl.offset(pl.applied+bulk))
		d1 := pl.dur + time.Duration(pl.applied)*pl.delta // step applied+1
		same := 0
		for _, s := range e.running {
			if g := time.Duration(at1 - s.lastTok); g == d1 {
				same++
			} else {
				e.itl.observe(g)
			}
			s.lastTok = atN
		}
		e.itl.observeN(d1, uint64(same))
		e.itl.observeRamp(d1+pl.delta, pl.delta, bulk-1, uint64(len(e.running)))
		if pl.streamers {
			for k := 1; k <= bulk; k++ {
				at := pl.start.Add(pl.offset(pl.applied + k))
				for _, s := range e.running {
					s.outputs++
					if s.req.StreamTokens {
						emit(Event{Kind: Token, ID: s.req.ID, At: at, CachedTokens: max(s.cached, 0), OutputTokens: s.outputs})
					}
				}
			}
		} else {
			for _, s := range e.running {
				s.outputs += bulk
			}
		}
		e.st.GenerationTokens += uint64(bulk * len(e.running))
	}
	// Schedule the steps that have started by now (the run checked that
	// their blocks are free).
	if upto := min(target+1, pl.steps); upto > pl.scheduled {
		d := upto - pl.scheduled
		for _, s := range e.running {
			e.allocate(s, d)
			s.computed += d
		}
		pl.scheduled = upto
	}
	pl.applied = target
	if last {
		at := pl.start.Add(pl.offset(pl.steps))
		for _, s := range e.running {
			e.sample(s, at, emit)
		}
	}
}

// sample gives s one output token at t and emits its events.
func (e *Engine) sample(s *seq, t time.Time, emit func(Event)) {
	s.outputs++
	e.st.GenerationTokens++
	cached := max(s.cached, 0)
	tn := t.UnixNano()
	switch {
	case s.outputs == 1:
		e.st.PromptTokens += uint64(s.req.Prompt.Tokens)
		e.ttft.observe(t.Sub(s.arrival))
		s.firstTok = tn
		emit(Event{Kind: FirstToken, ID: s.req.ID, At: t, CachedTokens: cached, OutputTokens: 1})
	case s.req.StreamTokens:
		e.itl.observe(time.Duration(tn - s.lastTok))
		emit(Event{Kind: Token, ID: s.req.ID, At: t, CachedTokens: cached, OutputTokens: s.outputs})
	default:
		e.itl.observe(time.Duration(tn - s.lastTok))
	}
	s.lastTok = tn
	if s.outputs >= s.req.MaxTokens {
		e.st.Finished++
		e.e2e.observe(t.Sub(s.arrival))
		e.queue.observe(s.scheduled.Sub(s.arrival))
		e.prefill.observe(time.Duration(s.firstTok - s.scheduled.UnixNano()))
		e.freeBlocks(s)
		s.done = true
		emit(Event{Kind: Finished, ID: s.req.ID, At: t, CachedTokens: cached, OutputTokens: s.outputs})
	}
}

// reap removes finished requests from the running list (keeping its order)
// and recycles them.
func (e *Engine) reap() {
	kept := e.running[:0]
	for _, s := range e.running {
		if !s.done {
			kept = append(kept, s)
			continue
		}
		s.state = stGone
		delete(e.seqs, s.req.ID)
		if e.blocked.s == s {
			e.blocked.s = nil
		}
		e.spare = append(e.spare, s)
	}
	clear(e.running[len(kept):])
	e.running = kept
}

// newSeq returns a clean request record, reusing a finished one.
func (e *Engine) newSeq() *seq {
	if n := len(e.spare); n > 0 {
		s := e.spare[n-1]
		e.spare = e.spare[:n-1]
		*s = seq{blocks: s.blocks[:0], cached: -1}
		return s
	}
	return &seq{cached: -1}
}

// compactWaiting drops the consumed head of the waiting queue when it
// dominates the slice.
func (e *Engine) compactWaiting() {
	if e.whead == len(e.waiting) {
		clear(e.waiting)
		e.waiting = e.waiting[:0]
		e.whead = 0
	} else if e.whead > 64 && e.whead*2 > len(e.waiting) {
		n := copy(e.waiting, e.waiting[e.whead:])
		clear(e.waiting[n:])
		e.waiting = e.waiting[:n]
		e.whead = 0
	}
}

// work is a step's attention work beyond its token count.
type work struct {
	halfPairs int64 // twice the (query, key) pairs its prefill chunks attend
	ctx       int64 // context tokens its decoding requests read
}

// add counts s's share of n tokens, already committed: a decode token reads
// the request's whole context (KV bytes / memory bandwidth); a prefill chunk
// of n tokens after c computed ones attends n*(c + n/2) pairs (causal), so a
// chunk after a cached prefix pays for attending to it.
func (w *work) add(s *seq, n int) {
	if n == 1 && s.outputs > 0 && s.computed == s.tokens() {
		w.ctx += int64(s.computed)
		return
	}
	c := int64(s.computed - n)
	w.halfPairs += int64(n) * (2*c + int64(n))
}

// stepTime is the model's duration of a step with seqs requests, tokens
// batched tokens and work w, at the current slowdown.
func (e *Engine) stepTime(seqs, tokens int, w work) time.Duration {
	return max(e.coef.stepTime(seqs, tokens, w.halfPairs, w.ctx), time.Nanosecond)
}

// offset is the time from the plan's start to the end of its j-th step: a
// run's steps last dur, dur+delta, dur+2*delta, ...
func (pl *plan) offset(j int) time.Duration {
	jj := time.Duration(j)
	return jj*pl.dur + pl.delta*(jj*(jj-1)/2)
}

// stepsBy is how many of the plan's steps (at most limit) end at or before t.
func (pl *plan) stepsBy(t time.Time, limit int) int {
	d := t.Sub(pl.start)
	if d < pl.dur {
		return 0
	}
	if pl.delta == 0 {
		return int(min(int64(d/pl.dur), int64(limit)))
	}
	// Solve j*dur + delta*j*(j-1)/2 = d for j, then correct the float
	// estimate with exact integer comparisons.
	a := float64(pl.delta) / 2
	b := float64(pl.dur) - a
	est := (-b + math.Sqrt(b*b+4*a*float64(d))) / (2 * a)
	j := int(min(max(est, 0), float64(limit)))
	for j > 0 && pl.offset(j) > d {
		j--
	}
	for j < limit && pl.offset(j+1) <= d {
		j++
	}
	return j
}

// stepsDone is stepsBy(t, steps) with a fast path for the common call: a
// driver advancing to the next step boundary (or not yet reaching it).
func (pl *plan) stepsDone(t time.Time) int {
	if pl.applied >= pl.steps {
		return pl.steps
	}
	d := t.Sub(pl.start)
	next := pl.applied + 1
	if pl.offset(next) > d {
		return pl.applied
	}
	if next == pl.steps || pl.offset(next+1) > d {
		return next
	}
	return pl.stepsBy(t, pl.steps)
}

// stepsUntil is the fewest steps whose end is at least d (> 0) after the
// plan's start: the step boundary at which something happening at start+d
// takes effect. It is at most limit+1.
func (pl *plan) stepsUntil(d time.Duration, limit int) int {
	return pl.stepsBy(pl.start.Add(d-1), limit) + 1
}

// blocksFor is the number of blocks that hold n tokens.
func blocksFor(n int) int { return (n + tokenize.BlockSize - 1) / tokenize.BlockSize }

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
