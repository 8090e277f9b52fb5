package flowcontrol

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Config is the flow_control section: plain data with defaults. Keys named
// in the field comments are those of the YAML file.
type Config struct {
	// Enabled turns the queue on (enabled, default true). Disabled, Admit
	// dispatches everything at once and applies no limits.
	Enabled bool
	// MaxQueued bounds the number of queued requests (max_queued, 10,000).
	MaxQueued int
	// MaxQueuedBytes bounds the request bodies held in the queue
	// (max_queued_bytes, 256 MiB). The queue's own bookkeeping adds
	// EntryBytes per queued request on top.
	MaxQueuedBytes int64
	// MaxQueueTime is the longest a request waits before Expire hands it
	// back for a 429 (max_queue_time, 60s).
	MaxQueueTime time.Duration
	// LIFOAfter turns a tenant's order around once its oldest queued
	// request has waited this long (lifo_after; 0 keeps first come,
	// first served; default 5s): its newest request goes first, while its oldest wait
	// out MaxQueueTime. Under sustained overload one first-come queue
	// makes every request wait about as long as the oldest; newest first,
	// most requests are served as fast as the fleet frees slots and the
	// excess is refused, the "adaptive LIFO" of Facebook's "Fail at
	// Scale" (ACM Queue, 2015). Short bursts, which drain before anything
	// waits this long, keep their arrival order.
	LIFOAfter time.Duration
	// StandingQueueTime shortens MaxQueueTime while the backlog stands:
	// once the queue has held requests without a break for StandingAfter,
	// every flow goes newest first (as past LIFOAfter) and a request that
	// has waited StandingQueueTime is answered 429 at once
	// (standing_queue_time, default 5s; 0, or MaxQueueTime or more: never). It is
	// the "controlled delay" half of Fail at Scale's adaptive LIFO: under
	// sustained overload the requests LIFO passes over are the ones served
	// last, at the next lull, and a client is better told to retry early
	// than answered after a minute.
	StandingQueueTime time.Duration
	// StandingAfter is how long the queue must have held requests without
	// a break before StandingQueueTime applies (standing_after, default
	// 10s): a burst that drains sooner refuses nothing. A request waits
	// at most as long as its backlog has stood, so while StandingQueueTime
	// applies none waits longer than max(StandingAfter, StandingQueueTime),
	// and MaxQueueTime binds only below that.
	StandingAfter time.Duration
	// LocalityScan is how many of a flow's held requests (one tenant, one
	// priority) dispatch looks at, the one whose turn it is included, to
	// find one that loses no cached prefix where a slot is free
	// (locality_scan; default 0: off, requests in turn). Late binding
	// sends a held request to whichever replica frees a slot first; a
	// conversation's next turn sent where its context is not computes all
	// of it again. With a scan, a request whose context is on a full
	// replica waits for it, and the slot goes to the first request behind
	// it that loses nothing there (admission.Gate; delay scheduling). Fair
	// shares between tenants and priorities are unchanged; only the order
	// within a flow moves. Measured (docs/FLOW_CONTROL.md): more cache hits
	// and output on agent workloads at saturation, a slightly worse median
	// over all overload runs, so it is off unless set.
	LocalityScan int
	// LocalityWait ends that: a request that has waited this long since it
	// was queued is never passed over for locality (locality_wait, 30s:
	// half of max_queue_time's default).
	LocalityWait time.Duration
	// MaxTenants bounds the tenants remembered at once (max_tenants, 10,000);
	// requests of further tenants share one overflow tenant (OverflowTenant).
	MaxTenants int
	// Tenant holds the limits every tenant gets unless Tenants names it
	// (tenant.max_concurrent, tenant.tokens_per_minute; 0 = none).
	Tenant TenantLimits
	// Tenants overrides the limits of named tenants (package config fills
	// it from the list flow_control.tenants[]; a map is no YAML key).
	Tenants map[string]TenantLimits
	// PriorityRules set a request's priority; the first match wins and beats
	// the header (priority_rules).
	PriorityRules []PriorityRule
	// DefaultPriority is the priority of a request no rule or header sets
	// (default_priority, 0).
	DefaultPriority int
	// PriorityHeader lets clients set their priority with X-LLMLB-Priority
	// when no rule matches (priority_header, default true).
	PriorityHeader bool
	// MaxHeaderPriority caps what the header may claim (max_header_priority,
	// default 0): any client can send the header, so by default it can only
	// lower a request's priority (background or sheddable work), never jump
	// the queue; rules, matched on tenant or API key, raise priorities.
	MaxHeaderPriority int
	// EnginePriority writes each request's priority into the body it
	// sends, as vLLM's "priority" field (engine_priority, default false):
	// engines run with --scheduling-policy priority then order their own
	// waiting queue by it, which matters while flow control holds nothing
	// (before the replicas' limits are known, or with headroom). vLLM
	// serves a lower value first, so the field is the negated priority;
	// every request carries it, replacing any the client sent. vLLM
	// refuses a non-zero priority unless it schedules by priority: turn it
	// on only for such engines. `llmlb epp` does not rewrite bodies and
	// ignores it.
	EnginePriority bool
}

// TenantLimits are the limits of one tenant; zero means no limit.
type TenantLimits struct {
	// MaxConcurrent bounds the tenant's requests admitted and not yet
	// finished, queued or running (max_concurrent).
	MaxConcurrent int
	// TokensPerMinute bounds the tenant's estimated tokens (prompt plus
	// output) admitted per minute, with a burst of one minute's worth
	// (tokens_per_minute).
	TokensPerMinute int
}

