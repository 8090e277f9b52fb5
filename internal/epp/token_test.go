package epp_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/llmlb/llmlb/internal/epp"
)

// The EPP's gRPC port took anyone: one connection held 2,000 exchanges on a
// chosen replica. With a shared token, an ext_proc stream without it is
// refused (Unauthenticated) before it can reserve anything; the health
// service (kubelet's probe sends no metadata) stays open.
func TestEPPSharedToken(t *testing.T) {
	r := startPicker(t, epp.Options{Token: "s3cret"})
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
		stream, err := r.client.Process(ctx)
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
	resp, err := healthpb.NewHealthClient(r.conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: epp.ServiceLiveness})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health without a token: %v %v, want SERVING", resp, err)
	}
}
