package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/llmlb/llmlb/internal/admission"
	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/flowcontrol"
	"github.com/llmlb/llmlb/internal/openai"
	"github.com/llmlb/llmlb/internal/request"
)

// Flow control's headers: the client's priority, and how long the request
// waited (set with the route headers on a response flow control held).
const (
	HeaderPriority  = "X-LLMLB-Priority"
	HeaderQueueWait = "X-LLMLB-Queue-Wait-Ms"
)

// QueueRecorder is what a Recorder may also implement to observe flow
// control: the wait of every request dispatched from the queue, by its
// priority (package admin's Metrics does).
type QueueRecorder interface {
	QueueWait(priority int, waited time.Duration)
}

// Why a waiting request leaves the queue without being dispatched; its
// ticket carries one of them, and it owes the gate no Done.
var (
	errQueueTimeout = errors.New("proxy: no replica had room within flow_control.max_queue_time or standing_queue_time")
	errShuttingDown = errors.New("proxy: llmlb is shutting down")
)

// held is a request flow control let through: it owes the gate a Done when
// it ends.
type held struct {
	req *admission.Request
	// res is the reservation of a late dispatch, the first attempt's (nil:
	// dispatched at once, the first attempt selects).
	res    *balancer.Reservation
	waited time.Duration
}

// admit runs flow control for the request st about to be routed (its
// admission.Request and held are st's own fields). It returns
// false when it answered the client itself (a refusal, a bad priority, a
// timeout, a shutdown, a client gone while waiting). Otherwise the request
// goes on; h is nil without flow control (no gate, not an inference
// request), else it owes p.gate.Done when it ends. A request that must
// wait waits here, on its ticket's channel, the client's context or the
// proxy's shutdown: nothing is sent to any replica and no header is written
// meanwhile.
func (p *Proxy) admit(w http.ResponseWriter, r *http.Request, st *routed) (h *held, ok bool) {
	body, prof := &st.out, &st.prof
	if p.gate == nil || r.Method != http.MethodPost || !request.Routed(r.URL.Path) {
		return nil, true
	}
	ctx := r.Context()
	tenant, key := p.tenantOf(r.Header)
	var prioText string
	if v := r.Header[priorityKey]; len(v) > 0 {
		prioText = v[0]
	}
	prio, err := p.flowCfg.Priority(prof.Model, tenant, key, prioText)
	if err != nil {
		p.answer(w, http.StatusBadRequest, openai.TypeInvalidRequest, openai.CodeInvalidPriority,
			HeaderPriority+" must be an integer (higher goes first; below 0 is sheddable)")
		return nil, false
	}
	if p.flowCfg.EnginePriority {
		body.b = openai.WithPriority(body.b, -prio) // vLLM serves lower values first
	}
	wt := &st.wait
	wt.ch = make(chan struct{}, 1)
	req := &st.areq
	*req = admission.Request{ID: p.ids.Add(1), Profile: prof, Priority: prio, Tenant: tenant,
		Bytes: int64(len(body.b)), Payload: wt}
	// Counted before Admit, so that a Release that finds no waiter has
	// nothing to pump.
	p.waiters.Add(1)
	d, err := p.gate.Admit(req, p.now())
	if err != nil || d.Outcome != flowcontrol.Queued {
		p.waiters.Add(-1)
	}
	if err != nil { // not expected: ids are unique, sizes are not negative
		p.log.Error("proxy: flow control rejected a request; routing it at once", slog.String("error", err.Error()))
		return nil, true
	}
	switch d.Outcome {
	case flowcontrol.Dispatch:
		st.held = held{req: req}
		return &st.held, true
	case flowcontrol.Refused:
		noteFlow(traceOf(w, ctx), prof, d.Reason.Code(), 0, false)
		p.refuse(w, prof, tenant, prio, d)
		return nil, false
	}

	// Held behind requests that may not take the replicas' reserve, it
	// may take it now (balancer.SaturationConfig.ReserveShare).
	p.Pump()
	t, dispatched := p.wait(ctx, req, wt)
	p.waiters.Add(-1)
	noteFlow(traceOf(w, ctx), prof, "", t.Waited, true)
	if dispatched {
		if p.qrec != nil {
			p.qrec.QueueWait(prio, t.Waited)
		}
		p.log.LogAttrs(ctx, slog.LevelDebug, "flow control: dispatched after waiting",
			slog.String("model", prof.Model), slog.Int("priority", prio), slog.Int64("queue_wait_ms", t.Waited.Milliseconds()))
	}
	switch {
	case ctx.Err() != nil: // the client went away; a reservation made meanwhile is unused
		if t.Res != nil {
			p.release(t.Res, balancer.OutcomeCanceled)
		}
		if dispatched {
			p.gate.Done(req, p.now())
		}
		p.metrics.Request("", "", StatusClientClosed)
		return nil, false
	case errors.Is(t.Err, errQueueTimeout):
		noteFlow(traceOf(w, ctx), prof, openai.CodeQueueTimeout, t.Waited, true)
		w.Header().Set("Retry-After", openai.RetryAfter(flowcontrol.DefaultRetryAfter))
		p.answer(w, http.StatusTooManyRequests, openai.TypeRateLimit, openai.CodeQueueTimeout,
			fmt.Sprintf("no replica of model %q had room in %s of waiting (flow_control.max_queue_time %s; standing_queue_time %s while the queue stays backlogged)",
				prof.Model, t.Waited.Round(time.Millisecond), p.flowCfg.MaxQueueTime, p.flowCfg.StandingQueueTime))
		return nil, false
	case errors.Is(t.Err, errShuttingDown):
		noteFlow(traceOf(w, ctx), prof, openai.CodeShuttingDown, t.Waited, true)
		w.Header().Set("Retry-After", openai.RetryAfter(flowcontrol.DefaultRetryAfter))
		p.answer(w, http.StatusServiceUnavailable, openai.TypeUnavailable, openai.CodeShuttingDown,
			"llmlb is shutting down and no replica had room; retry")
		return nil, false
	case t.Err != nil: // dispatched, but no replica could take it: as a failed Select
		p.selectFailed(w, t.Err, prof, nil)
		p.gate.Done(req, p.now())
		return nil, false
	}
	t.Res.Explanation.Queued = t.Waited
	st.held = held{req: req, res: t.Res, waited: t.Waited}
	return &st.held, true
}

