// Package epp is `llmlb epp`: llmlb's routing core behind the Endpoint
// Picker Protocol of the Gateway API Inference Extension
// (docs/proposals/004-endpoint-picker-protocol), an Envoy ext_proc v3 gRPC
// service. For every HTTP request the gateway streams the request headers
// and body here; the picker profiles the request exactly as `llmlb serve`
// does, selects through the same balancer, and answers with the
// x-gateway-destination-endpoint header and envoy.lb dynamic metadata. It
// then watches the response (status, first chunk, usage, end) to release
// the reservation once and feed health, as the proxy does. While every
// replica of the request's model is saturated, flow control (package
// admission) holds the exchange, its answer unsent, until a replica frees
// up, or refuses it with a 429. See docs/EPP.md.
package epp

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"log/slog"
	"math"
	"net"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/llmlb/llmlb/internal/admission"
	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/flowcontrol"
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

// FlowInterval is how often held requests are dispatched to replicas that
// got room without a request of this picker ending (a scrape showed room,
// a replica came back) and those that waited flow_control.max_queue_time
// are answered 429. A request that ends here dispatches at once.
const FlowInterval = 100 * time.Millisecond

// HeaderPriority is the request header a client sets its priority with
// (flow_control.priority_header): an integer, higher first, below zero
// sheddable.
const HeaderPriority = "X-LLMLB-Priority"

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
	// MaxExchangesPerConnection bounds the exchanges (HTTP requests) one
	// gateway connection may hold open at once
	// (epp.max_exchanges_per_connection), each of which may buffer a body
	// up to MaxBodyBytes and hold a pick. It is the HTTP/2
	// SETTINGS_MAX_CONCURRENT_STREAMS of the port: a gateway at the bound
	// opens another connection (Envoy) or waits (gRPC-Go), and a stream
	// beyond it is refused. 0 means DefaultMaxExchangesPerConnection.
	MaxExchangesPerConnection int
	// FlowControl holds requests while every replica of their model is
	// saturated (balancer saturation), with priorities, fair tenant shares
	// and limits (package flowcontrol); the zero Config means
	// flowcontrol.DefaultConfig(). Serve's flow_control section.
	FlowControl flowcontrol.Config
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
	// Token, when set, is a shared secret every ext_proc stream must
	// present as gRPC metadata "authorization: Bearer <token>" (Envoy's
	// grpc_service.initial_metadata); others are refused Unauthenticated.
	// The health service stays open (kubelet's probe sends no metadata).
	Token string
	// BodyTimeout bounds the time from an exchange's request headers to
	// the end of its body (server.read_body_timeout, as serve's): past it
	// the exchange is answered 408 and its buffered body dropped. 0 means
	// DefaultBodyTimeout.
	BodyTimeout time.Duration
	// FirstByteTimeout bounds the time from a pick to the response headers
	// reaching the picker (proxy.first_byte_timeout): past it the pick's
	// reservation is released, so a gateway that never reports a response
	// stops counting against the replica. 0 means
	// proxy.DefaultFirstByteTimeout.
	FirstByteTimeout time.Duration
	// MaxInFlightPerReplica bounds the exchanges this picker has routed to
	// one replica and not yet seen end (epp.max_in_flight_per_replica): a
	// replica at the bound is not picked, and a request no other replica
	// can take is refused 429 with Retry-After. 0 means
	// DefaultMaxInFlightPerReplica.
	MaxInFlightPerReplica int
	// TLS, when set, makes the gRPC port speak TLS only (health service
	// included); with ClientAuth RequireAndVerifyClientCert it is mutual
	// TLS (LoadTLS).
	TLS *tls.Config
}

// DefaultBodyTimeout is Options.BodyTimeout's default (serve's
// server.read_body_timeout).
const DefaultBodyTimeout = 60 * time.Second

