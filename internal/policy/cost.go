package policy

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/llmlb/llmlb/internal/kvindex"
)

// NameCost is the cost policy's name.
const NameCost = "cost"

// CostConfig holds policy cost's settings (YAML routing.cost.*). The rate
// and capacity values are priors: each replica's own, learned from its
// /metrics, replace them as soon as it has served requests.
type CostConfig struct {
	// PrefillRate is the prior prefill throughput, prompt tokens per second,
	// of a replica whose /metrics has not shown one yet (cost.prefill_rate,
	// 10000: a mid-size model on one data-centre GPU).
	PrefillRate float64
	// DecodeStep is the prior time between two output tokens
	// (cost.decode_step, 30ms).
	DecodeStep time.Duration
	// KVCacheTokens overrides every replica's KV capacity in tokens
	// (cost.kv_cache_tokens); 0 learns it from vllm:cache_config_info and
	// uses DefaultKVCacheTokens until then.
	KVCacheTokens int
	// BoundedLoad and BoundedLoadSlack bound any replica's in-flight
	// requests to max(ceil(bounded_load x the mean including this request),
	// the least-loaded candidate's + slack): consistent hashing with bounded
	// loads, so a prefix every request shares cannot pull all traffic to
	// one replica (cost.bounded_load 2, cost.bounded_load_slack 8). The
	// bound binds a replica that holds part of the prompt or whose batch is
	// full, not one that holds none of it and can admit it, up to twice the
	// bound (overBound). The slack binds at light load, where the estimates
	// already price the queue: at 4 it sent a prefix's later requests
	// elsewhere while its replica was the fastest, and cost hit rate on
	// held-out traces (BENCHMARKS.md); a bounded_load of 3 let sustained
	// overload pile onto the prefixes' replicas (Mooncake 4 replicas 2x: p50
	// 9.4 to 12.5 s).
	BoundedLoad      float64
	BoundedLoadSlack int
	// BatchTokens is the replicas' per-step token budget, vLLM's
	// max_num_batched_tokens (cost.batch_tokens, 2048: vLLM's default on
	// GPUs under 70 GiB; 8192 on larger ones). It counts the steps a prefill
	// takes.
	BatchTokens int
	// MaxNumSeqs is the replicas' batch size in requests, vLLM's
	// max_num_seqs: beyond it a request waits for a slot
	// (cost.max_num_seqs). 0, the default, learns each replica's own
	// (Candidate.MaxRunning: its running count held over scrapes while
	// requests waited, or its KV-bound batch while it preempts) and prices an unknown one at
	// DefaultMaxNumSeqs; a value set overrides every replica's.
	MaxNumSeqs int
	// TieSteps is the margin, in decode steps of the fastest candidate,
	// within which estimates count as equal and the most cached prompt wins
	// (cost.tie_steps, 1): a step computes a whole token budget, so smaller
	// differences are below the model's resolution.
	TieSteps float64
	// Sessions bounds the table of session keys remembered for requests
	// whose prompt cannot be hashed into blocks and for bursts
	// (cost.sessions, 65536; 0 remembers none, and spreads no burst).
	Sessions int
	// EvictionWeight scales the price of the blocks a prompt evicts from a
	// full cache: weight x the index's measured reuse of evicted blocks x
	// the prefill's time (cost.eviction_weight, 300; 0 never prices them).
	// At 1 that is the recompute the evictions are expected to cost later;
	// measured, a full cache is worth far more than that to the fleet (a
	// copy of a prefix onto another replica's full cache wins its own TTFT
	// but splits the prefix's later requests and the cache they would find:
	// BENCHMARKS.md). By default a copy onto a full cache must win 300 x
	// reuse times its prefill's time: 15-50 times at the reuse measured on
	// the Mooncake traces. (100 met the benchmark bar, TTFT and hit rate
	// against the best other policy's, on fewer held-out trace runs; 1,000
	// on fewer again.)
	EvictionWeight float64
	// RotationStart shifts where the rotation among equal candidates starts
	// (cost.rotation_start, 0). It changes nothing but the order in which
	// equal estimates are met: a benchmark run with 1, 2 or 3 shows how much
	// its result depends on that order (BENCHMARKS.md: on the held-out trace
	// runs, as much as most changes measured there).
	RotationStart int
	// BurstSpread lets the later requests of a session's burst (parallel
	// tool calls, sub-agents: requests of a session that arrive before
	// the one before has its first token) leave the replica the burst
	// went to: one takes the best other replica if its score there exceeds
	// its score on the burst's replica by at most burst_spread x the wait
	// the burst's earlier requests add there (cost.burst_spread, 1; 0 keeps
	// a burst where its estimates put it). A request's own estimate never justifies
	// that move, since the other replica must first copy the session's
	// context; the copy pays off at the session's next bursts, which then
	// find their context on two replicas and share steps on neither (on
	// agentic a session's bursts otherwise all queue on its one replica,
	// and round-robin, whose rotation copies every session everywhere, had
	// the better median: BENCHMARKS.md). At 1 a copy is worth the burst's
	// wait once more, the next burst's. On a full cache the copy's eviction price is shared by
	// the requests the burst is expected still to send, which follow the
	// copy (spreadBurst).
	BurstSpread float64
	// HotPrefixes bounds the table of prefixes whose request rate the
	// policy follows to price a copy of a shared prefix onto a replica that
	// lacks it (cost.hot_prefixes, 65536; 0 follows none and never prices a
	// copy below its prefill, as cost did before it followed prefixes). A
	// copy is computed once and serves the prefix's later
	// requests there: its price is divided by the requests expected at once
	// per replica holding it (docs/ROUTING.md, "Hot prefixes").
	HotPrefixes int
	// MarginWindow prices, for a request of a session seen before, what
	// computing the prompt tokens no candidate holds (its context, lost
	// everywhere, and its new message) evicts on each full replica, by that
	// replica's own marginal reuse: the share of its evicted blocks asked
	// for again while a cache larger by margin_window of its capacity
	// would still have held them (kvindex.MarginalReuse), per block of
	// that margin, times the tokens' prefill time: the recompute its
	// evictions are expected to cost (cost.margin_window, 0.75; 0 prices
	// none). It adds to eviction_weight's fleet-wide price, which is the
	// same on every full replica and so says nothing of where new data
	// costs least. On an oversubscribed cache sessions compete for it: a
	// lost context placed on a replica whose evicted blocks come back
	// displaces one that would have been hit; placed where they do not, it
	// displaces contexts that were not going to survive their think time
	// anyway (cache partitioning by marginal utility). A session's first
	// request and sessionless prompts are not priced so: what they bring
	// may become a prefix other requests share, and placing it by this
	// price sent it to the replicas that turn over fastest (docs/ROUTING.md,
	// "Marginal reuse").
	MarginWindow float64
}

