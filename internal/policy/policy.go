// Package policy owns every routing policy: the choice among the candidates
// that the routing core (package balancer) hands over, and the state a policy
// keeps between choices (pins, a prefix tree, a block index). Every policy
// implements one interface, Policy: Choose plus the Hooks of a request's life
// cycle, with Base's do-nothing hooks embedded for those it does not need.
// Policies register by name (registry.go); the core, the configuration and
// the commands look them up there, so adding a policy touches this package
// only. All of them share the core's reservation, health and fallback and
// differ only in the choice, which is what makes a benchmark of policies fair.
package policy

import (
	"time"

	"github.com/llmlb/llmlb/internal/request"
)

// Candidate is one routable replica (LIVE or PROBING, serving the model, not
// excluded, not draining) as a policy sees it. The balancer builds the slice
// under its lock; a policy must not keep it after Choose returns.
type Candidate struct {
	Name             string
	Live             bool    // LIVE (false: PROBING)
	EffectiveRunning float64 // docs/ROUTING.md "Effective load"
	EffectiveWaiting float64
	InFlight         int // the balancer's own in-flight requests (count, unweighted)

	// What the replica's own /metrics said at the last scrape.
	ScrapedRunning float64 // vllm:num_requests_running
	ScrapedWaiting float64 // vllm:num_requests_waiting
	KVCacheUsage   float64 // vllm:kv_cache_usage_perc, 0..1

	// KVCacheTokens is the replica's KV capacity in tokens (learned from
	// vllm:cache_config_info, or configured; a default until known).
	KVCacheTokens int
	// PrefillRate is the replica's prefill throughput in prompt tokens per
	// second and DecodeStep its time between two output tokens, in
	// seconds: learned from its /metrics, configured defaults until then.
	PrefillRate float64
	DecodeStep  float64
	// MeanOutput is the fleet's mean output tokens per request, learned
	// from /metrics (a default until then): how long a batch slot stays taken.
	MeanOutput float64
	// MaxRunning is the replica's running-slot limit as far as the
	// balancer knows it (configured for flow control, or learned from its
	// running count held over scrapes while requests waited, or, while it
	// preempts, the most it ran then: the batch its KV cache holds); 0
	// while not known.
	MaxRunning float64
	// PendingPrefill is the prompt tokens (less their expected cache hits)
	// of the balancer's own requests on the replica that have not had their
	// first token yet, bounded by what the replica can have computed since
	// they were sent; PendingRequests counts those requests.
	PendingPrefill  float64
	PendingRequests int
	// OthersWaiting is how many requests the replica's last scrape showed
	// waiting beyond the balancer's own then pending: queued by peers or
	// direct clients, whose prompts the balancer does not know.
	OthersWaiting float64
	// HeldPrefill is the prompt tokens the balancer's own in-flight
	// requests on the replica computed or will compute there (less their
	// cache hits): the KV they hold, or will once admitted, until they end.
	HeldPrefill float64
	// PeerHeldPrefill is the same for the requests other balancers
	// sharing state have in flight there, as they last published it (0
	// without shared state).
	PeerHeldPrefill float64
}

// Choice is a policy's answer: an index into the candidates, the reason for
// the X-LLMLB-Route header and a short explanation for the debug log.
type Choice struct {
	Index  int
	Reason string // "affinity" | "load"
	Detail string

	// Set by cost-aware policies (0 otherwise): the prompt tokens the chosen
	// replica is expected to compute (not found in its cache), the tokens
	// expected from its cache, and the expected time to first token there.
	PrefillTokens int
	CachedTokens  int
	Estimate      float64 // seconds
	// Shape is Estimate in the parts the chosen replica's prefill model
	// weighs (policy cost), handed back with the measured first token.
	Shape PrefillShape

	// Recorded is what the policy's Refused hook needs to undo its record
	// of the prompt on the chosen replica (0: nothing was recorded).
	Recorded uint64

	// What the choice considered, for the decision's explanation: how many
	// candidates it weighed (0: all of them) and which set ("no-wait",
	// "live", "routable"; "": all), the least running load among them, and
	// the pin it consulted or made with what it decided (pin policies).
	Candidates   int
	CandidateSet string
	// Rule is the rule of the policy that decided, in its own words
	// (cost: "cache", "load", "bounded load", "tie", "burst spread";
	// rr: "rotation"; ...). A constant: setting it allocates nothing.
	Rule string
	// Set by cost: the candidate with the next smallest score and its
	// expected time to first token (seconds), and the chosen replica's
	// pending prefill (prompt tokens still ahead of this one).
	RunnerUp         string
	RunnerUpEstimate float64
	PendingPrefill   float64
	MinRunning       float64
	PinKind          string // "session" | "prefix" | ""
	PinReplica       string
	PinDecision      string // "used" | "spill: queue" | "rebind" | "new" | "dead" | ...
}

// Request is what a policy may look at in a request.
type Request = request.Profile

// Policy chooses one candidate. Every method is called under the routing
// core's lock; Choose gets len(cands) > 0. A policy may keep its own state
// (a rotation counter, a prefix tree, a pin table) and learns how each
// request it routed fared through its Hooks; embed Base for the hooks a
// policy does not need.
type Policy interface {
	Name() string
	Choose(r *Request, cands []Candidate, now time.Time) Choice
	Hooks
}
