package server

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/llmlb/llmlb/internal/admin"
	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/discovery"
	"github.com/llmlb/llmlb/internal/scrape"
)

// TestMetricsModeOfEveryReplica: a replica's own metrics setting wins; one
// without (configured, added through the admin API or discovered) takes
// scrape.metrics. A reload replaces a configured replica whose effective
// mode changed, and only that one.
func TestMetricsModeOfEveryReplica(t *testing.T) {
	for _, def := range []string{config.MetricsAuto, config.MetricsNone} {
		t.Run("scrape.metrics "+def, func(t *testing.T) {
			cfg := testConfig("http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000")
			cfg.Scrape.Metrics = def
			cfg.Replicas[0].Metrics = config.MetricsAuto
			cfg.Replicas[1].Metrics = config.MetricsNone
			srv, err := New(cfg, nil, WithFetcher(scrape.NewFake()))
			if err != nil {
				t.Fatal(err)
			}
			if err := (fleet{srv}).AddReplica(balancer.ReplicaSpec{Name: "by-api", URL: "http://10.0.0.4:8000"}, admin.KVEvents{}); err != nil {
				t.Fatal(err)
			}
			if err := (discoveryFleet{srv}).AddReplica(discovery.Target{Name: "discovered", URL: "http://10.0.0.5:8000"}, ""); err != nil {
				t.Fatal(err)
			}
			livenessOnly := func() map[string]bool {
				m := map[string]bool{}
				for _, tg := range srv.scraper.Targets() {
					m[tg.Name] = tg.LivenessOnly
				}
				return m
			}
			none := def == config.MetricsNone
			want := map[string]bool{"sim-1": false, "sim-2": true, "sim-3": none, "by-api": none, "discovered": none}
			if d := cmp.Diff(want, livenessOnly()); d != "" {
				t.Errorf("liveness-only scrape per replica (-want +got):\n%s", d)
			}

			// The default written out changes nothing; switching sim-1 replaces it.
			list := slices.Clone(cfg.Replicas)
			list[2].Metrics = def
			list[0].Metrics = config.MetricsNone
			added, removed, err := srv.Reload(list)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(added, []string{"sim-1"}) || !slices.Equal(removed, []string{"sim-1"}) {
				t.Errorf("reload added %v removed %v, want sim-1 replaced only", added, removed)
			}
			want["sim-1"] = true
			if d := cmp.Diff(want, livenessOnly()); d != "" {
				t.Errorf("after the reload (-want +got):\n%s", d)
			}
		})
	}
}