// minMarginWindow is the smallest margin_window other than 0 (off).
const minMarginWindow = 0.05

// maxIndexBlocks bounds the blocks of one prompt the index matches and
// records: 8,192 blocks are 131,072 tokens, vLLM's longest common context.
const maxIndexBlocks = 8192

// MaxIndexBlocks is maxIndexBlocks for other packages (shared state
// publishes no more of a prompt than the index would record).
const MaxIndexBlocks = maxIndexBlocks

// DefaultMaxNumSeqs is the batch size in requests assumed for a replica
// whose limit is neither configured nor learned yet: vLLM's default on
// GPUs under 70 GiB (1024 on larger ones).
const DefaultMaxNumSeqs = 256

// slots is candidate c's batch size in requests: configured, else learned,
// else DefaultMaxNumSeqs.
func (p *Cost) slots(c *Candidate) float64 {
	switch {
	case p.cfg.MaxNumSeqs > 0:
		return float64(p.cfg.MaxNumSeqs)
	case c.MaxRunning >= 1:
		return c.MaxRunning
	}
	return DefaultMaxNumSeqs
}

// DefaultKVCacheTokens is the KV capacity assumed for a replica that exports
// no vllm:cache_config_info and has none configured.
const DefaultKVCacheTokens = 262_144

// DefaultCostConfig returns policy cost's defaults.
func DefaultCostConfig() CostConfig {
	return CostConfig{
		PrefillRate:      10_000,
		DecodeStep:       30 * time.Millisecond,
		BoundedLoad:      2,
		BoundedLoadSlack: 8,
		TieSteps:         1,
		BatchTokens:      2048,
		Sessions:         65_536,
		EvictionWeight:   300,
		BurstSpread:      1,
		HotPrefixes:      65_536,
		MarginWindow:     0.75,
	}
}

