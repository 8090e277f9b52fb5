package proxy

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/llmlb/llmlb/internal/request"
)

func TestAskUsage(t *testing.T) {
	withTrace := func() (context.Context, *Trace) {
		var tr Trace
		return WithTrace(context.Background(), &tr), &tr
	}
	cases := []struct {
		name   string
		trace  bool
		path   string
		stream bool
		body   string
		asked  bool
	}{
		{"streamed chat", true, "/v1/chat/completions", true, ` {"model":"m","stream":true,"messages":[]}`, true},
		{"streamed completion", true, "/v1/completions", true, `{"model":"m","stream":true,"prompt":"x"}`, true},
		{"client set stream_options", true, "/v1/chat/completions", true, `{"model":"m","stream":true,"stream_options":{"include_usage":false}}`, false},
		// The word as a string value: left alone (the check is on bytes; never a duplicate key).
		{"stream_options as a value", true, "/v1/chat/completions", true, `{"model":"m","stream":true,"messages":[{"role":"user","content":"stream_options"}]}`, false},
		// Quoted inside a string it is escaped: no top-level key, so the option is added.
		{"escaped inside a message", true, "/v1/chat/completions", true, `{"model":"m","stream":true,"messages":[{"role":"user","content":"\"stream_options\""}]}`, true},
		{"not streamed", true, "/v1/chat/completions", false, `{"model":"m"}`, false},
		{"embeddings", true, "/v1/embeddings", true, `{"model":"m","input":"x"}`, false},
		{"no observer attached", false, "/v1/chat/completions", true, `{"model":"m","stream":true}`, false},
		{"empty object", true, "/v1/chat/completions", true, `{ }`, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, tr := withTrace()
			if !c.trace {
				ctx = context.Background()
			}
			out := askUsage(ctx, c.path, &request.Profile{Stream: c.stream}, []byte(c.body))
			if tr.UsageAsked != c.asked {
				t.Fatalf("UsageAsked = %v, want %v", tr.UsageAsked, c.asked)
			}
			if !c.asked {
				if string(out) != c.body {
					t.Fatalf("body changed: %s", out)
				}
				return
			}
			var m map[string]json.RawMessage
			if err := json.Unmarshal(out, &m); err != nil {
				t.Fatalf("invalid JSON %s: %v", out, err)
			}
			if string(m["stream_options"]) != `{"include_usage":true}` || string(m["model"]) != `"m"` {
				t.Fatalf("body %s", out)
			}
		})
	}
}
