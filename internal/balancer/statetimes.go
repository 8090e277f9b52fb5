package balancer

import (
	"sort"
	"time"
)

// StateTime is when a replica's current health state began and how much of
// its ejection cooldown is left, for the dashboard (/ui).
type StateTime struct {
	Name         string
	Since        time.Time     // when the current state (LIVE|PROBING|EJECTED) was entered
	CooldownLeft time.Duration // 0 unless EJECTED and still cooling down
}

// StateTimes returns every replica's StateTime at now, sorted by name like
// Replicas. It copies under the lock and allocates one slice.
func (b *Balancer) StateTimes(now time.Time) []StateTime {
	b.mu.Lock()
	out := make([]StateTime, 0, len(b.replicas))
	for _, r := range b.replicas {
		out = append(out, StateTime{Name: r.name, Since: r.health.Since(), CooldownLeft: r.health.CooldownLeft(now)})
	}
	b.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
