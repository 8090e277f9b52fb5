package proxy

import (
	"context"

	"github.com/llmlb/llmlb/internal/openai"
	"github.com/llmlb/llmlb/internal/request"
)

// askUsage makes a streamed completion report its token usage
// (openai.AskUsage) when a Trace is attached: package server's observer
// counts the tokens and removes the usage chunk, which the client did not
// ask for. It records in the Trace that it did.
func askUsage(ctx context.Context, path string, prof *request.Profile, body []byte) []byte {
	t, ok := ctx.Value(traceKey{}).(*Trace)
	if !ok || !prof.Stream || !openai.CompletionsPath(path) {
		return body
	}
	out, asked := openai.AskUsage(body)
	if asked {
		t.UsageAsked = true
	}
	return out
}
