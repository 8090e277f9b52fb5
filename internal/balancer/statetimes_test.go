package balancer

import (
	"errors"
	"testing"
	"time"
)

// TestStateTimes checks that the dashboard sees when a replica entered its
// state and the cooldown left after an ejection.
func TestStateTimes(t *testing.T) {
	b := newFleet(t, 2, nil)
	at := t0.Add(5 * time.Second)
	b.ObserveScrape("a", Snapshot{}, errors.New("refused"), at)
	st := b.StateTimes(at.Add(10 * time.Second))
	if len(st) != 2 || st[0].Name != "a" || st[1].Name != "b" {
		t.Fatalf("StateTimes = %+v, want r1 and r2 in order", st)
	}
	cooldown := b.Config().Health.BaseCooldown
	if !st[0].Since.Equal(at) || st[0].CooldownLeft != cooldown-10*time.Second {
		t.Errorf("a = %+v, want since %v and %v left", st[0], at, cooldown-10*time.Second)
	}
	if st[1].CooldownLeft != 0 {
		t.Errorf("b = %+v, want no cooldown", st[1])
	}
}
