package policy

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/llmlb/llmlb/internal/kvindex"
	"github.com/llmlb/llmlb/internal/tokenize"
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
	// bound (overBound). The
	// slack binds at light load, where the estimates already price the
	// queue: at 4 it sent a prefix's later requests elsewhere while its
	// replica was the fastest, and cost hit rate on held-out traces
	// (BENCHMARKS.md, issue 9); a bounded_load of 3 let sustained overload
	// pile onto the prefixes' replicas (Mooncake 4 replicas 2x: p50 9.4 to
	// 12.5 s).
	BoundedLoad      float64
	BoundedLoadSlack int
	// BatchTokens is the replicas' per-step token budget, vLLM's
	// max_num_batched_tokens (cost.batch_tokens, 2048: vLLM's default on
	// GPUs under 70 GiB; 8192 on larger ones). It counts the steps a prefill
	// takes.
	BatchTokens int
	// MaxNumSeqs is the replicas' batch size in requests, vLLM's
	// max_num_seqs (cost.max_num_seqs, 256: vLLM's default under 70 GiB;
	// 1024 on larger GPUs). Beyond it a request waits for a slot.
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
	// BENCHMARKS.md, issue 9). By default a copy onto a full cache must win
	// 300 x reuse times its prefill's time: 15-50 times at the reuse
	// measured on the Mooncake traces. (100 met issue 9's rule on fewer
	// held-out trace runs; 1,000 on fewer again.)
	EvictionWeight float64
	// RotationStart shifts where the rotation among equal candidates starts
	// (cost.rotation_start, 0). It changes nothing but the order in which
	// equal estimates are met: a benchmark run with 1, 2 or 3 shows how much
	// its result depends on that order (BENCHMARKS.md: on issue 9's trace
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
	// find their context on two replicas and share steps on neither (issue
	// 9: on agentic a session's bursts otherwise all queue on its one
	// replica, and round-robin, whose rotation copies every session
	// everywhere, had the better median; BENCHMARKS.md, "Fourth session of
	// 2026-12-02"). At 1 a copy is worth the burst's wait once more, the
	// next burst's. On a full cache the copy's eviction price is shared by
	// the requests the burst is expected still to send, which follow the
	// copy (spreadBurst).
	BurstSpread float64
	// HotPrefixes bounds the table of prefixes whose request rate the
	// policy follows to price a copy of a shared prefix onto a replica that
	// lacks it (cost.hot_prefixes, 65536; 0 follows none and never prices a
	// copy below its prefill, the policy of the first eight sessions of
	// issue 9). A copy is computed once and serves the prefix's later
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

// maxUtilization caps rho in the delay that added prefill causes others.
const maxUtilization = 0.99

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
		MaxNumSeqs:       256,
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
	if c.MaxNumSeqs < 1 {
		bad = append(bad, fmt.Sprintf("cost.max_num_seqs: must be >= 1, got %d", c.MaxNumSeqs))
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

	sessions map[string]costSession
	hot      map[uint64]costHot // deepest held block of a prompt -> how often it comes

	explain bool
	rr      uint64
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
	arrivals   []costArrivals // by replica id
	meanPrompt float64        // running mean of routed prefill tokens: prices a foreign queue
}

// costSession remembers where a session's last request went, for requests
// whose prompt has no blocks, and the session's current burst.
type costSession struct {
	rep    int32
	tokens int
	// firstTokenBy is when the session's requests so far are expected to
	// have their first tokens (Unix nanoseconds): a request before it is
	// part of a burst, whose first request went to burstRep; burstTokens is
	// the prefill the burst's requests sent there make it compute.
	firstTokenBy int64
	burstRep     int32
	burstTokens  float64
	// burstCount is the requests of the current burst so far, prevBurst
	// those of the session's burst before (1 for a lone request).
	burstCount, prevBurst int32
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
	return nil
}

// SetExplain turns per-candidate detail in Choice.Detail on or off.
func (p *Cost) SetExplain(on bool) { p.explain = on }

// RemoveReplica forgets the replica's cached blocks.
func (p *Cost) RemoveReplica(name string) {
	if id, ok := p.ids[name]; ok {
		p.index.RemoveReplica(id)
	}
}

