// Package pinview reads a balancer's pins for tests: the policy's
// policy.PinTable through Balancer.Inspect (none when the policy keeps no
// pins).
package pinview

import (
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/policy"
)

// List copies at most limit of the policy's pins (0: all).
func List(b *balancer.Balancer, now time.Time, limit int) []policy.PinStatus {
	var out []policy.PinStatus
	b.Inspect(func(p policy.Policy) {
		if t, ok := p.(policy.PinTable); ok {
			out = t.PinList(now, limit)
		}
	})
	return out
}

// Counts returns the policy's number of session and prefix pins.
func Counts(b *balancer.Balancer) (session, prefix int) {
	b.Inspect(func(p policy.Policy) {
		if t, ok := p.(policy.PinTable); ok {
			session, prefix = t.PinCounts()
		}
	})
	return session, prefix
}