// Validate reports every invalid setting, naming its key.
func (c CostConfig) Validate() error {
	var bad []string
	if !(c.PrefillRate > 0) || math.IsInf(c.PrefillRate, 0) {
		bad = append(bad, fmt.Sprintf("cost.prefill_rate: must be > 0, got %v", c.PrefillRate))
	}
	if c.DecodeStep <= 0 {
		bad = append(bad, fmt.Sprintf("cost.decode_step: must be > 0, got %v", c.DecodeStep))
	}
	if c.KVCacheTokens < 0 {
		bad = append(bad, fmt.Sprintf("cost.kv_cache_tokens: must be >= 0, got %d", c.KVCacheTokens))
	}
	if !(c.BoundedLoad >= 1) || math.IsInf(c.BoundedLoad, 0) {
		bad = append(bad, fmt.Sprintf("cost.bounded_load: must be >= 1, got %v", c.BoundedLoad))
	}
	if c.BoundedLoadSlack < 0 {
		bad = append(bad, fmt.Sprintf("cost.bounded_load_slack: must be >= 0, got %d", c.BoundedLoadSlack))
	}
	if !(c.TieSteps >= 0) || math.IsInf(c.TieSteps, 0) {
		bad = append(bad, fmt.Sprintf("cost.tie_steps: must be >= 0, got %v", c.TieSteps))
	}
	if c.BatchTokens < 1 {
		bad = append(bad, fmt.Sprintf("cost.batch_tokens: must be >= 1, got %d", c.BatchTokens))
	}
	if c.MaxNumSeqs < 0 {
		bad = append(bad, fmt.Sprintf("cost.max_num_seqs: must be >= 0 (0 learns each replica's), got %d", c.MaxNumSeqs))
	}
	if !(c.EvictionWeight >= 0) || math.IsInf(c.EvictionWeight, 0) {
		bad = append(bad, fmt.Sprintf("cost.eviction_weight: must be >= 0, got %v", c.EvictionWeight))
	}
	if c.Sessions < 0 {
		bad = append(bad, fmt.Sprintf("cost.sessions: must be >= 0, got %d", c.Sessions))
	}
	if !(c.BurstSpread >= 0) || math.IsInf(c.BurstSpread, 0) {
		bad = append(bad, fmt.Sprintf("cost.burst_spread: must be >= 0, got %v", c.BurstSpread))
	}
	if c.HotPrefixes < 0 {
		bad = append(bad, fmt.Sprintf("cost.hot_prefixes: must be >= 0, got %d", c.HotPrefixes))
	}
	// Below minMarginWindow the margin holds a few blocks: its count is
	// noise, and dividing by the margin would make that noise the price.
	if !(c.MarginWindow == 0 || c.MarginWindow >= minMarginWindow && c.MarginWindow <= 16) {
		bad = append(bad, fmt.Sprintf("cost.margin_window: must be 0 (off) or between %v and 16, got %v", minMarginWindow, c.MarginWindow))
	}
	if c.RotationStart < 0 {
		bad = append(bad, fmt.Sprintf("cost.rotation_start: must be >= 0, got %d", c.RotationStart))
	}
	if len(bad) > 0 {
		return errors.New(strings.Join(bad, "; "))
	}
	return nil
}

