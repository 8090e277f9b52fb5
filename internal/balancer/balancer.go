package balancer

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/llmlb/llmlb/internal/health"
	"github.com/llmlb/llmlb/internal/policy"
)

// Reservation is the result of Select: the chosen replica with its in-flight
// slot already reserved. Pass it to Release exactly once (a second Release is
// a harmless no-op).
type Reservation struct {
	Replica     string
	URL         string
	Reason      Reason
	Explanation Explanation

	rep        *replica
	weight     int64   // in micro-units of load (see weightOf)
	prefill    float64 // prompt tokens the replica is expected to compute (cost-aware policies)
	firstToken bool    // past its first token: no longer pending prefill (guarded by the lock)
	released   bool    // guarded by the balancer's lock
	// blocks are the prompt's blocks (the Profile's PromptBlocks, not
	// copied), for a policy that re-records them when the request finishes.
	blocks []uint64
	// policy is the policy that made the choice: only it hears how the
	// request fared (a reload may have replaced the balancer's since).
	policy policy.Policy
	// run is the policy's token for the blocks the request holds while it
	// runs (its Started hook), returned to Ended on Release.
	run uint64
	// recorded is the policy's token for undoing its record of the prompt
	// (its Refused hook) if the replica turns the request away.
	recorded uint64
	// at is when the choice was made: the start of the time to first
	// token its estimate is checked against (limits.go).
	at time.Time
	// shape is the policy's estimate in parts, for its prefill model to
	// learn from the first token (limits.go).
	shape policy.PrefillShape
	// cachedSeen: the replica's report of the prompt's cached tokens was
	// handed to the policy (Cached).
	cachedSeen bool
	// sent is its place in its replica's dispatch order among requests
	// with prefill (prefillPace).
	sent uint64
}

// Weight returns the reservation's load weight (docs/ROUTING.md "Effective load" units).
func (r *Reservation) Weight() float64 { return float64(r.weight) / microUnit }

// Explanation says why a replica was chosen; it is logged at debug level for
// every routing decision. It holds no slices so that Select need not allocate.
type Explanation struct {
	Policy           string
	Candidates       int     // replicas the policy weighed
	CandidateSet     string  // "no-wait" | "live" | "routable" | "fallback"
	MinRunning       float64 // min_r of step 3
	EffectiveRunning float64 // of the chosen replica, before this reservation
	EffectiveWaiting float64
	// Set by pin policies (llmlb, llmlb-warm): the pin consulted or made
	// and what was decided.
	PinKind     string // "session" | "prefix" | ""
	PinReplica  string
	PinDecision string // "used" | "spill: queue" | "spill: running > min_r+slack" | "rebind" | "new" | "dead" | ...

	// Set by policy cost: the chosen replica's expected time to first token
	// (seconds), the prompt tokens expected from its cache and to compute,
	// and, when explaining is on (SetExplain), every candidate's estimate.
	Estimate      float64
	CachedTokens  int
	PrefillTokens int
	Detail        string
	// The rule that decided, in the policy's own words (cost: "cache",
	// "load", "bounded load", "tie", "burst spread"), and, set by cost, the
	// runner-up with its expected TTFT (seconds) and the chosen replica's
	// pending prefill (prompt tokens ahead of this request).
	Rule             string
	RunnerUp         string
	RunnerUpEstimate float64
	PendingPrefill   float64

	// Queued is how long flow control held the request before this
	// decision (0: not held); the shell sets it on the reservation it got
	// from a late dispatch.
	Queued time.Duration

	// The decision itself: the chosen replica and the route reason (set by
	// the core with the reservation), so that Why reads from this alone.
	Replica string
	Reason  Reason
}

