package proxy

import (
	"bytes"
	"context"

	"github.com/llmlb/llmlb/internal/request"
)

var (
	streamOptionsKey = []byte(`"stream_options"`)
	usageOption      = []byte(`"stream_options":{"include_usage":true},`)
)

// askUsage makes a streamed completion report its token usage: it adds
// "stream_options":{"include_usage":true} to a body that does not mention
// stream_options at all, so the replica ends the stream with a usage chunk.
// It does so only when a Trace is attached (package server's observer
// counts the tokens and removes that chunk, which the client did not ask
// for), and records it in the Trace. The body was parsed as a JSON object
// already; the key is added first, and since no "stream_options" occurs
// anywhere in the body it cannot repeat one.
func askUsage(ctx context.Context, path string, prof *request.Profile, body []byte) []byte {
	t, ok := ctx.Value(traceKey{}).(*Trace)
	if !ok || !prof.Stream || (path != "/v1/chat/completions" && path != "/v1/completions") ||
		bytes.Contains(body, streamOptionsKey) {
		return body
	}
	open := bytes.IndexByte(body, '{')
	if open < 0 || len(bytes.TrimSpace(body[:open])) > 0 {
		return body
	}
	rest := bytes.TrimLeft(body[open+1:], " \t\r\n")
	if len(rest) == 0 || rest[0] == '}' {
		return body // an empty object: nothing to put a comma before
	}
	out := make([]byte, 0, len(body)+len(usageOption))
	out = append(out, body[:open+1]...)
	out = append(out, usageOption...)
	out = append(out, body[open+1:]...)
	t.UsageAsked = true
	return out
}
