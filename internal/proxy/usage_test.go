package proxy

import (
	"context"
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
			out := askUsage(ctx, c.path, &request.Profile{Stream: c.stream}, []byte(c.body))
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
