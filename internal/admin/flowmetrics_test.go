package admin

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmlb/llmlb/internal/admission"
	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/flowcontrol"
)

// Flow control's metrics come from the gate at collection time, with
// bounded labels: priorities clamped to ±10, the top 10 tenants per model
// and the rest summed, and a model no replica serves counted as "other".
func TestFlowMetrics(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cfg := balancer.DefaultConfig()
	cfg.Saturation.MaxRunning, cfg.Saturation.Headroom = 1, 1 // full at two in flight
	bal, err := balancer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := bal.AddReplica(balancer.ReplicaSpec{Name: "a", URL: "http://a:8000", Models: []string{"m"}}, t0); err != nil {
		t.Fatal(err)
	}
	bal.ObserveScrape("a", balancer.Snapshot{}, nil, t0)
	for range 2 {
		if _, err := bal.Select(&balancer.Profile{Model: "m"}, t0); err != nil {
			t.Fatal(err)
		}
	}
	gate := admission.New(bal, flowcontrol.DefaultConfig())
	admit := func(id int, tenant string, prio int) {
		t.Helper()
		if _, err := gate.Admit(&admission.Request{ID: uint64(id), Profile: &balancer.Profile{Model: "m"}, Tenant: tenant, Priority: prio, Bytes: 100}, t0); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 12 { // tenants t00..t11, one request each; t00 has two
		admit(i, fmt.Sprintf("t%02d", i), 0)
	}
	admit(12, "t00", 0)
	admit(13, "vip", 1_000_000) // clamped to 10
	admit(14, "batch", -1)      // shed
	m := NewMetrics(bal, func() time.Time { return t0.Add(3 * time.Second) })
	m.RegisterQueue(gate)
	m.QueueWait(-50, 250*time.Millisecond)

	want := `
# HELP llmlb_flow_queued Requests waiting in flow control for a replica of their model to have room, by model and priority (priorities beyond ±10 count at ±10).
# TYPE llmlb_flow_queued gauge
llmlb_flow_queued{model="m",priority="0"} 13
llmlb_flow_queued{model="m",priority="10"} 1
# HELP llmlb_flow_oldest_wait_seconds How long the longest-waiting request of the model has waited (0: none waits).
# TYPE llmlb_flow_oldest_wait_seconds gauge
llmlb_flow_oldest_wait_seconds{model="m"} 3
# HELP llmlb_flow_refused_total Requests flow control refused with 429, by model and reason (queue_full, queue_bytes_full, shed, tenant_concurrency, tenant_rate).
# TYPE llmlb_flow_refused_total counter
llmlb_flow_refused_total{model="m",reason="queue_bytes_full"} 0
llmlb_flow_refused_total{model="m",reason="queue_full"} 0
llmlb_flow_refused_total{model="m",reason="shed"} 1
llmlb_flow_refused_total{model="m",reason="tenant_concurrency"} 0
llmlb_flow_refused_total{model="m",reason="tenant_rate"} 0
# HELP llmlb_flow_queued_bytes Request bodies held by the waiting requests, by model.
# TYPE llmlb_flow_queued_bytes gauge
llmlb_flow_queued_bytes{model="m"} 1400
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want),
		"llmlb_flow_queued", "llmlb_flow_oldest_wait_seconds", "llmlb_flow_refused_total", "llmlb_flow_queued_bytes"); err != nil {
		t.Error(err)
	}
	// Tenants: t00 (2) first, then 9 more by name, the remaining 3 summed.
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	tenants := map[string]float64{}
	wait := 0
	for _, mf := range mfs {
		switch mf.GetName() {
		case "llmlb_flow_tenant_queued":
			for _, s := range mf.GetMetric() {
				for _, l := range s.GetLabel() {
					if l.GetName() == "tenant" {
						tenants[l.GetValue()] = s.GetGauge().GetValue()
					}
				}
			}
		case "llmlb_flow_queue_wait_seconds":
			for _, s := range mf.GetMetric() {
				if s.GetLabel()[0].GetValue() == "-10" && s.GetHistogram().GetSampleCount() == 1 {
					wait++
				}
			}
		}
	}
	if len(tenants) != topTenants+1 || tenants["t00"] != 2 || tenants[RestTenants] != 3 {
		t.Errorf("tenant series %v: want the top %d and %q = 3", tenants, topTenants, RestTenants)
	}
	if wait != 1 {
		t.Error("the wait of priority -50 is not counted at -10")
	}
}
