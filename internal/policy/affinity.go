package policy

import (
	"errors"
	"fmt"
	"time"

	"github.com/llmlb/llmlb/internal/pins"
)

// AffinityConfig holds the pin rules of policies llmlb and llmlb-warm and
// the pin table's life cycle (routing.affinity.*; docs/ROUTING.md).
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

// DefaultAffinityConfig returns the design documents' pin rules.
func DefaultAffinityConfig() AffinityConfig {
	return AffinityConfig{
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
	}
}

// Validate reports every bad value, each naming its key (affinity.*).
func (a AffinityConfig) Validate() error {
	var errs []error
	bad := func(key, rule string, v any) {
		errs = append(errs, fmt.Errorf("%s: must be %s, got %v", key, rule, v))
	}
	if err := a.pins().Validate(); err != nil {
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
	return errors.Join(errs...)
}

// pins is the pin table's part of the settings.
func (a AffinityConfig) pins() pins.Config {
	return pins.Config{SessionTTL: a.SessionTTL, PrefixTTL: a.PrefixTTL, SpillsToRebind: a.SpillsToRebind,
		PrefixSpills: a.PrefixSpillsToDrop, MaxPins: a.MaxPins, MaxBytes: a.MaxPinBytes}
}
