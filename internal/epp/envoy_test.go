package epp_test

// The harness: a fleet of simulated replicas, `llmlb epp` in process (serve's
// server with the ext_proc frontend, real scraping and health), and a Go
// client that plays Envoy's side of the ext_proc stream and then forwards
// the request over HTTP to the endpoint it was given, feeding the response
// back through the stream as Envoy does.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/epp"
	"github.com/llmlb/llmlb/internal/server"
	"github.com/llmlb/llmlb/internal/simreplica"
)

const (
	fullDuplex = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	buffered   = filterv3.ProcessingMode_BUFFERED
)

// rig is one running epp with its fleet.
type rig struct {
	fleet *simreplica.Fleet
	srv   *server.Server
	addr  string          // the gRPC listener
	eps   map[string]bool // every replica's ip:port
	conn  *grpc.ClientConn
}

// startRig runs n simulated replicas and `llmlb epp` in front of them and
// waits until every replica is LIVE (their first scrapes).
func startRig(t *testing.T, n int) *rig {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	fleet, err := simreplica.StartFleet(ctx, simreplica.FleetOptions{Replicas: n, Model: "sim-model", Seed: 1})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Scrape.Interval = 50 * time.Millisecond
	cfg.Server.ShutdownTimeout = 5 * time.Second
	r := &rig{fleet: fleet, eps: map[string]bool{}}
	for _, rep := range fleet.Replicas {
		cfg.Replicas = append(cfg.Replicas, config.Replica{Name: rep.Name(), URL: rep.URL()})
		r.eps[rep.Addr()] = true
	}
	srv, err := server.New(cfg, nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	f, err := epp.New(epp.Options{
		Balancer: srv.Balancer(), Request: srv.RequestConfig(), MaxBodyBytes: 1 << 20,
		RouteHeaders: true, Metrics: srv.Recorder(), Completion: srv.Metrics().Completion,
		Decisions: srv.Dashboard().Decision, Transitions: srv.Transitions,
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	srv.UseFrontend(f)
	grpcLn, _ := net.Listen("tcp", "127.0.0.1:0")
	adminLn, _ := net.Listen("tcp", "127.0.0.1:0")
	srv.UseListeners(grpcLn, adminLn)
	r.srv, r.addr = srv, grpcLn.Addr().String()
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	r.conn = r.dial(t)
	t.Cleanup(func() {
		_ = r.conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
		_ = fleet.Close()
	})
	r.waitFor(t, "every replica LIVE", func() bool {
		for _, st := range srv.Balancer().Replicas(time.Now()) {
			if st.State != "LIVE" {
				return false
			}
		}
		return true
	})
	return r
}

func (r *rig) dial(t *testing.T) *grpc.ClientConn {
	t.Helper()
	return dialLoopback(t, r.addr)
}

// waitFor polls cond until it holds; it fails the test after a generous
// bound (a hang, not a timing assertion).
func (r *rig) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// inFlight sums the balancer's in-flight reservations.
func (r *rig) inFlight() int {
	n := 0
	for _, st := range r.srv.Balancer().Replicas(time.Now()) {
		n += st.InFlight
	}
	return n
}

// openExchanges counts the epp's ext_proc handlers still running.
func openExchanges() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "epp.(*Server).Process(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// settle waits until no reservation and no exchange is left.
func (r *rig) settle(t *testing.T) {
	t.Helper()
	r.waitFor(t, "reservations back to 0 and every exchange ended", func() bool {
		return r.inFlight() == 0 && openExchanges() == 0
	})
}

// call is one HTTP request as the gateway sees it.
type call struct {
	mode    filterv3.ProcessingMode_BodySendMode
	method  string // default POST
	path    string // default /v1/chat/completions
	header  map[string]string
	body    []byte
	chunks  int      // request body chunks in full-duplex mode (default 3)
	subset  []string // nil: no subset hint
	noProto bool     // send no protocol_config (older gateways)
	// reqTrailers ends the request body with trailers instead of
	// end_of_stream (full duplex).
	reqTrailers bool
}

// picked is the picker's answer to the request phase.
type picked struct {
	endpoint  string
	immediate *extprocv3.ImmediateResponse
	body      []byte // the request body as the gateway would forward it
}

// envoy plays the gateway's side of one ext_proc stream.
type envoy struct {
	stream extprocv3.ExternalProcessor_ProcessClient
	c      call
}

func chatBody(model, session string, turn int, stream bool) []byte {
	s := fmt.Sprintf(`{"model":%q,"max_tokens":8,"stream":%v,"messages":[{"role":"system","content":"You are a careful agent working on repository %s."},{"role":"user","content":"turn %d"}]}`,
		model, stream, session, turn)
	return []byte(s)
}

func headerMap(h map[string]string) *corev3.HeaderMap {
	hm := &corev3.HeaderMap{}
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(h[k])})
	}
	return hm
}