// Record notes that the named replica holds the blocks (a prompt sent there
// by another route: a warm start, a peer balancer), as if it had chosen it.
// capacityTokens sizes the replica's share of the index when it is new.
func (p *Cost) Record(name string, blocks []uint64, capacityTokens int) {
	id := p.id(name)
	if p.index.Capacity(id) == 0 {
		if p.cfg.KVCacheTokens > 0 {
			capacityTokens = p.cfg.KVCacheTokens
		}
		if capacityTokens <= 0 {
			capacityTokens = DefaultKVCacheTokens
		}
		p.index.SetCapacity(id, capacityTokens/tokenize.BlockSize)
	}
	p.index.Touch(id, blocks[:min(len(blocks), maxIndexBlocks)])
}

// ForgetCache forgets what a replica holds (it restarted: its counters went
// back), keeping its identity.
func (p *Cost) ForgetCache(name string) { p.RemoveReplica(name) }

func (p *Cost) id(name string) int32 {
	id, ok := p.ids[name]
	if !ok {
		id = int32(len(p.names))
		p.ids[name] = id
		p.names = append(p.names, name)
	}
	return id
}

// Choose estimates every candidate's time to first token and takes the
// smallest within the load bound; the chosen replica's index learns the
// prompt.
func (p *Cost) Choose(r *Request, cands []Candidate, now time.Time) Choice {
	var blocks []uint64
	tokens := 0
	session := ""
	if r != nil {
		blocks, tokens, session = r.PromptBlocks, max(r.PromptTokens, 0), r.SessionKey
	}
	// The index work runs under the balancer's lock: a prompt is matched and
	// recorded up to maxIndexBlocks (beyond any served context), so one
	// hostile prompt cannot hold routing up for long.
	blocks = blocks[:min(len(blocks), maxIndexBlocks)]
	p.mapCandidates(cands)
	n := len(cands)
	clear(p.depth)
	nowNS := now.UnixNano()
	hotDepth, hotHolders, hotGap, hotSeen := 0, 0, -1.0, 0.0
	if len(blocks) > 0 {
		p.index.Match(blocks, p.depth)
		hotDepth, hotHolders, hotGap, hotSeen = p.hotPrefix(blocks, nowNS)
	}
	sess, hasSession := p.sessions[session]
	if session == "" {
		hasSession = false
	}
	// A session seen before whose prompt no candidate holds all of: the
	// part none holds is its own context, lost everywhere (or its new
	// message), read again by its later turns only.
	p.fresh = 0
	if hasSession && len(blocks) > 0 {
		held := int32(0)
		for _, id := range p.candID {
			held = max(held, p.depth[id])
		}
		p.fresh = float64(max(0, tokens-int(held)*tokenize.BlockSize))
	}
	inBurst := hasSession && nowNS < sess.firstTokenBy
	if inBurst {
		hotGap = -1 // a burst's copies are spreadBurst's
	}

	// Bounded load: no replica beyond max(ceil(c x mean), min + slack) in
	// flight, counting this request, if it holds part of the prompt or its
	// batch is full (overBound).
	total, minIn := 0, math.MaxInt
	for i := range cands {
		total += cands[i].InFlight
		minIn = min(minIn, cands[i].InFlight)
	}
	limit := max(int(math.Ceil(p.cfg.BoundedLoad*float64(total+1)/float64(n))), minIn+p.cfg.BoundedLoadSlack, 1)

	reuse := p.index.Reuse()
	fastest := -1
	start := int((p.rr + uint64(p.cfg.RotationStart)) % uint64(n))
	p.rr++
	for j := range n {
		i := start + j
		if i >= n {
			i -= n
		}
		c := &cands[i]
		id := p.candID[i]
		cached := 0
		if len(blocks) > 0 {
			cached = int(p.depth[id]) * tokenize.BlockSize
		} else if hasSession && sess.rep == id {
			cached = sess.tokens
		}
		cached = max(0, min(cached, tokens-1)) // a full hit still computes its last token
		prefill := float64(tokens - cached)
		ahead := c.PendingPrefill + max(0, c.ScrapedWaiting-float64(c.PendingRequests))*p.meanPrompt
		p.aheads[i] = ahead
		arr := &p.arrivals[id]
		var est float64
		p.ttfts[i], est, p.delayed[i], p.evictions[i] = p.estimate(c, id, ahead, prefill, reuse, arr.meanGap, n)
		arr.note(nowNS)
		p.copyShares[i] = 0
		// A copy of a prefix other requests share is computed once and
		// then serves the later ones: its price counts for the share of
		// them expected to find it here: the requests of the prefix in
		// flight at once (its measured gap against a request's decode
		// time, at most as many as have come), per replica that would
		// hold it.
		if copied := float64(hotDepth-int(p.depth[id])) * tokenize.BlockSize; copied > 0 && hotGap >= 0 {
			overlap := math.Inf(1)
			if hotGap > 0 {
				overlap = c.MeanOutput * c.DecodeStep / hotGap
			}
			overlap = min(overlap, hotSeen) / float64(hotHolders+1)
			if overlap > 1 {
				copied = min(copied, prefill)
				_, lean, _, _ := p.estimate(c, id, ahead, prefill-copied, reuse, arr.meanGap, n)
				est = lean + (est-lean)/overlap
				p.copyShares[i] = overlap
			}
		}
		p.estimates[i], p.prefills[i] = est, prefill
		if p.overBound(c, limit, prefill, tokens) {
			continue
		}
		if fastest < 0 || est < p.estimates[fastest] {
			fastest = i
		}
	}
	// Estimates within one decode step of the fastest are equal: a step
	// computes a whole token budget, so such differences are below the
	// model's resolution. Among those (preferred): the fewest in flight, the
	// most cached prompt, the coldest cache, then rotation.
	best := fastest
	if fastest >= 0 {
		margin := p.estimates[fastest] + p.cfg.TieSteps*cands[fastest].DecodeStep
		for j := range n {
			i := start + j
			if i >= n {
				i -= n
			}
			c := &cands[i]
			if p.overBound(c, limit, p.prefills[i], tokens) || p.estimates[i] > margin {
				continue
			}
			if p.preferred(i, best, cands) {
				best = i
			}
		}
	} else { // unreachable: the least-loaded candidate is within the limit
		best = start
	}
	spreadFrom, burstAdded := -1, 0.0
	if inBurst && p.cfg.BurstSpread > 0 && best >= 0 && p.candID[best] == sess.burstRep {
		// The burst's later requests follow a copy to its replica: expect
		// as many as the session's previous burst had, less those routed.
		sharing := max(1, int(sess.prevBurst)-int(sess.burstCount))
		var alt int
		if alt, burstAdded = p.spreadBurst(best, cands, limit, tokens, sess.burstTokens, sharing); alt != best {
			spreadFrom, best = best, alt
		}
	}
	prefill := int(p.prefills[best])
	cached := tokens - prefill
	var recorded uint64
	if len(blocks) > 0 {
		id := p.candID[best]
		recorded = recordedToken(p.index.Touch(id, blocks), int(p.depth[id]))
	}
	if session != "" && p.cfg.Sessions > 0 {
		if _, ok := p.sessions[session]; !ok && len(p.sessions) >= p.cfg.Sessions {
			for k := range p.sessions { // evict an arbitrary session
				delete(p.sessions, k)
				break
			}
		}
		next := costSession{rep: p.candID[best], tokens: tokens, burstRep: p.candID[best], burstTokens: p.prefills[best],
			firstTokenBy: nowNS + burstWindow(p.ttfts[best])}
		next.burstCount, next.prevBurst = 1, sess.burstCount
		if inBurst {
			next.firstTokenBy = max(next.firstTokenBy, sess.firstTokenBy)
			next.burstRep, next.burstTokens = sess.burstRep, sess.burstTokens
			if next.burstRep == p.candID[best] {
				next.burstTokens += p.prefills[best]
			}
			next.burstCount, next.prevBurst = min(sess.burstCount+1, math.MaxInt32), sess.prevBurst
		}
		p.sessions[session] = next
	}
	if p.meanPrompt == 0 {
		p.meanPrompt = float64(prefill)
	} else {
		p.meanPrompt += (float64(prefill) - p.meanPrompt) / 64
	}

	choice := Choice{Index: best, Reason: ReasonLoad, PrefillTokens: prefill, CachedTokens: cached, Estimate: p.ttfts[best],
		Recorded: recorded}
	if cached > 0 {
		choice.Reason = ReasonAffinity
	}
	if p.explain {
		choice.Detail = p.detail(cands, limit, tokens)
		if spreadFrom >= 0 {
			choice.Detail += fmt.Sprintf("; burst_spread: from %s, where the burst added %.3fs", cands[spreadFrom].Name, burstAdded)
		}
	}
	return choice
}

