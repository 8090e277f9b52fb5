package balancer

import (
	"math"
	"strings"
	"testing"
)

// TestBadInput: bad input gets a clear error or a sane value, never a panic.
func TestBadInput(t *testing.T) {
	tests := []struct {
		name string
		run  func(b *Balancer) string // returns a problem, "" if fine
	}{
		{"absurd token estimate is capped", func(b *Balancer) string {
			res, err := b.Select(&Profile{PromptTokens: math.MaxInt, OutputTokens: math.MaxInt}, t0)
			if err != nil || res.Weight() != maxWeight {
				return "weight not capped"
			}
			b.Release(res, OutcomeOK, t0)
			return ""
		}},
		{"negative token estimate weighs min_weight", func(b *Balancer) string {
			res, err := b.Select(&Profile{PromptTokens: -5}, t0)
			if err != nil || res.Weight() != 1 {
				return "negative tokens mis-weighted"
			}
			return ""
		}},
		{"NaN and negative metrics read as 0", func(b *Balancer) string {
			b.ObserveScrape("a", Snapshot{Running: math.NaN(), Waiting: -3, KVCacheUsage: math.Inf(1)}, nil, t0)
			st := statusOf(t, b, "a", t0)
			if st.ScrapedRunning != 0 || st.ScrapedWaiting != 0 || st.KVCacheUsage != 0 {
				return "bad metrics kept"
			}
			return ""
		}},
		{"nil profile", func(b *Balancer) string {
			if _, err := b.Select(nil, t0); err == nil {
				return "nil profile accepted"
			}
			return ""
		}},
		{"empty and duplicate replica names", func(b *Balancer) string {
			if b.AddReplica(ReplicaSpec{}, t0) == nil || b.AddReplica(ReplicaSpec{Name: "a"}, t0) == nil {
				return "bad replica accepted"
			}
			return ""
		}},
		{"unknown replica names are ignored", func(b *Balancer) string {
			if b.ObserveScrape("zz", Snapshot{}, nil, t0) != nil || b.SetDraining("zz", true) || b.RemoveReplica("zz", t0) {
				return "unknown replica acted on"
			}
			b.SetModels("zz", []string{"m"})
			return ""
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if problem := tc.run(newFleet(t, 2, nil)); problem != "" {
				t.Fatal(problem)
			}
		})
	}
}

func TestValidateNamesTheKey(t *testing.T) {
	tests := []struct {
		mutate func(*Config)
		key    string
	}{
		{func(c *Config) { c.Affinity.SessionTTL = 0 }, "affinity.session_ttl: must be > 0"},
		{func(c *Config) { c.Load.TokenUnit = 0 }, "load.token_unit"},
		{func(c *Config) { c.Affinity.SessionSlack = -1 }, "affinity.session_slack"},
		{func(c *Config) { c.Health.BaseCooldown = 0 }, "health.base_cooldown"},
		{func(c *Config) { c.Probing.MaxInFlight = 0 }, "probing.max_in_flight"},
		{func(c *Config) { c.Alerts.ImbalanceFor = 0 }, "alerts.imbalance_for"},
		{func(c *Config) { c.Policy = "random" }, "policy: unknown policy"},
	}
	for _, tc := range tests {
		t.Run(tc.key, func(t *testing.T) {
			c := DefaultConfig()
			tc.mutate(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("error %v, want one naming %s", err, tc.key)
			}
			if _, err := New(c); err == nil {
				t.Fatal("New accepted an invalid config")
			}
		})
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
}
