package balancer

import (
	"time"

	"github.com/llmlb/llmlb/internal/health"
)

// Config is the routing core's configuration: plain data with the seeds'
// values as defaults (DefaultConfig) and a Validate that names the bad key.
// The YAML keys are given in the field comments; package config maps them.
type Config struct {
	Policy string // policy: llmlb | rr | least-request | sticky | prefix-tree

	Load     LoadConfig
	Affinity AffinityConfig
	Health   health.Config
	Probing  ProbingConfig
	Alerts   AlertsConfig
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
	PrefixChars    int           // affinity.prefix_chars (4096)
	MaxPins        int           // affinity.max_pins: bound on the table (default 1,000,000)
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
}