// estimate is candidate c's expected TTFT for a prefill of prefill tokens
// behind ahead, and its score: the TTFT plus the delay the prefill causes
// the requests it holds up (delayed of them) plus the price of the blocks
// it evicts (eviction).
func (p *Cost) estimate(c *Candidate, id int32, ahead, prefill, reuse, meanGap float64, n int) (ttft, score, delayed, eviction float64) {
	// The work ahead and this prompt are computed in steps of at most
	// batch_tokens, each paying about a decode step on top of its tokens.
	work := ahead + prefill
	est := c.DecodeStep*(1+math.Floor(work/float64(p.cfg.BatchTokens))) + work/c.PrefillRate
	// A full batch admits this request only as running ones finish:
	// one frees a slot every mean-output x step / max_num_seqs. (The
	// running count at a scrape that showed a queue, as the batch's
	// real size, was measured worse: a stale yes/no per replica that
	// herded requests onto those without one, docs/ROUTING.md.)
	slots := float64(p.cfg.MaxNumSeqs)
	if excess := max(float64(c.InFlight), c.ScrapedRunning+c.ScrapedWaiting) + 1 - slots; excess > 0 {
		est += excess * c.MeanOutput * c.DecodeStep / slots
	}
	// A full KV cache admits this prompt only as running requests end
	// and free theirs: the KV the balancer's requests there hold (their
	// computed prompts, half their mean output so far) turns over in
	// about one request's decode, mean-output x step. Without it a
	// replica that has just taken long contexts looked as fast as any,
	// and short prompts sent after them waited 12-15 s (issue 9: the
	// overloaded conversation trace runs; measured effect in
	// BENCHMARKS.md, "First session of 2026-12-02"). Only this
	// balancer's prompts are known: peers' requests count for their
	// output, direct clients' not at all.
	held := c.HeldPrefill + float64(c.InFlight)*c.MeanOutput/2
	if excess := held + prefill - float64(p.index.Capacity(id)*tokenize.BlockSize); excess > 0 && held > 0 {
		est += min(excess, prefill) / held * c.MeanOutput * c.DecodeStep
	}
	ttft = est
	// The prefill a choice adds also delays others on that replica, by
	// its time x the number of requests it holds up. Two groups:
	//  - those sharing the replica's batch and queue: rho/(1-rho), rho
	//    its batch over its slots, the waiting-time cost of added work
	//    in a queue; nothing when idle, the cache's worth under load;
	//  - those reaching the replica while it works off its queue and
	//    this prefill: that time over the replica's share of the
	//    measured gap between requests, counted at most once (a later
	//    request can mostly go elsewhere).
	// The second keeps a prompt with its prefix in proportion to how
	// fast requests come, where the first sees only the batch (issue
	// 9, BENCHMARKS.md: the bar's rule met on 42 of 68 held-out trace
	// runs, 36 without it). (KV usage as rho was measured worse: long
	// contexts fill the KV of replicas whose queues are short. The
	// fleet's prefill utilization as a floor was measured too: by
	// pricing every replica's prefill alike, it put short prompts
	// behind long prefills on longshort. The arrivals instead of rho
	// lost the overloaded agentic run's cache; as a floor under rho
	// they met the rule less often; without the cap of one a
	// prefill's price grows with the square of its time, and long
	// prompts waited behind their prefix's queue.)
	rho := min(maxUtilization, max(float64(c.InFlight), c.ScrapedRunning)/slots)
	own := prefill / c.PrefillRate
	delayed = rho / (1 - rho)
	if meanGap > 0 {
		delayed += min(1, (ahead/c.PrefillRate+own)/(meanGap*float64(n)))
	}
	est += own * delayed
	// On a full cache every computed block evicts one; evicted blocks
	// come back with the index's measured reuse rate, and then cost
	// their prefill again, by eviction_weight (CostConfig).
	// The replica's own marginal reuse adds what its evictions are
	// expected to cost in recompute there (margin_window, CostConfig).
	if reuse > 0 && p.index.Idle(id) >= 0 {
		eviction = p.cfg.EvictionWeight * reuse * prefill / c.PrefillRate
		if m, ok := p.index.MarginalReuse(id); ok && p.cfg.MarginWindow > 0 && p.fresh > 0 {
			eviction += m / p.cfg.MarginWindow * min(prefill, p.fresh) / c.PrefillRate
		}
		est += eviction
	}
	return ttft, est, delayed, eviction
}

