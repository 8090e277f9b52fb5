package epp_test

// Flow control through the ext_proc exchange: a saturated pool holds the
// exchange (its answer unsent) until a replica frees up, then routes it
// there; refusals, expiries and shutdown are immediate responses. The
// gateway's side is the harness's envoy client; the replicas are a
// routing core whose running-slot limit is configured
// (routing.saturation.max_running 1: a replica is full at 2 requests,
// one running and one of headroom), so saturation follows the picker's
// own reservations and nothing depends on timing.

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/epp"
	"github.com/llmlb/llmlb/internal/flowcontrol"
)

// flowRig is an epp serving on loopback gRPC over two replicas of model m
// that are full at 2 requests each.
type flowRig struct{ *picker }

func startFlowRig(t *testing.T, fc flowcontrol.Config) *flowRig {
	t.Helper()
	cfg := balancer.DefaultConfig()
	cfg.Saturation.MaxRunning, cfg.Saturation.Headroom = 1, 1 // full at 2
	r := &flowRig{startPicker(t, epp.Options{Balancer: newCore(t, cfg, 2, "m", idle), FlowControl: fc})}
	t.Cleanup(func() {
		if err := r.close(); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return r
}

// flowExchange is one open ext_proc stream whose request phase the
// picker answers (or holds) on answer.
type flowExchange struct {
	e      *envoy
	cancel context.CancelFunc
	answer chan flowAnswer
	p      picked // the answer, once wait returned it
}

type flowAnswer struct {
	p   picked
	err error
}

// start opens a stream and plays the request phase in the background
// (the picker may hold its answer).
func (r *flowRig) start(mode filterv3.ProcessingMode_BodySendMode, header map[string]string) *flowExchange {
	ctx, cancel := context.WithCancel(context.Background())
	x := &flowExchange{cancel: cancel, answer: make(chan flowAnswer, 1)}
	st, err := r.client.Process(ctx)
	if err != nil {
		x.answer <- flowAnswer{err: err}
		return x
	}
	x.e = &envoy{stream: st, c: call{mode: mode, header: header, body: chatBody("m", "flow", 1, false)}}
	go func() {
		p, err := x.e.request()
		x.answer <- flowAnswer{p, err}
	}()
	return x
}

// wait returns the request phase's answer; a hang fails the test after a
// generous bound (not a timing assertion).
func (x *flowExchange) wait(t *testing.T) picked {
	t.Helper()
	select {
	case a := <-x.answer:
		if a.err != nil {
			t.Fatal(a.err)
		}
		x.p = a.p
		return a.p
	case <-time.After(20 * time.Second):
		t.Fatal("the picker never answered the request phase")
	}
	return picked{}
}

// finish plays a 200 response to its end: the picker releases the
// reservation.
func (x *flowExchange) finish(t *testing.T) {
	t.Helper()
	st := x.e.stream
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerMap(map[string]string{":status": "200", "content-type": "application/json"})}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: []byte(`{"choices":[]}`), EndOfStream: true}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	_ = st.CloseSend()
	if _, err := st.Recv(); err != io.EOF {
		t.Fatalf("want the stream's end, got %v", err)
	}
	x.cancel()
}

// fill opens exchanges until the pool is saturated; each is routed at once
// (unsaturated, flow control changes nothing).
func (r *flowRig) fill(t *testing.T) []*flowExchange {
	t.Helper()
	var out []*flowExchange
	for !r.bal.Saturated("m", time.Now()) {
		if len(out) == 10 {
			t.Fatal("10 requests on two replicas full at 2 each did not saturate the pool")
		}
		x := r.start(fullDuplex, nil)
		if p := x.wait(t); p.endpoint == "" {
			t.Fatalf("unsaturated: want an endpoint at once, got %+v", p.immediate)
		}
		out = append(out, x)
	}
	if n := r.srv.Gate().Len(); n != 0 {
		t.Fatalf("%d held before saturation", n)
	}
	return out
}

func (r *flowRig) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// tenantsInFlight sums the tenant slots flow control counts as dispatched
// and not done.
func (r *flowRig) tenantsInFlight() int {
	n := 0
	for _, st := range r.srv.Gate().Stats(time.Now()) {
		for _, ts := range st.ByTenant {
			n += ts.InFlight
		}
	}
	return n
}

