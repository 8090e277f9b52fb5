package epp

import (
	"context"
	"net/http"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/llmlb/llmlb/internal/admission"
	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/flowcontrol"
	"github.com/llmlb/llmlb/internal/request"
)

// deadStream is a stream the gateway has cancelled.
type deadStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (d deadStream) Context() context.Context                  { return d.ctx }
func (deadStream) Recv() (*extprocv3.ProcessingRequest, error) { return nil, context.Canceled }
func (deadStream) Send(*extprocv3.ProcessingResponse) error    { return context.Canceled }

// TestHeldRequestCanceledAsItIsDispatched: the gateway cancels the stream
// of a held request just as a release dispatches it (its ticket is
// delivered, the context is done): the exchange answers nothing, and the
// reservation made for it and its tenant slot are released when it ends.
func TestHeldRequestCanceledAsItIsDispatched(t *testing.T) {
	cfg := balancer.DefaultConfig()
	cfg.Saturation.MaxRunning, cfg.Saturation.Headroom = 1, 1 // full at 2
	bal, err := balancer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if err := bal.AddReplica(balancer.ReplicaSpec{Name: "r", URL: "http://10.0.0.1:8000", Models: []string{"m"}}, now); err != nil {
		t.Fatal(err)
	}
	bal.ObserveScrape("r", balancer.Snapshot{}, nil, now)
	s, err := New(Options{Balancer: bal, Request: request.DefaultConfig()})
	if err != nil {
		t.Fatal(err)
	}
	var held []*balancer.Reservation
	for range 2 {
		res, err := bal.Select(&request.Profile{Model: "m"}, now)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, res)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	x := &exchange{s: s, stream: deadStream{ctx: ctx}, start: now, header: http.Header{}, prof: request.Profile{Model: "m"}}
	r := &admission.Request{ID: 1, Profile: &x.prof, Tenant: "t", Payload: make(chan admission.Ticket, 1)}
	if d, err := s.gate.Admit(r, now); err != nil || d.Outcome != flowcontrol.Queued {
		t.Fatalf("Admit at saturation: %v %v, want queued", d, err)
	}
	bal.Release(held[0], balancer.OutcomeOK, now)
	s.pump() // the ticket is in the channel and the context is done
	res, err := x.wait(r, now)
	if res != nil || err != nil || !x.gone || x.res == nil {
		t.Fatalf("wait = %v, %v (gone %v, reserved %v): want the stream gone with the reservation adopted", res, err, x.gone, x.res != nil)
	}
	x.end()
	sts := bal.Replicas(now)
	if sts[0].InFlight != 1 {
		t.Fatalf("%d in flight, want 1 (the other holder's)", sts[0].InFlight)
	}
	if sts[0].State != "LIVE" {
		t.Fatalf("a cancel is no health signal, yet the replica is %s", sts[0].State)
	}
	for _, st := range s.gate.Stats(now) {
		for _, ts := range st.ByTenant {
			if ts.InFlight != 0 {
				t.Fatalf("tenant %s still holds %d slots", ts.Tenant, ts.InFlight)
			}
		}
	}
	bal.Release(held[1], balancer.OutcomeOK, now)
}