// PriorityRule gives Priority to requests matching every non-empty field.
type PriorityRule struct {
	Model    string // model (exact)
	Tenant   string // tenant (exact)
	APIKey   string // api_key (exact)
	Priority int    // priority; below zero is sheddable
}

// Defaults of the flow_control section.
const (
	DefaultMaxQueued      = 10_000
	DefaultMaxQueuedBytes = 256 << 20
	DefaultMaxQueueTime   = 60 * time.Second
	DefaultLIFOAfter      = 5 * time.Second
	// DefaultStandingQueueTime and DefaultStandingAfter: a backlog that has
	// stood 10s refuses the requests that waited 5s.
	DefaultStandingQueueTime = 5 * time.Second
	DefaultStandingAfter     = 10 * time.Second
	DefaultLocalityWait      = 30 * time.Second
	maxLocalityScan          = 256
	DefaultMaxTenants        = 10_000
)

// DefaultConfig returns the defaults: on, bounded, no tenant limits.
func DefaultConfig() Config {
	return Config{
		Enabled:           true,
		MaxQueued:         DefaultMaxQueued,
		MaxQueuedBytes:    DefaultMaxQueuedBytes,
		MaxQueueTime:      DefaultMaxQueueTime,
		LIFOAfter:         DefaultLIFOAfter,
		StandingQueueTime: DefaultStandingQueueTime,
		StandingAfter:     DefaultStandingAfter,
		LocalityWait:      DefaultLocalityWait,
		MaxTenants:        DefaultMaxTenants,
		PriorityHeader:    true,
	}
}

// Validate reports every invalid setting, naming its key under flow_control.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("flowcontrol: flow_control."+format, args...))
	}
	if c.MaxQueued < 1 {
		bad("max_queued: must be >= 1, got %d", c.MaxQueued)
	}
	if c.MaxQueuedBytes < 1 {
		bad("max_queued_bytes: must be >= 1, got %d", c.MaxQueuedBytes)
	}
	if c.MaxQueueTime <= 0 {
		bad("max_queue_time: must be > 0, got %s", c.MaxQueueTime)
	}
	if c.LIFOAfter < 0 {
		bad("lifo_after: must be >= 0 (0: first come, first served), got %s", c.LIFOAfter)
	}
	if c.StandingQueueTime < 0 {
		bad("standing_queue_time: must be >= 0 (0: off), got %s", c.StandingQueueTime)
	}
	if c.StandingAfter < 0 {
		bad("standing_after: must be >= 0, got %s", c.StandingAfter)
	}
	if c.LocalityScan < 0 || c.LocalityScan > maxLocalityScan {
		bad("locality_scan: must be 0-%d (held requests looked at per dispatch; 0 or 1: in turn), got %d", maxLocalityScan, c.LocalityScan)
	}
	if c.LocalityWait < 0 {
		bad("locality_wait: must be >= 0, got %s", c.LocalityWait)
	}
	if c.MaxTenants < 1 {
		bad("max_tenants: must be >= 1, got %d", c.MaxTenants)
	}
	checkLimits := func(prefix string, l TenantLimits) {
		if l.MaxConcurrent < 0 {
			bad("%smax_concurrent: must be >= 0, got %d", prefix, l.MaxConcurrent)
		}
		if l.TokensPerMinute < 0 {
			bad("%stokens_per_minute: must be >= 0, got %d", prefix, l.TokensPerMinute)
		}
	}
	checkLimits("tenant.", c.Tenant)
	names := make([]string, 0, len(c.Tenants))
	for name := range c.Tenants {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		checkLimits("tenants."+name+".", c.Tenants[name])
	}
	for i, r := range c.PriorityRules {
		if r.Model == "" && r.Tenant == "" && r.APIKey == "" {
			bad("priority_rules[%d]: needs model, tenant or api_key", i)
		}
	}
	return errors.Join(errs...)
}

// limitsFor returns the limits of the named tenant.
func (c Config) limitsFor(name string) TenantLimits {
	if l, ok := c.Tenants[name]; ok {
		return l
	}
	return c.Tenant
}

// ErrBadPriority reports an X-LLMLB-Priority header that is not an integer.
var ErrBadPriority = errors.New("flowcontrol: priority header is not an integer")

// Priority returns a request's priority: the first matching rule, else the
// header (when PriorityHeader allows it and it is set), else DefaultPriority.
// A malformed header returns ErrBadPriority with the priority the request
// would have had without it, so the shell may refuse it or go on.
func (c Config) Priority(model, tenant, apiKey, header string) (int, error) {
	for _, r := range c.PriorityRules {
		if (r.Model == "" || r.Model == model) && (r.Tenant == "" || r.Tenant == tenant) &&
			(r.APIKey == "" || r.APIKey == apiKey) {
			return r.Priority, nil
		}
	}
	header = strings.TrimSpace(header)
	if !c.PriorityHeader || header == "" {
		return c.DefaultPriority, nil
	}
	p, err := strconv.Atoi(header)
	if err != nil {
		return c.DefaultPriority, fmt.Errorf("%w: %q", ErrBadPriority, header)
	}
	return min(p, c.MaxHeaderPriority), nil
}