// Cost routes each request to the replica where its first token is expected
// soonest, in seconds:
//
//	work     = work ahead + prompt tokens not in that replica's cache
//	estimate = decode step x (1 + floor(work / batch_tokens)) + work / prefill rate
//
// where the cache is the replica's share of a block index (package kvindex)
// sized to its real KV capacity, the work ahead is the prefill the replica
// still owes the balancer's earlier requests (Candidate.PendingPrefill) plus
// its scraped queue beyond them, and the rates are the replica's own,
// measured. Among the replicas within the bounded-load limit (which binds
// a replica that holds part of the prompt or whose batch is full, see
// overBound) it takes the smallest estimate; ties go to the fewest in-flight
// requests, then in rotation. docs/ROUTING.md explains the model and its
// limits.
type Cost struct {
	Base
	fleet Fleet

	cfg   CostConfig
	index *kvindex.Index
	ids   map[string]int32 // replica name -> index id
	names []string
	// holderDepth is Holder's scratch, one entry per replica id.
	holderDepth []int32

	sessions map[string]costSession
	hot      map[uint64]costHot // deepest held block of a prompt -> how often it comes

	explain bool
	rr      uint64
	precise PreciseIndex // replicas' own KV events; nil: none (cost_precise.go)
	// fresh is the prompt tokens of the current request that no candidate
	// holds, if it is of a session seen before: the replicas' marginal
	// reuse prices what computing them evicts (CostConfig.MarginWindow).
	fresh float64

	// Scratch reused by Choose (it runs under the balancer's lock).
	depth      []int32
	candID     []int32
	lastNames  []string  // candidate names of the last call, index-aligned with candID
	estimates  []float64 // scores: expected TTFT plus the delay the prefill causes others
	ttfts      []float64 // expected TTFT
	prefills   []float64
	delayed    []float64      // requests each candidate's prefill is priced to hold up
	evictions  []float64      // the part of each score that prices the blocks its prefill evicts
	aheads     []float64      // each candidate's work ahead, prefill tokens
	copyShares []float64      // requests a candidate's copy of a hot prefix is priced to serve (0: none)
	shapes     []PrefillShape // each candidate's TTFT in the parts its prefill model weighs
	prefill    prefillFit     // the replicas' prefill model (cost_prefill.go)
	report     reportFit      // the reported estimate's correction (cost_report.go)
	inflight   inflightFit    // prefixes pending a first token, the share recomputed (cost_inflight.go)
	unsched    []float64      // each candidate's unscheduled hit, tokens
	burst      int            // the decision's place in its session's burst (burstBucket)
	arrivals   []costArrivals // by replica id
	meanPrompt float64        // running mean of routed prefill tokens: prices a foreign queue
	share      trafficShare   // this balancer's share of the computed blocks (cost_share.go)
	// shared is the running share of routed prompts' tokens expected
	// cached where they went (about the last 256 decisions): below
	// minShared the fleet shares no prefixes (estimate, "by queue"),
	// once sharedSeen, the decisions it has seen, makes a window: at
	// start nothing is cached yet, shared or not.
	shared     float64
	sharedSeen int
}

// NewCost returns a cost policy, or an error for a bad config.
func NewCost(cfg CostConfig) (*Cost, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Cost{cfg: cfg, index: kvindex.New(), ids: make(map[string]int32), sessions: make(map[string]costSession), hot: make(map[uint64]costHot)}
	p.index.SetMargin(cfg.MarginWindow)
	return p, nil
}

// Name returns "cost".
func (p *Cost) Name() string { return NameCost }

// SetSettings replaces cost's parameters, keeping its index and sessions
// (a configuration reload).
func (p *Cost) SetSettings(s Settings) error {
	if err := s.Cost.Validate(); err != nil {
		return err
	}
	p.cfg = s.Cost
	p.index.SetMargin(p.cfg.MarginWindow)
	p.setFleetMargin()
	return nil
}

// SetExplain turns per-candidate detail in Choice.Detail on or off.
func (p *Cost) SetExplain(on bool) { p.explain = on }