// ReplicaStatus is a copy of one replica's state for /admin/replicas and metrics.
type ReplicaStatus struct {
	Name             string   `json:"name"`
	URL              string   `json:"url"`
	Models           []string `json:"models"`
	State            string   `json:"state"`
	Draining         bool     `json:"draining"`
	EffectiveRunning float64  `json:"effective_running"`
	EffectiveWaiting float64  `json:"effective_waiting"`
	ScrapedRunning   float64  `json:"scraped_running"`
	ScrapedWaiting   float64  `json:"scraped_waiting"`
	// Running and Waiting are vLLM's own counts at the last scrape
	// (vllm:num_requests_running and vllm:num_requests_waiting) under
	// vLLM's names; Load is the token-weighted load the routing counts:
	// effective running plus waiting, in requests of
	// routing.load.token_unit tokens (a 100K-token request weighs 100).
	Running        float64 `json:"running"`
	Waiting        float64 `json:"waiting"`
	Load           float64 `json:"load"`
	KVCacheUsage   float64 `json:"kv_cache_usage"`
	InFlight       int     `json:"in_flight"`
	InFlightWeight float64 `json:"in_flight_weight"`
	// PeerInFlight is other llmlb instances' in-flight requests on the
	// replica (shared state), counted in the effective load; in_flight is
	// this instance's own.
	PeerInFlight    int       `json:"peer_in_flight"`
	CooldownSeconds float64   `json:"cooldown_seconds"`
	Ejections       int       `json:"ejections"`
	LastScrape      time.Time `json:"last_scrape"`
	LastScrapeOK    bool      `json:"last_scrape_ok"`
	Requests        uint64    `json:"requests"`

	// What policy cost prices the replica with (docs/ROUTING.md): its KV
	// capacity from vllm:cache_config_info (0: not exported), the prefill
	// throughput (the fleet's pooled one) and its decode step, learned from
	// /metrics or the configured priors, and the prefill still owed to
	// requests not past their first token.
	KVCacheTokens     float64 `json:"kv_cache_tokens"`
	PrefillRate       float64 `json:"prefill_tokens_per_second"`
	DecodeStepSeconds float64 `json:"decode_step_seconds"`
	PendingPrefill    float64 `json:"pending_prefill_tokens"`
	// How well policy cost's time-to-first-token estimates hold on the
	// replica, over its latest 256 streamed first tokens: the median of
	// |estimate - measured| / measured and of estimate / measured (1 is
	// right; below 1 the replica is slower than estimated), and how many
	// first tokens were ever checked. Measured from the decision to the
	// first token seen.
	TTFTPredictionError float64 `json:"ttft_prediction_error"`
	TTFTPredictionRatio float64 `json:"ttft_prediction_ratio"`
	TTFTPredictions     uint64  `json:"ttft_predictions"`

	// Flow control's view (SaturationConfig): the running-slot limit,
	// configured or learned (0: not known yet), the requests the replica
	// holds (running and waiting), and whether that makes it full.
	MaxRunning float64 `json:"max_running"`
	Occupancy  float64 `json:"occupancy"`
	Full       bool    `json:"full"`
	// FullBy is the signal that makes it full: memory (its queue waits for
	// KV memory, as scraped), prefill_backlog, kv_commit (llmlb's requests
	// commit its KV capacity) or slots; empty when not full. KVCommitted
	// is the KV llmlb's requests there hold or will hold, in tokens (this
	// instance's and, with shared state, its peers'), as kv_commit counts
	// it against KVCacheTokens.
	FullBy      string  `json:"full_by,omitempty"`
	KVCommitted float64 `json:"kv_committed_tokens"`
	// FullForLowerBy is, for a replica that is not full while flow
	// control has lately held back requests it does not favour, the signal
	// that makes it full for a request of a lower priority while a higher
	// one has requests outstanding (the reserves of slots and of KV it may
	// not take: SaturationConfig.ReserveShare, KVReserveShare); empty when
	// none does.
	FullForLowerBy string `json:"full_for_lower_by,omitempty"`
	// TentativeMaxRunning is the limit the requests flow control does not
	// favour are held at while none is learned and requests of several
	// priorities or tenants compete (0: none; docs/FLOW_CONTROL.md).
	TentativeMaxRunning float64 `json:"tentative_max_running,omitempty"`

	// LastDecision is why the latest request routed here was, in the words
	// of the policy that chose it (Explanation.Why); empty until one was.
	LastDecision   string    `json:"last_decision,omitempty"`
	LastDecisionAt time.Time `json:"last_decision_at,omitzero"`
}

// Alert is one alert (docs/ROUTING.md "Alerts").
type Alert struct {
	Name    string    `json:"name"` // imbalance | one_replica | probe_broken | flapping
	Replica string    `json:"replica,omitempty"`
	Message string    `json:"message"`
	Since   time.Time `json:"since"`
}