// TestFlowControlHoldsUntilAReplicaFrees: with every replica full, a new
// request's exchange gets no answer and reserves nothing; when one
// response ends, the held request is routed to the replica that freed
// (the only one with room), in either body mode.
func TestFlowControlHoldsUntilAReplicaFrees(t *testing.T) {
	for _, mode := range []filterv3.ProcessingMode_BodySendMode{fullDuplex, buffered} {
		t.Run(mode.String(), func(t *testing.T) {
			r := startFlowRig(t, flowcontrol.DefaultConfig())
			holders := r.fill(t)
			held := r.start(mode, nil)
			r.waitFor(t, "the request to be held", func() bool { return r.srv.Gate().Len() == 1 })
			if n := inFlight(r.bal); n != len(holders) {
				t.Fatalf("held request reserved: %d in flight, want %d", n, len(holders))
			}
			select {
			case a := <-held.answer:
				t.Fatalf("a held request was answered: %+v %v", a.p, a.err)
			default:
			}
			freed := holders[0].p.endpoint
			holders[0].finish(t)
			p := held.wait(t)
			if p.immediate != nil || p.endpoint != freed {
				t.Fatalf("held request: endpoint %q (immediate %v), want the freed %s", p.endpoint, p.immediate, freed)
			}
			if n := inFlight(r.bal); n != len(holders) {
				t.Fatalf("%d in flight after the hand-over, want %d", n, len(holders))
			}
			for _, x := range append(holders[1:], held) {
				x.finish(t)
			}
			if n := inFlight(r.bal); n != 0 {
				t.Fatalf("%d in flight after every response", n)
			}
			r.waitFor(t, "every tenant slot back", func() bool { return r.tenantsInFlight() == 0 })
		})
	}
}

// TestFlowControlCanceledWhileHeldLeaves: a stream the gateway cancels
// while its request is held leaves the queue, reserves nothing, and its
// handler ends; the replica that frees later keeps its room.
func TestFlowControlCanceledWhileHeldLeaves(t *testing.T) {
	r := startFlowRig(t, flowcontrol.DefaultConfig())
	holders := r.fill(t)
	held := r.start(fullDuplex, nil)
	r.waitFor(t, "the request to be held", func() bool { return r.srv.Gate().Len() == 1 })
	held.cancel()
	r.waitFor(t, "the canceled request to leave the queue", func() bool { return r.srv.Gate().Len() == 0 })
	r.waitFor(t, "its handler to end", func() bool { return openExchanges() == len(holders) })
	if n := inFlight(r.bal); n != len(holders) {
		t.Fatalf("%d in flight, want %d: the canceled request reserved", n, len(holders))
	}
	holders[0].finish(t)
	if n := inFlight(r.bal); n != len(holders)-1 {
		t.Fatalf("%d in flight after one response, want %d", n, len(holders)-1)
	}
	for _, x := range holders[1:] {
		x.finish(t)
	}
	r.waitFor(t, "every tenant slot back", func() bool { return r.tenantsInFlight() == 0 })
}

// refusal checks an immediate flow-control answer: status, Retry-After and
// the OpenAI error code.
func refusal(t *testing.T, p picked, status int, code string) {
	t.Helper()
	im := p.immediate
	if im == nil {
		t.Fatalf("want an immediate %d %s, got endpoint %q", status, code, p.endpoint)
	}
	if got := int(im.GetStatus().GetCode()); got != status {
		t.Fatalf("status %d, want %d: %s", got, status, im.GetBody())
	}
	var e struct {
		Error struct{ Message, Type, Code string }
	}
	if err := json.Unmarshal(im.GetBody(), &e); err != nil || e.Error.Code != code || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("body %s: want OpenAI's error shape with code %s", im.GetBody(), code)
	}
	if status != http.StatusTooManyRequests {
		return
	}
	retry := ""
	for _, h := range im.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == "retry-after" {
			retry = string(h.GetHeader().GetRawValue())
		}
	}
	if retry != "1" {
		t.Fatalf("Retry-After %q, want 1 (flowcontrol.DefaultRetryAfter)", retry)
	}
}

