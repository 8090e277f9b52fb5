package epp

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmlb/llmlb/internal/admission"
	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/flowcontrol"
	"github.com/llmlb/llmlb/internal/openai"
	"github.com/llmlb/llmlb/internal/proxy"
	"github.com/llmlb/llmlb/internal/request"
)

// exchange is one ext_proc stream: one HTTP request and its response. It
// runs on the stream's own goroutine only (Recv, decide, Send in turn), so
// it needs no lock. While a deadline runs (the request's end, the
// response's start) each Recv runs on a goroutine of its own that the
// exchange waits for with the deadline's timer: it ends with the stream,
// which ends when the exchange returns. A request flow control holds waits
// on the stream's goroutine too (exchange.wait).
type exchange struct {
	s      *Server
	stream extprocv3.ExternalProcessor_ProcessServer
	start  time.Time

	// The gateway's body modes (protocol_config of the first message);
	// FULL_DUPLEX_STREAMED, the protocol's required mode, when not told.
	reqMode, respMode filterv3.ProcessingMode_BodySendMode

	method, path string // path: decoded, without the query
	header       http.Header
	subset       map[string]bool // nil: no subset given
	body         []byte
	bodyEOS      bool // the body ended with end_of_stream (not with trailers)
	partial      bool // BUFFERED_PARTIAL sent only the start of the body
	decided      bool // the request phase was answered (endpoint or immediate response)
	immediate    bool // an immediate response ended the exchange
	gone         bool // the stream ended while flow control held the request

	slot   *admission.Request // admitted: holds its tenant's slot until gate.Done
	waited time.Duration      // how long flow control held the request

	prof     request.Profile
	res      *balancer.Reservation
	picked   time.Time
	status   int  // the response's status (0 before its headers)
	sse      bool // the response is an event stream
	gotBytes bool // a response body byte arrived
	ttftAt   time.Time
	usage    openai.UsageReader // the model and usage of a 2xx answer
	done     bool               // the response ended; the reservation was released
	served   string             // the endpoint the gateway says served the request

	counted bool // res is counted in Server.picks (MaxInFlightPerReplica)
	capped  int  // replicas left out of the pick for being at MaxInFlightPerReplica
}

// recvd is one Recv's result.
type recvd struct {
	req *extprocv3.ProcessingRequest
	err error
}

// Deadlines of an exchange (exchange.deadline).
const (
	noDeadline   = iota
	bodyDeadline // the request (headers and body) must have ended
	pickDeadline // the response headers must have reached the picker
)

// deadline returns the exchange's running deadline and which it is: the
// request's end (BodyTimeout from the stream's start) until the request
// phase is answered, then the response's start (FirstByteTimeout from the
// pick) until the response headers come.
func (x *exchange) deadline() (time.Time, int) {
	switch {
	case !x.decided:
		return x.start.Add(x.s.bodyTimeout), bodyDeadline
	case x.res != nil && !x.done && x.status == 0:
		return x.picked.Add(x.s.firstByteTimeout), pickDeadline
	}
	return time.Time{}, noDeadline
}

// next returns the stream's next message. While a deadline runs it waits
// for it at most until the deadline and, past it, answers the deadline
// (expire) and returns nil, nil. pending carries a Recv still running
// from one call to the next.
func (x *exchange) next(pending *chan recvd) (*extprocv3.ProcessingRequest, error) {
	at, which := x.deadline()
	if which == noDeadline && *pending == nil {
		return x.stream.Recv()
	}
	if *pending == nil {
		ch := make(chan recvd, 1) // the goroutine never blocks, even if nobody reads
		go func() {
			req, err := x.stream.Recv()
			ch <- recvd{req, err}
		}()
		*pending = ch
	}
	var timeout <-chan time.Time
	if which != noDeadline {
		t := time.NewTimer(max(at.Sub(x.s.now()), 0))
		defer t.Stop()
		timeout = t.C
	}
	select {
	case r := <-*pending:
		*pending = nil
		return r.req, r.err
	case <-timeout:
		return nil, x.expire(which)
	}
}