// Counters are the core's monotonic totals for metrics: health ejections
// and step 5's last-resort fallbacks. A policy's own (pin decisions) are
// read from the policy (policy.PinTable).
type Counters struct {
	Ejections, Fallbacks uint64
}

// microUnit is the fixed-point scale of in-flight weights: integer sums make
// a replica's load return to exactly 0 when its last request ends, so the
// no-wait test (effective_waiting == 0) is never spoiled by float residue.
const microUnit = 1e6

// maxWeight caps one request's weight so that absurd token estimates cannot
// overflow the fixed-point sums (1e9 units is 1e12 tokens at the default unit).
const maxWeight = 1e9

// replica is one replica's runtime state, guarded by the balancer's lock.
type replica struct {
	name, url string
	models    []string
	health    health.Machine // by value: one cache miss less per replica in step 1

	snap         Snapshot // last successful scrape
	kvDecl       float64  // declared KV capacity in tokens (0: reported; kvclaim.go)
	kvCut        bool     // the reported capacity is being cut down (logged once)
	lastScrape   time.Time
	lastScrapeOK bool

	last   Explanation // the latest decision that chose this replica
	lastAt time.Time   // when it was made (zero: never chosen)

	inFlight       int     // the balancer's own in-flight requests
	inFlightWeight int64   // their token weights, in micro-units (wlc_in_flight)
	heldPrefill    float64 // their computed prompt tokens (cost-aware policies): KV they hold or will
	// Peers' in-flight requests on this replica (shared state, shared.go):
	// part of the effective load, never of this instance's reservations.
	peerInFlight int
	peerWeight   int64
	peerHeld     float64   // their heldPrefill, as published
	sent         float64   // the send rate at sentAt (sendRate)
	sentAt       time.Time // the latest prompt sent
	// othersKV is the KV the last scrape showed in use on the replica
	// beyond what this balancer and its peers account for, when it also
	// showed requests that are not theirs (othersKV).
	othersKV float64
	requests uint64
	traffic  window // requests routed, for the alerts

	draining, removed bool

	// Policy cost's view (docs/ROUTING.md): own requests not past their
	// first token and the prompt tokens they still make the replica compute,
	// drained at the learned rate from prefillBusyUntil's fluid queue.
	pendingPrefill  float64
	pendingRequests int
	// othersWaiting is how many requests the last scrape showed waiting
	// beyond the balancer's own then without a first token: queued by
	// peers or direct clients. Fixed at the scrape, so that its own
	// requests' first tokens since do not turn into phantom ones.
	othersWaiting    float64
	prefillBusyUntil time.Time
	pace             prefillPace // how fast it has got through our prompts (rates.go)
	rates            learnedRates

	cap   capacity  // running-slot limit and occupancy (capacity.go)
	ttft  ttftTrack // estimates against measured first tokens (limits.go)
	slots slotSeen  // policy cost's quicker view of the slot limit (limits.go)
}

// effective returns the effective load (docs/ROUTING.md "Effective load": the WLC
// blind spot between two scrapes).
//
// Peers' in-flight requests (shared state) count in the running load but
// not in the inferred queue: they arrive up to state.load_interval late, so
// a request a peer has just finished would show as a phantom queue and
// break every pin on the replica (spill: queue) until the next refresh.
func (r *replica) effective() (running, waiting float64) {
	own := float64(r.inFlightWeight) / microUnit
	running = max(r.snap.Running, own+float64(r.peerWeight)/microUnit)
	waiting = r.snap.Waiting + max(0, own-r.snap.Running)
	return running, waiting
}

// fallbackOK reports whether the replica may be tried at all (step 5's
// "known"): routable, or EJECTED but answering its scrapes (in its cooldown,
// or ejected for failed requests). One whose latest scrape failed, or that
// was never seen healthy, is dead for the fallback.
func (r *replica) fallbackOK() bool {
	st := r.health.State()
	return st != health.Ejected || (r.lastScrapeOK && !r.health.Pending())
}

// serves reports whether the replica serves model. A replica whose models
// are not known yet serves every model, and model "" matches every replica.
func (r *replica) serves(model string) bool {
	return model == "" || len(r.models) == 0 || slices.Contains(r.models, model)
}

