package epp_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/epp"
	"github.com/llmlb/llmlb/internal/request"
	"github.com/llmlb/llmlb/internal/testutil/policyspy"
)

// fakeStream is the server side of one ext_proc stream without gRPC: Recv
// hands out msgs in order, then io.EOF (or err); Send records.
type fakeStream struct {
	grpc.ServerStream
	ctx  context.Context
	msgs []*extprocv3.ProcessingRequest
	err  error // returned by Recv after msgs (nil: io.EOF)
	sent []*extprocv3.ProcessingResponse
	// before, when set, runs before Recv hands out message i.
	before func(i int)
	n      int
}

func (f *fakeStream) Context() context.Context { return f.ctx }

func (f *fakeStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if len(f.msgs) == 0 {
		if f.err != nil {
			return nil, f.err
		}
		return nil, io.EOF
	}
	if f.before != nil {
		f.before(f.n)
	}
	f.n++
	m := f.msgs[0]
	f.msgs = f.msgs[1:]
	return m, nil
}

func (f *fakeStream) Send(r *extprocv3.ProcessingResponse) error {
	f.sent = append(f.sent, r)
	return nil
}

func inFlight(bal *balancer.Balancer) int {
	n := 0
	for _, r := range bal.Replicas(time.Now()) {
		n += r.InFlight
	}
	return n
}

