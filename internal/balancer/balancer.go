package balancer

import (
	"time"
)

// Reservation is the result of Select: the chosen replica with its in-flight
// slot already reserved. Pass it to Release exactly once.
type Reservation struct {
	Replica     string
	URL         string
	Reason      Reason
	Explanation Explanation
}

// Explanation says why a replica was chosen; it is logged at debug level for
// every routing decision. It holds no slices so that Select need not allocate.
type Explanation struct {
	Policy           string
	Candidates       int     // replicas that passed steps 1-2
	CandidateSet     string  // "no-wait" | "live" | "routable" | "fallback"
	MinRunning       float64 // min_r of step 3
	EffectiveRunning float64 // of the chosen replica, before this reservation
	EffectiveWaiting float64
	PinKind          string // "session" | "prefix" | ""
	PinReplica       string
	PinDecision      string // "used" | "spill: queue" | "spill: running > min_r+slack" | "rebind" | "new" | "dead" | ...
}

// ReplicaStatus is a copy of one replica's state for /admin/replicas and metrics.
type ReplicaStatus struct {
	Name             string    `json:"name"`
	URL              string    `json:"url"`
	Models           []string  `json:"models"`
	State            string    `json:"state"`
	Draining         bool      `json:"draining"`
	EffectiveRunning float64   `json:"effective_running"`
	EffectiveWaiting float64   `json:"effective_waiting"`
	ScrapedRunning   float64   `json:"scraped_running"`
	ScrapedWaiting   float64   `json:"scraped_waiting"`
	KVCacheUsage     float64   `json:"kv_cache_usage"`
	InFlight         int       `json:"in_flight"`
	InFlightWeight   float64   `json:"in_flight_weight"`
	CooldownSeconds  float64   `json:"cooldown_seconds"`
	Ejections        int       `json:"ejections"`
	LastScrape       time.Time `json:"last_scrape"`
	LastScrapeOK     bool      `json:"last_scrape_ok"`
	Requests         uint64    `json:"requests"`
}

// PinStatus is a copy of one pin for /admin/pins.
type PinStatus struct {
	Kind      string    `json:"kind"` // session | prefix
	Key       string    `json:"key"`
	Replica   string    `json:"replica"`
	LastUsed  time.Time `json:"last_used"`
	ExpiresAt time.Time `json:"expires_at"`
	Spills    int       `json:"spills"`
}

// Alert is one alert of SPEC s5.
type Alert struct {
	Name    string    `json:"name"` // imbalance | one_replica | probe_broken | flapping
	Replica string    `json:"replica,omitempty"`
	Message string    `json:"message"`
	Since   time.Time `json:"since"`
}

// Counters are monotonic totals for metrics.
type Counters struct {
	Spills, Rebinds, ForceRebinds, PrefixDrops, Ejections, Fallbacks uint64
}

// Balancer is the routing core. It is safe for concurrent use: one mutex
// guards all state, and Select reserves under it (incident 2).
type Balancer struct{}

// New returns a balancer with no replicas. cfg must have passed Validate.
func New(cfg Config) (*Balancer, error) { panic("balancer: not implemented yet") }

// AddReplica adds a replica (LIVE until its first failed scrape).
func (b *Balancer) AddReplica(spec ReplicaSpec, now time.Time) error { panic("not implemented") }

// RemoveReplica removes a replica; its reservations may still be released.
func (b *Balancer) RemoveReplica(name string, now time.Time) bool { panic("not implemented") }

// SetDraining stops (or resumes) new traffic to a replica; in-flight continues.
func (b *Balancer) SetDraining(name string, draining bool) bool { panic("not implemented") }

// SetModels records the models a replica serves (learned from /v1/models).
func (b *Balancer) SetModels(name string, models []string) { panic("not implemented") }

// Models returns the union of all replicas' models, sorted.
func (b *Balancer) Models() []string { panic("not implemented") }

// Select chooses a replica for p and reserves its in-flight slot atomically
// (SPEC s3). exclude names replicas already tried for this request (failover).
func (b *Balancer) Select(p *Profile, now time.Time, exclude ...string) (*Reservation, error) {
	panic("not implemented")
}

// Release returns a reservation's slot and feeds the outcome to health.
func (b *Balancer) Release(r *Reservation, o Outcome, now time.Time) []Transition {
	panic("not implemented")
}

// ObserveScrape records a scrape: snap on success, err on failure.
func (b *Balancer) ObserveScrape(name string, snap Snapshot, err error, now time.Time) []Transition {
	panic("not implemented")
}

// Tick advances time-driven transitions (PROBING -> LIVE after the clean
// window, streak reset) and expires pins, with bounded cost per call.
func (b *Balancer) Tick(now time.Time) []Transition { panic("not implemented") }

// Replicas returns a copy of every replica's state, sorted by name.
func (b *Balancer) Replicas(now time.Time) []ReplicaStatus { panic("not implemented") }

// Pins returns a copy of the pin table (at most limit entries, 0 = all).
func (b *Balancer) Pins(now time.Time, limit int) []PinStatus { panic("not implemented") }

// Alerts returns the alerts firing at now.
func (b *Balancer) Alerts(now time.Time) []Alert { panic("not implemented") }

// Counters returns the monotonic totals.
func (b *Balancer) Counters() Counters { panic("not implemented") }