// Balancer is the routing core. It is safe for concurrent use: one mutex
// guards all state, and Select reserves under it (two requests must never both see a replica idle).
type Balancer struct {
	mu       sync.Mutex
	cfg      Config
	replicas []*replica // in the order they were added
	byName   map[string]*replica
	// modelUnion is the union of the replicas' models, sorted (Models);
	// nil when a replica or its models changed since it was built.
	modelUnion []string
	// fleetLimit is the largest running-slot limit of any replica
	// (capacity.go, provisionalLimit).
	fleetLimit float64
	// contestedAt is when flow control last asked about a request it does
	// not favour (SaturatedFor): requests of several priorities or
	// tenants compete, and a replica whose limit is not known yet gets a
	// tentative one for those requests (capacity.go, tentativeLimit).
	contestedAt time.Time
	policy      policy.Policy
	rng         *rand.Rand
	counters    Counters
	alerts      alertState

	// Scratch reused by every Select under the lock (no per-call allocation):
	// the candidates handed to the policy and their replicas, index-aligned.
	cands    []policy.Candidate
	candReps []*replica
	expl     Explanation

	fleetPrefill fleetPrefill // pooled prefill throughput (rates.go)
	fleetDecode  float64      // median of the replicas' decode steps
	fleetSlots   float64      // the largest slot limit known of a replica (limits.go)
	decodeSlope  decodeSlope  // decode step per request in the batch, fleet-wide

	// Shared state (shared.go): where the policy's affinity changes are
	// published, and the peers' latest in-flight loads with the earliest of
	// their expiries.
	sharer      policy.Sharer
	peers       map[string]peerLoad
	peersLive   int       // live peers (sumPeers)
	peersAgeSum float64   // the sum of their loads' ages at peersSummed, seconds
	peersSummed time.Time // when sumPeers last ran
	peersExpire time.Time
}

// New returns a balancer with no replicas whose choice is made by the
// policy cfg.Policy names ("": policy.DefaultName), built from the policy
// registry with cfg's settings. cfg must have passed Validate.
func New(cfg Config) (*Balancer, error) {
	return NewWithPolicy(cfg, nil)
}

// NewWithPolicy returns a balancer whose steps 2-4 are p's choice (nil: the
// policy cfg.Policy names). Steps 1 and 5, reservations, health and alerts
// are shared, so a comparison of policies differs only in the choice.
func NewWithPolicy(cfg Config, p policy.Policy) (*Balancer, error) {
	cfg = cfg.withDefaults()
	check := cfg
	if p != nil {
		check.Policy = "" // a policy built by the caller need not be registered
	}
	if err := check.Validate(); err != nil {
		return nil, fmt.Errorf("balancer: invalid config: %w", err)
	}
	if p != nil {
		cfg.Policy = p.Name()
	} else {
		var err error
		if p, err = policy.NewWithSettings(cfg.Policy, cfg.Settings); err != nil {
			return nil, fmt.Errorf("balancer: %w", err)
		}
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = 0x11e1b
	}
	b := &Balancer{
		cfg:    cfg,
		byName: make(map[string]*replica),
		rng:    rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		policy: p,
	}
	p.Attach(fleetView{b})
	return b, nil
}

// Policy returns the name of the policy that makes the choice.
func (b *Balancer) Policy() string { return b.cfg.Policy }

// Config returns the configuration the balancer runs with.
func (b *Balancer) Config() Config { return b.cfg }