// request runs the request phase: headers, body, and the picker's answers.
func (e *envoy) request() (picked, error) {
	c := e.c
	if c.method == "" {
		c.method = http.MethodPost
	}
	if c.path == "" {
		c.path = "/v1/chat/completions"
	}
	if c.chunks <= 0 {
		c.chunks = 3
	}
	h := map[string]string{":method": c.method, ":path": c.path, ":scheme": "http", ":authority": "gateway", "content-type": "application/json"}
	for k, v := range c.header {
		h[k] = v
	}
	first := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: headerMap(h), EndOfStream: len(c.body) == 0}}}
	if !c.noProto {
		first.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: c.mode, ResponseBodyMode: c.mode}
	}
	if c.subset != nil {
		vals := make([]*structpb.Value, 0, len(c.subset))
		for _, s := range c.subset {
			vals = append(vals, structpb.NewStringValue(s))
		}
		first.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			epp.SubsetNamespace: {Fields: map[string]*structpb.Value{epp.SubsetKey: structpb.NewListValue(&structpb.ListValue{Values: vals})}},
		}}
	}
	if err := e.stream.Send(first); err != nil {
		return picked{}, err
	}
	var out picked
	if len(c.body) == 0 {
		return e.headersAnswer(&out)
	}
	if c.mode == buffered {
		resp, err := e.stream.Recv()
		if err != nil {
			return out, err
		}
		if im := resp.GetImmediateResponse(); im != nil {
			out.immediate = im
			return out, nil
		}
		if resp.GetRequestHeaders() == nil {
			return out, fmt.Errorf("buffered: want the headers' answer first, got %T", resp.GetResponse())
		}
		if len(resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders()) != 0 {
			return out, errors.New("buffered: the headers' answer must not route (the body is not read yet)")
		}
		if err := e.stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: c.body, EndOfStream: true}}}); err != nil {
			return out, err
		}
		resp, err = e.stream.Recv()
		if err != nil {
			return out, err
		}
		if im := resp.GetImmediateResponse(); im != nil {
			out.immediate = im
			return out, nil
		}
		rb := resp.GetRequestBody()
		if rb == nil {
			return out, fmt.Errorf("buffered: want the body's answer, got %T", resp.GetResponse())
		}
		if rb.GetResponse().GetBodyMutation() != nil {
			return out, errors.New("buffered: the body must pass unchanged")
		}
		out.body = c.body
		out.endpoint, err = endpointOf(rb.GetResponse().GetHeaderMutation(), resp.GetDynamicMetadata())
		return out, err
	}
	// Full duplex: the body in chunks, then the held headers' answer and
	// the body back.
	size := (len(c.body) + c.chunks - 1) / c.chunks
	for off := 0; off < len(c.body); off += size {
		end := min(off+size, len(c.body))
		err := e.stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: c.body[off:end], EndOfStream: end == len(c.body) && !c.reqTrailers}}})
		if err == io.EOF {
			break // the picker answered early (an immediate response): read it
		}
		if err != nil {
			return out, err
		}
	}
	if c.reqTrailers {
		if err := e.stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
			RequestTrailers: &extprocv3.HttpTrailers{}}}); err != nil && err != io.EOF {
			return out, err
		}
	}
	if _, err := e.headersAnswer(&out); err != nil || out.immediate != nil {
		return out, err
	}
	for {
		resp, err := e.stream.Recv()
		if err != nil {
			return out, err
		}
		if resp.GetRequestTrailers() != nil && c.reqTrailers {
			break // the body was ended by the trailers' answer
		}
		sb := resp.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sb == nil {
			return out, fmt.Errorf("full duplex: want streamed body answers, got %v", resp)
		}
		out.body = append(out.body, sb.GetBody()...)
		if sb.GetEndOfStream() {
			if c.reqTrailers {
				return out, errors.New("full duplex: a body ended by trailers came back with end_of_stream")
			}
			break
		}
	}
	if !bytes.Equal(out.body, c.body) {
		return out, errors.New("full duplex: the body came back changed")
	}
	return out, nil
}

