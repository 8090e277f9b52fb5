// Package epp is `llmlb epp`: llmlb's routing core behind the Endpoint
// Picker Protocol of the Gateway API Inference Extension
// (docs/proposals/004-endpoint-picker-protocol), an Envoy ext_proc v3 gRPC
// service. For every HTTP request the gateway streams the request headers
// and body here; the picker profiles the request exactly as `llmlb serve`
// does, selects through the same balancer, and answers with the
// x-gateway-destination-endpoint header and envoy.lb dynamic metadata. It
// then watches the response (status, first chunk, usage, end) to release
// the reservation once and feed health, as the proxy does. See docs/EPP.md.
package epp

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/health"
	"github.com/llmlb/llmlb/internal/openai"
	"github.com/llmlb/llmlb/internal/proxy"
	"github.com/llmlb/llmlb/internal/request"
)

// Names of the Endpoint Picker Protocol (a contract with the gateways).
const (
	// HeaderDestination is the request header naming the picked endpoint.
	HeaderDestination = "x-gateway-destination-endpoint"
	// MetadataNamespace wraps the picked endpoint in the dynamic metadata.
	MetadataNamespace = "envoy.lb"
	// MetadataDestination is the picked endpoint's key in MetadataNamespace.
	MetadataDestination = HeaderDestination
	// SubsetNamespace wraps the subset the gateway allows, in the filter
	// metadata of the request.
	SubsetNamespace = "envoy.lb.subset_hint"
	// SubsetKey is the list of "ip:port" the picker must choose from.
	SubsetKey = "x-gateway-destination-endpoint-subset"
	// ServedKey is the endpoint the gateway says served the request
	// (metadata_context, namespace MetadataNamespace).
	ServedKey = "x-gateway-destination-endpoint-served"
)

// gRPC health service names answered besides "" (the whole server).
const (
	ServiceExtProc   = "envoy.service.ext_proc.v3.ExternalProcessor"
	ServiceReadiness = "readiness"
	ServiceLiveness  = "liveness"
)

// HealthInterval is how often the gRPC health status is recomputed from the
// replicas' states.
const HealthInterval = time.Second

// bodyChunk is the largest body chunk sent back to the gateway in one
// streamed body response (some Envoy builds cap a chunk at 64 KiB).
const bodyChunk = 62000

// Options configures a Server. Balancer is required; the rest has defaults.
type Options struct {
	Balancer *balancer.Balancer
	// Request is how requests are profiled (serve's: server.RequestConfig).
	Request request.Config
	// MaxBodyBytes bounds a buffered request body (proxy.max_body_bytes);
	// 0 means proxy.DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// MaxStreams bounds the exchanges (HTTP requests) one gateway
	// connection may have open at once, as server.max_connections bounds
	// serve's clients: each may buffer a body up to MaxBodyBytes. 0 means
	// DefaultMaxStreams.
	MaxStreams int
	// RouteHeaders adds X-LLMLB-Replica and X-LLMLB-Route to the response,
	// as serve does (proxy.route_headers).
	RouteHeaders bool
	// Metrics records requests and first bytes; nil records nothing.
	Metrics proxy.Recorder
	// Completion records a relayed response's latency and token usage
	// (admin.Metrics.Completion); nil records nothing.
	Completion func(model string, route balancer.Reason, ttft, total time.Duration, u openai.TokenCounts)
	// Decisions receives every routing decision (the dashboard); nil ignores them.
	Decisions func(at time.Time, res *balancer.Reservation, prof *request.Profile, attempt int)
	// Transitions receives the health transitions Release caused; nil ignores them.
	Transitions func([]balancer.Transition)
	Logger      *slog.Logger
	Now         func() time.Time
}

// Server is the ext_proc service and its gRPC server (with the standard
// health service). It implements server.Frontend.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	bal         *balancer.Balancer
	reqCfg      request.Config
	maxBody     int64
	routeHdrs   bool
	metrics     proxy.Recorder
	completion  func(string, balancer.Reason, time.Duration, time.Duration, openai.TokenCounts)
	decisions   func(time.Time, *balancer.Reservation, *request.Profile, int)
	transitions func([]balancer.Transition)
	log         *slog.Logger
	now         func() time.Time

	grpc   *grpc.Server
	health *grpchealth.Server

	mu   sync.Mutex
	stop context.CancelFunc // ends the health loop of Serve
}

