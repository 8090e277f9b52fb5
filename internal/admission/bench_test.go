package admission

import (
	"fmt"
	"testing"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/flowcontrol"
)

// BenchmarkQueuedDispatch measures the work flow control adds per request
// with the queue engaged: every replica is full (routing.saturation
// .max_running 8), a request ends, Pump dispatches the oldest waiting
// request to the replica that freed (Balancer.Dispatch) and a new request
// is admitted into the queue, 100 waiting throughout. Policy: the default
// (cost). Results: docs/benchmarks/LAB-2026.md "Flow control: dispatch with the queue engaged".
func BenchmarkQueuedDispatch(b *testing.B) {
	for _, n := range []int{4, 1024} {
		b.Run(fmt.Sprintf("replicas=%d", n), func(b *testing.B) {
			cfg := balancer.DefaultConfig()
			cfg.Saturation.MaxRunning = 8
			bal, err := balancer.New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			for i := range n {
				name := fmt.Sprintf("replica-%04d", i)
				if err := bal.AddReplica(balancer.ReplicaSpec{Name: name, URL: "http://" + name, Models: []string{"m"}}, t0); err != nil {
					b.Fatal(err)
				}
				bal.ObserveScrape(name, balancer.Snapshot{}, nil, t0)
			}
			g := New(bal, flowcontrol.DefaultConfig())
			var running []*balancer.Reservation
			var held []*Request
			id := uint64(0)
			admit := func() {
				id++
				r := &Request{ID: id, Profile: &balancer.Profile{Model: "m", PromptTokens: 1000, OutputTokens: 200},
					Tenant: fmt.Sprint("tenant-", id%16)}
				d, err := g.Admit(r, t0)
				if err != nil {
					b.Fatal(err)
				}
				switch d.Outcome {
				case flowcontrol.Dispatch:
					res, err := bal.Select(r.Profile, t0)
					if err != nil {
						b.Fatal(err)
					}
					running = append(running, res)
					held = append(held, r)
				case flowcontrol.Refused:
					b.Fatalf("refused: %v", d.Reason)
				}
			}
			for g.Len() < 100 { // fill every replica, then 100 waiting
				admit()
			}
			b.ReportAllocs()
			for b.Loop() {
				res, r := running[0], held[0]
				running, held = running[1:], held[1:]
				bal.Release(res, balancer.OutcomeOK, t0)
				g.Done(r, t0)
				for _, t := range g.Pump(t0) {
					if t.Err != nil {
						b.Fatal(t.Err)
					}
					running = append(running, t.Res)
					held = append(held, t.Request)
				}
				admit()
			}
			b.StopTimer()
			if g.Len() != 100 {
				b.Fatalf("%d waiting at the end, want 100", g.Len())
			}
		})
	}
}