// randomMessage draws one ext_proc message, well-formed or not.
func randomMessage(rng *rand.Rand) *extprocv3.ProcessingRequest {
	bodies := [][]byte{
		[]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`),
		[]byte(`{"model":"m","prompt":"x"}`), []byte(`{"model":`), []byte(`{"model":"nope","messages":[]}`),
		[]byte("\xff\x00garbage"), nil, []byte(`{"model":"m","messages":[{"role":"system","content":"s"}]}`),
	}
	hdr := func() *corev3.HeaderMap {
		paths := []string{"/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/../x", "%zz", "", "/metrics", "/v1/embeddings?x=1"}
		methods := []string{"POST", "GET", "", "DELETE"}
		hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":path", RawValue: []byte(paths[rng.IntN(len(paths))])},
			{Key: ":method", Value: methods[rng.IntN(len(methods))]},
		}}
		if rng.IntN(2) == 0 {
			hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: "x-session-id", RawValue: []byte("s")})
		}
		if rng.IntN(3) == 0 {
			hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: ":status", RawValue: []byte([]string{"200", "503", "x", "-1"}[rng.IntN(4)])},
				&corev3.HeaderValue{Key: "content-type", RawValue: []byte("text/event-stream")})
		}
		return hm
	}
	m := &extprocv3.ProcessingRequest{}
	switch rng.IntN(8) {
	case 0:
		m.Request = &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdr(), EndOfStream: rng.IntN(4) == 0}}
	case 1, 2:
		m.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: bodies[rng.IntN(len(bodies))], EndOfStream: rng.IntN(2) == 0}}
	case 3:
		m.Request = &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}
	case 4:
		m.Request = &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: hdr(), EndOfStream: rng.IntN(4) == 0}}
	case 5:
		m.Request = &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("data: {\"usage\":{\"prompt_tokens\":3}}\n"), EndOfStream: rng.IntN(2) == 0}}
	case 6:
		m.Request = &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}
	case 7: // no request at all (flow control only)
	}
	if rng.IntN(3) == 0 {
		modes := []filterv3.ProcessingMode_BodySendMode{0, 1, 2, 3, 4, 5, 99}
		m.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: modes[rng.IntN(len(modes))], ResponseBodyMode: modes[rng.IntN(len(modes))]}
	}
	if rng.IntN(4) == 0 {
		vals := []*structpb.Value{structpb.NewStringValue("10.0.0.1:8000"), structpb.NewNumberValue(3), structpb.NewStringValue("[::1]:x"), structpb.NewNullValue()}
		subset := structpb.NewListValue(&structpb.ListValue{Values: vals[:rng.IntN(len(vals)+1)]})
		if rng.IntN(3) == 0 {
			subset = structpb.NewStringValue("10.0.0.2:8000,junk")
		}
		m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			epp.SubsetNamespace: {Fields: map[string]*structpb.Value{epp.SubsetKey: subset}},
			"envoy.lb":          {Fields: map[string]*structpb.Value{epp.ServedKey: structpb.NewStringValue("10.0.0.3:8000")}},
		}}
	}
	return m
}

// TestProcessRandomSequencesNeverPanicAndAlwaysRelease: any sequence of
// ext_proc messages, in any order, ending cleanly or with an error, is
// answered without a panic; every endpoint the picker names is a replica's
// (and in the subset when one was given); and when the stream is over no
// reservation is left.
func TestProcessRandomSequencesNeverPanicAndAlwaysRelease(t *testing.T) {
	bal := coreWith(t, 3)
	srv, err := epp.New(epp.Options{Balancer: bal, Request: request.DefaultConfig(), MaxBodyBytes: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	valid := map[string]bool{"10.0.0.1:8000": true, "10.0.0.2:8000": true, "10.0.0.3:8000": true}
	for i := range 10000 {
		fs := &fakeStream{ctx: context.Background()}
		for range rng.IntN(9) {
			fs.msgs = append(fs.msgs, randomMessage(rng))
		}
		if rng.IntN(3) == 0 {
			fs.err = context.Canceled
		}
		msgs := fmt.Sprint(fs.msgs)
		_ = srv.Process(fs)
		for _, r := range fs.sent {
			for _, h := range r.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
				if h.GetHeader().GetKey() == epp.HeaderDestination && !valid[string(h.GetHeader().GetRawValue())] {
					t.Fatalf("sequence %d: endpoint %q\n%s", i, h.GetHeader().GetRawValue(), msgs)
				}
			}
		}
		if n := inFlight(bal); n != 0 {
			t.Fatalf("sequence %d left %d reservations\n%s", i, n, msgs)
		}
	}
}

// TestShutdownEndsOpenStreams: Shutdown waits for open exchanges up to its
// deadline, then closes them; their reservations are released and no
// goroutine of the picker is left.
func TestShutdownEndsOpenStreams(t *testing.T) {
	bal := coreWith(t, 2)
	r := startPicker(t, epp.Options{Balancer: bal})
	st, err := r.client.Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	e := &envoy{stream: st, c: call{mode: fullDuplex, body: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)}}
	if _, err := e.request(); err != nil {
		t.Fatal(err)
	}
	if inFlight(bal) != 1 {
		t.Fatal("the picked request holds no reservation")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no grace: close at once
	shutdownErr, serveErr := r.stop(ctx)
	if shutdownErr == nil {
		t.Error("Shutdown with an open stream and an ended deadline: want its error")
	}
	if serveErr != nil {
		t.Fatalf("Serve: %v", serveErr)
	}
	deadline := time.Now().Add(10 * time.Second)
	for inFlight(bal) != 0 || openExchanges() != 0 || pickerGoroutines() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("after Shutdown: %d reserved, %d exchanges, %d picker goroutines", inFlight(bal), openExchanges(), pickerGoroutines())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// pickerGoroutines counts goroutines running the picker's own code.
func pickerGoroutines() int {
	buf := make([]byte, 1<<20)
	n := 0
	for {
		n = len(buf)
		if k := runtimeStack(buf); k < len(buf) {
			n = k
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	c := 0
	for g := range strings.SplitSeq(string(buf[:n]), "\n\n") {
		if strings.Contains(g, "llmlb/internal/epp.") && !strings.Contains(g, "epp_test.") {
			c++
		}
	}
	return c
}

// TestBufferedBodyAboveGRPCDefault: a BUFFERED gateway sends the body in
// one message; one larger than gRPC's default 4 MiB (but within
// proxy.max_body_bytes) is routed, not failed by the transport.
func TestBufferedBodyAboveGRPCDefault(t *testing.T) {
	r := startPicker(t, epp.Options{Balancer: coreWith(t, 2), MaxBodyBytes: 8 << 20},
		withDialOptions(grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(16<<20))))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := r.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"model":"m","prompt":"` + strings.Repeat("a ", 3<<20) + `"}`)
	e := &envoy{stream: st, c: call{mode: buffered, path: "/v1/completions", body: body}}
	p, err := e.request()
	if err != nil || p.endpoint == "" {
		t.Fatalf("a %d-byte buffered body: %+v %v", len(body), p.immediate, err)
	}
}

// TestFirstChunkIsFirstToken: as serve's proxy, the first chunk of an event
// stream tells the core the replica's prefill is done (policy cost's
// pending work), while the reservation is held until the response ends.
// oneReplicaEPP adds one LIVE replica "r" to bal and returns an endpoint
// picker over it that hashes prompts into blocks (as serve does for cost).
func oneReplicaEPP(t *testing.T, bal *balancer.Balancer) *epp.Server {
	t.Helper()
	now := time.Now()
	if err := bal.AddReplica(balancer.ReplicaSpec{Name: "r", URL: "http://10.0.0.1:8000"}, now); err != nil {
		t.Fatal(err)
	}
	bal.ObserveScrape("r", balancer.Snapshot{}, nil, now)
	reqCfg := request.DefaultConfig()
	reqCfg.PromptBlocks = true
	srv, err := epp.New(epp.Options{Balancer: bal, Request: reqCfg})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

func TestFirstChunkIsFirstToken(t *testing.T) {
	cfg := balancer.DefaultConfig()
	cfg.Policy = "cost"
	bal, err := balancer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := oneReplicaEPP(t, bal)
	pending := func() (float64, int) {
		st := bal.Replicas(time.Now())[0]
		return st.PendingPrefill, st.InFlight
	}
	body := []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("word ", 2000) + `"}]}`)
	hdr := headerMap(map[string]string{":method": "POST", ":path": "/v1/chat/completions"})
	fs := &fakeStream{ctx: context.Background(), msgs: []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdr}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}},
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(map[string]string{":status": "200", "content-type": "text/event-stream"})}}},
		{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("data: {}\n\n")}}},
		{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{EndOfStream: true}}},
	}}
	fs.before = func(i int) {
		p, n := pending()
		switch i {
		case 3: // picked, headers answered, no body byte yet
			if p <= 0 || n != 1 {
				t.Errorf("before the first chunk: pending prefill %v, in flight %d; want > 0 and 1", p, n)
			}
		case 4: // the first chunk went through
			if p != 0 || n != 1 {
				t.Errorf("after the first chunk: pending prefill %v, in flight %d; want 0 and 1", p, n)
			}
		}
	}
	if err := srv.Process(fs); err != nil {
		t.Fatal(err)
	}
	if p, n := pending(); p != 0 || n != 0 {
		t.Fatalf("after the response: pending %v, in flight %d", p, n)
	}
}

