package balancer

import (
	"fmt"

	"github.com/llmlb/llmlb/internal/policy"
)

// newBaseline builds a baseline policy of SPEC s12 by name (package policy).
func newBaseline(name string) (policy.Policy, error) {
	p, err := policy.New(name)
	if err != nil {
		return nil, fmt.Errorf("balancer: %w", err)
	}
	return p, nil
}
