package ui

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/admission"
	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/flowcontrol"
)

// The snapshot carries flow control's queue per model: what waits, the
// oldest wait, a row per priority, the top tenants and the refusals.
func TestSnapshotShowsTheQueue(t *testing.T) {
	cfg := balancer.DefaultConfig()
	cfg.Saturation.MaxRunning, cfg.Saturation.Headroom = 1, 1 // full at two in flight
	bal, err := balancer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := bal.AddReplica(balancer.ReplicaSpec{Name: "a", URL: "http://a", Models: []string{"m"}}, t0); err != nil {
		t.Fatal(err)
	}
	bal.ObserveScrape("a", balancer.Snapshot{}, nil, t0)
	for range 2 {
		if _, err := bal.Select(&balancer.Profile{Model: "m"}, t0); err != nil {
			t.Fatal(err)
		}
	}
	gate := admission.New(bal, flowcontrol.DefaultConfig())
	for i, r := range []struct {
		tenant   string
		priority int
		want     flowcontrol.Outcome
	}{{"acme", 0, flowcontrol.Queued}, {"acme", 0, flowcontrol.Queued}, {"vip", 5, flowcontrol.Queued}, {"batch", -1, flowcontrol.Refused}} {
		d, err := gate.Admit(&admission.Request{ID: uint64(i), Profile: &balancer.Profile{Model: "m"}, Tenant: r.tenant, Priority: r.priority}, t0)
		if err != nil || d.Outcome != r.want {
			t.Fatalf("request %d: %v %v, want %v", i, d.Outcome, err, r.want)
		}
	}
	d := New(Options{Balancer: bal, Queue: gate.Stats, Now: func() time.Time { return t0 }})
	b, err := json.Marshal(d.Snapshot(t0.Add(2 * time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Queue []struct {
			Model      string  `json:"model"`
			Queued     int     `json:"queued"`
			OldestWait float64 `json:"oldest_wait_seconds"`
			Classes    []struct {
				Priority, Queued int
			} `json:"classes"`
			Tenants []struct {
				Tenant string `json:"tenant"`
				Queued int    `json:"queued"`
			} `json:"tenants"`
			Refused map[string]uint64 `json:"refused"`
		} `json:"queue"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Queue) != 1 {
		t.Fatalf("queue %s", b)
	}
	q := got.Queue[0]
	if q.Model != "m" || q.Queued != 3 || q.OldestWait != 2 || q.Refused["shed"] != 1 {
		t.Errorf("queue %+v", q)
	}
	if len(q.Classes) != 2 || q.Classes[0].Priority != 5 || q.Classes[0].Queued != 1 || q.Classes[1].Queued != 2 {
		t.Errorf("classes %+v, want priority 5 (1) above 0 (2)", q.Classes)
	}
	if len(q.Tenants) != 2 || q.Tenants[0].Tenant != "acme" || q.Tenants[0].Queued != 2 {
		t.Errorf("tenants %+v, want acme (2) first", q.Tenants)
	}
}