// costHot is how often requests come that match a prefix as their deepest
// held block: a running mean of the gaps between them.
type costHot struct {
	last    int64 // Unix nanoseconds
	meanGap float64
	seen    uint32
}

// hotPrefix returns the depth of the candidates' deepest match of the prompt
// (its mapped blocks in p.depth), how many of them hold it, and the mean gap
// in seconds between the requests that matched it before (0 until two
// have).
func (p *Cost) hotPrefix(blocks []uint64, nowNS int64) (depth, holders int, gap float64, seen float64) {
	for _, id := range p.candID {
		switch d := int(p.depth[id]); {
		case d > depth:
			depth, holders = d, 1
		case d == depth && d > 0:
			holders++
		}
	}
	if depth == 0 || p.cfg.HotPrefixes == 0 {
		return 0, 0, -1, 0
	}
	key := blocks[depth-1]
	h, ok := p.hot[key]
	if !ok && len(p.hot) >= p.cfg.HotPrefixes {
		for k := range p.hot { // forget an arbitrary prefix
			delete(p.hot, k)
			break
		}
	}
	if ok && nowNS >= h.last {
		g := float64(nowNS-h.last) / 1e9
		if h.seen == 1 {
			h.meanGap = g
		} else {
			h.meanGap += (g - h.meanGap) / 16
		}
	}
	gap = h.meanGap
	if h.seen < 2 {
		gap = -1
	}
	seen = float64(h.seen)
	h.last, h.seen = nowNS, min(h.seen+1, 1<<30)
	p.hot[key] = h
	return depth, holders, gap, seen
}