// DefaultMaxInFlightPerReplica is Options.MaxInFlightPerReplica's default
// (epp.max_in_flight_per_replica).
const DefaultMaxInFlightPerReplica = 1024

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

	gate     *admission.Gate // flow control: holds requests at saturation
	flow     flowcontrol.Config
	ids      atomic.Uint64 // admission.Request IDs
	draining atomic.Bool   // Shutdown drained the gate: nothing may wait any more

	grpc   *grpc.Server
	health *grpchealth.Server

	bodyTimeout, firstByteTimeout time.Duration
	maxPerReplica                 int

	picksMu sync.Mutex
	picks   map[string]int // replica name -> exchanges routed there, not yet released

	mu   sync.Mutex
	stop context.CancelFunc // ends the health loop of Serve
}

// DefaultMaxExchangesPerConnection is Options.MaxExchangesPerConnection's
// default: a quarter of DefaultMaxInFlightPerReplica, so that one
// connection alone cannot fill a replica's share of picks.
const DefaultMaxExchangesPerConnection = 256

// New returns a Server. It starts nothing: Serve does.
func New(opts Options) (*Server, error) {
	if opts.Balancer == nil {
		return nil, errors.New("epp: balancer is required")
	}
	flow := opts.FlowControl
	if reflect.ValueOf(flow).IsZero() {
		flow = flowcontrol.DefaultConfig()
	}
	if err := flow.Validate(); err != nil {
		return nil, err
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
		gate:        admission.New(opts.Balancer, flow),
		flow:        flow,

		bodyTimeout:      opts.BodyTimeout,
		firstByteTimeout: opts.FirstByteTimeout,
		maxPerReplica:    opts.MaxInFlightPerReplica,
		picks:            map[string]int{},
	}
	if s.bodyTimeout <= 0 {
		s.bodyTimeout = DefaultBodyTimeout
	}
	if s.firstByteTimeout <= 0 {
		s.firstByteTimeout = proxy.DefaultFirstByteTimeout
	}
	if s.maxPerReplica <= 0 {
		s.maxPerReplica = DefaultMaxInFlightPerReplica
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
	streams := opts.MaxExchangesPerConnection
	if streams <= 0 {
		streams = DefaultMaxExchangesPerConnection
	}
	srvOpts := []grpc.ServerOption{grpc.MaxRecvMsgSize(int(min(s.maxBody, 1<<30)) + 1<<20),
		grpc.MaxConcurrentStreams(uint32(min(streams, math.MaxUint32)))}
	if opts.TLS != nil {
		srvOpts = append(srvOpts, grpc.Creds(credentials.NewTLS(opts.TLS)))
	}
	if opts.Token != "" {
		srvOpts = append(srvOpts, grpc.StreamInterceptor(tokenCheck(opts.Token)))
	}
	s.grpc = grpc.NewServer(srvOpts...)
	extprocv3.RegisterExternalProcessorServer(s.grpc, s)
	s.health = grpchealth.NewServer()
	healthpb.RegisterHealthServer(s.grpc, s.health)
	s.health.SetServingStatus(ServiceLiveness, healthpb.HealthCheckResponse_SERVING)
	s.updateHealth()
	return s, nil
}

// Serve serves the ext_proc and health services on ln until Shutdown,
// keeping the health status in step with the replicas and dispatching and
// expiring held requests (FlowInterval) meanwhile.
func (s *Server) Serve(ln net.Listener) error {
	ctx, cancel := context.WithCancel(context.Background())
	s.mu.Lock()
	s.stop = cancel
	s.mu.Unlock()
	var wg sync.WaitGroup
	wg.Go(func() { s.watchHealth(ctx) })
	wg.Go(func() { s.watchQueue(ctx) })
	err := s.grpc.Serve(ln)
	cancel()
	wg.Wait()
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// Shutdown reports NOT_SERVING, answers the requests flow control holds
// 503 (and any that would be held from now on), stops accepting and waits
// for the open ext_proc streams (requests still streaming) to end; when
// ctx ends first it closes them (their reservations are released as
// cancelled).
func (s *Server) Shutdown(ctx context.Context) error {
	s.health.Shutdown()
	s.mu.Lock()
	if s.stop != nil {
		s.stop()
	}
	s.mu.Unlock()
	s.drain()
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
	every(ctx, HealthInterval, s.updateHealth)
}

// every runs f every d until ctx ends: the body of the picker's
// background loops, which its Serve starts and its ctx stops.
func every(ctx context.Context, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}

// Gate returns the flow control gate (its queues' statistics).
func (s *Server) Gate() *admission.Gate { return s.gate }

// errExpired and errShutdown are the tickets of held requests that no
// replica will take: they waited max_queue_time, or the picker shuts down.
var (
	errExpired  = errors.New("epp: waited flow_control.max_queue_time")
	errShutdown = errors.New("epp: shutting down")
)

// deliver hands a held request its ticket: its exchange waits on the
// channel (size 1) in its Payload. The gate hands out one ticket per held
// request (dispatched by Pump, expired or drained), so this never blocks.
func deliver(t admission.Ticket) {
	t.Request.Payload.(chan admission.Ticket) <- t
}

// pump dispatches held requests while their replicas have room; it runs
// after every release and every FlowInterval.
func (s *Server) pump() {
	for _, t := range s.gate.Pump(s.now()) {
		deliver(t)
	}
}

// watchQueue answers the requests that waited max_queue_time and
// dispatches held ones every FlowInterval until ctx ends.
func (s *Server) watchQueue(ctx context.Context) {
	every(ctx, FlowInterval, func() {
		for _, r := range s.gate.Expire(s.now()) {
			deliver(admission.Ticket{Request: r, Err: errExpired})
		}
		s.pump()
	})
}

// drain takes every held request out of the queue and answers it 503.
// draining is set first: an exchange admitted to the queue afterwards sees
// it and leaves by itself (exchange.wait), so none waits for a dispatch
// that will not come.
func (s *Server) drain() {
	s.draining.Store(true)
	for _, r := range s.gate.Drain() {
		deliver(admission.Ticket{Request: r, Err: errShutdown})
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

// tokenCheck refuses ext_proc streams that do not present token as
// "authorization: Bearer <token>" metadata; other services pass.
func tokenCheck(token string) grpc.StreamServerInterceptor {
	want := sha256.Sum256([]byte("Bearer " + token))
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if strings.HasPrefix(info.FullMethod, "/envoy.service.ext_proc.") {
			md, _ := metadata.FromIncomingContext(ss.Context())
			var got [sha256.Size]byte
			if v := md.Get("authorization"); len(v) == 1 {
				got = sha256.Sum256([]byte(v[0]))
			}
			if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
				return status.Error(codes.Unauthenticated, "epp: missing or wrong authorization token")
			}
		}
		return handler(srv, ss)
	}
}

// Process implements the ext_proc service: one stream is one HTTP request.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	x := &exchange{s: s, stream: stream, start: s.now()}
	defer x.end()
	return x.run()
}

// countPick counts one more exchange routed to replica.
func (s *Server) countPick(replica string) {
	s.picksMu.Lock()
	s.picks[replica]++
	s.picksMu.Unlock()
}

// uncountPick counts one exchange routed to replica fewer.
func (s *Server) uncountPick(replica string) {
	s.picksMu.Lock()
	if s.picks[replica]--; s.picks[replica] <= 0 {
		delete(s.picks, replica)
	}
	s.picksMu.Unlock()
}

// atCap lists the replicas with MaxInFlightPerReplica exchanges routed to
// them and not released (not to be picked).
func (s *Server) atCap() []string {
	s.picksMu.Lock()
	defer s.picksMu.Unlock()
	var out []string
	for name, n := range s.picks {
		if n >= s.maxPerReplica {
			out = append(out, name)
		}
	}
	return out
}

// PicksInFlight reports how many exchanges this picker routed to replica
// and has not released yet (what MaxInFlightPerReplica bounds).
func (s *Server) PicksInFlight(replica string) int {
	s.picksMu.Lock()
	defer s.picksMu.Unlock()
	return s.picks[replica]
}

type nopRecorder struct{}

func (nopRecorder) Request(string, balancer.Reason, int) {}
func (nopRecorder) FirstByte(string, time.Duration)      {}
func (nopRecorder) StreamError(string)                   {}
func (nopRecorder) Failover(string)                      {}