// TestBufferedPartialRoutesOnTheStart: BUFFERED_PARTIAL sends only what
// fits the gateway's buffer; a start that does not parse is routed on the
// headers, not refused as malformed.
func TestBufferedPartialRoutesOnTheStart(t *testing.T) {
	bal := coreWith(t, 2)
	srv, err := epp.New(epp.Options{Balancer: bal, Request: request.DefaultConfig()})
	if err != nil {
		t.Fatal(err)
	}
	hdr := headerMap(map[string]string{":method": "POST", ":path": "/v1/chat/completions"})
	fs := &fakeStream{ctx: context.Background(), msgs: []*extprocv3.ProcessingRequest{
		{ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED_PARTIAL},
			Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdr}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(`{"model":"m","messages":[{"role":"user","content":"cut he`)}}},
	}}
	if err := srv.Process(fs); err != nil {
		t.Fatal(err)
	}
	if len(fs.sent) != 2 || fs.sent[1].GetRequestBody() == nil {
		t.Fatalf("want the headers' answer then the body's, got %v", fs.sent)
	}
	ep, err := endpointOf(fs.sent[1].GetRequestBody().GetResponse().GetHeaderMutation(), fs.sent[1].GetDynamicMetadata())
	if err != nil || !strings.HasPrefix(ep, "10.0.0.") {
		t.Fatalf("endpoint %q: %v", ep, err)
	}
}

// TestRejectedAnswerIsNotIndexed: a 4xx served nothing, so the policy is
// not told the prompt finished on the replica (as the proxy does).
func TestRejectedAnswerIsNotIndexed(t *testing.T) {
	for _, tc := range []struct {
		status       string
		wantFinished int
	}{{"200", 1}, {"400", 0}} {
		spy := &policyspy.Finishes{}
		bal, err := balancer.NewWithPolicy(balancer.DefaultConfig(), spy)
		if err != nil {
			t.Fatal(err)
		}
		srv := oneReplicaEPP(t, bal)
		body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("word ", 200) + `"}]}`)
		hdr := headerMap(map[string]string{":method": "POST", ":path": "/v1/chat/completions"})
		fs := &fakeStream{ctx: context.Background(), msgs: []*extprocv3.ProcessingRequest{
			{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdr}}},
			{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}},
			{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
				Headers: headerMap(map[string]string{":status": tc.status, "content-type": "application/json"})}}},
			{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("{}"), EndOfStream: true}}},
		}}
		if err := srv.Process(fs); err != nil {
			t.Fatal(err)
		}
		if got := len(spy.Calls()); got != tc.wantFinished {
			t.Errorf("status %s: policy told of %d finished prompts, want %d", tc.status, got, tc.wantFinished)
		}
		if st := bal.Replicas(time.Now())[0]; st.InFlight != 0 {
			t.Errorf("status %s: %d in flight after the response", tc.status, st.InFlight)
		}
	}
}