// AddReplica adds a replica (LIVE until its first failed scrape).
func (b *Balancer) AddReplica(spec ReplicaSpec, now time.Time) error {
	if spec.Name == "" {
		return errors.New("balancer: replica name is empty")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.byName[spec.Name]; ok {
		return fmt.Errorf("balancer: replica %q already exists", spec.Name)
	}
	r := &replica{
		name:   spec.Name,
		url:    spec.URL,
		models: slices.Clone(spec.Models),
		health: *health.NewMachine(&b.cfg.Health, now),
		kvDecl: float64(max(spec.KVCacheTokens, 0)),
	}
	if spec.NotReady {
		r.health = *health.NewPendingMachine(&b.cfg.Health, now)
	}
	b.replicas = append(b.replicas, r)
	b.byName[r.name] = r
	b.modelUnion = nil
	if b.alerts.lastGoodScrape.IsZero() {
		b.alerts.lastGoodScrape = now // the probe_broken clock starts with the fleet
	}
	return nil
}

// RemoveReplica removes a replica; its reservations may still be released.
func (b *Balancer) RemoveReplica(name string, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.byName[name]
	if !ok {
		return false
	}
	r.removed = true
	delete(b.byName, name)
	b.replicas = slices.DeleteFunc(b.replicas, func(x *replica) bool { return x == r })
	b.modelUnion = nil
	b.updateFleetLimit()
	b.policy.RemoveReplica(name)
	return true
}

// SetDraining stops (or resumes) new traffic to a replica; in-flight continues.
func (b *Balancer) SetDraining(name string, draining bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.byName[name]
	if ok {
		r.draining = draining
	}
	return ok
}

// SetModels records the models a replica serves (learned from /v1/models).
func (b *Balancer) SetModels(name string, models []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r, ok := b.byName[name]; ok && !slices.Equal(r.models, models) {
		r.models = slices.Clone(models)
		b.modelUnion = nil
	}
}

// Models returns the union of all replicas' models, sorted.
func (b *Balancer) Models() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if m := b.models(); len(m) > 0 {
		return slices.Clone(m)
	}
	return nil
}

// ModelRank returns model's index in Models and whether it is there,
// without copying the list: a lookup per request stays cheap however many
// models the fleet advertises.
func (b *Balancer) ModelRank(model string) (int, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.BinarySearch(b.models(), model)
}

// models is the sorted union of the replicas' models, built again only
// after a change; under the lock.
func (b *Balancer) models() []string {
	if b.modelUnion == nil {
		var out []string
		for _, r := range b.replicas {
			out = append(out, r.models...)
		}
		slices.Sort(out)
		b.modelUnion = slices.Compact(out)
		if b.modelUnion == nil {
			b.modelUnion = []string{}
		}
	}
	return b.modelUnion
}

// Select chooses a replica for p and reserves its in-flight slot atomically
// (docs/ROUTING.md "Selection"). exclude names replicas already tried for this request (failover).
// Health changes with time only through Tick, ObserveScrape and Release.
// p.PromptBlocks must not change until the reservation is released.
func (b *Balancer) Select(p *Profile, now time.Time, exclude ...string) (*Reservation, error) {
	res, _, err := b.choose(p, now, exclude, false, Favoured)
	return res, err
}

