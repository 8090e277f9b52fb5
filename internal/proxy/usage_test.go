package proxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/llmlb/llmlb/internal/openai"
	"github.com/llmlb/llmlb/internal/request"
)

// TestAskUsage: the proxy asks for usage only on a streamed completion
// with an observer attached, and notes it in the Trace (the body's
// rewrite itself is openai.AskUsage's, tested there).
func TestAskUsage(t *testing.T) {
	cases := []struct {
		name, path, body string
		trace, stream    bool
		asked            bool
	}{
		{"streamed chat", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[]}`, true, true, true},
		{"streamed completion", "/v1/completions", `{"model":"m","stream":true,"prompt":"x"}`, true, true, true},
		{"client set stream_options", "/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":false}}`, true, true, false},
		{"not streamed", "/v1/chat/completions", `{"model":"m"}`, true, false, false},
		{"embeddings", "/v1/embeddings", `{"model":"m","input":"x"}`, true, true, false},
		{"no observer attached", "/v1/chat/completions", `{"model":"m","stream":true}`, false, true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var tr Trace
			ctx := context.Background()
			if c.trace {
				ctx = WithTrace(ctx, &tr)
			}
			out := askUsage(traceOf(httptest.NewRecorder(), ctx), c.path, &request.Profile{Stream: c.stream}, []byte(c.body))
			if tr.UsageAsked != c.asked {
				t.Fatalf("UsageAsked = %v, want %v", tr.UsageAsked, c.asked)
			}
			want := c.body
			if c.asked {
				b, _ := openai.AskUsage([]byte(c.body))
				want = string(b)
			}
			if string(out) != want {
				t.Fatalf("body %s, want %s", out, want)
			}
		})
	}
}

// tracedRecorder carries a Trace the way package server's writer does.
type tracedRecorder struct {
	*httptest.ResponseRecorder
	tr Trace
}

func (w *tracedRecorder) ProxyTrace() *Trace { return &w.tr }

// TestTraceOf: the Trace comes from a TracedWriter first, else from the
// context (WithTrace), else there is none.
func TestTraceOf(t *testing.T) {
	var inCtx Trace
	ctx := WithTrace(context.Background(), &inCtx)
	tw := &tracedRecorder{ResponseRecorder: httptest.NewRecorder()}
	cases := []struct {
		name string
		w    http.ResponseWriter
		ctx  context.Context
		want *Trace
	}{
		{"writer", tw, context.Background(), &tw.tr},
		{"writer before context", tw, ctx, &tw.tr},
		{"context", httptest.NewRecorder(), ctx, &inCtx},
		{"none", httptest.NewRecorder(), context.Background(), nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := traceOf(c.w, c.ctx); got != c.want {
				t.Fatalf("traceOf = %p, want %p", got, c.want)
			}
		})
	}
}
