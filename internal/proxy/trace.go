package proxy

import (
	"context"
	"net/http"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/request"
)

// Trace is what the proxy decided for one request, filled in as it routes
// so that a wrapping handler (package server's access log and latency
// metrics) can report it after ServeHTTP returns, whether or not route
// headers are enabled. Only the request's own goroutine writes it.
type Trace struct {
	Model    string          // the request's model field ("" when none)
	Replica  string          // replica of the last attempt ("" when none was chosen)
	Reason   balancer.Reason // its route reason
	Attempts int             // replicas tried
	// Queued is set when flow control held the request, QueueWait how long.
	Queued    bool
	QueueWait time.Duration
	// Flow is the code of flow control's own answer to the request
	// (queue_full, shed, tenant_limit, queue_timeout, shutting_down); ""
	// when it let the request through.
	Flow string
	// ModelTokens is the prompt's token count when the model's own
	// tokenizer counted it (request.Profile.TokenBlocks), else 0: the
	// observer compares it with the engine's usage.prompt_tokens.
	ModelTokens int
	// UsageAsked is set when the proxy added stream_options.include_usage
	// to a streamed request that did not ask for usage (askUsage): the
	// wrapper must then remove the usage chunk from what the client sees.
	UsageAsked bool
	// Res is the last attempt's reservation: the observer hands the
	// engine's report of the prompt's cached tokens back to the balancer
	// with it (balancer.Cached).
	Res *balancer.Reservation
}

type traceKey struct{}

// WithTrace returns a context that makes the proxy fill t.
func WithTrace(ctx context.Context, t *Trace) context.Context {
	return context.WithValue(ctx, traceKey{}, t)
}

// TracedWriter is a ResponseWriter that carries the request's Trace: a
// wrapping handler that already wraps the writer hands the Trace over this
// way, without a copy of the request for a new context (WithTrace).
type TracedWriter interface {
	http.ResponseWriter
	ProxyTrace() *Trace
}

// traceOf returns the request's Trace, from its writer or its context; nil
// when it has none.
func traceOf(w http.ResponseWriter, ctx context.Context) *Trace {
	if tw, ok := w.(TracedWriter); ok {
		return tw.ProxyTrace()
	}
	t, _ := ctx.Value(traceKey{}).(*Trace)
	return t
}

// noteFlow records flow control's part in the request's Trace, if any.
func noteFlow(t *Trace, prof *request.Profile, code string, waited time.Duration, queued bool) {
	if t == nil {
		return
	}
	t.Model, t.Flow, t.QueueWait, t.Queued = prof.Model, code, waited, queued
}

// noteDecision records a routing decision in the request's Trace, if any.
func noteDecision(t *Trace, res *balancer.Reservation, prof *request.Profile, attempt int) {
	if t == nil {
		return
	}
	t.Model, t.Replica, t.Reason, t.Attempts, t.Res = prof.Model, res.Replica, res.Reason, attempt, res
	if prof.TokenBlocks {
		t.ModelTokens = prof.PromptTokens
	}
}