// expire answers a deadline that passed: a request that did not end is
// answered 408 (its buffered body dropped); a pick whose response did not
// start is released as cancelled, so it stops counting against the
// replica (a response that comes later is relayed, not counted again).
func (x *exchange) expire(which int) error {
	switch which {
	case bodyDeadline:
		n := len(x.body)
		x.body = nil
		x.s.log.Info("epp: request body timeout", slog.Duration("timeout", x.s.bodyTimeout), slog.Int("bytes", n))
		return x.reject(http.StatusRequestTimeout, openai.TypeInvalidRequest, openai.CodeBodyTimeout,
			fmt.Sprintf("the request did not end within %s", x.s.bodyTimeout))
	case pickDeadline:
		x.s.log.Warn("epp: no response from the gateway in time: reservation released",
			slog.String("replica", x.res.Replica), slog.Duration("timeout", x.s.firstByteTimeout))
		x.done = true
		x.release(balancer.OutcomeCanceled, http.StatusGatewayTimeout)
	}
	return nil
}

// run reads the stream until it ends, answering each message.
func (x *exchange) run() error {
	first := true
	var pending chan recvd
	for {
		req, err := x.next(&pending)
		if err == nil && req == nil {
			if x.over() {
				return nil
			}
			continue // a deadline passed and was answered
		}
		if err != nil {
			if err == io.EOF || status.Code(err) == codes.Canceled || x.stream.Context().Err() != nil {
				return nil
			}
			return err
		}
		if first {
			first = false
			x.reqMode, x.respMode = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
			if pc := req.GetProtocolConfig(); pc != nil {
				x.reqMode, x.respMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
			}
		}
		x.readMetadata(req)
		if err := x.handle(req); err != nil {
			return err
		}
		if x.over() {
			return nil
		}
	}
}

// over reports whether the exchange ended without a response to watch: an
// immediate response answered it, or the stream ended while it was held.
func (x *exchange) over() bool { return x.immediate || x.gone }

