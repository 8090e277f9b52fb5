package balancer

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestReconfigure(t *testing.T) {
	b := newFleet(t, 2, nil)
	cfg := b.Config()

	// A health threshold reaches the replicas already running: with
	// request_failures_to_eject 1, one failed request ejects.
	cfg.Health.RequestFailuresToEject = 1
	cfg.Affinity.SessionTTL = time.Second
	if err := b.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	res, err := b.Select(&Profile{SessionKey: "s"}, t0)
	if err != nil {
		t.Fatal(err)
	}
	tr := b.Release(res, OutcomeServerError, t0)
	if len(tr) != 1 || tr[0].To.String() != "EJECTED" {
		t.Fatalf("one 5xx after request_failures_to_eject 1: transitions %+v", tr)
	}
	// The new session TTL applies to the pin made above.
	if len(pinsOf(b, t0.Add(2*time.Second))) != 0 {
		t.Fatal("a session pin outlived the reloaded 1 s TTL")
	}

	// What cannot change while running is refused, and nothing is applied.
	bad := b.Config()
	bad.Policy = "rr"
	bad.Health.RequestFailuresToEject = 7
	if err := b.Reconfigure(bad); err == nil || !strings.Contains(err.Error(), "needs a restart") {
		t.Fatalf("a policy change: %v, want an error saying it needs a restart", err)
	}
	if b.Config().Health.RequestFailuresToEject != 1 {
		t.Fatal("a refused reload changed the health thresholds")
	}
	invalid := b.Config()
	invalid.Load.TokenUnit = 0
	if err := b.Reconfigure(invalid); err == nil {
		t.Fatal("an invalid routing config was applied")
	}
}

func TestReconfigureCostParameters(t *testing.T) {
	b := costFleet(t, 2)
	cfg := b.Config()
	cfg.Cost.BoundedLoad = 1.25
	if err := b.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	if got := b.Config().Cost.BoundedLoad; got != 1.25 {
		t.Fatalf("bounded_load after reload = %v", got)
	}
	cfg.Cost.BatchTokens = 0
	if err := b.Reconfigure(cfg); err == nil || errors.Is(err, ErrNoHealthyInstances) {
		t.Fatalf("invalid cost parameters: %v", err)
	}
}
