package epp_test

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/epp"
	"github.com/llmlb/llmlb/internal/request"
)

// The EPP's gRPC port took anyone: one connection held 2,000 exchanges on a
// chosen replica. With a shared token, an ext_proc stream without it is
// refused (Unauthenticated) before it can reserve anything; the health
// service (kubelet's probe sends no metadata) stays open.
func TestEPPSharedToken(t *testing.T) {
	bal, err := balancer.New(balancer.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	srv, err := epp.New(epp.Options{Balancer: bal, Request: request.DefaultConfig(), Token: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-served
	})
	tests := []struct {
		name string
		md   metadata.MD
		want codes.Code
	}{
		{"no token", nil, codes.Unauthenticated},
		{"wrong token", metadata.Pairs("authorization", "Bearer nope"), codes.Unauthenticated},
		{"the token", metadata.Pairs("authorization", "Bearer s3cret"), codes.OK},
	}
	for _, tc := range tests {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if tc.md != nil {
			ctx = metadata.NewOutgoingContext(ctx, tc.md)
		}
		stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
		if err == nil {
			// The server's verdict comes with the first receive. A server
			// that refused the stream before the send makes Send return
			// io.EOF; the status is then Recv's too.
			err = stream.Send(&extprocv3.ProcessingRequest{})
			if err == nil || errors.Is(err, io.EOF) {
				_ = stream.CloseSend()
				_, err = stream.Recv()
			}
		}
		cancel()
		got := status.Code(err)
		if tc.want == codes.OK {
			if got == codes.Unauthenticated {
				t.Errorf("%s: refused: %v", tc.name, err)
			}
			continue
		}
		if got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	resp, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: epp.ServiceLiveness})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health without a token: %v %v, want SERVING", resp, err)
	}
}
