package epp_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/epp"
)

// TestExchangesPerConnectionAreBounded: one gateway connection holds at
// most MaxExchangesPerConnection exchanges open at once (each may buffer a
// body up to the body limit and hold a pick); a further one on that
// connection waits until one ends, while another connection is served
// meanwhile. One connection held 2,000 exchanges when the bound was
// server.max_connections (10,000); the default row fails there.
func TestExchangesPerConnectionAreBounded(t *testing.T) {
	tests := []struct {
		name       string
		configured int // Options.MaxExchangesPerConnection
		held       int // the bound in effect
	}{
		{"configured", 2, 2},
		{"default", 0, 256}, // epp.max_exchanges_per_connection's documented default
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := startPicker(t, epp.Options{Balancer: newCore(t, balancer.DefaultConfig(), 1, "m", nil), MaxExchangesPerConnection: tc.configured})
			// Two gateway connections (a ClientConn each).
			a, b := r.client, extprocv3.NewExternalProcessorClient(r.dial(t))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			if err := modelsExchange(ctx, a); err != nil { // a is up, its settings known
				t.Fatal(err)
			}
			// a holds the bound's worth of exchanges: POSTs whose body never comes.
			releases := make([]context.CancelFunc, tc.held)
			for i := range releases {
				holdCtx, release := context.WithCancel(ctx)
				releases[i] = release
				held, err := a.Process(holdCtx)
				if err != nil {
					t.Fatal(err)
				}
				if err := held.Send(headersOnly(call{mode: fullDuplex})); err != nil {
					t.Fatal(err)
				}
			}
			defer func() {
				for _, release := range releases {
					release()
				}
			}()
			answered := make(chan error, 1)
			go func() { answered <- modelsExchange(ctx, a) }()
			// Another connection is not held up by a's.
			if err := modelsExchange(ctx, b); err != nil {
				t.Fatalf("an exchange on another connection: %v", err)
			}
			// The wait below can only let a broken bound pass unnoticed,
			// never fail a working one.
			select {
			case err := <-answered:
				t.Fatalf("exchange %d on one connection was answered (%v) with %d held", tc.held+1, err, tc.held)
			case <-time.After(300 * time.Millisecond):
			}
			releases[0]()
			if err := <-answered; err != nil {
				t.Fatalf("the waiting exchange, once a slot freed: %v", err)
			}
		})
	}
}

// modelsExchange is an exchange the picker answers at its headers.
func modelsExchange(ctx context.Context, client extprocv3.ExternalProcessorClient) error {
	s, err := client.Process(ctx)
	if err != nil {
		return err
	}
	h := map[string]string{":method": http.MethodGet, ":path": "/v1/models"}
	if err := s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: headerMap(h), EndOfStream: true}}}); err != nil {
		return err
	}
	_, err = s.Recv()
	return err
}