// maxBurstWindow bounds how long after a request the session's next ones
// count as its burst, whatever its estimate (an estimate of hours is a
// replica in trouble, not a prefill).
const maxBurstWindow = 10 * time.Minute

// burstWindow is a TTFT estimate in seconds as nanoseconds, within
// [0, maxBurstWindow].
func burstWindow(ttft float64) int64 {
	if !(ttft > 0) {
		return 0
	}
	return int64(min(ttft, maxBurstWindow.Seconds()) * float64(time.Second))
}

// spreadBurst returns the candidate a later request of a burst takes
// instead of best, the burst's replica: the best other one within the
// bound, if its score there is at most burst_spread x what the burst's
// earlier requests add to the request's TTFT on best; best otherwise
// (CostConfig.BurstSpread says why). What they add is their prefill still
// ahead of it there (burstTokens, at most the replica's work ahead: what
// it has computed since is gone), in tokens and steps, so neither time
// nor other sessions' queue counts. The price of the blocks the copy
// evicts counts once for the sharing requests of the burst expected to
// follow the copy there: on a full cache it would otherwise keep a whole
// burst behind a replica's 100K-token prefill to spare one copy
// (BENCHMARKS.md, "Fourth session of 2026-12-02": mixed's P99). It also
// returns what the burst added, in seconds.
func (p *Cost) spreadBurst(best int, cands []Candidate, limit, tokens int, burstTokens float64, sharing int) (int, float64) {
	c := &cands[best]
	ahead := p.aheads[best]
	behind := min(burstTokens, ahead)
	if !(behind > 0) {
		return best, 0
	}
	work, batch := ahead+p.prefills[best], float64(p.cfg.BatchTokens)
	added := c.DecodeStep*(math.Floor(work/batch)-math.Floor((work-behind)/batch)) + behind/c.PrefillRate
	alt := -1
	for i := range cands {
		if i == best || p.overBound(&cands[i], limit, p.prefills[i], tokens) {
			continue
		}
		if alt < 0 || p.estimates[i] < p.estimates[alt] {
			alt = i
		}
	}
	if alt < 0 {
		return best, added
	}
	score := p.estimates[alt] - p.evictions[alt]*(1-1/float64(sharing))
	if score <= p.estimates[best]+p.cfg.BurstSpread*added {
		return alt, added
	}
	return best, added
}

