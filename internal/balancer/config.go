package balancer

import (
	"errors"
	"fmt"
	"time"

	"github.com/llmlb/llmlb/internal/health"
	"github.com/llmlb/llmlb/internal/pins"
	"github.com/llmlb/llmlb/internal/policy"
)

// Config is the routing core's configuration: plain data with the seeds'
// values as defaults (DefaultConfig) and a Validate that names the bad key.
// The YAML keys are given in the field comments; package config maps them.
type Config struct {
	Policy string // policy: cost | llmlb | llmlb-warm | rr | least-request | sticky | prefix-tree | llm-d

	// Cost, PrefixTree and LLMD are the settings of policies cost,
	// prefix-tree and llm-d (routing.cost.*, routing.prefix_tree.*,
	// routing.llmd.*); other policies ignore them.
	Cost       policy.CostConfig
	PrefixTree policy.PrefixTreeConfig
	LLMD       policy.LLMDConfig

	Load     LoadConfig
	Affinity AffinityConfig
	Health   health.Config
	Probing  ProbingConfig
	Alerts   AlertsConfig

	// Seed seeds the random pick of step 5 (fallback) so that a benchmark
	// run is deterministic (seed: 0 means a fixed default seed).
	Seed uint64
}

// LoadConfig sets how in-flight requests are weighted (SPEC s2.2).
type LoadConfig struct {
	TokenUnit int     // load.token_unit: estimated tokens that weigh 1.0 (default 1000)
	MinWeight float64 // load.min_weight: floor of one request's weight (default 1)
}

// AffinityConfig holds the pin rules of SPEC s3 step 4 and the pin life cycle.
type AffinityConfig struct {
	SessionTTL     time.Duration // affinity.session_ttl (60m)
	PrefixTTL      time.Duration // affinity.prefix_ttl (5m)
	SessionSlack   float64       // affinity.session_slack (1)
	PrefixSlack    float64       // affinity.prefix_slack (0)
	SpillsToRebind int           // affinity.spills_to_rebind (3)
	ForceRebindGap float64       // affinity.force_rebind_gap (3)
	// RebindRatio is llmlb-warm's relative bound: its session pin also holds
	// while running(pin) < rebind_ratio * mean running (counted in requests),
	// the bound of consistent hashing with bounded loads.
	// affinity.rebind_ratio (1.5).
	RebindRatio float64
	MaxPins     int // affinity.max_pins: bound on the table (default 1,000,000)
	// MaxPinBytes is affinity.max_pin_bytes (64 MiB): bound on the pin
	// table's estimated memory; at the bound new pins evict pins never
	// reused, not reused ones (package pins).
	MaxPinBytes int64

	// PrefixSpillsToDrop is affinity.prefix_spills_to_drop (2): consecutive
	// spills that delete a prefix pin ("a repeated spill deletes the key").
	PrefixSpillsToDrop int
	// SweepBudget is affinity.sweep_budget (1024): the most expired pins
	// one Tick deletes, so housekeeping never stalls routing.
	SweepBudget int
}

// ProbingConfig limits traffic to PROBING replicas.
type ProbingConfig struct {
	MaxInFlight int // probing.max_in_flight (default 2)
}

// AlertsConfig holds the alert thresholds of SPEC s5.
type AlertsConfig struct {
	ImbalanceIndex float64       // alerts.imbalance_index (3)
	ImbalanceFor   time.Duration // alerts.imbalance_for (5m)
	OneReplicaFor  time.Duration // alerts.one_replica_for (5m)
	ProbeBrokenFor time.Duration // alerts.probe_broken_for (1m)

	// Window is alerts.window (1m): the sliding window over which traffic
	// shares (the imbalance index, "all traffic on one replica") are counted.
	Window time.Duration
}

