// Package workload generates the benchmark's traffic (docs/BENCH.md): synthetic
// workloads (agentic, chat, oneshot, longshort, mixed; flood and
// flood-polite with tenants) and replays of public traces (Mooncake and
// Qwen-Bailian JSONL, Azure and BurstGPT CSV). Everything is deterministic
// for a seed.
package workload

import (
	"time"

	"github.com/llmlb/llmlb/internal/request"
	"github.com/llmlb/llmlb/internal/tokenize"
)

// Request is one generated request.
type Request struct {
	ID      uint64
	At      time.Duration // arrival, as an offset from the start of the run
	Session string        // "" for one-shot requests
	Turn    int           // 1-based turn within its session (1 for one-shots)
	Profile request.Profile
	Prompt  tokenize.Prompt
	Output  int // output tokens the engine will generate
	// Tenant is who sent it: flow control's fair shares and limits are per
	// tenant. "" for workloads and traces without tenants (one tenant).
	Tenant string
	// Priority is its flow-control class: higher first, below zero
	// sheddable (0 unless the workload or WithPriorities sets it).
	Priority int

	owner completer // the generator that made it; Complete is routed there
	sess  *session  // its session, for closed-loop generators
	done  bool      // Complete has been called
}

// completer is what every generator in this package implements; a mixed
// workload routes each completion to the part that made the request.
type completer interface {
	complete(r *Request, at time.Duration)
}

// Workload is a source of requests in arrival order. Closed-loop workloads
// (a session's next turn comes after the previous answer plus think time)
// learn of completions through Complete and schedule follow-ups.
type Workload interface {
	// Peek returns the arrival time of the next request; ok is false when no
	// request is pending (more may come after a Complete).
	Peek() (at time.Duration, ok bool)
	// Pop removes and returns the next request.
	Pop() *Request
	// Complete reports that r finished (or failed) at at.
	Complete(r *Request, at time.Duration)
	// Done reports that no request is pending and none will be scheduled.
	Done() bool
}