// overBound reports whether the bounded-load rule keeps candidate c out: it
// would go past the limit, and either holds part of the prompt (the bound
// stops cache affinity from piling requests onto the replicas that hold a
// prefix everyone shares) or has no free batch slot. A replica that holds
// none of a sized prompt and can still admit it is ahead on its estimate
// alone (queue, batch, KV), which already prices its load: bounding it by
// request count sent short requests behind 100K-token prefills on
// longshort, where the one replica without a long prefill takes most short
// requests (BENCHMARKS.md, "Third session of 2026-12-02"). Twice the limit
// binds every replica: the bound is also the backstop against estimates
// that are wrong (a replica whose /metrics claim rates it does not have
// would otherwise take requests up to a full batch).
func (p *Cost) overBound(c *Candidate, limit int, prefill float64, tokens int) bool {
	if c.InFlight+1 <= limit {
		return false
	}
	holds := prefill < float64(tokens)
	return tokens <= 0 || holds || c.InFlight+1 > min(2*limit, p.cfg.MaxNumSeqs)
}

// costArrivals is one replica's running mean of the seconds between the
// decisions it was a candidate in: how fast requests that could go there
// come, whatever the other replicas serve (models on disjoint replicas do
// not count each other's requests; LoRA adapters on the same replicas do).
// It is updated for every candidate of every decision, so it keeps the
// time as Unix nanoseconds: time.Time arithmetic there cost a third of a
// decision at 1,000 replicas.
type costArrivals struct {
	meanGap float64
	last    int64 // Unix nanoseconds; valid when seen
	seen    bool
}

// note updates the mean gap over about the last 64 decisions (a clock that
// went back is skipped; while the mean is 0, as after requests that came
// together at start, the next gap replaces it).
func (a *costArrivals) note(now int64) {
	if a.seen {
		if gap := now - a.last; gap >= 0 {
			g := float64(gap) / 1e9
			if a.meanGap == 0 {
				a.meanGap = g
			} else {
				a.meanGap += (g - a.meanGap) / 64
			}
		}
	}
	a.last, a.seen = now, true
}

// Finished records a finished request's prompt blocks again on its replica:
// vLLM frees a request's blocks when it finishes (its prompt's tail first),
// so they join the replica's LRU order then; a long request's prompt is
// fresher in the replica's cache than its routing time says.
func (p *Cost) Finished(replica string, blocks []uint64, now time.Time) {
	p.publishBlocks(replica, blocks, now) // the peers' indexes learn the same order
	id, ok := p.ids[replica]
	if !ok || len(blocks) == 0 {
		return
	}
	p.index.Touch(id, blocks[:min(len(blocks), maxIndexBlocks)])
}

// recordedToken packs a Touch (its stamp and evictions) and the blocks the
// replica held before it into Choice.Recorded: the stamp in the top 32
// bits, bit 31 set, the evictions in bits 15-30 and the held blocks in bits
// 0-14 (both at most maxIndexBlocks).
func recordedToken(t kvindex.Touched, held int) uint64 {
	return uint64(t.Stamp)<<32 | 1<<31 | uint64(min(max(t.Evicted, 0), maxIndexBlocks))<<15 | uint64(min(held, maxIndexBlocks))
}

// recordedTouch unpacks recordedToken.
func recordedTouch(v uint64) (t kvindex.Touched, held int) {
	return kvindex.Touched{Stamp: uint32(v >> 32), Evicted: int(v >> 15 & (1<<16 - 1))}, int(v & (1<<15 - 1))
}

// Refused undoes Choose's record of a prompt the replica turned away
// before running it: the blocks it added there leave the index, unless a
// later prompt has used them since (kvindex.Forget). Without it a rejected
// prompt (too long for the replica's context, say) stayed in the index as
// if the replica had computed it, drew the prompt's next requests there
// for a cache hit that was not, and had evicted as much of what the replica
// does hold.
func (p *Cost) Refused(replica string, blocks []uint64, recorded uint64) {
	id, ok := p.ids[replica]
	if !ok || recorded&(1<<31) == 0 || len(blocks) == 0 {
		return
	}
	t, held := recordedTouch(recorded)
	p.index.Forget(id, blocks[:min(len(blocks), maxIndexBlocks)], held, t)
}

// Started pins the prompt's blocks on the replica while the request runs
// (from its first token to its end; vLLM holds a running request's blocks
// out of its free queue) and returns the token Ended releases them with.
func (p *Cost) Started(replica string, blocks []uint64) uint64 {
	id, ok := p.ids[replica]
	if !ok || len(blocks) == 0 {
		return 0
	}
	return uint64(p.index.Pin(id, blocks[:min(len(blocks), maxIndexBlocks)]))
}

// Ended releases what Started pinned.
func (p *Cost) Ended(token uint64) { p.index.Unpin(kvindex.Pin(token)) }

