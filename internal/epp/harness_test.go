package epp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/epp"
	"github.com/llmlb/llmlb/internal/request"
	"github.com/llmlb/llmlb/internal/simreplica"
)

// TestHarnessRoutesEveryModeEndToEnd: in every body mode, with and without
// a subset, streamed or not, ending by end_of_stream or trailers, each
// request gets exactly one endpoint that is a replica (of the subset), the
// replica answers it, and the reservations are back to 0 after each one.
func TestHarnessRoutesEveryModeEndToEnd(t *testing.T) {
	r := startRig(t, 4)
	all := r.addrs()
	cases := []struct {
		name     string
		c        call
		trailers bool
	}{
		{"full duplex, chat", call{mode: fullDuplex, body: chatBody("sim-model", "a", 1, false)}, false},
		{"full duplex, stream", call{mode: fullDuplex, body: chatBody("sim-model", "b", 1, true), chunks: 7}, false},
		{"full duplex, stream ends with trailers", call{mode: fullDuplex, body: chatBody("sim-model", "c", 1, true)}, true},
		{"full duplex, request body ended by trailers", call{mode: fullDuplex, body: chatBody("sim-model", "t", 1, false), reqTrailers: true}, false},
		{"full duplex, subset of two", call{mode: fullDuplex, body: chatBody("sim-model", "d", 1, true), subset: all[2:]}, false},
		{"full duplex, subset with unknown endpoints too", call{mode: fullDuplex, body: chatBody("sim-model", "e", 1, false),
			subset: []string{"10.9.9.9:8000", all[1]}}, false},
		{"no protocol_config: full duplex assumed", call{mode: fullDuplex, noProto: true, body: chatBody("sim-model", "f", 1, true)}, false},
		{"buffered, chat", call{mode: buffered, body: chatBody("sim-model", "g", 1, false)}, false},
		{"buffered, stream, subset of one", call{mode: buffered, body: chatBody("sim-model", "h", 1, true), subset: all[:1]}, false},
		{"completions", call{mode: fullDuplex, path: "/v1/completions", body: []byte(`{"model":"sim-model","prompt":"hello","max_tokens":4}`)}, false},
		{"GET without body", call{mode: fullDuplex, method: http.MethodGet, path: "/v1/files"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, code, body, err := r.do(context.Background(), r.conn, tc.c, tc.trailers)
			if err != nil {
				t.Fatal(err)
			}
			if p.immediate != nil {
				t.Fatalf("immediate response %d: %s", code, body)
			}
			if tc.c.method == "" && code != http.StatusOK {
				t.Fatalf("replica answered %d: %s", code, body)
			}
			if tc.c.subset != nil && !strings.Contains(strings.Join(tc.c.subset, ","), p.endpoint) {
				t.Fatalf("endpoint %s outside the subset", p.endpoint)
			}
			if n := r.inFlight(); n != 0 {
				t.Fatalf("in flight after the response: %d", n)
			}
		})
	}
	r.settle(t)
}

