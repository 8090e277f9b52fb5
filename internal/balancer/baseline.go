package balancer

import (
	"fmt"

	"github.com/llmlb/llmlb/internal/policy"
)

// newBaseline builds a policy of package policy by name with cfg's settings.
func newBaseline(name string, cfg Config) (policy.Policy, error) {
	p, err := policy.NewWithSettings(name, policy.Settings{PrefixTree: cfg.PrefixTree, Cost: cfg.Cost, LLMD: cfg.LLMD})
	if err != nil {
		return nil, fmt.Errorf("balancer: %w", err)
	}
	return p, nil
}