// preferred orders two candidates whose estimates count as equal: fewer in
// flight (a lighter batch steps faster for everyone in it; the cache is
// already priced in the score), then the most cached prompt, then a cache
// with room or whose coldest block is the coldest (new blocks evict the
// least valuable data).
func (p *Cost) preferred(i, best int, cands []Candidate) bool {
	if cands[i].InFlight != cands[best].InFlight {
		return cands[i].InFlight < cands[best].InFlight
	}
	if p.prefills[i] != p.prefills[best] {
		return p.prefills[i] < p.prefills[best]
	}
	if p.prefills[i] > 0 {
		ii, ib := p.index.Idle(p.candID[i]), p.index.Idle(p.candID[best])
		if (ii < 0) != (ib < 0) {
			return ii < 0
		}
		if ii != ib {
			return ii > ib
		}
	}
	return false
}

func (p *Cost) mapCandidates(cands []Candidate) {
	// The fleet rarely changes between two requests: reuse the last
	// mapping where the name at the same position is the same string.
	reuse := p.candID
	p.candID = p.candID[:0]
	same := len(p.lastNames) == len(cands)
	for i := range cands {
		c := &cands[i]
		var id int32
		if i < len(reuse) && i < len(p.lastNames) && p.lastNames[i] == c.Name {
			id = reuse[i]
		} else {
			id, same = p.id(c.Name), false
		}
		p.candID = append(p.candID, id)
		capTokens := c.KVCacheTokens
		if p.cfg.KVCacheTokens > 0 {
			capTokens = p.cfg.KVCacheTokens
		}
		if capTokens <= 0 {
			capTokens = DefaultKVCacheTokens
		}
		if blocks := capTokens / tokenize.BlockSize; p.index.Capacity(id) != blocks {
			p.index.SetCapacity(id, blocks)
		}
	}
	if !same {
		p.lastNames = p.lastNames[:0]
		for i := range cands {
			p.lastNames = append(p.lastNames, cands[i].Name)
		}
	}
	if len(p.depth) < len(p.names) {
		p.depth = make([]int32, len(p.names))
	}
	for len(p.arrivals) < len(p.names) {
		p.arrivals = append(p.arrivals, costArrivals{})
	}
	if cap(p.estimates) < len(cands) {
		p.estimates = make([]float64, len(cands))
		p.ttfts = make([]float64, len(cands))
		p.prefills = make([]float64, len(cands))
		p.delayed = make([]float64, len(cands))
		p.evictions = make([]float64, len(cands))
		p.aheads = make([]float64, len(cands))
		p.copyShares = make([]float64, len(cands))
	}
	p.estimates, p.ttfts, p.prefills = p.estimates[:len(cands)], p.ttfts[:len(cands)], p.prefills[:len(cands)]
	p.delayed, p.evictions, p.aheads = p.delayed[:len(cands)], p.evictions[:len(cands)], p.aheads[:len(cands)]
	p.copyShares = p.copyShares[:len(cands)]
}

// detail lists every candidate's estimate for the debug log and decision
// records.
func (p *Cost) detail(cands []Candidate, limit, tokens int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "limit=%d", limit)
	for i, c := range cands {
		fmt.Fprintf(&b, "; %s ttft=%.3fs score=%.3fs prefill=%.0f held_up=%.2f pending=%.0f kv_held=%.0f in_flight=%d rate=%.0f step=%.3fs",
			c.Name, p.ttfts[i], p.estimates[i], p.prefills[i], p.delayed[i], c.PendingPrefill, c.HeldPrefill, c.InFlight, c.PrefillRate, c.DecodeStep)
		if p.copyShares[i] > 0 {
			fmt.Fprintf(&b, " hot_copy_shared_by=%.1f", p.copyShares[i])
		}
		if p.evictions[i] > 0 {
			fmt.Fprintf(&b, " eviction=%.3fs", p.evictions[i])
			if m, ok := p.index.MarginalReuse(p.candID[i]); ok && p.cfg.MarginWindow > 0 && p.fresh > 0 {
				fmt.Fprintf(&b, " marginal_reuse=%.3f", m)
			}
		}
		if c.InFlight+1 > limit {
			if p.overBound(&cands[i], limit, p.prefills[i], tokens) {
				b.WriteString(" over_limit")
			} else {
				b.WriteString(" over_limit_exempt")
			}
		}
	}
	return b.String()
}