// headersAnswer reads the answer to the request headers that routes.
func (e *envoy) headersAnswer(out *picked) (picked, error) {
	resp, err := e.stream.Recv()
	if err != nil {
		return *out, err
	}
	if im := resp.GetImmediateResponse(); im != nil {
		out.immediate = im
		return *out, nil
	}
	rh := resp.GetRequestHeaders()
	if rh == nil {
		return *out, fmt.Errorf("want the headers' answer, got %T", resp.GetResponse())
	}
	out.endpoint, err = endpointOf(rh.GetResponse().GetHeaderMutation(), resp.GetDynamicMetadata())
	return *out, err
}

// endpointOf checks that the header and the envoy.lb metadata name one
// and the same endpoint, overwriting any client value.
func endpointOf(mut *extprocv3.HeaderMutation, md *structpb.Struct) (string, error) {
	var hdr []string
	for _, h := range mut.GetSetHeaders() {
		if h.GetHeader().GetKey() == epp.HeaderDestination {
			if h.GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
				return "", errors.New("the endpoint header must overwrite a client's")
			}
			hdr = append(hdr, string(h.GetHeader().GetRawValue()))
		}
	}
	meta := md.GetFields()[epp.MetadataNamespace].GetStructValue().GetFields()[epp.MetadataDestination].GetStringValue()
	if len(hdr) != 1 || hdr[0] != meta || meta == "" {
		return "", fmt.Errorf("endpoint header %q and metadata %q disagree", hdr, meta)
	}
	return meta, nil
}

// relay forwards the request to the endpoint as the gateway would and
// passes the response through the stream: headers, body chunks as they
// arrive, then the end (end_of_stream or trailers). It returns the status
// and the body the client would get.
func (e *envoy) relay(ctx context.Context, p picked, trailers bool) (int, []byte, error) {
	c := e.c
	if c.method == "" {
		c.method = http.MethodPost
	}
	if c.path == "" {
		c.path = "/v1/chat/completions"
	}
	status, ctype := 0, ""
	var resp *http.Response
	req, err := http.NewRequestWithContext(ctx, c.method, "http://"+p.endpoint+c.path, bytes.NewReader(p.body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range c.header {
		req.Header.Set(k, v)
	}
	resp, err = http.DefaultTransport.RoundTrip(req)
	if err != nil {
		// Envoy answers a refused upstream with its own 503, which the
		// ext_proc filter sees as the response.
		status, ctype = http.StatusServiceUnavailable, "text/plain"
	} else {
		defer resp.Body.Close()
		status, ctype = resp.StatusCode, resp.Header.Get("Content-Type")
	}
	h := map[string]string{":status": strconv.Itoa(status), "content-type": ctype}
	if err := e.stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerMap(h)}}}); err != nil {
		return 0, nil, err
	}
	ans, err := e.stream.Recv()
	if err != nil {
		return 0, nil, err
	}
	if ans.GetResponseHeaders() == nil {
		return 0, nil, fmt.Errorf("want the response headers' answer, got %T", ans.GetResponse())
	}
	var body []byte
	if resp != nil {
		buf := make([]byte, 4096)
		for {
			n, rerr := resp.Body.Read(buf)
			if n > 0 {
				if err := e.stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
					ResponseBody: &extprocv3.HttpBody{Body: slices.Clone(buf[:n])}}}); err != nil {
					return 0, nil, err
				}
				got, err := e.responseBody()
				if err != nil {
					return 0, nil, err
				}
				if e.c.mode != fullDuplex {
					got = slices.Clone(buf[:n]) // passed on unchanged by the gateway
				}
				if !bytes.Equal(got, buf[:n]) {
					return 0, nil, errors.New("a response chunk came back changed")
				}
				body = append(body, got...)
			}
			if rerr == io.EOF {
				break
			}
			if rerr != nil {
				return 0, nil, rerr
			}
		}
	}
	if trailers {
		if err := e.stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
			ResponseTrailers: &extprocv3.HttpTrailers{}}}); err != nil {
			return 0, nil, err
		}
		if ans, err := e.stream.Recv(); err != nil || ans.GetResponseTrailers() == nil {
			return 0, nil, fmt.Errorf("want the trailers' answer: %v %v", ans, err)
		}
	} else {
		if err := e.stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
			ResponseBody: &extprocv3.HttpBody{EndOfStream: true}}}); err != nil {
			return 0, nil, err
		}
		if _, err := e.responseBody(); err != nil {
			return 0, nil, err
		}
	}
	if err := e.stream.CloseSend(); err != nil {
		return 0, nil, err
	}
	if _, err := e.stream.Recv(); err != io.EOF {
		return 0, nil, fmt.Errorf("want the stream's end, got %v", err)
	}
	return status, body, nil
}

