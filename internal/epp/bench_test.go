package epp_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/epp"
	"github.com/llmlb/llmlb/internal/request"
)

// benchFleet is a routing core with n LIVE replicas (no I/O behind them:
// the benchmark stops at the decision).
func benchFleet(b *testing.B, n int) *balancer.Balancer {
	return newCore(b, balancer.DefaultConfig(), n, "sim-model", func(i int) balancer.Snapshot {
		return balancer.Snapshot{Running: float64(i % 3)}
	})
}

func p99(xs []time.Duration) time.Duration {
	slices.Sort(xs)
	return xs[len(xs)*99/100]
}

func p50(xs []time.Duration) time.Duration {
	slices.Sort(xs)
	return xs[len(xs)/2]
}

// BenchmarkEPP measures the routing decision through the ext_proc round
// trip on loopback (a gateway's request headers and body sent, the picked
// endpoint received) against serve's own decision (request.Parse, Select,
// Release) on the same core, and reports both P99s and the P99 the
// picker adds. One ext_proc stream per request, as Envoy opens them; the
// response phase is run after each decision, outside the measurement.
//
//	go test -run '^$' -bench EPP -benchtime 5000x ./internal/epp
func BenchmarkEPP(b *testing.B) {
	for _, mode := range []struct {
		name string
		c    call
		stub bool
	}{
		{"full-duplex", call{mode: fullDuplex, chunks: 1}, false},
		{"buffered", call{mode: buffered}, false},
		// The same gRPC hop to a stub that answers without parsing or
		// selecting: what the transport alone costs on this machine.
		{"bare-grpc-stub", call{mode: fullDuplex, chunks: 1}, true},
	} {
		b.Run(mode.name, func(b *testing.B) {
			bal := benchFleet(b, 8)
			var serve []pickerOption
			if mode.stub {
				serve = append(serve, servingStub(stubPicker{}))
			}
			client := startPicker(b, epp.Options{Balancer: bal}, serve...).client
			cfg := request.DefaultConfig()
			hdr := http.Header{"X-Session-Id": {"s"}}

			// Warm up: the connection, the HTTP/2 windows, the pools.
			for i := range 200 {
				st, err := client.Process(context.Background())
				if err != nil {
					b.Fatal(err)
				}
				c := mode.c
				c.body = chatBody("sim-model", "warm", i, true)
				e := &envoy{stream: st, c: c}
				if _, err := e.request(); err != nil {
					b.Fatal(err)
				}
				if err := finishResponse(e); err != nil {
					b.Fatal(err)
				}
			}
			var viaEPP, direct []time.Duration
			b.ResetTimer()
			for i := range b.N {
				body := chatBody("sim-model", fmt.Sprintf("bench-%d", i%64), i, true)
				c := mode.c
				c.body, c.header = body, map[string]string{"x-session-id": fmt.Sprintf("s%d", i%64)}

				// serve's decision on the same core.
				t0 := time.Now()
				prof, err := request.Parse(cfg, "/v1/chat/completions", hdr, body)
				if err != nil {
					b.Fatal(err)
				}
				res, err := bal.Select(&prof, t0)
				if err != nil {
					b.Fatal(err)
				}
				direct = append(direct, time.Since(t0))
				bal.Release(res, balancer.OutcomeOK, time.Now())

				// The picker's, over gRPC on loopback.
				ctx, cancel := context.WithCancel(context.Background())
				t1 := time.Now()
				st, err := client.Process(ctx)
				if err != nil {
					b.Fatal(err)
				}
				e := &envoy{stream: st, c: c}
				p, err := e.request()
				if err != nil || p.endpoint == "" {
					b.Fatalf("%v %+v", err, p)
				}
				viaEPP = append(viaEPP, time.Since(t1))
				if err := finishResponse(e); err != nil {
					b.Fatal(err)
				}
				cancel()
			}
			b.StopTimer()
			pe, pd := p99(viaEPP), p99(direct)
			b.ReportMetric(float64(pe.Nanoseconds()), "p99-ns")
			b.ReportMetric(float64(p50(viaEPP).Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(pd.Nanoseconds()), "select-p99-ns")
			b.ReportMetric(float64((pe - pd).Nanoseconds()), "p99-extra-ns")
		})
	}
}

// stubPicker answers a full-duplex exchange with a fixed endpoint and
// does nothing else (the transport's share of BenchmarkEPP).
type stubPicker struct {
	extprocv3.UnimplementedExternalProcessorServer
}

func (stubPicker) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
	ep := "10.0.0.1:8000"
	var body []byte
	for {
		req, err := st.Recv()
		if err != nil {
			return nil
		}
		var out []*extprocv3.ProcessingResponse
		switch m := req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestBody:
			body = append(body, m.RequestBody.GetBody()...)
			if !m.RequestBody.GetEndOfStream() {
				continue
			}
			out = append(out, &extprocv3.ProcessingResponse{
				Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
					Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
						Header: &corev3.HeaderValue{Key: epp.HeaderDestination, RawValue: []byte(ep)}, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}}}}}},
				DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{epp.MetadataNamespace: structpb.NewStructValue(
					&structpb.Struct{Fields: map[string]*structpb.Value{epp.MetadataDestination: structpb.NewStringValue(ep)}})}},
			}, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
				Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
					StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body, EndOfStream: true}}}}}}})
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}})
		case *extprocv3.ProcessingRequest_ResponseBody:
			out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{
				Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
					StreamedResponse: &extprocv3.StreamedBodyResponse{Body: m.ResponseBody.GetBody(), EndOfStream: m.ResponseBody.GetEndOfStream()}}}}}}})
		}
		for _, r := range out {
			if err := st.Send(r); err != nil {
				return err
			}
		}
	}
}

// BenchmarkEPPProcess is the picker's own work for one whole exchange
// (full duplex: headers, body, pick, response headers and body, release),
// without gRPC: a stream in memory.
//
//	go test -run '^$' -bench EPPProcess -benchmem ./internal/epp
func BenchmarkEPPProcess(b *testing.B) {
	bal := benchFleet(b, 8)
	srv, err := epp.New(epp.Options{Balancer: bal, Request: request.DefaultConfig()})
	if err != nil {
		b.Fatal(err)
	}
	body := chatBody("sim-model", "bench", 1, true)
	hdr := headerMap(map[string]string{":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json", "x-session-id": "s"})
	msgs := []*extprocv3.ProcessingRequest{
		{ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: fullDuplex, ResponseBodyMode: fullDuplex},
			Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdr}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}},
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(map[string]string{":status": "200", "content-type": "text/event-stream"})}}},
		{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n")}}},
		{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("data: [DONE]\n\n"), EndOfStream: true}}},
	}
	b.ReportAllocs()
	for b.Loop() {
		fs := &fakeStream{ctx: context.Background(), msgs: msgs}
		if err := srv.Process(fs); err != nil || len(fs.sent) != 5 {
			b.Fatalf("%v, %d answers", err, len(fs.sent))
		}
	}
}

// finishResponse runs a short successful response through the stream.
func finishResponse(e *envoy) error {
	st := e.stream
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerMap(map[string]string{":status": "200", "content-type": "application/json"})}}}); err != nil {
		return err
	}
	if _, err := st.Recv(); err != nil {
		return err
	}
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: []byte(`{"choices":[]}`), EndOfStream: true}}}); err != nil {
		return err
	}
	if _, err := st.Recv(); err != nil {
		return err
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	if _, err := st.Recv(); err != io.EOF {
		return fmt.Errorf("want the stream's end, got %v", err)
	}
	return nil
}
