// Package balancer is llmlb's routing core, and it is policy-neutral: the
// replica set, the effective load with atomic in-flight reservations, step
// 1's pool of candidates and step 5's fallback, health, learned rates, peer
// loads and alerts. The choice among the candidates belongs to a policy
// (package policy), which hears how each request fared through its hooks.
// It does no I/O, starts no goroutines and keeps no timers: every
// call takes now, so `llmlb serve` (wall clock) and `llmlb bench` (virtual
// clock) run the very same code.
package balancer

import (
	"errors"

	"github.com/llmlb/llmlb/internal/health"
	"github.com/llmlb/llmlb/internal/request"
)

// ErrNoHealthyInstances: the pool for the request is empty (docs/ROUTING.md "Selection", step 5).
var ErrNoHealthyInstances = errors.New("balancer: no healthy instances")

// ErrUnknownModel: no known replica serves the requested model.
var ErrUnknownModel = errors.New("balancer: unknown model")

// Profile is what routing knows about one request.
type Profile = request.Profile

// Reason is why a replica was chosen (the X-LLMLB-Route header).
type Reason string

// The reasons the X-LLMLB-Route header gives: the policy followed affinity
// (a pin, a cached prefix), chose by load, or step 5 took a random replica
// as a last resort.
const (
	ReasonAffinity Reason = "affinity"
	ReasonLoad     Reason = "load"
	ReasonFallback Reason = "fallback"
)

// Outcome is how a proxied request ended; Release feeds it to health.
type Outcome int

// The outcomes Release distinguishes; only server and transport errors are
// health signals.
const (
	OutcomeOK             Outcome = iota // response completed with a status below 400
	OutcomeServerError                   // the replica answered 5xx
	OutcomeTransportError                // refused, reset, timeout before or during the response
	OutcomeCanceled                      // the client went away; says nothing about the replica
	// OutcomeRejected: the replica answered 4xx. It is healthy (health
	// counts a success) but served nothing, so its cache did not take the
	// prompt: a policy that indexes finished prompts is not told.
	OutcomeRejected
	// OutcomeLoop: the replica sent the request back to this llmlb (its
	// URL is llmlb's own listener, or leads back to it). It can never
	// serve, so it is ejected at once.
	OutcomeLoop
)

// ReplicaSpec is a configured replica (config, not runtime state).
type ReplicaSpec struct {
	Name   string
	URL    string
	Models []string // declared models; empty until learned with SetModels
	// NotReady starts the replica as never seen healthy: no
	// traffic, no cooldown, LIVE on its first good scrape. `llmlb serve`
	// sets it; the benchmark and tests that drive no scrapes leave it off.
	NotReady bool
	// KVCacheTokens declares the replica's KV capacity in tokens
	// (replicas[].kv_cache_tokens): it replaces what the replica reports,
	// unbounded by the plausibility checks (kvclaim.go). 0: reported.
	KVCacheTokens int
}

// Snapshot is one successful scrape of a replica's /metrics. The fields
// name vLLM's metrics; package scrape maps other engines' equivalents onto
// them (0 where an engine has none), and a replica scraped for liveness
// only (metrics: none) gives the zero Snapshot.
type Snapshot struct {
	Running      float64 // vllm:num_requests_running (summed over engines)
	Waiting      float64 // vllm:num_requests_waiting
	KVCacheUsage float64 // 0..1

	// Counters and histogram sums the balancer learns each replica's rates
	// from (differences between scrapes); 0 when the replica does not export
	// them. See docs/ROUTING.md, policy cost.
	PromptTokens   float64 // vllm:prompt_tokens_total
	PrefixHits     float64 // vllm:prefix_cache_hits_total (tokens)
	PrefillSeconds float64 // vllm:request_prefill_time_seconds_sum
	PrefillCount   float64 // vllm:request_prefill_time_seconds_count
	DecodeSeconds  float64 // vllm:inter_token_latency_seconds_sum
	DecodeCount    float64 // vllm:inter_token_latency_seconds_count
	Preemptions    float64 // vllm:num_preemptions_total

	// KVCacheTokens is the replica's KV capacity in tokens, num_gpu_blocks
	// x block_size of vllm:cache_config_info; 0 when not exported.
	KVCacheTokens float64
}

// Transition is a health state change of a named replica.
type Transition struct {
	Replica string
	health.Transition
}