// responseBody reads one answer to a response body chunk: the chunk itself
// in full duplex, an empty answer otherwise.
func (e *envoy) responseBody() ([]byte, error) {
	ans, err := e.stream.Recv()
	if err != nil {
		return nil, err
	}
	rb := ans.GetResponseBody()
	if rb == nil {
		return nil, fmt.Errorf("want a response body answer, got %T", ans.GetResponse())
	}
	if e.c.mode != fullDuplex {
		if rb.GetResponse().GetBodyMutation() != nil {
			return nil, errors.New("non-duplex: the response body must pass unchanged")
		}
		return nil, nil
	}
	return rb.GetResponse().GetBodyMutation().GetStreamedResponse().GetBody(), nil
}

// do runs one whole request: returns the endpoint, the status and body the
// client gets (an immediate response's when the picker answered itself).
func (r *rig) do(ctx context.Context, conn *grpc.ClientConn, c call, trailers bool) (picked, int, []byte, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // a failed exchange ends as Envoy's would: the stream is reset
	st, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		return picked{}, 0, nil, err
	}
	e := &envoy{stream: st, c: c}
	p, err := e.request()
	if err != nil {
		return p, 0, nil, err
	}
	if p.immediate != nil {
		if _, err := st.Recv(); err != io.EOF {
			return p, 0, nil, fmt.Errorf("after an immediate response the stream must end, got %v", err)
		}
		return p, int(p.immediate.GetStatus().GetCode()), p.immediate.GetBody(), nil
	}
	if !r.eps[p.endpoint] {
		return p, 0, nil, fmt.Errorf("endpoint %q is no replica's", p.endpoint)
	}
	if c.subset != nil && !slices.Contains(c.subset, p.endpoint) {
		return p, 0, nil, fmt.Errorf("endpoint %q is outside the subset %v", p.endpoint, c.subset)
	}
	code, body, err := e.relay(ctx, p, trailers)
	return p, code, body, err
}

func (r *rig) addrs() []string {
	var out []string
	for _, rep := range r.fleet.Replicas {
		out = append(out, rep.Addr())
	}
	return out
}

func (r *rig) replicaAt(ep string) *simreplica.Replica {
	for _, rep := range r.fleet.Replicas {
		if rep.Addr() == ep {
			return rep
		}
	}
	return nil
}

func (r *rig) state(name string) string {
	for _, st := range r.srv.Balancer().Replicas(time.Now()) {
		if st.Name == name {
			return st.State
		}
	}
	return ""
}

func runtimeStack(buf []byte) int { return runtime.Stack(buf, true) }
