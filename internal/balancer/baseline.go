package balancer

import (
	"fmt"

	"github.com/llmlb/llmlb/internal/policy"
)

// newBaseline builds a baseline policy of SPEC s12 by name.
// TODO(policy): call policy.New(name) once package policy's registry is committed.
func newBaseline(name string) (policy.Policy, error) {
	return nil, fmt.Errorf("balancer: policy %q is not available yet", name)
}
