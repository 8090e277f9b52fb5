// Package policy is the seam between the routing core and the choice it makes:
// one method, Choose. The llmlb five-step pipeline (package balancer) and the
// baselines the benchmark compares against (rr, least-request, sticky,
// prefix-tree; SPEC s12) all implement it, so they share reservation, health
// and fallback and differ only in the choice.
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
	EffectiveRunning float64 // SPEC s2.2
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
	// PendingPrefill is the prompt tokens (less their expected cache hits)
	// of the balancer's own requests on the replica that have not had their
	// first token yet, bounded by what the replica can have computed since
	// they were sent; PendingRequests counts those requests.
	PendingPrefill  float64
	PendingRequests int
	// HeldPrefill is the prompt tokens the balancer's own in-flight
	// requests on the replica computed or will compute there (less their
	// cache hits): the KV they hold, or will once admitted, until they end.
	HeldPrefill float64
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

	// Recorded is what a RefusalObserver needs to undo its record of the
	// prompt on the chosen replica (0: nothing was recorded).
	Recorded uint64
}

// Request is what a policy may look at in a request.
type Request = request.Profile

// Policy chooses one candidate. It is called under the balancer's lock, with
// len(cands) > 0, and may keep its own state (a rotation counter, a prefix
// tree, a pin table).
type Policy interface {
	Name() string
	Choose(r *Request, cands []Candidate, now time.Time) Choice
}

// Explainer is implemented by policies that can describe every candidate in
// Choice.Detail (it costs an allocation per decision); the balancer turns it
// on when decisions are logged or recorded.
type Explainer interface {
	SetExplain(on bool)
}

// ReplicaRemover is implemented by policies that keep per-replica state and
// must forget a replica that left the fleet.
type ReplicaRemover interface {
	RemoveReplica(name string)
}

// CacheForgetter is implemented by policies that model replicas' caches and
// must forget one that restarted (its /metrics counters went back).
type CacheForgetter interface {
	ForgetCache(name string)
}

// BlockRecorder is implemented by policies that index the prompt blocks each
// replica was sent (cost): Record notes that a peer balancer sent the named
// replica a prompt with these blocks (shared state), as if this one had.
// capacityTokens sizes a replica new to the index (0: the policy's default).
type BlockRecorder interface {
	Record(name string, blocks []uint64, capacityTokens int)
}

// RunObserver is implemented by policies that model which blocks a
// replica's running requests hold (cost). Started is called when a request
// is known to run on the replica (its first token; waiting requests hold no
// blocks) with its prompt blocks (Request.PromptBlocks, not to be kept), and
// returns a token; Ended gets that token when the request ends, whatever
// the outcome. A token of 0 needs no Ended.
type RunObserver interface {
	Started(replica string, blocks []uint64) uint64
	Ended(token uint64)
}

// RefusalObserver is implemented by policies that record a prompt on the
// replica chosen for it (cost's index of cached blocks). Refused is called
// when that replica turned the request away before running it (a 4xx or
// 5xx answer, a refused or broken connection, all before its first token),
// with its prompt blocks (not to be kept) and the Choice's Recorded, so
// that the policy stops expecting the prompt's blocks there.
type RefusalObserver interface {
	Refused(replica string, blocks []uint64, recorded uint64)
}

// FinishObserver is implemented by policies that model replicas' caches and
// want to know when a request finished successfully on a replica: vLLM frees
// a request's blocks when it finishes, so their place in the replica's LRU
// eviction order is set then, not when the request was routed. blocks are
// the request's prompt blocks (Request.PromptBlocks); the policy must not
// keep them.
type FinishObserver interface {
	Finished(replica string, blocks []uint64, now time.Time)
}