// TestHarnessConcurrentLoadReleasesEverything: many exchanges at once on
// one connection (as Envoy multiplexes them), then nothing reserved and no
// handler left.
func TestHarnessConcurrentLoadReleasesEverything(t *testing.T) {
	r := startRig(t, 3)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	seen := make([]map[string]int, 8)
	for w := range 8 {
		seen[w] = map[string]int{}
		wg.Go(func() {
			for i := range 8 {
				mode := fullDuplex
				if i%2 == 1 {
					mode = buffered
				}
				c := call{mode: mode, body: chatBody("sim-model", fmt.Sprintf("w%d-%d", w, i), 1, i%3 != 0)}
				p, code, _, err := r.do(context.Background(), r.conn, c, i%4 == 0)
				if err == nil && code != http.StatusOK {
					err = fmt.Errorf("status %d", code)
				}
				if err != nil {
					errs <- err
					return
				}
				seen[w][p.endpoint]++
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	r.settle(t)
	used := map[string]bool{}
	for _, m := range seen {
		for ep := range m {
			used[ep] = true
		}
	}
	if len(used) < 2 {
		t.Errorf("64 concurrent requests all went to %v: the load was not spread", used)
	}
	// The admin listener counts them as serve does.
	resp, err := http.Get("http://" + r.srv.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, want := range []string{`llmlb_requests_total{code="200"`, "llmlb_time_to_first_byte_seconds_count", "llmlb_request_duration_seconds_count"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics has no %s", want)
		}
	}
}

// TestHarnessSessionsStick: a session's turns go to the same replica, in
// both body modes, whatever else is going on.
func TestHarnessSessionsStick(t *testing.T) {
	r := startRig(t, 4)
	for _, mode := range []struct {
		name string
		m    call
	}{{"full duplex", call{mode: fullDuplex}}, {"buffered", call{mode: buffered}}} {
		t.Run(mode.name, func(t *testing.T) {
			for s := range 4 {
				session := fmt.Sprintf("%s-session-%d", mode.name, s)
				first := ""
				for turn := 1; turn <= 4; turn++ {
					c := mode.m
					c.header = map[string]string{"x-session-id": session}
					c.body = chatBody("sim-model", session, turn, turn%2 == 0)
					p, code, _, err := r.do(context.Background(), r.conn, c, false)
					if err != nil || code != http.StatusOK {
						t.Fatalf("%s turn %d: %d %v", session, turn, code, err)
					}
					if first == "" {
						first = p.endpoint
					} else if p.endpoint != first {
						t.Fatalf("%s turn %d went to %s, its earlier turns to %s", session, turn, p.endpoint, first)
					}
				}
			}
		})
	}
	r.settle(t)
}

// TestHarnessDeadPodIsEjectedAndNeverPicked: a replica that refuses
// connections fails its requests (the gateway's own 503) and its scrapes,
// is ejected, and is then never picked, with or without a subset naming it.
func TestHarnessDeadPodIsEjectedAndNeverPicked(t *testing.T) {
	r := startRig(t, 3)
	dead := r.fleet.Replicas[0]
	if err := dead.SetFault(simreplica.Fault{Mode: simreplica.Refuse}); err != nil {
		t.Fatal(err)
	}
	// Until it is ejected some requests may still be sent there: the
	// gateway answers them 503 and the picker counts that.
	for i := 0; r.state(dead.Name()) != "EJECTED"; i++ {
		c := call{mode: fullDuplex, body: chatBody("sim-model", fmt.Sprintf("pre-%d", i), 1, false)}
		if _, _, _, err := r.do(context.Background(), r.conn, c, false); err != nil {
			t.Fatal(err)
		}
		if i > 2000 {
			t.Fatal("the refusing replica was never ejected")
		}
	}
	for i := range 40 {
		c := call{mode: fullDuplex, body: chatBody("sim-model", fmt.Sprintf("post-%d", i), 1, i%2 == 0)}
		if i%3 == 0 {
			c.subset = r.addrs() // the gateway still lists it
		}
		p, code, _, err := r.do(context.Background(), r.conn, c, false)
		if err != nil {
			t.Fatal(err)
		}
		if p.endpoint == dead.Addr() {
			t.Fatalf("request %d went to the ejected replica", i)
		}
		if code != http.StatusOK {
			t.Fatalf("request %d: %d", i, code)
		}
	}
	// A subset holding only the dead pod: no eligible endpoint.
	c := call{mode: fullDuplex, body: chatBody("sim-model", "only-dead", 1, false), subset: []string{dead.Addr()}}
	p, code, body, err := r.do(context.Background(), r.conn, c, false)
	if err != nil {
		t.Fatal(err)
	}
	if p.immediate == nil || code != http.StatusServiceUnavailable || !strings.Contains(string(body), "no_healthy_instances") {
		t.Fatalf("subset of the dead pod: want a 503 immediate response, got %d %s (endpoint %q)", code, body, p.endpoint)
	}
	r.settle(t)
}

// TestHarnessCancelsAndBreaksRelease: a client that goes away (the
// gateway cancels the stream) or a broken gRPC connection, at any phase,
// releases the reservation once and leaves no handler running.
func TestHarnessCancelsAndBreaksRelease(t *testing.T) {
	r := startRig(t, 2)
	phases := []string{"mid-request-body", "after-pick", "after-response-headers", "mid-response-body"}
	for _, phase := range phases {
		for _, how := range []string{"cancel", "break"} {
			t.Run(phase+"/"+how, func(t *testing.T) {
				conn := r.conn
				if how == "break" {
					conn = r.dial(t)
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				stop := func() {
					if how == "cancel" {
						cancel()
					} else {
						_ = conn.Close()
					}
				}
				st, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
				if err != nil {
					t.Fatal(err)
				}
				body := chatBody("sim-model", "cancel-"+phase, 1, true)
				e := &envoy{stream: st, c: call{mode: fullDuplex, body: body}}
				if phase == "mid-request-body" {
					e.c.body = body[:len(body)/2] // sent, but never its end
					_ = st.Send(headersOnly(e.c))
					_ = st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
						RequestBody: &extprocv3.HttpBody{Body: e.c.body}}})
					stop()
					r.settle(t)
					return
				}
				p, err := e.request()
				if err != nil {
					t.Fatal(err)
				}
				if r.inFlight() != 1 {
					t.Fatalf("in flight after the pick: %d, want 1", r.inFlight())
				}
				if phase != "after-pick" {
					_ = st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
						ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerMap(map[string]string{":status": "200", "content-type": "text/event-stream"})}}})
					if _, err := st.Recv(); err != nil {
						t.Fatal(err)
					}
				}
				if phase == "mid-response-body" {
					_ = st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
						ResponseBody: &extprocv3.HttpBody{Body: []byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")}}})
					if _, err := st.Recv(); err != nil {
						t.Fatal(err)
					}
				}
				_ = p
				stop()
				r.settle(t)
			})
		}
	}
	// The replicas said nothing wrong: cancels are no health signal.
	for _, rep := range r.fleet.Replicas {
		if s := r.state(rep.Name()); s != "LIVE" {
			t.Errorf("%s is %s after client cancels", rep.Name(), s)
		}
	}
}