// costDecision is one Choose call's request and what its passes found,
// handed from each pass to the next.
type costDecision struct {
	blocks []uint64 // the prompt's blocks, at most maxIndexBlocks
	tokens int      // the prompt's tokens
	// tokenBlocks: blocks were hashed over the model's token ids
	// (request.Profile.TokenBlocks).
	tokenBlocks bool
	session     string
	nowNS       int64

	sess       costSession // the session's state before this request
	hasSession bool        // sess is that of a session seen before
	inBurst    bool        // the request is a later one of sess's burst

	// The candidates' deepest match of the prompt, how many hold it, the
	// mean gap in seconds between the requests that matched it (-1: not
	// known, or not to be priced) and how many have (hotPrefix).
	hotDepth, hotHolders int
	hotGap, hotSeen      float64

	limit int // the bounded-load limit, in flight counting this request
	// byQueue: no candidate holds any of the prompt and the fleet shares
	// no prefixes: the delay the prefill causes others is priced from the
	// replica's queue time, not from its request count (estimate).
	byQueue bool
	start   int // where this decision's rotation over the candidates starts

	spreadFrom int     // the burst's replica the request left (-1: none)
	burstAdded float64 // what the burst's earlier requests added there, seconds
}

// Choose estimates every candidate's time to first token and takes the
// smallest within the load bound; the chosen replica's index learns the
// prompt.
func (p *Cost) Choose(r *Request, cands []Candidate, now time.Time) Choice {
	// 1. The request: its prompt's blocks and tokens, its session.
	var d costDecision
	p.request(&d, r, now)
	// 2. What each candidate holds of the prompt and has pending.
	p.candidates(&d, cands)
	// 3. The bounded-load limit on each candidate's in-flight requests.
	d.limit = p.bound(cands)
	// 4. Every candidate's expected TTFT and score; the fastest in bound.
	fastest := p.estimateAll(&d, cands)
	// 5. Among scores too close to tell apart, the preferred candidate.
	best := p.tieBreak(&d, cands, fastest)
	// 6. A later request of a burst may leave the burst's replica.
	best = p.spread(&d, cands, best)
	// 7. The index, the session and the mean prompt learn the choice.
	recorded := p.learn(&d, best)
	// 8. The answer, with every candidate's estimate when explaining.
	return p.answer(&d, cands, best, recorded)
}

// request reads what the decision depends on from r, matching at most
// maxIndexBlocks of its prompt: the index work runs under the balancer's
// lock, so one hostile prompt must not hold routing up for long (no
// served context is longer).
func (p *Cost) request(d *costDecision, r *Request, now time.Time) {
	d.nowNS, d.hotGap, d.spreadFrom = now.UnixNano(), -1, -1
	if r != nil {
		d.blocks, d.tokens, d.session, d.tokenBlocks = r.PromptBlocks, max(r.PromptTokens, 0), r.SessionKey, r.TokenBlocks
	}
	d.blocks = d.blocks[:min(len(d.blocks), maxIndexBlocks)]
	d.sess, d.hasSession = p.sessions[d.session]
	if d.session == "" {
		d.hasSession = false
	}
	d.inBurst = d.hasSession && d.nowNS < d.sess.firstTokenBy
}

// answer is the Choice for candidate best: affinity if it is expected to
// find part of the prompt in its cache, and Detail when explaining.
func (p *Cost) answer(d *costDecision, cands []Candidate, best int, recorded uint64) Choice {
	prefill := int(p.prefills[best])
	cached := d.tokens - prefill
	choice := Choice{Index: best, Reason: ReasonLoad, PrefillTokens: prefill, CachedTokens: cached, Estimate: p.reported(best),
		Recorded: recorded, Shape: p.shapes[best]}
	if cached > 0 {
		choice.Reason = ReasonAffinity
	}
	p.costRule(&choice, d, cands, best)
	if p.explain {
		choice.Detail = p.explainChoice(d, cands)
	}
	return choice
}
