// Package policyspy is a routing policy for tests that always picks the
// first candidate and records what the balancer tells it of finished
// requests (Hooks.Finished).
package policyspy

import (
	"fmt"
	"sync"
	"time"

	"github.com/llmlb/llmlb/internal/policy"
)

// Finishes picks the first candidate and records each Finished call as
// "replica:blocks".
type Finishes struct {
	policy.Base
	mu       sync.Mutex
	finished []string
}

// Name returns "finish-spy".
func (s *Finishes) Name() string { return "finish-spy" }

// Choose picks the first candidate.
func (s *Finishes) Choose(*policy.Request, []policy.Candidate, time.Time) policy.Choice {
	return policy.Choice{Index: 0, Reason: policy.ReasonLoad}
}

// Finished records the call.
func (s *Finishes) Finished(replica string, blocks []uint64, _ time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.finished = append(s.finished, fmt.Sprintf("%s:%d", replica, len(blocks)))
}

// Calls returns the Finished calls so far, oldest first.
func (s *Finishes) Calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.finished...)
}
