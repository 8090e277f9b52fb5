package epp_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"runtime"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/epp"
)

// These tests use short real deadlines (100 ms) and only wait for what the
// deadline must cause, with a generous bound (20 s): a slow machine makes
// them slower, never wrong.

// eventually polls cond for up to 20 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("after 20 s: %s", what)
}

func bodyMsg(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}
}

// TestBodyDeadline: a request whose body has not ended BodyTimeout after
// the exchange opened is answered 408 request_timeout in OpenAI's error
// shape and the stream ends (its buffered body goes with it), whatever
// the body mode and however much of the body came. Before, such an
// exchange held its body for as long as the client liked.
func TestBodyDeadline(t *testing.T) {
	cases := []struct {
		name string
		mode filterv3.ProcessingMode_BodySendMode
		body [][]byte // chunks sent without end_of_stream
	}{
		{"full duplex, no body", fullDuplex, nil},
		{"full duplex, 1 MiB of a body that never ends", fullDuplex, [][]byte{make([]byte, 512<<10), make([]byte, 512<<10)}},
		{"buffered, body never sent", buffered, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := startPicker(t, epp.Options{Balancer: coreWith(t, 1), BodyTimeout: 100 * time.Millisecond})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			st := r.open(t, ctx)
			if err := st.Send(headersOnly(call{mode: tc.mode})); err != nil {
				t.Fatal(err)
			}
			for _, b := range tc.body {
				// io.EOF: the picker already answered and ended the stream
				// (a slow machine, -race); its answer is Recv's.
				if err := st.Send(bodyMsg(b, false)); errors.Is(err, io.EOF) {
					break
				} else if err != nil {
					t.Fatal(err)
				}
			}
			var im *extprocv3.ImmediateResponse
			for im == nil {
				resp, err := st.Recv()
				if err != nil {
					t.Fatalf("no 408 before the stream ended or 20 s passed: %v", err)
				}
				im = resp.GetImmediateResponse()
			}
			refusal(t, picked{immediate: im}, http.StatusRequestTimeout, "request_timeout")
			if _, err := st.Recv(); err == nil {
				t.Fatal("the stream goes on after the 408")
			}
			if n := inFlight(r.bal); n != 0 {
				t.Fatalf("in flight after the 408: %d", n)
			}
		})
	}
}

// TestPickDeadline: a pick whose response headers have not reached the
// picker FirstByteTimeout later stops counting against its replica (in
// the balancer and in the picker's own count); a response that comes
// after that is relayed and releases nothing twice. Before, a gateway
// that never reported a response kept the replica's count up forever.
func TestPickDeadline(t *testing.T) {
	cases := []struct {
		name string
		c    call
	}{
		{"full duplex POST", call{mode: fullDuplex, body: chatBody("m", "a", 1, false)}},
		{"GET without body", call{mode: fullDuplex, method: http.MethodGet, path: "/v1/files"}},
		{"buffered POST", call{mode: buffered, body: chatBody("m", "b", 1, false)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := startPicker(t, epp.Options{Balancer: coreWith(t, 1), FirstByteTimeout: 100 * time.Millisecond})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			e := &envoy{stream: r.open(t, ctx), c: tc.c}
			p, err := e.request()
			if err != nil || p.immediate != nil {
				t.Fatalf("pick: %v %v", err, p.immediate)
			}
			eventually(t, "the pick without a response is released", func() bool {
				return inFlight(r.bal) == 0 && r.srv.PicksInFlight("r0") == 0
			})
			// The late response passes and releases nothing more.
			if err := e.stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
				ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerMap(map[string]string{":status": "200"}), EndOfStream: true}}}); err != nil {
				t.Fatal(err)
			}
			if _, err := e.stream.Recv(); err != nil {
				t.Fatal(err)
			}
			if n, m := inFlight(r.bal), r.srv.PicksInFlight("r0"); n != 0 || m != 0 {
				t.Fatalf("after the late response: in flight %d, picks %d", n, m)
			}
		})
	}
}

// subsetCall is a full-duplex chat request restricted to subset.
func subsetCall(session string, subset ...string) call {
	return call{mode: fullDuplex, body: chatBody("m", session, 1, false), subset: subset}
}