// choose is Select; roomOnly offers the policy only replicas that are not
// full (Dispatch; for a request flow control does not favour, full at
// their limit less the reserves its standing s may not take), or all of them when every one is, and then reports whether
// some replica still has room after the reservation.
func (b *Balancer) choose(p *Profile, now time.Time, exclude []string, roomOnly bool, s Standing) (_ *Reservation, roomLeft bool, _ error) {
	if p == nil {
		return nil, false, errors.New("balancer: nil request profile")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expl = Explanation{Policy: b.cfg.Policy}
	b.refreshPeers(now)

	// Step 1. Pool: candidates are LIVE and PROBING replicas serving the
	// model (not draining, not already tried; PROBING ones only below
	// probing.max_in_flight). EJECTED replicas get no traffic.
	known, err := b.pool(p.Model, exclude, now, roomOnly, s)
	withRoom := len(b.cands)
	if err == nil && roomOnly && withRoom == 0 {
		known, err = b.pool(p.Model, exclude, now, false, Favoured)
	}
	if err != nil {
		return nil, false, err
	}

	// Step 5. Fallback: no replica is LIVE or PROBING but some are known:
	// pick one at random (last resort). None known: no_healthy_instances.
	// Known for the fallback means alive by its latest scrape: a replica
	// whose scrape fails (refused, hung) or that was never seen healthy
	// would only make the client hang or fail, so all-dead answers 503 at
	// once.
	if len(b.cands) == 0 {
		if known == 0 {
			return nil, false, ErrNoHealthyInstances
		}
		b.expl.CandidateSet = "fallback"
		b.counters.Fallbacks++
		return b.reserve(b.fallback(p.Model, exclude, known), ReasonFallback, p, now), false, nil // changes no affinity
	}

	// Steps 2-4. The policy's choice among step 1's pool (package policy;
	// for llmlb: no-wait, least-loaded, then pins).
	c := b.policy.Choose(p, b.cands, now)
	if c.Index < 0 || c.Index >= len(b.cands) {
		return nil, false, fmt.Errorf("balancer: policy %s chose candidate %d of %d", b.cfg.Policy, c.Index, len(b.cands))
	}
	b.explain(&c)
	reason := ReasonLoad
	if c.Reason == string(ReasonAffinity) {
		reason = ReasonAffinity
	}
	res := b.reserve(b.candReps[c.Index], reason, p, now)
	res.policy, res.blocks, res.recorded, res.shape = b.policy, p.PromptBlocks, c.Recorded, c.Shape
	if c.PrefillTokens > 0 {
		b.addPending(res, float64(c.PrefillTokens), now)
	}
	b.policy.Routed(res.Replica, p, c, now)
	if roomOnly {
		roomLeft = withRoom > 1 || (withRoom == 1 && b.hasRoom(res.rep, s, now))
	}
	return res, roomLeft, nil
}

// explain copies what the policy says of its choice into the explanation.
func (b *Balancer) explain(c *policy.Choice) {
	e := &b.expl
	e.Candidates, e.CandidateSet, e.MinRunning = c.Candidates, c.CandidateSet, c.MinRunning
	if c.Candidates == 0 { // the policy weighed all of step 1's pool
		e.Candidates, e.CandidateSet = len(b.cands), "routable"
	}
	e.PinKind, e.PinReplica, e.PinDecision = c.PinKind, c.PinReplica, c.PinDecision
	e.Estimate, e.CachedTokens, e.PrefillTokens, e.Detail = c.Estimate, c.CachedTokens, c.PrefillTokens, c.Detail
	e.Rule, e.RunnerUp, e.RunnerUpEstimate, e.PendingPrefill = c.Rule, c.RunnerUp, c.RunnerUpEstimate, c.PendingPrefill
}

// pool fills b.cands / b.candReps with step 1's routable replicas and returns
// how many known replicas serve the model and may be tried at all.
func (b *Balancer) pool(model string, exclude []string, now time.Time, roomOnly bool, s Standing) (known int, err error) {
	b.cands, b.candReps = b.cands[:0], b.candReps[:0]
	servedBy := 0
	// The fleet's learned values, once for all candidates.
	rate, meanOutput := b.prefillRate(nil), b.fleetPrefill.meanOutput()
	for _, r := range b.replicas {
		if !r.serves(model) {
			continue
		}
		servedBy++
		if r.draining || slices.Contains(exclude, r.name) {
			continue
		}
		if !r.fallbackOK() {
			continue
		}
		known++
		state := r.health.State()
		if state == health.Ejected || (state == health.Probing && r.inFlight >= b.cfg.Probing.MaxInFlight) {
			continue
		}
		if roomOnly && !b.hasRoom(r, s, now) {
			continue
		}
		running, waiting := r.effective()
		step := b.decodeStep(r)
		b.cands = append(b.cands, policy.Candidate{Name: r.name, Live: state == health.Live,
			EffectiveRunning: running, EffectiveWaiting: waiting, InFlight: r.inFlight + r.peerInFlight,
			ScrapedRunning: r.snap.Running, ScrapedWaiting: r.snap.Waiting, KVCacheUsage: r.snap.KVCacheUsage,
			KVCacheTokens: int(r.snap.KVCacheTokens), PrefillRate: rate, DecodeStep: step,
			MeanOutput: meanOutput, MaxRunning: b.slotLimit(r),
			PendingPrefill: b.pendingAt(r, now, step, rate), PendingRequests: r.pendingRequests, OthersWaiting: r.othersWaiting,
			HeldPrefill: r.heldPrefill, PeerHeldPrefill: r.peerHeld})
		b.candReps = append(b.candReps, r)
	}
	if servedBy == 0 && len(b.replicas) > 0 {
		return 0, fmt.Errorf("%w: %q", ErrUnknownModel, model)
	}
	return known, nil
}

// fallback picks uniformly at random among the known replicas of step 5.
func (b *Balancer) fallback(model string, exclude []string, known int) *replica {
	k := b.rng.IntN(known)
	var last *replica
	for _, r := range b.replicas {
		if !r.serves(model) || r.draining || slices.Contains(exclude, r.name) || !r.fallbackOK() {
			continue
		}
		if k == 0 {
			return r
		}
		k--
		last = r
	}
	return last // unreachable: known counted the same set
}

// reserve takes r's in-flight slot under the lock that made the choice.
func (b *Balancer) reserve(r *replica, reason Reason, p *Profile, now time.Time) *Reservation {
	running, waiting := r.effective()
	b.expl.EffectiveRunning, b.expl.EffectiveWaiting = running, waiting
	b.expl.Replica, b.expl.Reason = r.name, reason
	r.last, r.lastAt = b.expl, now
	w := b.weightOf(p)
	r.inFlight++
	r.inFlightWeight += w
	r.requests++
	r.traffic.add(now, b.cfg.Alerts.Window)
	return &Reservation{Replica: r.name, URL: r.url, Reason: reason, Explanation: b.expl, rep: r, weight: w, at: now}
}

// weightOf is one request's load: max(min_weight, (prompt+output)/token_unit),
// in micro-units (docs/ROUTING.md "Effective load": a 100K-token request weighs 100x a 1K one).
func (b *Balancer) weightOf(p *Profile) int64 {
	tokens := float64(max(0, p.PromptTokens)) + float64(max(0, p.OutputTokens)) // float: no int overflow
	w := max(b.cfg.Load.MinWeight, tokens/float64(b.cfg.Load.TokenUnit))
	return int64(math.Round(min(w, maxWeight) * microUnit))
}

// Release returns a reservation's slot and feeds the outcome to health. A
// client cancel says nothing about the replica. Releasing twice is harmless.
func (b *Balancer) Release(res *Reservation, o Outcome, now time.Time) []Transition {
	if res == nil || res.rep == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if res.released {
		return nil
	}
	res.released = true
	r := res.rep
	r.inFlight--
	r.inFlightWeight -= res.weight
	if r.heldPrefill -= res.prefill; r.inFlight <= 0 || r.heldPrefill < 0 {
		r.heldPrefill = 0
	}
	started := res.firstToken
	b.donePending(res)
	// Only the policy that chose hears how the request fared (a reload may
	// have replaced it); a replica removed since voids its tokens anyway.
	mine := res.policy != nil && any(res.policy) == any(b.policy)
	if res.run != 0 {
		if mine {
			b.policy.Ended(res.run)
		}
		res.run = 0
	}
	if r.removed {
		return nil
	}
	if !started && res.recorded != 0 && o != OutcomeOK && o != OutcomeCanceled && mine {
		// Turned away before it ran: the replica never computed the prompt.
		b.policy.Refused(r.name, res.blocks, res.recorded)
	}
	if f, ok := b.policy.(policy.PendingFollower); ok && !started && o == OutcomeCanceled && mine && len(res.blocks) > 0 {
		f.Canceled(r.name, res.blocks)
	}
	if f, ok := b.policy.(policy.AbortFollower); ok && started && o != OutcomeOK && mine && len(res.blocks) > 0 {
		f.Aborted(r.name, res.blocks)
	}
	var tr []health.Transition
	switch o {
	case OutcomeOK:
		if mine && len(res.blocks) > 0 {
			b.policy.Finished(r.name, res.blocks, now)
		}
		tr = r.health.ObserveRequest(true, "", now)
	case OutcomeRejected:
		tr = r.health.ObserveRequest(true, "", now)
	case OutcomeServerError:
		tr = r.health.ObserveRequest(false, "5xx", now)
	case OutcomeTransportError:
		tr = r.health.ObserveRequest(false, "transport error", now)
	case OutcomeLoop:
		tr = r.health.Eject("request loop: the replica forwards to this llmlb", now)
	}
	return b.named(r, tr, nil)
}

// ObserveScrape records a scrape: snap on success, err on failure.
func (b *Balancer) ObserveScrape(name string, snap Snapshot, err error, now time.Time) []Transition {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.byName[name]
	if !ok {
		return nil
	}
	r.lastScrape, r.lastScrapeOK = now, err == nil
	if err != nil {
		return b.named(r, r.health.ObserveScrape(false, err.Error(), now), nil)
	}
	if r.rates.observe(snap, &b.fleetPrefill, &b.decodeSlope) {
		// The replica's counters went back: it restarted with an empty cache.
		b.policy.ForgetCache(r.name)
	}
	b.updateFleetDecode()
	r.snap = Snapshot{Running: sane(snap.Running), Waiting: sane(snap.Waiting), KVCacheUsage: sane(snap.KVCacheUsage),
		Preemptions: sane(snap.Preemptions), KVCacheTokens: b.plausibleKV(r, sane(snap.KVCacheTokens))}
	r.othersWaiting = max(0, r.snap.Waiting-float64(r.pendingRequests))
	r.othersKV = b.othersKV(r)
	r.cap.observe(r.snap, r.inFlight+r.peerInFlight, b.cfg.Saturation.kvFullUsage(), b.contested(now))
	r.slots.observe(r.snap)
	b.updateFleetSlots()
	b.updateFleetLimit()
	b.alerts.lastGoodScrape = now
	return b.named(r, r.health.ObserveScrape(true, "", now), nil)
}

// sane maps NaN, infinities and negatives of a bad exporter to 0.
func sane(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0
	}
	return v
}