// DefaultConfig returns the seeds' values (SPEC s2-s5).
func DefaultConfig() Config {
	return Config{
		Policy:     PolicyLLMLB,
		Cost:       policy.DefaultCostConfig(),
		PrefixTree: policy.DefaultPrefixTreeConfig(),
		LLMD:       policy.DefaultLLMDConfig(),
		Load:       LoadConfig{TokenUnit: 1000, MinWeight: 1},
		Affinity: AffinityConfig{
			SessionTTL:         60 * time.Minute,
			PrefixTTL:          5 * time.Minute,
			SessionSlack:       1,
			PrefixSlack:        0,
			SpillsToRebind:     3,
			ForceRebindGap:     3,
			RebindRatio:        1.5,
			MaxPins:            1_000_000,
			MaxPinBytes:        pins.DefaultMaxBytes,
			PrefixSpillsToDrop: 2,
			SweepBudget:        1024,
		},
		Health:  health.Default(),
		Probing: ProbingConfig{MaxInFlight: 2},
		Alerts: AlertsConfig{
			ImbalanceIndex: 3,
			ImbalanceFor:   5 * time.Minute,
			OneReplicaFor:  5 * time.Minute,
			ProbeBrokenFor: time.Minute,
			Window:         time.Minute,
		},
	}
}

// PolicyLLMLB is the name of the seed algorithm's policy (the default).
const PolicyLLMLB = "llmlb"

// PolicyLLMLBWarm is the hybrid of the seed algorithm whose pins read the
// replica's own scraped queue (see type llmlb).
const PolicyLLMLBWarm = "llmlb-warm"

// Validate reports every bad value, each error naming its YAML key relative
// to the routing section (e.g. "affinity.session_ttl: must be > 0").
func (c Config) Validate() error {
	var errs []error
	bad := func(key, rule string, v any) {
		errs = append(errs, fmt.Errorf("%s: must be %s, got %v", key, rule, v))
	}
	switch c.Policy {
	case "", PolicyLLMLB, PolicyLLMLBWarm, "rr", "least-request", "sticky", "prefix-tree", "llm-d", "cost":
	default:
		errs = append(errs, fmt.Errorf("policy: unknown policy %q (want cost, llmlb, llmlb-warm, rr, least-request, sticky, prefix-tree or llm-d)", c.Policy))
	}
	if err := c.Cost.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.PrefixTree.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.LLMD.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Load.TokenUnit < 1 {
		bad("load.token_unit", ">= 1", c.Load.TokenUnit)
	}
	if !(c.Load.MinWeight > 0) {
		bad("load.min_weight", "> 0", c.Load.MinWeight)
	}
	a := c.Affinity
	if err := c.pins().Validate(); err != nil {
		errs = append(errs, err)
	}
	if !(a.SessionSlack >= 0) {
		bad("affinity.session_slack", ">= 0", a.SessionSlack)
	}
	if !(a.PrefixSlack >= 0) {
		bad("affinity.prefix_slack", ">= 0", a.PrefixSlack)
	}
	if !(a.RebindRatio >= 1) {
		bad("affinity.rebind_ratio", ">= 1", a.RebindRatio)
	}
	if !(a.ForceRebindGap > 0) {
		bad("affinity.force_rebind_gap", "> 0", a.ForceRebindGap)
	}
	if a.SweepBudget < 1 {
		bad("affinity.sweep_budget", ">= 1", a.SweepBudget)
	}
	if err := c.Health.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Probing.MaxInFlight < 1 {
		bad("probing.max_in_flight", ">= 1", c.Probing.MaxInFlight)
	}
	al := c.Alerts
	if !(al.ImbalanceIndex > 1) {
		bad("alerts.imbalance_index", "> 1", al.ImbalanceIndex)
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"alerts.imbalance_for", al.ImbalanceFor}, {"alerts.one_replica_for", al.OneReplicaFor},
		{"alerts.probe_broken_for", al.ProbeBrokenFor}, {"alerts.window", al.Window}} {
		if d.v <= 0 {
			bad(d.key, "> 0", d.v)
		}
	}
	return errors.Join(errs...)
}

func (c Config) pins() pins.Config {
	a := c.Affinity
	return pins.Config{SessionTTL: a.SessionTTL, PrefixTTL: a.PrefixTTL, SpillsToRebind: a.SpillsToRebind,
		PrefixSpills: a.PrefixSpillsToDrop, MaxPins: a.MaxPins, MaxBytes: a.MaxPinBytes}
}