func headersOnly(c call) *extprocv3.ProcessingRequest {
	h := map[string]string{":method": http.MethodPost, ":path": "/v1/chat/completions", "content-type": "application/json"}
	return &extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: c.mode, ResponseBodyMode: c.mode},
		Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: headerMap(h)}},
	}
}

// TestHarnessImmediateAnswers: what the picker answers itself, in serve's
// OpenAI error shape and status, with nothing reserved.
func TestHarnessImmediateAnswers(t *testing.T) {
	r := startRig(t, 2)
	cases := []struct {
		name string
		c    call
		code int
		want string // in the body
	}{
		{"malformed JSON", call{mode: fullDuplex, body: []byte(`{"model":`)}, 400, `"invalid_request"`},
		{"malformed JSON, buffered", call{mode: buffered, body: []byte(`[1,2`)}, 400, `"invalid_request"`},
		{"no model", call{mode: fullDuplex, body: []byte(`{"messages":[]}`)}, 400, `"invalid_request"`},
		{"unknown model", call{mode: fullDuplex, body: chatBody("no-such-model", "x", 1, false)}, 404, `"model_not_found"`},
		{"too large", call{mode: fullDuplex, body: []byte(`{"model":"sim-model","prompt":"` + strings.Repeat("a", 2<<20) + `"}`), chunks: 64}, 413, `"request_too_large"`},
		{"too large, buffered in one message", call{mode: buffered, body: []byte(`{"model":"sim-model","prompt":"` + strings.Repeat("a", 3<<19) + `"}`)}, 413, `"request_too_large"`},
		{"empty subset", call{mode: fullDuplex, body: chatBody("sim-model", "x", 1, false), subset: []string{}}, 503, `"no_healthy_instances"`},
		{"subset of strangers", call{mode: buffered, body: chatBody("sim-model", "x", 1, false), subset: []string{"10.1.1.1:8000", "garbage"}}, 503, `"no_healthy_instances"`},
		{"path traversal", call{mode: fullDuplex, path: "/v1/%2e%2e/metrics", body: []byte(`{}`)}, 400, `"invalid_path"`},
		{"not /v1/", call{mode: fullDuplex, path: "/metrics", method: http.MethodGet}, 404, `"not_found"`},
		{"models", call{mode: fullDuplex, path: "/v1/models", method: http.MethodGet}, 200, `"sim-model"`},
		{"one model", call{mode: fullDuplex, path: "/v1/models/nope", method: http.MethodGet}, 404, `"model_not_found"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, code, body, err := r.do(context.Background(), r.conn, tc.c, false)
			if err != nil {
				t.Fatal(err)
			}
			if p.immediate == nil || code != tc.code || !strings.Contains(string(body), tc.want) {
				t.Fatalf("got %d %q (endpoint %q), want an immediate %d with %s", code, body, p.endpoint, tc.code, tc.want)
			}
			if tc.code != 200 {
				var e struct {
					Error struct{ Message, Type, Code string }
				}
				if json.Unmarshal(body, &e) != nil || e.Error.Message == "" || e.Error.Type == "" || e.Error.Code == "" {
					t.Fatalf("not OpenAI's error shape: %s", body)
				}
			}
			if r.inFlight() != 0 {
				t.Fatal("an immediate answer left a reservation")
			}
		})
	}
	r.settle(t)
}

// TestHarnessGRPCHealth: SERVING while a replica is LIVE, NOT_SERVING
// when none is; liveness stays SERVING.
func TestHarnessGRPCHealth(t *testing.T) {
	r := startRig(t, 1)
	hc := healthpb.NewHealthClient(r.conn)
	status := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetStatus()
	}
	r.waitFor(t, "SERVING", func() bool { return status("") == healthpb.HealthCheckResponse_SERVING })
	if s := status("envoy.service.ext_proc.v3.ExternalProcessor"); s != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("ext_proc service: %v", s)
	}
	if err := r.fleet.Replicas[0].SetFault(simreplica.Fault{Mode: simreplica.Refuse}); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, "NOT_SERVING with no LIVE replica", func() bool { return status("") == healthpb.HealthCheckResponse_NOT_SERVING })
	if s := status("liveness"); s != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("liveness: %v", s)
	}
}

// newCore returns a routing core on cfg with n replicas r0, r1, ... at
// 10.0.0.1:8000, 10.0.0.2:8000, ... serving model. scrape, when set, gives
// replica i its first scrape (which makes it LIVE); nil leaves them
// unscraped.
func newCore(t testing.TB, cfg balancer.Config, n int, model string, scrape func(i int) balancer.Snapshot) *balancer.Balancer {
	t.Helper()
	bal, err := balancer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i := range n {
		name := fmt.Sprintf("r%d", i)
		if err := bal.AddReplica(balancer.ReplicaSpec{Name: name, URL: fmt.Sprintf("http://10.0.0.%d:8000", i+1), Models: []string{model}}, now); err != nil {
			t.Fatal(err)
		}
		if scrape != nil {
			bal.ObserveScrape(name, scrape(i), nil, now)
		}
	}
	return bal
}

// idle is a first scrape that reports nothing running.
func idle(int) balancer.Snapshot { return balancer.Snapshot{} }

// coreWith returns a routing core with n LIVE replicas at 10.0.0.i:8000.
func coreWith(t testing.TB, n int) *balancer.Balancer {
	t.Helper()
	return newCore(t, balancer.DefaultConfig(), n, "m", idle)
}

// picker is an epp.Server serving gRPC on a loopback listener in front of
// a routing core, with one cleartext client connection to it (the
// gateway's). It is shut down when the test ends, unless stop or close
// did it first.
type picker struct {
	bal    *balancer.Balancer
	srv    *epp.Server // nil when serving a stub
	addr   string
	conn   *grpc.ClientConn
	client extprocv3.ExternalProcessorClient

	served   chan error
	shutdown func(context.Context) error
	once     sync.Once
	stopErr  error // Shutdown's
	serveErr error // Serve's
}

// pickerOption changes how startPicker serves and connects.
type pickerOption func(*pickerSetup)

type pickerSetup struct {
	dial []grpc.DialOption
	stub extprocv3.ExternalProcessorServer
}

// withDialOptions adds options to the client connection's (after its
// cleartext credentials, which they may replace).
func withDialOptions(o ...grpc.DialOption) pickerOption {
	return func(s *pickerSetup) { s.dial = append(s.dial, o...) }
}

// servingStub serves stub on the listener instead of an epp.Server (what
// the transport alone costs).
func servingStub(stub extprocv3.ExternalProcessorServer) pickerOption {
	return func(s *pickerSetup) { s.stub = stub }
}

// startPicker serves epp.New(opts) on a loopback listener and dials it.
// What differs between tests goes in opts (TLS, Token, FlowControl,
// timeouts and limits); a nil opts.Balancer is a core with no replicas,
// and a zero opts.Request is request.DefaultConfig().
func startPicker(t testing.TB, opts epp.Options, more ...pickerOption) *picker {
	t.Helper()
	var setup pickerSetup
	for _, o := range more {
		o(&setup)
	}
	if opts.Balancer == nil {
		bal, err := balancer.New(balancer.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		opts.Balancer = bal
	}
	if reflect.ValueOf(opts.Request).IsZero() {
		opts.Request = request.DefaultConfig()
	}
	p := &picker{bal: opts.Balancer, served: make(chan error, 1)}
	var serve func(net.Listener) error
	if setup.stub != nil {
		gs := grpc.NewServer()
		extprocv3.RegisterExternalProcessorServer(gs, setup.stub)
		serve = gs.Serve
		p.shutdown = func(context.Context) error { gs.Stop(); return nil }
	} else {
		srv, err := epp.New(opts)
		if err != nil {
			t.Fatal(err)
		}
		p.srv, serve, p.shutdown = srv, srv.Serve, srv.Shutdown
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	go func() { p.served <- serve(ln) }()
	p.conn = dialLoopback(t, p.addr, setup.dial...)
	p.client = extprocv3.NewExternalProcessorClient(p.conn)
	t.Cleanup(func() { _ = p.close() })
	return p
}

// dialLoopback opens a cleartext client connection to addr; opts come
// after the credentials and may replace them.
func dialLoopback(t testing.TB, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// dial opens another client connection to the picker (another gateway
// connection), closed when the test ends.
func (p *picker) dial(t testing.TB, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn := dialLoopback(t, p.addr, opts...)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// stop shuts the server down with ctx and waits for Serve to return; it
// leaves the client connection open. Later calls return the first's
// errors.
func (p *picker) stop(ctx context.Context) (shutdownErr, serveErr error) {
	p.once.Do(func() {
		p.stopErr = p.shutdown(ctx)
		p.serveErr = <-p.served
	})
	return p.stopErr, p.serveErr
}

// close closes the client connection, then stops the server (giving
// open exchanges 10 s); it returns Serve's error.
func (p *picker) close() error {
	_ = p.conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := p.stop(ctx)
	return err
}

// open starts an exchange that lives until the test ends (or ctx does).
func (p *picker) open(t *testing.T, ctx context.Context) extprocv3.ExternalProcessor_ProcessClient {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	st, err := p.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}
