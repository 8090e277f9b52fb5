package balancer

import (
	"fmt"

	"github.com/llmlb/llmlb/internal/policy"
)

// SettingsSetter is implemented by policies whose parameters can change
// while they run, keeping their state (policy cost keeps its block index).
type SettingsSetter interface {
	SetSettings(policy.Settings) error
}

// Reconfigure applies a new routing configuration to the running core (a
// configuration reload): load weights, pin rules, health thresholds and
// cooldowns, probing, alerts, and the policy's parameters, all at once
// under the lock; pins, reservations, health states and learned rates are
// kept. The policy itself and the seed cannot change while running: an
// error says so and nothing is applied.
func (b *Balancer) Reconfigure(next Config) error {
	next = next.withDefaults()
	if err := next.Validate(); err != nil {
		return fmt.Errorf("balancer: invalid config: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	name := next.Policy
	if name == "" {
		name = PolicyLLMLB
	}
	if name != b.cfg.Policy {
		return fmt.Errorf("balancer: routing.policy %s -> %s needs a restart (the policy's state would be lost)", b.cfg.Policy, name)
	}
	if next.Seed != b.cfg.Seed {
		return fmt.Errorf("balancer: routing.seed needs a restart")
	}
	if s, ok := b.policy.(SettingsSetter); ok {
		if err := s.SetSettings(policy.Settings{PrefixTree: next.PrefixTree, Cost: next.Cost, LLMD: next.LLMD}); err != nil {
			return fmt.Errorf("balancer: %w", err)
		}
	}
	next.Policy = b.cfg.Policy
	// Health machines hold a pointer to b.cfg.Health: assigning in place
	// gives every replica the new thresholds.
	b.cfg = next
	b.pins.SetConfig(next.pins())
	return nil
}