// TestFlowControlShedsSheddableAtSaturation: a priority -1 request is
// routed while the pool has room, and refused at once (429 shed with
// Retry-After) once it is saturated, holding nothing.
func TestFlowControlShedsSheddableAtSaturation(t *testing.T) {
	r := startFlowRig(t, flowcontrol.DefaultConfig())
	sheddable := map[string]string{"x-llmlb-priority": "-1"}
	x := r.start(fullDuplex, sheddable)
	if p := x.wait(t); p.endpoint == "" {
		t.Fatalf("unsaturated: a sheddable request must be routed, got %+v", p.immediate)
	}
	x.finish(t)
	holders := r.fill(t)
	x = r.start(fullDuplex, sheddable)
	refusal(t, x.wait(t), http.StatusTooManyRequests, "shed")
	x.cancel()
	if n := r.srv.Gate().Len(); n != 0 {
		t.Fatalf("%d held after a shed", n)
	}
	if n := inFlight(r.bal); n != len(holders) {
		t.Fatalf("%d in flight, want %d: the shed request reserved", n, len(holders))
	}
	// A malformed priority is the client's mistake.
	x = r.start(fullDuplex, map[string]string{"x-llmlb-priority": "high"})
	refusal(t, x.wait(t), http.StatusBadRequest, "invalid_request")
	x.cancel()
	for _, h := range holders {
		h.finish(t)
	}
	r.waitFor(t, "every tenant slot back", func() bool { return r.tenantsInFlight() == 0 })
}

// TestFlowControlExpiresHeldRequests: a request held for
// flow_control.max_queue_time is answered 429 queue_timeout with
// Retry-After, holding and reserving nothing.
func TestFlowControlExpiresHeldRequests(t *testing.T) {
	fc := flowcontrol.DefaultConfig()
	fc.MaxQueueTime = 20 * time.Millisecond
	r := startFlowRig(t, fc)
	holders := r.fill(t)
	x := r.start(fullDuplex, nil)
	refusal(t, x.wait(t), http.StatusTooManyRequests, "queue_timeout")
	x.cancel()
	if n := r.srv.Gate().Len(); n != 0 {
		t.Fatalf("%d still held after the expiry", n)
	}
	if n := inFlight(r.bal); n != len(holders) {
		t.Fatalf("%d in flight, want %d", n, len(holders))
	}
	for _, h := range holders {
		h.finish(t)
	}
}

// TestFlowControlShutdownAnswersHeldRequests: Shutdown answers every held
// request 503 at once (none waits for a dispatch that will not come),
// then waits for the routed ones as before.
func TestFlowControlShutdownAnswersHeldRequests(t *testing.T) {
	r := startFlowRig(t, flowcontrol.DefaultConfig())
	holders := r.fill(t)
	held := []*flowExchange{r.start(fullDuplex, nil), r.start(buffered, nil)}
	r.waitFor(t, "both requests to be held", func() bool { return r.srv.Gate().Len() == 2 })
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		done <- r.srv.Shutdown(ctx)
	}()
	for _, x := range held {
		refusal(t, x.wait(t), http.StatusServiceUnavailable, "shutting_down")
		x.cancel()
	}
	for _, h := range holders {
		h.finish(t)
	}
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if n := inFlight(r.bal); n != 0 {
		t.Fatalf("%d in flight after Shutdown", n)
	}
}

// TestFlowControlDisabledRoutesAtOnce: with flow_control.enabled false a
// saturated pool routes every request at once, as before flow control,
// and X-LLMLB-Priority means nothing.
func TestFlowControlDisabledRoutesAtOnce(t *testing.T) {
	fc := flowcontrol.DefaultConfig()
	fc.Enabled = false
	r := startFlowRig(t, fc)
	holders := r.fill(t)
	for _, prio := range []string{"-1", "high", ""} {
		x := r.start(fullDuplex, map[string]string{"x-llmlb-priority": prio})
		if p := x.wait(t); p.endpoint == "" {
			t.Fatalf("priority %q: want an endpoint at once, got %+v", prio, p.immediate)
		}
		holders = append(holders, x)
	}
	for _, h := range holders {
		h.finish(t)
	}
	if n := inFlight(r.bal); n != 0 {
		t.Fatalf("%d in flight after every response", n)
	}
}
