package balancer

import "fmt"

// Reconfigure applies a new routing configuration to the running core (a
// configuration reload): load weights, pin rules, health thresholds and
// cooldowns, probing, alerts, and the policy's parameters, all at once
// under the lock; the policy's state (pins, block index), reservations,
// health states and learned rates are kept. The policy itself and the seed cannot change while running: an
// error says so and nothing is applied.
func (b *Balancer) Reconfigure(next Config) error {
	next = next.withDefaults()
	if err := next.Validate(); err != nil {
		return fmt.Errorf("balancer: invalid config: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if name := next.Policy; name != b.cfg.Policy {
		return fmt.Errorf("balancer: routing.policy %s -> %s needs a restart (the policy's state would be lost)", b.cfg.Policy, next.Policy)
	}
	if next.Seed != b.cfg.Seed {
		return fmt.Errorf("balancer: routing.seed needs a restart")
	}
	if err := b.policy.SetSettings(next.Settings); err != nil {
		return fmt.Errorf("balancer: %w", err)
	}
	next.Policy = b.cfg.Policy
	// Health machines hold a pointer to b.cfg.Health: assigning in place
	// gives every replica the new thresholds.
	b.cfg = next
	return nil
}