// handle answers one message of the stream.
func (x *exchange) handle(req *extprocv3.ProcessingRequest) error {
	switch m := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return x.requestHeaders(m.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return x.requestBody(m.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return x.requestTrailers()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return x.responseHeaders(m.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		return x.responseBody(m.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		x.finish()
		return x.send(trailersResponse(false))
	}
	return nil // a flow-control-only message: nothing to answer
}

// readMetadata takes the subset (request messages) and the served endpoint
// (response messages) from the filter metadata.
func (x *exchange) readMetadata(req *extprocv3.ProcessingRequest) {
	fm := req.GetMetadataContext().GetFilterMetadata()
	if fm == nil {
		return
	}
	if ns := fm[SubsetNamespace]; ns != nil && !x.decided {
		if v, ok := ns.GetFields()[SubsetKey]; ok {
			x.subset = parseSubset(v)
		}
	}
	if ns := fm[MetadataNamespace]; ns != nil {
		if v, ok := ns.GetFields()[ServedKey]; ok {
			x.served = v.GetStringValue()
		}
	}
}

func (x *exchange) requestHeaders(h *extprocv3.HttpHeaders) error {
	if x.header != nil || x.decided {
		return x.reject(http.StatusBadRequest, openai.TypeInvalidRequest, openai.CodeInvalidJSON,
			"the gateway sent the request headers twice")
	}
	x.header = make(http.Header)
	var rawPath string
	for _, hv := range h.GetHeaders().GetHeaders() {
		v := hv.GetValue()
		if raw := hv.GetRawValue(); len(raw) > 0 {
			v = string(raw)
		}
		switch k := strings.ToLower(hv.GetKey()); k {
		case ":path":
			rawPath = v
		case ":method":
			x.method = v
		default:
			if !strings.HasPrefix(k, ":") {
				x.header.Add(k, v)
			}
		}
	}
	u, err := url.ParseRequestURI(rawPath)
	if err != nil {
		return x.reject(http.StatusBadRequest, openai.TypeInvalidRequest, openai.CodeInvalidPath, "the request path is not a valid URL path")
	}
	x.path = u.Path
	// The proxy's own answers: path traversal, paths outside /v1/, and
	// the model list.
	if a, ok := openai.CheckPath(x.path); !ok {
		return x.reject(a.Status, a.Type, a.Code, a.Message)
	}
	if x.method == http.MethodGet && openai.IsModelsPath(x.path) {
		return x.models()
	}
	switch {
	case h.GetEndOfStream():
		// No body (a GET): route by the headers alone, as serve does.
		return x.decide(true)
	case x.reqMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		// The headers are answered with the endpoint once the body is read.
		return nil
	case x.reqMode == filterv3.ProcessingMode_BUFFERED || x.reqMode == filterv3.ProcessingMode_BUFFERED_PARTIAL:
		// The body comes after this answer; the endpoint goes with the body's.
		return x.send(headersResponse(nil, nil))
	default:
		// NONE or STREAMED: the gateway routes on the headers' answer
		// before any body: pick by the headers alone.
		return x.decide(true)
	}
}

func (x *exchange) requestBody(b *extprocv3.HttpBody) error {
	if x.header == nil {
		return x.reject(http.StatusBadRequest, openai.TypeInvalidRequest, openai.CodeInvalidJSON,
			"the gateway sent a request body before its headers")
	}
	if x.decided {
		// The body's answer went out already (NONE/STREAMED modes, or a
		// gateway that sends more after end_of_stream): pass it on.
		return x.send(requestBodyPassthrough(x.reqMode, b))
	}
	if int64(len(x.body))+int64(len(b.GetBody())) > x.s.maxBody {
		return x.reject(http.StatusRequestEntityTooLarge, openai.TypeInvalidRequest, openai.CodeTooLarge,
			fmt.Sprintf("request body exceeds the limit of %d bytes", x.s.maxBody))
	}
	x.body = append(x.body, b.GetBody()...)
	switch {
	case b.GetEndOfStream():
		x.bodyEOS = true
		return x.decide(false)
	case x.reqMode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		// BUFFERED_PARTIAL sent what fit in its buffer: it will not send
		// the rest here, so decide on what came.
		x.partial = true
		return x.decide(false)
	}
	return nil
}

// requestTrailers ends a body that came without end_of_stream.
func (x *exchange) requestTrailers() error {
	if x.header == nil {
		return x.reject(http.StatusBadRequest, openai.TypeInvalidRequest, openai.CodeInvalidJSON,
			"the gateway sent request trailers before the headers")
	}
	if !x.decided {
		if err := x.decide(false); err != nil || x.over() {
			return err
		}
	}
	return x.send(trailersResponse(true))
}

// decide profiles the request, selects a replica from the subset and
// answers the request phase with the endpoint (or an immediate response).
// headersOnly: there is no body to read (yet).
func (x *exchange) decide(headersOnly bool) error {
	if x.decided || x.res != nil {
		return nil // one decision (and one reservation) per exchange
	}
	x.decided = true
	var prof request.Profile
	if !headersOnly && x.method == http.MethodPost && request.Routed(x.path) {
		var err error
		prof, err = request.Parse(x.s.reqCfg, x.path, x.header, x.body)
		switch {
		case err != nil && x.partial:
			// Only the body's start: not the client's fault that it does
			// not parse; route on the headers alone.
			prof = request.Profile{}
		case err != nil:
			return x.reject(http.StatusBadRequest, openai.TypeInvalidRequest, openai.CodeInvalidJSON, err.Error())
		}
	}
	x.prof = prof
	now := x.s.now()
	exclude, ok := x.outsideSubset(now)
	if !ok {
		return x.reject(http.StatusServiceUnavailable, openai.TypeUnavailable, openai.CodeNoHealthyInstances,
			"no replica of the gateway's endpoint subset is known to the picker")
	}
	if capped := x.s.atCap(); len(capped) > 0 {
		x.capped = len(capped)
		exclude = append(exclude, capped...)
	}
	res, err := x.reserve(exclude, now)
	if err != nil || res == nil {
		return err // answered (refused, failed), or the stream ended while held
	}
	now = x.s.now() // picked now: a held request waited since
	ep, err := hostPort(res.URL)
	if err != nil {
		x.s.bal.Release(res, balancer.OutcomeCanceled, x.s.now())
		x.s.pump()
		x.s.log.Error("epp: replica has no usable address", slog.String("replica", res.Replica), slog.String("error", err.Error()))
		return x.reject(http.StatusServiceUnavailable, openai.TypeUnavailable, openai.CodeNoHealthyInstances,
			"the chosen replica has no ip:port address")
	}
	x.res, x.picked = res, now
	x.counted = true
	x.s.countPick(res.Replica)
	x.logDecision(ep)
	if x.s.decisions != nil {
		x.s.decisions(now, res, &x.prof, 1)
	}
	return x.answerPicked(ep, headersOnly)
}

// reserve reserves a replica for the request through flow control
// (package admission): at once with Select, exactly as without flow
// control, while its model's replicas have room; late while every one is
// saturated: the exchange then waits with its answer unsent until the
// gate dispatches it to the first replica that frees up. It returns nil
// when it answered the gateway itself (refused, routing failed) or the
// stream ended while the request was held.
func (x *exchange) reserve(exclude []string, now time.Time) (*balancer.Reservation, error) {
	s := x.s
	tenant := request.Tenant(s.reqCfg, x.header)
	prio, err := s.flow.Priority(x.prof.Model, tenant, request.APIKey(x.header), x.header.Get(HeaderPriority))
	if err != nil && s.flow.Enabled { // disabled, the header means nothing
		return nil, x.reject(http.StatusBadRequest, openai.TypeInvalidRequest, openai.CodeInvalidJSON,
			HeaderPriority+" must be an integer")
	}
	r := &admission.Request{ID: s.ids.Add(1), Profile: &x.prof, Priority: prio, Tenant: tenant,
		Bytes: int64(len(x.body)), Exclude: exclude, Payload: make(chan admission.Ticket, 1)}
	d, err := s.gate.Admit(r, now)
	switch {
	case err != nil:
		// Not expected (ids are unique, sizes not negative): route it
		// unqueued rather than fail it.
		s.log.Error("epp: flow control", slog.String("error", err.Error()))
	case d.Outcome == flowcontrol.Refused:
		return nil, x.refuse(openai.Refusal(d.Reason.Code()), d.RetryAfter)
	case d.Outcome == flowcontrol.Queued:
		// Held behind requests that may not take the replicas' reserve,
		// it may take it now (balancer.SaturationConfig.ReserveShare).
		s.pump()
		return x.wait(r, now)
	default:
		x.slot = r
	}
	res, err := s.bal.Select(&x.prof, now, exclude...)
	if err != nil {
		return nil, x.selectFailed(err)
	}
	return res, nil
}

// wait holds the request until the gate hands it its ticket: a
// reservation on the replica that freed up (or why none could be made), or
// that it waited max_queue_time (429 queue_timeout) or the picker shuts
// down (503). If the stream ends first (the client went away), the request
// leaves the queue and nothing is reserved; if it was dispatched meanwhile,
// its reservation is released as cancelled when the exchange ends.
func (x *exchange) wait(r *admission.Request, since time.Time) (*balancer.Reservation, error) {
	s := x.s
	ch := r.Payload.(chan admission.Ticket)
	if s.draining.Load() && s.gate.Remove(r) {
		// Queued after Shutdown drained the gate: nothing would dispatch it.
		a := openai.ShuttingDown()
		return nil, x.reject(a.Status, a.Type, a.Code, a.Message)
	}
	var t admission.Ticket
	select {
	case t = <-ch:
	case <-x.stream.Context().Done():
		x.gone = true
		if s.gate.Remove(r) {
			return nil, nil
		}
		t = <-ch // dispatched, expired or drained meanwhile: the ticket is on its way
	}
	if x.stream.Context().Err() != nil {
		x.gone = true // it ended as the ticket came: answer no dead stream
	}
	x.waited = s.now().Sub(since)
	switch {
	case errors.Is(t.Err, errExpired):
		if x.gone {
			return nil, nil
		}
		return nil, x.refuse(openai.Refusal(openai.CodeQueueTimeout), flowcontrol.DefaultRetryAfter)
	case errors.Is(t.Err, errShutdown):
		if x.gone {
			return nil, nil
		}
		a := openai.ShuttingDown()
		return nil, x.reject(a.Status, a.Type, a.Code, a.Message)
	}
	x.slot = r // dispatched: it holds its tenant slot until Done
	switch {
	case x.gone:
		x.res = t.Res // released as cancelled by end (nil: nothing reserved)
		return nil, nil
	case t.Err != nil:
		return nil, x.selectFailed(t.Err)
	}
	if ep, err := hostPort(t.Res.URL); err == nil && x.subset != nil && !x.subset[ep] {
		// A replica that joined while the request waited, outside the
		// gateway's subset: choose again among those the subset allows.
		now := s.now()
		s.bal.Release(t.Res, balancer.OutcomeCanceled, now)
		s.pump()
		exclude, ok := x.outsideSubset(now)
		if !ok {
			return nil, x.reject(http.StatusServiceUnavailable, openai.TypeUnavailable, openai.CodeNoHealthyInstances,
				"no replica of the gateway's endpoint subset is known to the picker")
		}
		res, err := s.bal.Select(&x.prof, now, exclude...)
		if err != nil {
			return nil, x.selectFailed(err)
		}
		return res, nil
	}
	return t.Res, nil
}

// answerPicked sends the endpoint in the answer the gateway routes on.
func (x *exchange) answerPicked(ep string, headersOnly bool) error {
	mut := destination(ep)
	md := destinationMetadata(ep)
	if headersOnly {
		return x.send(headersResponse(mut, md))
	}
	if x.reqMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		// The headers were held until now: their answer carries the
		// endpoint, then the body goes back in chunks.
		if err := x.send(headersResponse(mut, md)); err != nil {
			return err
		}
		// A body that ended with trailers goes back without end_of_stream:
		// the trailers' answer ends it.
		for _, r := range streamedBody(x.body, x.bodyEOS, true) {
			if err := x.send(r); err != nil {
				return err
			}
		}
		x.body = nil
		return nil
	}
	// BUFFERED: the headers went on already; a header mutation in the
	// body's answer still reaches the upstream request.
	x.body = nil
	return x.send(requestBodyResponse(mut, md))
}

// outsideSubset lists the replicas whose address is not in the gateway's
// subset (to exclude); ok is false when a subset is given and no known
// replica is in it (the protocol's 503).
func (x *exchange) outsideSubset(now time.Time) (exclude []string, ok bool) {
	if x.subset == nil {
		return nil, true
	}
	in := 0
	for _, r := range x.s.bal.Replicas(now) {
		ep, err := hostPort(r.URL)
		if err == nil && x.subset[ep] {
			in++
			continue
		}
		exclude = append(exclude, r.Name)
	}
	return exclude, in > 0
}

// selectFailed answers as the proxy does when Select finds no replica.
func (x *exchange) selectFailed(err error) error {
	switch {
	case x.capped > 0 && errors.Is(err, balancer.ErrNoHealthyInstances):
		// Replicas were left out for their picks in flight: the request
		// may be taken once some end.
		x.s.log.Warn("epp: every replica the request may use is at epp.max_in_flight_per_replica",
			slog.Int("limit", x.s.maxPerReplica), slog.Int("replicas_at_limit", x.capped))
		return x.refuse(replicaLimit, flowcontrol.DefaultRetryAfter)
	case errors.Is(err, balancer.ErrUnknownModel):
		a := openai.ModelNotFound(x.prof.Model)
		return x.reject(a.Status, a.Type, a.Code, a.Message)
	case errors.Is(err, balancer.ErrNoHealthyInstances):
		return x.reject(http.StatusServiceUnavailable, openai.TypeUnavailable, openai.CodeNoHealthyInstances,
			"no healthy replica is available")
	default:
		x.s.log.Error("epp: select failed", slog.String("error", err.Error()))
		return x.reject(http.StatusInternalServerError, openai.TypeServer, openai.CodeInternal, "routing failed")
	}
}

// reject ends the exchange with an immediate response in OpenAI's error
// shape, counted like the proxy's own answers.
func (x *exchange) reject(code int, typ, errCode, msg string) error {
	x.decided, x.immediate = true, true
	x.s.metrics.Request("", "", code)
	return x.send(immediateError(code, typ, errCode, msg))
}

// replicaLimit is the answer to a request every replica it may use has
// MaxInFlightPerReplica picks in flight on.
var replicaLimit = openai.Answer{Status: http.StatusTooManyRequests, Type: openai.TypeRateLimit,
	Code: "replica_in_flight_limit", Message: "every replica the request may use has as many requests in flight from this picker as epp.max_in_flight_per_replica allows"}

// refuse ends the exchange with flow control's 429 and its Retry-After.
func (x *exchange) refuse(a openai.Answer, after time.Duration) error {
	x.decided, x.immediate = true, true
	x.s.metrics.Request("", "", a.Status)
	return x.send(immediateRefusal(a, after))
}

// models answers GET /v1/models or /v1/models/{id} itself, as the proxy
// does: the union of the replicas' models.
func (x *exchange) models() error {
	x.decided, x.immediate = true, true
	code, body := openai.ModelsAnswer(x.path, x.s.bal.Models(), "llmlb")
	x.s.metrics.Request("", "", code)
	return x.send(immediateJSON(code, body))
}

func (x *exchange) responseHeaders(h *extprocv3.HttpHeaders) error {
	for _, hv := range h.GetHeaders().GetHeaders() {
		v := hv.GetValue()
		if raw := hv.GetRawValue(); len(raw) > 0 {
			v = string(raw)
		}
		switch strings.ToLower(hv.GetKey()) {
		case ":status", "status":
			x.status, _ = strconv.Atoi(v)
		case "content-type":
			x.sse = strings.HasPrefix(strings.ToLower(strings.TrimSpace(v)), "text/event-stream")
		}
	}
	var mut *extprocv3.HeaderMutation
	if x.s.routeHdrs && x.res != nil {
		mut = routeHeaders(x.res)
	}
	if h.GetEndOfStream() {
		x.finish()
	}
	return x.send(responseHeadersResponse(mut))
}

func (x *exchange) responseBody(b *extprocv3.HttpBody) error {
	if chunk := b.GetBody(); len(chunk) > 0 {
		if !x.gotBytes && x.res != nil {
			x.gotBytes = true
			now := x.s.now()
			x.s.metrics.FirstByte(x.res.Replica, now.Sub(x.picked))
			if x.sse {
				// A stream's first chunk comes with its first token: the
				// replica's prefill is done (policy cost's pending work).
				x.s.bal.FirstToken(x.res, now)
				x.ttftAt = now
			}
		}
		if x.status >= 200 && x.status < 300 {
			if x.sse {
				x.usage.Stream(chunk)
			} else {
				x.usage.Body(chunk)
			}
		}
	}
	if b.GetEndOfStream() {
		x.finish()
	}
	return x.send(responseBodyPassthrough(x.respMode, b))
}

// finish releases the reservation of a response that ended: a 5xx is the
// replica's failure (health), a 4xx a success that served nothing, anything
// else a success.
func (x *exchange) finish() {
	if x.done || x.res == nil {
		return // released already, or nothing reserved (yet)
	}
	x.done = true
	o := balancer.OutcomeOK
	switch {
	case x.status >= 500:
		o = balancer.OutcomeServerError
	case x.status >= 400:
		o = balancer.OutcomeRejected
	}
	x.release(o, x.status)
	if x.status < 200 || x.status >= 300 {
		return
	}
	x.usage.Finish()
	// The prompt tokens the engine found cached teach policy cost how
	// much of a prefix still being prefilled it computes again.
	if u := x.usage.Usage; u.CachedReported {
		x.s.bal.Cached(x.res, int(min(u.CachedTokens, math.MaxInt32)))
	}
	if x.s.completion != nil {
		ttft := time.Duration(-1)
		if !x.ttftAt.IsZero() {
			ttft = x.ttftAt.Sub(x.start)
		}
		model := x.prof.Model
		if model == "" {
			model = x.usage.Model
		}
		x.s.completion(model, x.res.Reason, ttft, x.s.now().Sub(x.start), x.usage.Usage)
	}
}

// end runs when the stream is over, however it ended: a response that
// did not finish (the client or the gateway went away, the stream broke)
// releases its reservation as cancelled, which says nothing about the
// replica, unless the replica had already answered 5xx.
func (x *exchange) end() {
	defer x.leave()
	if x.done || x.res == nil {
		return
	}
	x.done = true
	o, code := balancer.OutcomeCanceled, proxy.StatusClientClosed
	if x.status != 0 {
		code = x.status
	}
	if x.status >= 500 {
		o = balancer.OutcomeServerError
	}
	if x.gotBytes && x.status < 500 {
		x.s.metrics.StreamError(x.res.Replica)
	}
	x.release(o, code)
}

func (x *exchange) release(o balancer.Outcome, code int) {
	if x.counted {
		x.counted = false
		x.s.uncountPick(x.res.Replica)
	}
	x.s.metrics.Request(x.res.Replica, x.res.Reason, code)
	if x.served != "" {
		if ep, err := hostPort(x.res.URL); err == nil && ep != x.served {
			x.s.log.Warn("epp: the gateway served another endpoint than the one picked",
				slog.String("picked", ep), slog.String("served", x.served))
		}
	}
	if ts := x.s.bal.Release(x.res, o, x.s.now()); len(ts) > 0 {
		x.s.transitions(ts)
	}
	x.leave()
	x.s.pump() // the replica has room: a held request may take it
}

// leave releases the tenant slot of an admitted request (once).
func (x *exchange) leave() {
	if x.slot != nil {
		x.s.gate.Done(x.slot, x.s.now())
		x.slot = nil
	}
}

// send answers the gateway; a failed send ends the stream.
func (x *exchange) send(r *extprocv3.ProcessingResponse) error {
	if err := x.stream.Send(r); err != nil {
		return fmt.Errorf("epp: send: %w", err)
	}
	return nil
}

// logDecision writes the one debug line per routing decision (never
// header values).
func (x *exchange) logDecision(ep string) {
	ctx := x.stream.Context()
	if !x.s.log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	attrs := append([]slog.Attr{
		slog.String("replica", x.res.Replica),
		slog.String("endpoint", ep),
		slog.String("reason", string(x.res.Reason)),
		slog.String("model", x.prof.Model),
		slog.Bool("session", x.prof.SessionKey != ""),
		slog.Bool("prefix", x.prof.PrefixKey != ""),
		slog.Int("prompt_tokens", x.prof.PromptTokens),
		slog.Bool("subset", x.subset != nil),
		slog.Duration("queued", x.waited),
	}, x.res.Explanation.LogAttrs()...)
	x.s.log.LogAttrs(ctx, slog.LevelDebug, "route", attrs...)
}