// named converts a replica's health transitions, counting ejections.
func (b *Balancer) named(r *replica, tr []health.Transition, out []Transition) []Transition {
	for _, t := range tr {
		if t.To == health.Ejected {
			b.counters.Ejections++
		}
		out = append(out, Transition{Replica: r.name, Transition: t})
	}
	return out
}

// Tick advances time-driven transitions (PROBING -> LIVE after the clean
// window, streak reset), expires at most affinity.sweep_budget pins and
// evaluates the alert windows.
func (b *Balancer) Tick(now time.Time) []Transition {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []Transition
	b.refreshPeers(now)
	for _, r := range b.replicas {
		out = b.named(r, r.health.Tick(now), out)
	}
	b.policy.Tick(now)
	b.evalAlerts(now)
	return out
}

// Replicas returns a copy of every replica's state, sorted by name.
func (b *Balancer) Replicas(now time.Time) []ReplicaStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]ReplicaStatus, 0, len(b.replicas))
	b.refreshPeers(now)
	for _, r := range b.replicas {
		running, waiting := r.effective()
		out = append(out, ReplicaStatus{
			Name: r.name, URL: r.url, Models: slices.Clone(r.models),
			State: r.health.State().String(), Draining: r.draining,
			EffectiveRunning: running, EffectiveWaiting: waiting,
			ScrapedRunning: r.snap.Running, ScrapedWaiting: r.snap.Waiting, KVCacheUsage: r.snap.KVCacheUsage,
			Running: r.snap.Running, Waiting: r.snap.Waiting, Load: running + waiting,
			InFlight: r.inFlight, InFlightWeight: float64(r.inFlightWeight) / microUnit, PeerInFlight: r.peerInFlight,
			CooldownSeconds: r.health.Cooldown().Seconds(), Ejections: r.health.Ejections(),
			LastScrape: r.lastScrape, LastScrapeOK: r.lastScrapeOK, Requests: r.requests,
			KVCacheTokens: r.snap.KVCacheTokens, PrefillRate: b.prefillRate(r), DecodeStepSeconds: b.decodeStep(r),
			PendingPrefill: b.pending(r, now),
			MaxRunning:     b.limit(r), Occupancy: r.occupancy(), FullBy: b.fullBy(r, Favoured, now), KVCommitted: b.kvHeld(r, now),
			TentativeMaxRunning: b.tentativeLimit(r),
		})
		st := &out[len(out)-1]
		st.Full = st.FullBy != ""
		if !st.Full && b.contested(now) {
			st.FullForLowerBy = b.fullBy(r, Outranked, now)
		}
		st.TTFTPredictionError, st.TTFTPredictionRatio = r.ttft.summary()
		st.TTFTPredictions = r.ttft.total
		if !r.lastAt.IsZero() {
			st := &out[len(out)-1]
			st.LastDecision, st.LastDecisionAt = r.last.Why(), r.lastAt
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Inspect calls f with the policy under the core's lock, for readers of a
// policy's own state (the admin API's pins: policy.PinTable). f must not
// keep p or anything it returns by reference, and must not call back into
// the balancer.
func (b *Balancer) Inspect(f func(p policy.Policy)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f(b.policy)
}

// Counters returns the monotonic totals.
func (b *Balancer) Counters() Counters {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.counters
}
