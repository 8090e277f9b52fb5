package balancer

import "github.com/llmlb/llmlb/internal/policy"

// SetPreciseIndex hands the policy an index fed by the replicas' own KV
// cache events, and reports whether the policy reads one (cost does). A
// configuration reload that changes the policy drops it; call it again.
func (b *Balancer) SetPreciseIndex(x policy.PreciseIndex) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	p, ok := b.policy.(interface{ SetPreciseIndex(policy.PreciseIndex) })
	if ok {
		p.SetPreciseIndex(x)
	}
	return ok
}
