// Package engine simulates one vLLM replica's scheduler and KV cache on a clock
// it is given: continuous batching, chunked prefill, automatic prefix caching in
// 16-token blocks, a waiting queue and preemption. It has no HTTP and no
// goroutines: the benchmark drives it on a virtual clock, the simulated replica
// (package simreplica) on the wall clock.
package engine

import (
	"errors"
	"time"

	"github.com/llmlb/llmlb/internal/tokenize"
)

// ErrPromptTooLong is returned by Add for a prompt that can never fit the KV
// cache (or the profile's maximum model length).
var ErrPromptTooLong = errors.New("engine: prompt longer than the model's context")

// Request is one generation request as the engine sees it.
type Request struct {
	ID        uint64
	Prompt    tokenize.Prompt
	MaxTokens int // output tokens to generate (the simulator always generates exactly this many, min 1)
	// StreamTokens asks for a Token event for every generated token (streaming
	// HTTP responses); without it only FirstToken and Finished are emitted.
	StreamTokens bool
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
	// Aborted: the request was removed by Abort.
	Aborted
)

// Event is emitted by Advance.
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
}

// Engine is one simulated replica. It is not safe for concurrent use; the
// owner serialises calls.
type Engine struct {
	profile Profile
}

// New returns an idle engine with an empty cache.
func New(p Profile) *Engine { return &Engine{profile: p} }

// Profile returns the engine's profile.
func (e *Engine) Profile() Profile { return e.profile }

// Add queues a request that arrived at now. If the engine is idle the next step
// starts at now; otherwise the request joins at the next step boundary.
func (e *Engine) Add(r Request, now time.Time) error { panic("engine: not implemented yet") }

// Abort removes a request (client went away) and frees its blocks.
func (e *Engine) Abort(id uint64, now time.Time) bool { panic("engine: not implemented yet") }

// Advance runs every scheduler step that ends at or before now and calls emit
// for each event in time order.
func (e *Engine) Advance(now time.Time, emit func(Event)) { panic("engine: not implemented yet") }

// NextEvent returns the earliest time at which Advance would emit an event;
// ok is false when the engine is idle.
func (e *Engine) NextEvent() (t time.Time, ok bool) { panic("engine: not implemented yet") }

// SetSlowdown multiplies every step's duration by factor (>= 1; fault injection).
func (e *Engine) SetSlowdown(factor float64) { panic("engine: not implemented yet") }

// Stats returns the counters as of the last Advance.
func (e *Engine) Stats() Stats { panic("engine: not implemented yet") }
