package epp_test

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/epp"
	"github.com/llmlb/llmlb/internal/request"
)

// TestMaxStreamsBoundsOpenExchanges: one gateway connection holds at most
// MaxStreams exchanges open at once (each may buffer a body up to the body
// limit); a further one waits until one ends, then is answered.
func TestMaxStreamsBoundsOpenExchanges(t *testing.T) {
	bal, err := balancer.New(balancer.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := bal.AddReplica(balancer.ReplicaSpec{Name: "r0", URL: "http://10.0.0.1:8000", Models: []string{"m"}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	srv, err := epp.New(epp.Options{Balancer: bal, Request: request.DefaultConfig(), MaxStreams: 1})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := extprocv3.NewExternalProcessorClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// models is an exchange the picker answers at its headers.
	models := func(ctx context.Context) error {
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
	if err := models(ctx); err != nil { // the connection is up, its settings known
		t.Fatal(err)
	}
	// One exchange stays open: a POST whose body never comes.
	holdCtx, release := context.WithCancel(ctx)
	held, err := client.Process(holdCtx)
	if err != nil {
		t.Fatal(err)
	}
	if err := held.Send(headersOnly(call{mode: fullDuplex})); err != nil {
		t.Fatal(err)
	}
	answered := make(chan error, 1)
	go func() { answered <- models(ctx) }()
	// The wait below can only let a broken bound pass unnoticed, never fail
	// a working one.
	select {
	case err := <-answered:
		t.Fatalf("a second exchange was answered (%v) while the only stream slot was held", err)
	case <-time.After(300 * time.Millisecond):
	}
	release()
	if err := <-answered; err != nil {
		t.Fatalf("the waiting exchange, once the slot freed: %v", err)
	}
}