// TestMaxInFlightPerReplica: exchanges held open with a subset hint on one
// replica count against it up to MaxInFlightPerReplica; past it a request
// only that replica may take is refused 429 replica_in_flight_limit with
// Retry-After, one free to go elsewhere goes to another replica, and the
// replica takes requests again once one of its exchanges ends. Before,
// one connection could pile any number of picks on a chosen replica.
func TestMaxInFlightPerReplica(t *testing.T) {
	const limit = 3
	r := startPicker(t, epp.Options{Balancer: coreWith(t, 2), MaxInFlightPerReplica: limit})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	target := "10.0.0.1:8000" // r0
	var held []extprocv3.ExternalProcessor_ProcessClient
	steps := []struct {
		name   string
		c      call
		want   string // endpoint, or "" for the 429
		isHeld bool
	}{
		{"1st on the target", subsetCall("s1", target), target, true},
		{"2nd on the target", subsetCall("s2", target), target, true},
		{"3rd on the target", subsetCall("s3", target), target, true},
		{"4th on the target: refused", subsetCall("s4", target), "", false},
		{"free to go elsewhere", subsetCall("s5", target, "10.0.0.2:8000"), "10.0.0.2:8000", false},
	}
	for _, s := range steps {
		e := &envoy{stream: r.open(t, ctx), c: s.c}
		p, err := e.request()
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if s.want == "" {
			refusal(t, p, http.StatusTooManyRequests, "replica_in_flight_limit")
			continue
		}
		if p.immediate != nil || p.endpoint != s.want {
			t.Fatalf("%s: endpoint %q (immediate %v), want %s", s.name, p.endpoint, p.immediate, s.want)
		}
		if s.isHeld {
			held = append(held, e.stream)
		}
	}
	if n := r.srv.PicksInFlight("r0"); n != limit {
		t.Fatalf("picks in flight on the target: %d, want %d", n, limit)
	}
	// One held exchange ends (its stream is reset): the target takes one again.
	if err := held[0].CloseSend(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a held exchange's end frees a place on the target", func() bool {
		return r.srv.PicksInFlight("r0") < limit
	})
	e := &envoy{stream: r.open(t, ctx), c: subsetCall("s6", target)}
	if p, err := e.request(); err != nil || p.endpoint != target {
		t.Fatalf("after one ended: endpoint %q, err %v, immediate %v", p.endpoint, err, p.immediate)
	}
}

// BenchmarkBodyFlood: 40 exchanges each send 8 MiB of a full-duplex body
// that never ends (the attack held 2.35 GB this way for as long as the
// client liked). Reported: the live heap while the bodies are held
// (held-MB) and once BodyTimeout (1 s) has answered them all 408
// (after-MB). go test -run '^$' -bench BodyFlood -benchtime 1x ./internal/epp
func BenchmarkBodyFlood(b *testing.B) {
	const exchanges, size = 40, 8 << 20
	for range b.N {
		r := startPicker(b, epp.Options{Balancer: newCore(b, balancer.DefaultConfig(), 1, "m", nil), BodyTimeout: time.Second})
		client := r.client
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		heap := func() float64 {
			runtime.GC()
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			return float64(m.HeapAlloc) / (1 << 20)
		}
		base := heap()
		chunk := make([]byte, 62000)
		answered := make(chan int, exchanges)
		sent := make(chan struct{}, exchanges)
		for range exchanges {
			go func() {
				st, err := client.Process(ctx)
				if err != nil {
					answered <- 0
					sent <- struct{}{}
					return
				}
				_ = st.Send(headersOnly(call{mode: fullDuplex}))
				for n := 0; n < size; n += len(chunk) {
					if st.Send(bodyMsg(chunk, false)) != nil {
						break
					}
				}
				sent <- struct{}{}
				for {
					resp, err := st.Recv()
					if err != nil {
						answered <- 0
						return
					}
					if im := resp.GetImmediateResponse(); im != nil {
						answered <- int(im.GetStatus().GetCode())
						return
					}
				}
			}()
		}
		for range exchanges {
			<-sent
		}
		held := heap() - base
		n408 := 0
		for range exchanges {
			if <-answered == http.StatusRequestTimeout {
				n408++
			}
		}
		after := heap() - base
		b.ReportMetric(held, "held-MB")
		b.ReportMetric(after, "after-MB")
		b.ReportMetric(float64(n408), "answered-408")
		cancel()
		_ = r.close()
	}
}