// DefaultMaxStreams is Options.MaxStreams's default (serve's default
// server.max_connections).
const DefaultMaxStreams = 10000

// New returns a Server. It starts nothing: Serve does.
func New(opts Options) (*Server, error) {
	if opts.Balancer == nil {
		return nil, errors.New("epp: balancer is required")
	}
	s := &Server{
		bal:         opts.Balancer,
		reqCfg:      opts.Request,
		maxBody:     opts.MaxBodyBytes,
		routeHdrs:   opts.RouteHeaders,
		metrics:     opts.Metrics,
		completion:  opts.Completion,
		decisions:   opts.Decisions,
		transitions: opts.Transitions,
		log:         opts.Logger,
		now:         opts.Now,
	}
	if s.maxBody <= 0 {
		s.maxBody = proxy.DefaultMaxBodyBytes
	}
	if s.metrics == nil {
		s.metrics = nopRecorder{}
	}
	if s.transitions == nil {
		s.transitions = func([]balancer.Transition) {}
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	// A BUFFERED gateway sends the whole body in one message: let one up to
	// the body limit through (gRPC's default is 4 MiB) so that it is
	// answered 413 or routed, not failed by the transport.
	streams := opts.MaxStreams
	if streams <= 0 {
		streams = DefaultMaxStreams
	}
	s.grpc = grpc.NewServer(grpc.MaxRecvMsgSize(int(min(s.maxBody, 1<<30))+1<<20),
		grpc.MaxConcurrentStreams(uint32(min(streams, math.MaxUint32))))
	extprocv3.RegisterExternalProcessorServer(s.grpc, s)
	s.health = grpchealth.NewServer()
	healthpb.RegisterHealthServer(s.grpc, s.health)
	s.health.SetServingStatus(ServiceLiveness, healthpb.HealthCheckResponse_SERVING)
	s.updateHealth()
	return s, nil
}

// Serve serves the ext_proc and health services on ln until Shutdown,
// keeping the health status in step with the replicas meanwhile.
func (s *Server) Serve(ln net.Listener) error {
	ctx, cancel := context.WithCancel(context.Background())
	s.mu.Lock()
	s.stop = cancel
	s.mu.Unlock()
	var wg sync.WaitGroup
	wg.Go(func() { s.watchHealth(ctx) })
	err := s.grpc.Serve(ln)
	cancel()
	wg.Wait()
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// Shutdown reports NOT_SERVING, stops accepting and waits for the open
// ext_proc streams (requests still streaming) to end; when ctx ends first
// it closes them (their reservations are released as cancelled).
func (s *Server) Shutdown(ctx context.Context) error {
	s.health.Shutdown()
	s.mu.Lock()
	if s.stop != nil {
		s.stop()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.grpc.Stop()
		<-done
		return ctx.Err()
	}
}

// watchHealth recomputes the health status every HealthInterval until ctx ends.
func (s *Server) watchHealth(ctx context.Context) {
	t := time.NewTicker(HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.updateHealth()
		}
	}
}

// updateHealth: SERVING while at least one replica is LIVE (a picker with
// nothing to pick should be taken out of the gateway's rotation).
func (s *Server) updateHealth() {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if s.anyLive() {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range []string{"", ServiceExtProc, ServiceReadiness} {
		s.health.SetServingStatus(name, st)
	}
}

func (s *Server) anyLive() bool {
	for _, r := range s.bal.Replicas(s.now()) {
		if r.State == health.Live.String() && !r.Draining {
			return true
		}
	}
	return false
}

// Process implements the ext_proc service: one stream is one HTTP request.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	x := &exchange{s: s, stream: stream, start: s.now()}
	defer x.end()
	return x.run()
}

type nopRecorder struct{}

func (nopRecorder) Request(string, balancer.Reason, int) {}
func (nopRecorder) FirstByte(string, time.Duration)      {}
func (nopRecorder) StreamError(string)                   {}
func (nopRecorder) Failover(string)                      {}