// wait parks a queued request until its ticket comes, its client goes away
// or the proxy shuts down. dispatched reports a ticket of a late dispatch
// (the request then owes a Done), as opposed to a queue timeout, a
// shutdown, or a client gone while it waited (Err is then set).
func (p *Proxy) wait(ctx context.Context, req *admission.Request, wt *waiter) (t admission.Ticket, dispatched bool) {
	select {
	case <-wt.ch:
		t = wt.t
		return t, !errors.Is(t.Err, errQueueTimeout) && !errors.Is(t.Err, errShuttingDown)
	case <-ctx.Done():
	case <-p.stopping:
	}
	if p.gate.Remove(req) {
		err := ctx.Err()
		if err == nil {
			err = errShuttingDown
		}
		return admission.Ticket{Request: req, Err: err, Waited: p.now().Sub(req.Enqueued())}, false
	}
	// Taken out of the queue meanwhile: its ticket is on its way.
	<-wt.ch
	t = wt.t
	return t, !errors.Is(t.Err, errQueueTimeout) && !errors.Is(t.Err, errShuttingDown)
}

// tenantOf returns the request's tenant (flow_control.tenant_from) and the
// client's API key (priority rules may match it).
func (p *Proxy) tenantOf(h http.Header) (tenant, key string) {
	key = request.APIKey(h)
	if p.keyTenant {
		return request.KeyTenant(key), key
	}
	return request.Tenant(p.reqCfg, h), key
}

