package balancer

import (
	"errors"
	"fmt"
	"time"

	"github.com/llmlb/llmlb/internal/health"
	"github.com/llmlb/llmlb/internal/policy"
)

// Config is the routing core's configuration: plain data with the
// defaults of docs/ROUTING.md (DefaultConfig) and a Validate that names the bad key.
// The YAML keys are given in the field comments; package config maps them.
type Config struct {
	// Policy names the policy that makes the choice (routing.policy; ""
	// is policy.DefaultName); package policy's registry knows them all.
	Policy string

	// Settings are the policies' own sections (routing.cost.*,
	// routing.prefix_tree.*, routing.llmd.*, routing.affinity.*; package
	// policy owns them); each policy reads only its own.
	policy.Settings

	Load    LoadConfig
	Health  health.Config
	Probing ProbingConfig
	Alerts  AlertsConfig
	// Saturation says when a pool is saturated (routing.saturation.*),
	// flow control's signal to hold requests.
	Saturation SaturationConfig

	// Seed seeds the random pick of step 5 (fallback) so that a benchmark
	// run is deterministic (seed: 0 means a fixed default seed).
	Seed uint64
}

// LoadConfig sets how in-flight requests are weighted (docs/ROUTING.md "Effective load").
type LoadConfig struct {
	TokenUnit int     // load.token_unit: estimated tokens that weigh 1.0 (default 1000)
	MinWeight float64 // load.min_weight: floor of one request's weight (default 1)
}

// ProbingConfig limits traffic to PROBING replicas.
type ProbingConfig struct {
	MaxInFlight int // probing.max_in_flight (default 2)
}

// AlertsConfig holds the alert thresholds (docs/ROUTING.md "Alerts").
type AlertsConfig struct {
	ImbalanceIndex float64       // alerts.imbalance_index (3)
	ImbalanceFor   time.Duration // alerts.imbalance_for (5m)
	OneReplicaFor  time.Duration // alerts.one_replica_for (5m)
	ProbeBrokenFor time.Duration // alerts.probe_broken_for (1m)

	// Window is alerts.window (1m): the sliding window over which traffic
	// shares (the imbalance index, "all traffic on one replica") are counted.
	Window time.Duration
}

// DefaultConfig returns the defaults of every setting, with the default
// policy (policy.DefaultName).
func DefaultConfig() Config {
	return Config{
		Policy:     policy.DefaultName,
		Settings:   policy.DefaultSettings(),
		Load:       LoadConfig{TokenUnit: 1000, MinWeight: 1},
		Health:     health.Default(),
		Probing:    ProbingConfig{MaxInFlight: 2},
		Saturation: DefaultSaturationConfig(),
		Alerts: AlertsConfig{
			ImbalanceIndex: 3,
			ImbalanceFor:   5 * time.Minute,
			OneReplicaFor:  5 * time.Minute,
			ProbeBrokenFor: time.Minute,
			Window:         time.Minute,
		},
	}
}

// Validate reports every bad value, each error naming its YAML key relative
// to the routing section (e.g. "affinity.session_ttl: must be > 0").
func (c Config) Validate() error {
	var errs []error
	bad := func(key, rule string, v any) {
		errs = append(errs, fmt.Errorf("%s: must be %s, got %v", key, rule, v))
	}
	if _, ok := policy.Lookup(c.Policy); !ok && c.Policy != "" {
		errs = append(errs, policy.ErrUnknown(c.Policy))
	}
	if err := c.Settings.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Load.TokenUnit < 1 {
		bad("load.token_unit", ">= 1", c.Load.TokenUnit)
	}
	if !(c.Load.MinWeight > 0) {
		bad("load.min_weight", "> 0", c.Load.MinWeight)
	}
	if err := c.Health.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Saturation.Validate(); err != nil {
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
