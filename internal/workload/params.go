package workload

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// Params scales a synthetic workload. Zero values take the workload's
// defaults (docs/WORKLOADS.md).
type Params struct {
	// Seed makes the run reproducible: the same seed gives the same requests.
	Seed int64
	// Duration is how long new requests keep arriving (default 30 min): no
	// request arrives at or after it, and sessions still open then end.
	Duration time.Duration
	// Rate is the arrival rate of new sessions (closed-loop workloads) or of
	// requests (open-loop ones) per second; 0 takes the default for Replicas.
	Rate float64
	// Users, for closed-loop workloads, replaces Poisson session arrivals by a
	// fixed population of users who each run one session after another.
	// It excludes Rate; 0 means session arrivals at Rate.
	Users int
	// Replicas is the fleet size the default load is scaled for (default 4):
	// about 70% of the fleet's capacity when routed round-robin.
	Replicas int
	// Speed multiplies the arrival rate, Rate's or the default (0 means 1):
	// 2 offers twice the load (llmlb bench --speed). Closed-loop workloads
	// scale their session arrivals; it excludes Users.
	Speed float64
}

// speed is Speed, 1 when unset.
func (p Params) speed() float64 {
	if p.Speed == 0 {
		return 1
	}
	return p.Speed
}

// Defaults used when Params leaves a field zero.
const (
	DefaultDuration = 30 * time.Minute
	DefaultReplicas = 4
	// DeclaredOutput is the output length a client without max_tokens
	// declares, as the request profiler assumes (the token estimate of docs/ROUTING.md "Effective load").
	DeclaredOutput = 256
	// TargetUtilisation is the share of the load at which round-robin
	// saturates that a workload's default rate offers (docs/WORKLOADS.md
	// has the calibration runs).
	TargetUtilisation = 0.7
)

// ErrUnknownWorkload is returned by New for a name Names does not list.
var ErrUnknownWorkload = errors.New("workload: unknown workload")

// normalized validates p and fills in the defaults.
func (p Params) normalized(name string, closedLoop bool) (Params, error) {
	switch {
	case p.Duration < 0:
		return p, fmt.Errorf("workload: %s: negative duration %v", name, p.Duration)
	case math.IsNaN(p.Rate) || math.IsInf(p.Rate, 0) || p.Rate < 0:
		return p, fmt.Errorf("workload: %s: rate must be a finite number >= 0, got %v", name, p.Rate)
	case math.IsNaN(p.Speed) || math.IsInf(p.Speed, 0) || p.Speed < 0:
		return p, fmt.Errorf("workload: %s: speed must be a finite number > 0, got %v", name, p.Speed)
	case p.Users > 0 && p.speed() != 1:
		return p, fmt.Errorf("workload: %s: a fixed population of users has no rate to speed up", name)
	case p.Users < 0:
		return p, fmt.Errorf("workload: %s: negative users %d", name, p.Users)
	case p.Replicas < 0:
		return p, fmt.Errorf("workload: %s: negative replicas %d", name, p.Replicas)
	case p.Users > 0 && !closedLoop:
		return p, fmt.Errorf("workload: %s has Poisson arrivals (open loop): set a rate, not users", name)
	case p.Users > 0 && p.Rate > 0:
		return p, fmt.Errorf("workload: %s: set either users or a session rate, not both", name)
	}
	if p.Duration == 0 {
		p.Duration = DefaultDuration
	}
	if p.Replicas == 0 {
		p.Replicas = DefaultReplicas
	}
	return p, nil
}

// Names lists the synthetic workloads New knows, in a fixed order.
func Names() []string {
	return []string{"agentic", "chat", "oneshot", "longshort", "mixed", "flood", "flood-polite"}
}

// New returns the synthetic workload called name (one of Names), scaled by
// p. In brief (docs/WORKLOADS.md has every distribution and the calibration):
//   - agentic: closed-loop sessions of 8-12 turns on 5 projects' shared 2-6K
//     system prompts; each turn a burst of 3-10 parallel requests (same
//     prefix, own 100-400-token suffixes), context ~6K growing to ~17K, think
//     time 2-8 s; default 0.0218 new sessions/s per replica.
//   - chat: closed-loop dialogues of 10-20 turns, a distinct 1-3K system
//     prompt per session, context ~4K growing by ~775 a turn, think time
//     10-60 s; default 0.055 new sessions/s per replica.
//   - oneshot: Poisson requests on 6 scenarios' 2,000-token shared prefixes
//     plus unique 100-400-token suffixes, no session key; 4.3 req/s per replica.
//   - longshort: Poisson requests, 2% with ~100K-token prompts (output 128),
//     the rest ~2K (output 64), nothing shared; 2.95 req/s per replica.
//   - mixed: all four at 40/30/15/15% of their default load.
//   - flood: four tenants sending oneshot's requests, tenant-1..tenant-3
//     at one rate each and tenant "flood" at 10 times it; by default twice
//     oneshot's default load in all (1.4x what round-robin sustains).
//   - flood-polite: flood's tenant-1..tenant-3 alone, the very same
//     requests (their latency without the flooder).
//
// Every request declares DeclaredOutput output tokens (no max_tokens sent).
func New(name string, p Params) (Workload, error) {
	switch name {
	case "agentic":
		return unwrap(newSessions(agenticSpec, p, newIDs()))
	case "chat":
		return unwrap(newSessions(chatSpec, p, newIDs()))
	case "oneshot":
		return unwrap(newOpen(oneshotSpec, p, newIDs()))
	case "longshort":
		return unwrap(newOpen(longshortSpec, p, newIDs()))
	case "mixed":
		return unwrap(newMixed(p))
	case "flood":
		return unwrap(newTenants(p, true))
	case "flood-polite":
		return unwrap(newTenants(p, false))
	}
	return nil, fmt.Errorf("%w %q (known: %s)", ErrUnknownWorkload, name, strings.Join(Names(), ", "))
}

// unwrap turns a constructor's (*T, error) into (Workload, error), so that
// a failed constructor yields a nil interface rather than a typed nil.
func unwrap[T Workload](w T, err error) (Workload, error) {
	if err != nil {
		return nil, err
	}
	return w, nil
}

// ids hands out request ids, shared by the parts of a mixed workload so that
// ids stay unique across them.
type ids struct{ next uint64 }

func newIDs() *ids { return &ids{} }

func (c *ids) take() uint64 {
	c.next++
	return c.next
}

// intRange is a uniform distribution over the integers Lo..Hi inclusive.
type intRange struct{ Lo, Hi int }

func (r intRange) mean() float64 { return float64(r.Lo+r.Hi) / 2 }

// durRange is a uniform distribution over [Lo, Hi].
type durRange struct{ Lo, Hi time.Duration }

func (r durRange) mean() time.Duration { return (r.Lo + r.Hi) / 2 }
