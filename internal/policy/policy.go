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
}

// Choice is a policy's answer: an index into the candidates, the reason for
// the X-LLMLB-Route header and a short explanation for the debug log.
type Choice struct {
	Index  int
	Reason string // "affinity" | "load"
	Detail string
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

// ReplicaRemover is implemented by policies that keep per-replica state and
// must forget a replica that left the fleet.
type ReplicaRemover interface {
	RemoveReplica(name string)
}