// refuse answers a request flow control refused: 429 with Retry-After.
func (p *Proxy) refuse(w http.ResponseWriter, prof *request.Profile, tenant string, prio int, d flowcontrol.Decision) {
	var msg string
	switch d.Reason {
	case flowcontrol.QueueFull:
		msg = fmt.Sprintf("every replica of model %q is full and its queue holds flow_control.max_queued requests", prof.Model)
	case flowcontrol.QueueBytesFull:
		msg = fmt.Sprintf("every replica of model %q is full and its queue holds flow_control.max_queued_bytes of requests", prof.Model)
	case flowcontrol.Shed:
		msg = fmt.Sprintf("every replica of model %q is full and priority %d is sheddable (below 0)", prof.Model, prio)
	case flowcontrol.TenantConcurrency:
		msg = fmt.Sprintf("tenant %q has as many requests in flight as its max_concurrent allows", tenant)
	case flowcontrol.TenantRate:
		msg = fmt.Sprintf("tenant %q has used its tokens_per_minute", tenant)
	default:
		msg = "refused by flow control"
	}
	w.Header().Set("Retry-After", openai.RetryAfter(d.RetryAfter))
	p.answer(w, http.StatusTooManyRequests, openai.TypeRateLimit, d.Reason.Code(), msg)
}

// release returns an attempt's reservation, reports the health transitions
// it caused and lets waiting requests have the slot it freed.
func (p *Proxy) release(res *balancer.Reservation, o balancer.Outcome) {
	if ts := p.bal.Release(res, o, p.now()); len(ts) > 0 {
		p.transitions(ts)
	}
	p.Pump()
}

// Pump dispatches the requests flow control holds while their model's
// replicas have room, and hands each its ticket. The proxy calls it after
// every Release; the server after every scrape, every health or fleet
// change, and on a ticker. A nil Proxy does nothing.
func (p *Proxy) Pump() {
	if p == nil || p.gate == nil || p.waiters.Load() == 0 {
		return
	}
	for _, t := range p.gate.Pump(p.now()) {
		p.deliver(t)
	}
}

// Expire answers the requests that waited flow_control.max_queue_time (or
// standing_queue_time under a standing backlog): 429 queue_timeout. The server calls it on its flow control ticker.
func (p *Proxy) Expire() {
	if p == nil || p.gate == nil || p.waiters.Load() == 0 {
		return
	}
	now := p.now()
	for _, r := range p.gate.Expire(now) {
		p.deliver(admission.Ticket{Request: r, Err: errQueueTimeout, Waited: now.Sub(r.Enqueued())})
	}
}

// Shutdown ends flow control when the server starts draining: waiting
// requests that fit on a replica with room are dispatched, every other one
// is answered 503 shutting_down, and a request that would wait from now on
// is answered so at once. Requests already dispatched run to their end.
func (p *Proxy) Shutdown() {
	if p == nil || p.gate == nil {
		return
	}
	p.Pump()
	p.stopOnce.Do(func() { close(p.stopping) })
	now := p.now()
	for _, r := range p.gate.Drain() {
		p.deliver(admission.Ticket{Request: r, Err: errShuttingDown, Waited: now.Sub(r.Enqueued())})
	}
}

// waiter is how a request in flow control's queue gets its ticket: deliver
// keeps the ticket and signals ch, which has room for the one signal a
// request ever gets. It lives in the request's routed allocation, and a
// channel of empty signals is one allocation where a channel of tickets
// (pointers in its buffer) was two.
type waiter struct {
	ch   chan struct{}
	sent atomic.Bool // t is kept: a second ticket is not expected
	t    admission.Ticket
}

// deliver hands a ticket to its waiting request; it never blocks.
func (p *Proxy) deliver(t admission.Ticket) {
	wt, _ := t.Request.Payload.(*waiter)
	switch {
	case wt != nil && wt.sent.CompareAndSwap(false, true):
		wt.t = t
		wt.ch <- struct{}{}
	default: // not expected: no waiter would ever read it
		if t.Res != nil {
			p.bal.Release(t.Res, balancer.OutcomeCanceled, p.now())
		}
		p.log.Error("proxy: a flow control ticket could not be delivered", slog.Uint64("id", t.Request.ID))
	}
}

// queueWaitValue is HeaderQueueWait's value.
func queueWaitValue(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
